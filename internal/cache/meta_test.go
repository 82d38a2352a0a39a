package cache

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
)

// heldFind is a tree whose Find delivers only once released, so a test
// can change the tree while a prefetch is on its way. With walkFirst the
// walk is made before the release (it sees the tree as it was when Find
// was called), else after.
type heldFind struct {
	ferry.FS
	release   chan struct{}
	walkFirst bool
}

func (h heldFind) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	if !h.walkFirst {
		<-h.release
		return h.FS.Find(ctx, p, pred)
	}
	return walked(ctx, h.FS.Find(ctx, p, pred), func() { <-h.release })
}

// walked reads s to its end, then returns a stream that calls before and
// delivers what s did.
func walked(ctx context.Context, s *ferry.Stream[ferry.Entry], before func()) *ferry.Stream[ferry.Entry] {
	var es []ferry.Entry
	for e := range s.All() {
		es = append(es, e)
	}
	err := s.Err()
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		before()
		for _, e := range es {
			if err := send(e); err != nil {
				return err
			}
		}
		return err
	})
}

// localWith returns a new directory holding files, each with the content
// "x", and a local tree over it.
func localWith(t *testing.T, files ...string) (string, *local.Tree) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, tree
}

// changingFind is a tree whose Find calls during after its walk and
// before it delivers: an event about the directory arrives while every
// fetch of it is on its way.
type changingFind struct {
	ferry.FS
	during func()
}

func (c changingFind) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	return walked(ctx, c.FS.Find(ctx, p, pred), c.during)
}

// TestListingChangedWhileFetched: a directory that others change during
// every fetch of it (each change drops what is cached below it, as a
// replica member's break does) is still listed, as the tree below had it
// when read: a listing concurrent with those changes, where giving up
// was an EIO for the program's readdir.
func TestListingChangedWhileFetched(t *testing.T) {
	_, tree := localWith(t, "d/a", "d/b")
	var m *meta
	h := changingFind{FS: tree, during: func() { m.invalidateAll("/d") }}
	m = newMeta(h, 16, 1000, 0, time.Hour)
	m.data = newContents(h, slog.New(slog.DiscardHandler), 1<<20, nil, 0)
	m.setLease(true)
	got, err := m.list(context.Background(), "/d")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.Name())
	}
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("listed %v, want [a b]", names)
	}
	if m.finds < 2 {
		t.Errorf("%d fetches: the listing was not changed while fetched", m.finds)
	}
}

// TestListingRacesOwnChanges: a listing that was on its way while this
// mount created or removed names in it does not lose the created name or
// bring back the removed one, whichever way the walk saw them.
func TestListingRacesOwnChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		// walkFirst: the server's walk ran before the change reached
		// the server (it saw the old names); else after.
		walkFirst      bool
		create, remove bool
		want           []string
	}{
		{"create, walk saw the old names", true, true, false, []string{"keep", "new", "old"}},
		{"create, walk saw the new names", false, true, false, []string{"keep", "new", "old"}},
		{"remove, walk saw the old names", true, false, true, []string{"keep"}},
		{"remove, walk saw the new names", false, false, true, []string{"keep"}},
		{"both, walk saw the old names", true, true, true, []string{"keep", "new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, tree := localWith(t, "d/old", "d/keep")
			h := heldFind{FS: tree, release: make(chan struct{}), walkFirst: tc.walkFirst}
			m := newMeta(h, 16, 1000, 0, time.Hour)
			m.data = newContents(h, slog.New(slog.DiscardHandler), 1<<20, nil, 0)
			m.setLease(true)
			ctx := context.Background()

			listed := make(chan error, 1)
			var got []ferry.Dir
			go func() {
				var err error
				got, err = m.list(ctx, "/d")
				listed <- err
			}()
			// Wait for the fetch to be on its way, as a walk takes its
			// seq when it starts.
			for {
				m.mu.Lock()
				n := m.finds
				m.mu.Unlock()
				if n > 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			change := func() { // On the server.
				if tc.create {
					if err := os.WriteFile(filepath.Join(dir, "d/new"), []byte("y"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if tc.remove {
					if err := os.Remove(filepath.Join(dir, "d/old")); err != nil {
						t.Fatal(err)
					}
				}
			}
			// This mount's own calls, as Create and Unlink record them.
			change()
			if tc.create {
				d, err := tree.Stat(ctx, "/d/new").Wait()
				if err != nil {
					t.Fatal(err)
				}
				m.set(d)
			}
			if tc.remove {
				m.forget("/d/old")
			}
			close(h.release)
			if err := <-listed; err != nil {
				t.Fatalf("list: %v", err)
			}
			// The listing in flight may have been made before the
			// changes; ask again, from the cache.
			got, err := m.list(ctx, "/d")
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			var names []string
			for _, d := range got {
				names = append(names, d.Name())
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("listing of /d = %v, want %v", names, tc.want)
			}
			if _, err := m.lookup(ctx, "/d", "old"); tc.remove != ferry.IsKind(err, ferry.KindNotExist) {
				t.Errorf("lookup of old: %v, want it gone: %v", err, tc.remove)
			}
			if _, err := m.lookup(ctx, "/d", "new"); tc.create != (err == nil) {
				t.Errorf("lookup of new: %v, want it there: %v", err, tc.create)
			}
		})
	}
}

// TestMetaBounded: with room for fewer entries than the tree has, the
// metadata cache keeps at most that many, evicting the least recently
// used, and still answers every lookup and listing right, a directory
// bigger than the bound included.
func TestMetaBounded(t *testing.T) {
	dir := t.TempDir()
	want := map[string][]string{}
	for d, n := range map[string]int{"a": 60, "b": 60, "c": 60, "big": 300} {
		for i := range n {
			name := fmt.Sprintf("f%03d", i)
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, d, name), []byte(name), 0o644); err != nil {
				t.Fatal(err)
			}
			want["/"+d] = append(want["/"+d], name)
		}
	}
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	const max = 100
	m := newMeta(tree, 16, 1000, max, time.Hour)
	m.data = newContents(tree, slog.New(slog.DiscardHandler), 1<<20, nil, 0)
	m.setLease(true)
	ctx := context.Background()
	for round := range 3 {
		for _, d := range []string{"/a", "/big", "/b", "/c"} {
			got, err := m.list(ctx, d)
			if err != nil {
				t.Fatalf("round %d: list %s: %v", round, d, err)
			}
			var names []string
			for _, e := range got {
				names = append(names, e.Name())
			}
			if !slices.Equal(names, want[d]) {
				t.Errorf("round %d: list %s has %d names, want %d", round, d, len(names), len(want[d]))
			}
			for _, name := range []string{"f000", "f059", "missing"} {
				e, err := m.lookup(ctx, d, name)
				if name == "missing" {
					if !ferry.IsKind(err, ferry.KindNotExist) {
						t.Errorf("round %d: lookup %s/%s: %v, want not found", round, d, name, err)
					}
					continue
				}
				if err != nil || e.Size() != int64(len(name)) {
					t.Errorf("round %d: lookup %s/%s: %v, %v", round, d, name, e, err)
				}
			}
			m.mu.Lock()
			n := len(m.ents)
			m.mu.Unlock()
			if d != "/big" && n > max {
				t.Errorf("round %d: after %s the cache holds %d entries, want at most %d", round, d, n, max)
			}
		}
	}
	if _, evicted := m.size(); evicted == 0 {
		t.Error("nothing was evicted from a cache bounded below the tree's size")
	}
}
