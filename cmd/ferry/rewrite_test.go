package main

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRewriteSeenWhole: while one mount holds the write lease over a
// directory (it keeps writing there), another mount rewrites a file in it
// with O_TRUNC again and again, and a third reads it: the reader sees the
// file's old content or its new one, never the file empty or partial.
// With no write lease, the writer's mount stores the file at its close:
// on mounts as they are by default, where the kernel opens files itself,
// that close is the FLUSH the kernel sends with no handle, and the
// truncation comes before it on its own (internal/fusefs/unclosed.go).
// Before the mount kept hearing that FLUSH, 11-48% of the reads there saw
// the file empty.
func TestRewriteSeenWhole(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
	}{
		{"kernel opens", nil},
		{"opens heard", []string{"--kernel-opens=false"}},
	} {
		t.Run(c.name, func(t *testing.T) { rewriteSeenWhole(t, c.args...) })
	}
}

func rewriteSeenWhole(t *testing.T, mountArgs ...string) {
	needMount(t)
	e := start(t)
	var mnts []string
	for range 3 {
		m := mountPoint(t)
		e.run(true, append(append([]string{"mount"}, mountArgs...), e.at("/"), m)...)
		t.Cleanup(func() { e.run(true, "umount", m) })
		mnts = append(mnts, m)
	}
	if err := os.Mkdir(filepath.Join(mnts[0], "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	const content = "the content of y"
	y := func(i int) string { return filepath.Join(mnts[i], "d", "y") }
	if err := os.WriteFile(y(1), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var reads, empty atomic.Int64
	var wg sync.WaitGroup
	loop := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				fn()
			}
		}()
	}
	loop(func() { // the lease holder
		if err := os.WriteFile(filepath.Join(mnts[0], "d", "x"), []byte("x"), 0o644); err != nil {
			t.Error(err)
			stop.Store(true)
		}
		time.Sleep(5 * time.Millisecond)
	})
	loop(func() { // the rewriter
		if err := os.WriteFile(y(1), []byte(content), 0o644); err != nil {
			t.Error(err)
			stop.Store(true)
		}
		time.Sleep(5 * time.Millisecond)
	})
	loop(func() { // the reader
		b, err := os.ReadFile(y(2))
		if err != nil {
			t.Error(err)
			stop.Store(true)
			return
		}
		reads.Add(1)
		if string(b) != content {
			empty.Add(1)
		}
	})
	time.Sleep(4 * time.Second)
	stop.Store(true)
	wg.Wait()
	if n := empty.Load(); n > 0 || reads.Load() == 0 {
		t.Fatalf("%d of %d reads did not see the file whole", n, reads.Load())
	}
	t.Logf("%d reads, each of the whole file", reads.Load())
}
