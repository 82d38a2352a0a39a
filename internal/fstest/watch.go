package fstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// WatchSetup returns a fresh Watcher to test and the directory on disk that
// holds its tree.
type WatchSetup func(t *testing.T) (w ferry.Watcher, fs ferry.FS, dir string)

// RunWatch tests a ferry.Watcher: changes made through the tree and behind
// its back, in directories old and new, are all reported.
func RunWatch(t *testing.T, setup WatchSetup) {
	w, fs, dir := setup(t)
	write(t, dir, "old/sub/f", "x")
	s := w.Watch(ctx(t), "/")
	t.Cleanup(func() { s.Close() })
	events := make(chan ferry.Event, 1000)
	go func() {
		for e := range s.All() {
			events <- e
		}
		close(events)
	}()
	// wait returns once an event for p has arrived, failing the test if
	// none comes soon; it notes the temporary names it saw.
	wait := func(what, p string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("%s: the watch ended: %v", what, s.Err())
				}
				if strings.Contains(e.Path, ".ferry-") {
					t.Errorf("%s: an event names a temporary file: %s", what, e.Path)
				}
				if e.Path == p {
					return
				}
			case <-timeout:
				t.Fatalf("%s: no event for %s", what, p)
			}
		}
	}
	wait("the first event", "/")

	c := ctx(t)
	steps := []struct {
		what string
		do   func() error
		want string
	}{
		{"a file written behind the tree's back", func() error {
			return os.WriteFile(filepath.Join(dir, "old/sub/f"), []byte("changed"), 0o644)
		}, "/old/sub/f"},
		{"a file put through the tree", func() error {
			_, err := fs.Put(c, "/put", nil, ferry.Whole, strings.NewReader("p")).Wait()
			return err
		}, "/put"},
		{"a new directory", func() error { return os.Mkdir(filepath.Join(dir, "new"), 0o755) }, "/new"},
		{"a file in the new directory", func() error {
			return os.WriteFile(filepath.Join(dir, "new/g"), []byte("g"), 0o644)
		}, "/new/g"},
		{"a rename's old name", func() error {
			return os.Rename(filepath.Join(dir, "put"), filepath.Join(dir, "new/renamed"))
		}, "/put"},
		{"a chmod", func() error { return os.Chmod(filepath.Join(dir, "old/sub"), 0o700) }, "/old/sub"},
		{"a moved directory's new name", func() error {
			return os.Rename(filepath.Join(dir, "old"), filepath.Join(dir, "new/old2"))
		}, "/new/old2"},
		{"a change below a moved directory", func() error {
			return os.WriteFile(filepath.Join(dir, "new/old2/sub/f"), []byte("again"), 0o644)
		}, "/new/old2/sub/f"},
		{"a removal through the tree", func() error {
			_, err := fs.RemoveAll(c, "/new/old2").Wait()
			return err
		}, "/new/old2"},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		wait(st.what, st.want)
	}
	if err := s.Close(); ferry.KindOf(err) != ferry.KindCanceled {
		t.Errorf("closing the watch: %v, want a cancellation", err)
	}
}
