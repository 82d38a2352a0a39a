package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// TestWatchShared: many more Watches than the kernel's default of 128
// inotify instances per user run at once on one tree through one instance;
// each sees the changes in its own subtree and no others, a Watch of a
// file sees that file's, and the instance closes with the last Watch.
func TestWatchShared(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	roots := []string{"/a", "/b", "/a/f"}
	for range 200 {
		roots = append(roots, "/")
	}
	watches := make([]*ferry.Stream[ferry.Event], len(roots))
	for i, root := range roots {
		watches[i] = tree.Watch(ctx, root)
		defer watches[i].Close()
		if e, ok := watches[i].Next(); !ok || e.Path != root || !e.Lost {
			t.Fatalf("watch %d of %s: first event %+v (%v), want %s lost", i, root, e, watches[i].Err(), root)
		}
	}
	if n := inotifies(t); n != 1 {
		t.Errorf("%d watches hold %d inotify instances, want 1", len(roots), n)
	}

	// A change in /a, then one in /b: each watch's next event is the
	// first change in its subtree.
	if err := os.WriteFile(filepath.Join(dir, "a", "f"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b", "g"), []byte("z"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, root := range roots {
		e, ok := watches[i].Next()
		want := "/a/f"
		if root == "/b" {
			want = "/b/g"
		}
		if !ok || e.Path != want {
			t.Errorf("watch %d of %s: next event %+v (%v), want %s", i, root, e, watches[i].Err(), want)
		}
	}

	for _, w := range watches {
		w.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for inotifies(t) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := inotifies(t); n != 0 {
		t.Errorf("%d inotify instances open after every watch ended", n)
	}
}

// inotifies counts the process's open inotify instances.
func inotifies(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "inotify") {
			n++
		}
	}
	return n
}
