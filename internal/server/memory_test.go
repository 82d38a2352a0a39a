package server_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestStreamMemoryReturned: thousands of streams of every kind, whole and
// cut short, leave the server (and its clients, in the same process)
// holding no more heap and no more goroutines than before them, give or
// take what caches and pools keep: what a stream takes is returned when
// it ends.
func TestStreamMemoryReturned(t *testing.T) {
	s := servertest.StartChunked(t, "")
	for i := range 40 {
		if err := os.WriteFile(filepath.Join(s.Dir, fmt.Sprintf("f%02d", i)), bytes.Repeat([]byte{byte(i)}, 16<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "big"), bytes.Repeat([]byte("b"), 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	var clients []ferry.FS
	for i := range 4 {
		clients = append(clients, s.Client(t, fmt.Sprintf("u%d", i)))
	}
	ops := []func(c ferry.FS, i int) error{
		func(c ferry.FS, i int) error { _, err := c.Stat(ctx(t), "/big").Wait(); return err },
		func(c ferry.FS, i int) error { return drain(c.Find(ctx(t), "/", "")) },
		func(c ferry.FS, i int) error { return drain(c.FindGet(ctx(t), "/", "")) },
		func(c ferry.FS, i int) error {
			r := c.Get(ctx(t), fmt.Sprintf("/f%02d", i%40), 0, -1)
			defer r.Close()
			_, err := io.Copy(io.Discard, r)
			return err
		},
		func(c ferry.FS, i int) error {
			// Cut short: most of the file is still read ahead.
			r := c.Get(ctx(t), "/big", 0, -1)
			defer r.Close()
			_, err := io.ReadFull(r, make([]byte, 256<<10))
			return err
		},
		func(c ferry.FS, i int) error {
			_, err := c.Put(ctx(t), fmt.Sprintf("/p%d", i%50), nil, ferry.Whole, bytes.NewReader(bytes.Repeat([]byte("p"), 100<<10))).Wait()
			return err
		},
	}
	round := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ops[i%len(ops)](clients[i%len(clients)], i); err != nil {
					t.Errorf("op %d: %v", i%len(ops), err)
				}
			}()
		}
		wg.Wait()
	}
	settle := func() (heap uint64, goroutines int) {
		// Read-ahead of cut streams and closing streams end shortly
		// after their callers return.
		deadline := time.Now().Add(10 * time.Second)
		for {
			held, _ := s.Srv.ReadAhead()
			if held == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		runtime.GC()
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse, runtime.NumGoroutine()
	}
	round(60) // Pools, caches and connections fill here.
	heap0, g0 := settle()
	const streams = 600
	for range streams / 60 {
		round(60)
	}
	heap1, g1 := settle()
	t.Logf("%d streams: heap in use %d -> %d MiB, goroutines %d -> %d", streams, heap0>>20, heap1>>20, g0, g1)
	if grew := int64(heap1) - int64(heap0); grew > 16<<20 {
		t.Errorf("after %d streams the heap in use grew by %d MiB (%d -> %d), want under 16 MiB: %d bytes a stream kept", streams, grew>>20, heap0>>20, heap1>>20, grew/streams)
	}
	if g1 > g0+20 {
		t.Errorf("after %d streams %d goroutines run, %d before", streams, g1, g0)
	}
}

// drain reads s to its end.
func drain(s *ferry.Stream[ferry.Entry]) error {
	for range s.All() {
	}
	return s.Err()
}
