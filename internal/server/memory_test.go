package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
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
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/server"
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

// TestUploadMemoryBounded: uploads whose handlers wait (here for the
// recall of a write lease whose holder does not answer) hold no more of
// the server's memory than its budget leaves for uploads, whatever their
// number: the uploads beyond it are refused before any of their data is
// kept, and their clients wait and try again. Once the holder lets go,
// every upload completes whole.
func TestUploadMemoryBounded(t *testing.T) {
	const (
		uploads = 6
		size    = 36 << 20
	)
	s := servertest.StartWith(t, "", func(cfg *server.Config) {
		cfg.Memory = 128 << 20
		cfg.ReadAheadBudget = 32 << 20
		cfg.Lease = time.Minute
	})
	if err := os.Mkdir(filepath.Join(s.Dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, limit, _ := s.Srv.Uploads()
	if limit != 96<<20 {
		t.Fatalf("upload memory %d MiB, want the 96 MiB that 128 MiB less 32 MiB of read-ahead leaves", limit>>20)
	}

	// The holder takes a write lease over /d and never acknowledges its
	// recall: every put into /d waits for it, reading nothing more.
	holder := s.Client(t, "holder")
	w := holder.Watch(context.Background(), "/")
	events := make(chan struct{})
	go func() {
		defer close(events)
		for range w.All() {
		}
	}()
	// The lease is held with the watch, once the watch is in place.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		grant, err := holder.WriteLease(ctx(t), "/d")
		if err != nil {
			t.Fatal(err)
		}
		if grant == ferry.WriteDeep {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("no write lease over /d after 5 s")
		}
	}

	data := make([][]byte, uploads)
	clients := make([]*remote.Client, uploads)
	errs := make(chan error, uploads)
	for i := range uploads {
		data[i] = make([]byte, size)
		rand.Read(data[i])
		clients[i] = s.Client(t, fmt.Sprintf("u%d", i))
		go func() {
			_, err := clients[i].Put(ctx(t), fmt.Sprintf("/d/f%d", i), nil, ferry.Whole, bytes.NewReader(data[i])).Wait()
			errs <- err
		}()
	}

	// While the holder holds on, the admitted uploads fill their windows
	// and the others are refused again and again.
	var most int64
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		most = max(most, s.Srv.Received())
		time.Sleep(5 * time.Millisecond)
	}
	_, _, refused := s.Srv.Uploads()
	t.Logf("received and unread: at most %d MiB of %d MiB; %d streams refused", most>>20, limit>>20, refused)
	if most > limit+4<<20 {
		t.Errorf("the server held %d MiB of uploads' data, want at most the %d MiB of its budget", most>>20, limit>>20)
	}
	if most < limit/2 {
		t.Errorf("the server held only %d MiB of uploads' data: the admitted uploads never filled their windows, so nothing was tested", most>>20)
	}
	if refused == 0 {
		t.Errorf("no upload was refused, %d of 32 MiB each against %d MiB", uploads, limit>>20)
	}

	w.Close()
	<-events
	for range uploads {
		if err := <-errs; err != nil {
			t.Errorf("put: %v", err)
		}
	}
	var busy int64
	for i := range uploads {
		got, err := os.ReadFile(filepath.Join(s.Dir, "d", fmt.Sprintf("f%d", i)))
		if err != nil || !bytes.Equal(got, data[i]) {
			t.Errorf("f%d: %d bytes, %v; want the %d put", i, len(got), err, size)
		}
		busy += clients[i].Traffic().Busy
	}
	if busy == 0 {
		t.Errorf("no client waited for the busy server")
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		reserved, _, _ := s.Srv.Uploads()
		if reserved == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still reserved after every upload ended", reserved)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
