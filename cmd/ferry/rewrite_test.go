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
// file's old content or its new one, never the file empty. The mounts
// hear opens; TestRewriteSeenWholeKernelOpens has why.
func TestRewriteSeenWhole(t *testing.T) {
	rewriteSeenWhole(t, "--kernel-opens=false")
}

// TestRewriteSeenWholeKernelOpens is TestRewriteSeenWhole on mounts as
// they are by default, where the kernel opens files itself. It fails
// today, and so runs only with FERRY_KNOWN_BUGS set: such a mount hears
// no close, so without a write lease (the other mount holds it) it
// stores each write before it returns (internal/fusefs/unclosed.go), and
// the truncation O_TRUNC reaches it as is stored on its own. On this
// machine 11% and 48% of the reads (two runs) did not see the file whole.
func TestRewriteSeenWholeKernelOpens(t *testing.T) {
	if os.Getenv("FERRY_KNOWN_BUGS") == "" {
		t.Skip("a known bug (see the comment): FERRY_KNOWN_BUGS=1 runs it")
	}
	rewriteSeenWhole(t)
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
