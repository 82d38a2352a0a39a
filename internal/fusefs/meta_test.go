package fusefs

import (
	"context"
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
	var es []ferry.Entry
	s := h.FS.Find(ctx, p, pred)
	for e := range s.All() {
		es = append(es, e)
	}
	err := s.Err()
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		<-h.release
		for _, e := range es {
			if err := send(e); err != nil {
				return err
			}
		}
		return err
	})
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
			dir := t.TempDir()
			for _, f := range []string{"d/old", "d/keep"} {
				os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
				if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tree, err := local.New(dir)
			if err != nil {
				t.Fatal(err)
			}
			h := heldFind{FS: tree, release: make(chan struct{}), walkFirst: tc.walkFirst}
			m := newMeta(h, 16, 1000, time.Hour)
			m.data = newContents(h, slog.New(slog.DiscardHandler), 1<<20)
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
			if got, err = m.list(ctx, "/d"); err != nil {
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
