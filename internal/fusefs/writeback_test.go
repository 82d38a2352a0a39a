package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/servertest"
)

// slowPuts is a tree whose Puts take a while, so that background stores
// overlap what the test does next, and fail for names containing "bad".
type slowPuts struct {
	ferry.FS
	delay time.Duration
}

func (s *slowPuts) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	if strings.Contains(p, "bad") {
		return ferry.Resolved[ferry.Dir](nil, ferry.E("test.Put", p, ferry.KindIO, "refused"))
	}
	time.Sleep(s.delay)
	return s.FS.Put(ctx, p, d, off, data)
}

func mountWriteBack(t *testing.T) (dir, mnt string) {
	t.Helper()
	dir, tree := localTree(t)
	mnt, _ = mountFS(t, &slowPuts{FS: tree, delay: 20 * time.Millisecond}, Options{WriteBack: true})
	return dir, mnt
}

// syncDir fsyncs the directory p: it returns once what was written below
// it is stored, with the first failure.
func syncDir(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func TestWriteBack(t *testing.T) {
	dir, mnt := mountWriteBack(t)
	want := map[string]string{}
	for i := range 10 {
		for j := range 5 {
			rel := fmt.Sprintf("d%d/sub/f%d", i, j)
			if err := os.MkdirAll(filepath.Join(mnt, filepath.Dir(rel)), 0o755); err != nil {
				t.Fatal(err)
			}
			want[rel] = strings.Repeat(rel, i+j+1)
			writeFile(t, filepath.Join(mnt, rel), want[rel])
		}
	}
	// Changes to the same paths, each depending on the last, while the
	// stores of the first ones may still be under way.
	steps := []struct {
		what string
		do   func() error
	}{
		{"write x", func() error { return os.WriteFile(filepath.Join(mnt, "x"), []byte("one"), 0o644) }},
		{"rename x y", func() error { return os.Rename(filepath.Join(mnt, "x"), filepath.Join(mnt, "y")) }},
		{"write x again", func() error { return os.WriteFile(filepath.Join(mnt, "x"), []byte("two"), 0o644) }},
		{"overwrite y", func() error { return os.WriteFile(filepath.Join(mnt, "y"), []byte("three"), 0o644) }},
		{"remove d0/sub/f0", func() error { return os.Remove(filepath.Join(mnt, "d0/sub/f0")) }},
		{"rename d1 e1", func() error { return os.Rename(filepath.Join(mnt, "d1"), filepath.Join(mnt, "e1")) }},
		{"chmod y", func() error { return os.Chmod(filepath.Join(mnt, "y"), 0o600) }},
		// A lock file's life, as git leads it: made exclusively,
		// removed, made again, renamed into place.
		{"lock, unlock, lock, commit", func() error {
			lock := filepath.Join(mnt, "z.lock")
			for i, content := range []string{"first", "second"} {
				f, err := os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return err
				}
				f.WriteString(content)
				if err := f.Close(); err != nil {
					return err
				}
				if i == 0 {
					if err := os.Remove(lock); err != nil {
						return err
					}
				}
			}
			return os.Rename(lock, filepath.Join(mnt, "z"))
		}},
		{"remove e1/sub/f1", func() error { return os.Remove(filepath.Join(mnt, "e1/sub/f1")) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
	}
	want["x"], want["y"], want["z"] = "two", "three", "second"
	delete(want, "d0/sub/f0")
	for j := range 5 {
		rel := fmt.Sprintf("d1/sub/f%d", j)
		want["e1/sub/"+filepath.Base(rel)] = want[rel]
		delete(want, rel)
	}
	delete(want, "e1/sub/f1")
	if _, err := os.Stat(filepath.Join(mnt, "e1/sub/f1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount: e1/sub/f1 after its removal: %v", err)
	}
	// The mount shows the changes at once...
	for rel, w := range want {
		if got := readFile(t, filepath.Join(mnt, rel)); got != w {
			t.Errorf("mount: %s = %q, want %q", rel, got, w)
		}
	}
	// ...and the server has them once the root is synced.
	if err := syncDir(mnt); err != nil {
		t.Fatalf("fsync of the root: %v", err)
	}
	got := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			b, _ := os.ReadFile(p)
			got[rel] = string(b)
		}
		return nil
	})
	for rel, w := range want {
		if got[rel] != w {
			t.Errorf("server: %s = %q, want %q", rel, got[rel], w)
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("server has %s, which was removed or renamed", rel)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "y")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("server: y's mode = %v (%v), want 0600", fi.Mode().Perm(), err)
	}
}

func TestWriteBackFailure(t *testing.T) {
	dir, mnt := mountWriteBack(t)
	os.Mkdir(filepath.Join(mnt, "d"), 0o755)
	// The close succeeds: the store fails later, in the background.
	if err := os.WriteFile(filepath.Join(mnt, "d", "bad"), []byte("lost"), 0o644); err != nil {
		t.Fatalf("close: %v", err)
	}
	writeFile(t, filepath.Join(mnt, "d", "good"), "kept")
	// fsync of the directory reports it, once.
	if err := syncDir(filepath.Join(mnt, "d")); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync after a failed background store: got %v, want EIO", err)
	}
	if err := syncDir(filepath.Join(mnt, "d")); err != nil {
		t.Errorf("second fsync: got %v, want the failure reported only once", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "d", "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server: bad exists (%v)", err)
	}
	if got := readFile(t, filepath.Join(dir, "d", "good")); got != "kept" {
		t.Errorf("server: good = %q, want %q", got, "kept")
	}
	// fsync of the file itself waits for its store and reports its
	// failure.
	f, err := os.Create(filepath.Join(mnt, "bad2"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("lost too")
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync of a file whose store fails: got %v, want EIO", err)
	}
	f.Close()
}

// TestWriteBackRenameOverOpen: a file renamed over one that is open for
// writing and not yet stored replaces it, on the mount and on the server,
// whatever the replaced file's descriptor does after; on a local disk its
// writes go to a file no name leads to.
func TestWriteBackRenameOverOpen(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback=%v", wb), func(t *testing.T) {
			dir, tree := localTree(t)
			mnt, _ := mountFS(t, &slowPuts{FS: tree, delay: 50 * time.Millisecond}, Options{WriteBack: wb})
			f1 := strings.Repeat("1", 1000)
			if err := os.WriteFile(filepath.Join(mnt, "f1"), []byte(f1), 0o644); err != nil {
				t.Fatal(err)
			}
			f0, err := os.OpenFile(filepath.Join(mnt, "f0"), os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f0.WriteString("0123456789"); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(mnt, "f1"), filepath.Join(mnt, "f0")); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(filepath.Join(mnt, "f0")); err != nil || fi.Size() != 1000 {
				t.Errorf("f0 after the rename: %v, %v; want 1000 bytes", fi, err)
			}
			if _, err := f0.WriteString("more"); err != nil {
				t.Fatal(err)
			}
			if err := f0.Close(); err != nil {
				t.Fatal(err)
			}
			if err := syncDir(mnt); err != nil {
				t.Fatal(err)
			}
			for _, base := range []string{mnt, dir} {
				if got := readFile(t, filepath.Join(base, "f0")); got != f1 {
					t.Errorf("%s/f0: %d bytes %.12q, want f1's 1000", base, len(got), got)
				}
				if _, err := os.Stat(filepath.Join(base, "f1")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s/f1 after the rename: %v, want none", base, err)
				}
			}
		})
	}
}

// TestWriteBackReopen: a file opened for writing again while its last
// close is still being stored waits for that store, no longer, and gives
// what a local disk gives: an append after a write, a rewrite, a second
// descriptor appending beside a first.
func TestWriteBackReopen(t *testing.T) {
	dir, mnt := mountWriteBack(t)
	steps := func(name string) []func() error {
		p := filepath.Join(mnt, name)
		appendTo := func(s string) func() error {
			return func() error {
				f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					return err
				}
				if _, err := f.WriteString(s); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
		}
		write := func(s string) func() error { return func() error { return os.WriteFile(p, []byte(s), 0o644) } }
		twoAppends := func() error {
			a, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer a.Close()
			b, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer b.Close()
			for _, s := range []string{"a1\n", "b1\n", "a2\n"} {
				f := a
				if s[0] == 'b' {
					f = b
				}
				if _, err := f.WriteString(s); err != nil {
					return err
				}
			}
			return nil
		}
		return []func() error{write("data\n"), appendTo("more\n"), write("z\n"), appendTo("after z\n"), twoAppends}
	}
	const want = "z\nafter z\na1\nb1\na2\n"
	for i := range 3 {
		name := fmt.Sprintf("f%d", i)
		done := make(chan error, 1)
		go func() {
			for _, step := range steps(name) {
				if err := step(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: writing, closing and opening again still blocks after 20 s", name)
		}
		if got := readFile(t, filepath.Join(mnt, name)); got != want {
			t.Errorf("%s on the mount: %q, want %q", name, got, want)
		}
	}
	if err := syncDir(mnt); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got := readFile(t, filepath.Join(dir, fmt.Sprintf("f%d", i))); got != want {
			t.Errorf("f%d on the server: %q, want %q", i, got, want)
		}
	}
}

// TestAppendUnderLease: on a write-back mount of a server, a file opened
// for appending under the mount's write lease is loaded from the cache,
// without asking the server or waiting for its earlier stores (configure
// appends to config.log thousands of times), and the server ends with
// every append.
func TestAppendUnderLease(t *testing.T) {
	srv := servertest.Start(t, "")
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{WriteBack: true})
	p := filepath.Join(mnt, "config.log")
	writeFile(t, p, "start\n")
	want := "start\n"
	before := srv.Srv.Calls()
	getattrs := s.kernel.getattrs.Load()
	for i := range 20 {
		want += appendLine(t, p, i)
	}
	if n := servertest.CallsSince(srv.Srv, before, "stat", 0); n > 0 {
		t.Errorf("20 appends under the lease asked the server %d times for the file", n)
	}
	// The kernel keeps the attributes of what it wrote, which the store
	// kept back takes as they are: an open for appending need not ask
	// for them again.
	if n := s.kernel.getattrs.Load() - getattrs; n > 2 {
		t.Errorf("20 appends under the lease asked the mount %d times for the attributes", n)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != int64(len(want)) {
		t.Errorf("after the appends: %v, %v; want size %d", fi, err, len(want))
	}
	if err := syncDir(mnt); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(srv.Dir, "config.log")); got != want {
		t.Errorf("the server has %q, want %q", got, want)
	}
}

// TestAppendWhileHeldOpen: a file one program keeps open for writing while
// others append to it and close (configure's config.log) is stored at each
// close from its content then, which write-back takes from the last
// close's content and what was appended since; a write below the end and
// a truncate in between are stored as they are too.
func TestAppendWhileHeldOpen(t *testing.T) {
	srv := servertest.Start(t, "")
	mnt, _ := mountFS(t, srv.Client(t, "a"), Options{WriteBack: true})
	p := filepath.Join(mnt, "config.log")
	writeFile(t, p, "start\n")
	held, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "start\n"
	for i := range 30 {
		switch i {
		case 20:
			// A write below the end, through a descriptor of its own.
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("START"), 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			want = "START" + want[5:]
		case 10:
			if err := os.Truncate(p, int64(len(want)/2)); err != nil {
				t.Fatal(err)
			}
			want = want[:len(want)/2]
		}
		want += appendLine(t, p, i)
		if got := readFile(t, p); got != want {
			t.Fatalf("after append %d the mount reads %q, want %q", i, got, want)
		}
	}
	if _, err := held.WriteString("end\n"); err != nil {
		t.Fatal(err)
	}
	want += "end\n"
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(mnt); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(srv.Dir, "config.log")); got != want {
		t.Errorf("the server has %q, want %q", got, want)
	}
}

// appendLine opens p for appending, appends line i and closes it, as a
// shell's >> does, and returns the line.
func appendLine(t *testing.T, p string, i int) string {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("check %d\n", i)
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return line
}

// TestStoreBesideNameChange: a store of a file begun while an unlink or a
// rename of it is on its way (a descriptor's late release stores what
// another descriptor wrote) never brings the old name back, and a renamed
// file keeps what was stored. The exerciser found the first: a late store
// landed on the server after the unlink of its file.
func TestStoreBesideNameChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(mnt string) error
		want   string // The name the content ends under, if any.
	}{
		{"unlink", func(mnt string) error { return os.Remove(filepath.Join(mnt, "f")) }, ""},
		{"rename", func(mnt string) error { return os.Rename(filepath.Join(mnt, "f"), filepath.Join(mnt, "g")) }, "g"},
	} {
		for _, wb := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/writeback=%v", tc.name, wb), func(t *testing.T) {
				dir, tree := localTree(t)
				// The change is held up just before it is sent, and
				// the store begins meanwhile.
				var armed atomic.Bool
				changing := make(chan struct{})
				slow := func(string) {
					if armed.CompareAndSwap(true, false) {
						close(changing)
						time.Sleep(200 * time.Millisecond)
					}
				}
				mnt, s := mountFS(t, &slowPuts{FS: tree, delay: 300 * time.Millisecond}, Options{WriteBack: wb, beforeNameChange: slow})
				if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("old"), 0o644); err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteString("new content"); err != nil {
					t.Fatal(err)
				}
				c := s.root.GetChild("f")
				if c == nil || nodeOf(c).file() == nil {
					t.Fatal("the mount has no node for f")
				}
				fn := nodeOf(c).file()
				armed.Store(true)
				changed := make(chan error, 1)
				go func() { changed <- tc.change(mnt) }()
				<-changing
				if e := fn.flush(context.Background()); e != 0 {
					t.Fatalf("store: %v", e)
				}
				if err := <-changed; err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
				if err := syncDir(mnt); err != nil {
					t.Fatal(err)
				}
				for _, base := range []string{dir, mnt} {
					if _, err := os.Stat(filepath.Join(base, "f")); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s/f after the %s: %v, want none", base, tc.name, err)
					}
					if tc.want != "" {
						if got := readFile(t, filepath.Join(base, tc.want)); got != "new content" {
							t.Errorf("%s/%s: %q, want %q", base, tc.want, got, "new content")
						}
					}
				}
			})
		}
	}
}

// TestRemovedDirStaysRemoved: a directory made and removed under a write
// lease before its making reached the server (configure's conftest.dir,
// 120 ms away) stays removed once the making's answer arrives: it used to
// come back into its parent's listing, where every later `rm -rf
// conftest*` found it and waited for the server to refuse an rmdir.
func TestRemovedDirStaysRemoved(t *testing.T) {
	srv := servertest.Start(t, "")
	c := srv.ClientVia(t, "a", servertest.DelayProxy(t, srv.Addr, 100*time.Millisecond))
	mnt, s := mountFS(t, c, Options{TTL: time.Hour, WriteBack: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	if err := os.Mkdir(filepath.Join(mnt, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "src", "conftest.dir")
	for round := range 3 {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Long enough for the making to leave, not to be answered.
		time.Sleep(50 * time.Millisecond)
		if err := os.Remove(dir); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.cache.Drain(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("round %d: once stored, the removed directory is there: %v", round, err)
		}
		ents, err := os.ReadDir(filepath.Join(mnt, "src"))
		if err != nil || len(ents) != 0 {
			t.Errorf("round %d: src lists %v (%v), want nothing", round, ents, err)
		}
	}
}
