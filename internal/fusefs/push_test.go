package fusefs

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// pushMount mounts a new server's tree with the kernel opening files by
// itself, and has it told so (a first file read); each of before, if
// any, first makes files in the tree, whose events the mount then never
// gets.
func pushMount(t *testing.T, before ...func(*servertest.Server)) (*servertest.Server, string, *Server) {
	t.Helper()
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "a", "f"), "a file\n")
	for _, f := range before {
		f(srv)
	}
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	readFile(t, filepath.Join(mnt, "a", "f"))
	if !s.kernel.noOpen.Load() {
		t.Fatal("the kernel was not told it need not open files")
	}
	return srv, mnt, s
}

// makeFiles makes n small files in dir on the server, and returns their
// contents by name.
func makeFiles(t *testing.T, srv *servertest.Server, dir string, n int) map[string]string {
	t.Helper()
	want := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("f%02d", i)
		want[name] = fmt.Sprintf("file %d of %s\n", i, dir)
		writeFile(t, filepath.Join(srv.Dir, dir, name), want[name])
	}
	return want
}

// hold has the cache hold the content of the file dir/name.
func hold(t *testing.T, s *Server, dir, name string) {
	t.Helper()
	ctx := context.Background()
	// Looked up each time: the server's events for the file's making may
	// still be coming.
	if !waitFor(5*time.Second, func() bool {
		d, err := s.cache.Lookup(ctx, dir, name)
		if err != nil {
			return false
		}
		_, ok := s.cache.Contents(ctx, d)
		return ok
	}) {
		t.Fatalf("the cache does not hold %s", path.Join(dir, name))
	}
}

// readAsksNothing reads the files of want in dir through the mount and
// checks that it took no READ.
func readAsksNothing(t *testing.T, s *Server, mnt, dir string, want map[string]string) {
	t.Helper()
	reads := s.kernel.reads.Load()
	for name, w := range want {
		if got := readFile(t, filepath.Join(mnt, dir, name)); got != w {
			t.Errorf("%s/%s: %q, want %q", dir, name, got, w)
		}
	}
	if n := s.kernel.reads.Load() - reads; n != 0 {
		t.Errorf("reading the files given asked the mount %d times", n)
	}
}

// TestListingGivesContents: once the kernel opens files by itself, a
// listing read to its end gives the kernel the content the cache holds
// of the files in it (push), so reading them asks the mount nothing; a
// change on the server drops what was given, and a file written here is
// never given the server's older content over the kernel's pages.
func TestListingGivesContents(t *testing.T) {
	srv, mnt, s := pushMount(t)
	const files = 30
	want := makeFiles(t, srv, "b", files)
	for name := range want {
		hold(t, s, "/b", name)
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "b"))
	if err != nil || len(ents) != files {
		t.Fatalf("listing b: %d entries, %v; want %d", len(ents), err, files)
	}
	for name := range want {
		if in := s.inode("/b/" + name); in == nil || !nodeOf(in).file().pages.held.Load() {
			t.Errorf("b/%s not given with the listing", name)
		}
	}
	readAsksNothing(t, s, mnt, "b", want)

	// A change on the server drops the pages given.
	writeFile(t, filepath.Join(srv.Dir, "b", "f00"), "changed on the server\n")
	if !waitFor(5*time.Second, func() bool { return readFile(t, filepath.Join(mnt, "b", "f00")) == "changed on the server\n" }) {
		t.Errorf("b/f00 still reads %q after a change on the server", readFile(t, filepath.Join(mnt, "b", "f00")))
	}

	// A file the kernel never read, written here: the next listing must
	// not give the kernel the server's content over what was written.
	writeFile(t, filepath.Join(srv.Dir, "b", "new"), "the server's\n")
	if !waitFor(5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(mnt, "b", "new"))
		return err == nil
	}) {
		t.Fatal("b/new does not show on the mount")
	}
	hold(t, s, "/b", "new")
	// Written over in place, its size unchanged: the kernel would take
	// pages given of the server's content for whole.
	f, err := os.OpenFile(filepath.Join(mnt, "b", "new"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("THIS MOUNT'S\n"), 0); err != nil {
		t.Fatal(err)
	}
	s.inode("/b").NotifyContent(0, 0) // The kernel lists b anew.
	if _, err := os.ReadDir(filepath.Join(mnt, "b")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mnt, "b", "new")); got != "THIS MOUNT'S\n" {
		t.Errorf("b/new reads %q after a write here", got)
	}
}

// TestArrivalsGiven: a file whose content arrives after the kernel
// listed its directory is given to the kernel as it arrives, so reading
// it asks the mount nothing.
func TestArrivalsGiven(t *testing.T) {
	srv, mnt, s := pushMount(t)
	// Made after the mount's first walks, and listed before anything of
	// them is read: nothing of them is held to give with the listing.
	const files = 20
	want := makeFiles(t, srv, "c", files)
	if !waitFor(5*time.Second, func() bool {
		ds, err := s.cache.List(context.Background(), "/c")
		return err == nil && len(ds) == files
	}) {
		t.Fatal("c's files do not show in the cache")
	}
	pushed := s.pushed.Load()
	ents, err := os.ReadDir(filepath.Join(mnt, "c"))
	if err != nil || len(ents) != files {
		t.Fatalf("listing c: %d entries, %v; want %d", len(ents), err, files)
	}
	if n := s.pushed.Load() - pushed; n != 0 {
		t.Fatalf("%d files given with c's listing before any was read", n)
	}
	for name := range want {
		hold(t, s, "/c", name)
	}
	if !waitFor(5*time.Second, func() bool { return s.pushed.Load()-pushed >= files }) {
		t.Fatalf("%d files given as they arrived, want %d", s.pushed.Load()-pushed, files)
	}
	readAsksNothing(t, s, mnt, "c", want)
}

// TestListingRestated: a directory whose listing the kernel read from
// the mount is stated again in the background (restatQueued), so a
// second walk's stat of it asks the mount nothing.
func TestListingRestated(t *testing.T) {
	const dirs = 10
	// Made before the mount: an event of a file's making would drop its
	// directory's attributes again.
	_, mnt, s := pushMount(t, func(srv *servertest.Server) {
		for i := range dirs {
			makeFiles(t, srv, fmt.Sprintf("c/d%d", i), 2)
		}
	})
	restated := s.restated.Load()
	if ents, err := os.ReadDir(filepath.Join(mnt, "c")); err != nil || len(ents) != dirs {
		t.Fatalf("listing c: %d entries, %v; want %d", len(ents), err, dirs)
	}
	for i := range dirs {
		if ents, err := os.ReadDir(filepath.Join(mnt, "c", fmt.Sprintf("d%d", i))); err != nil || len(ents) != 2 {
			t.Fatalf("listing c/d%d: %d entries, %v", i, len(ents), err)
		}
	}
	if !waitFor(5*time.Second, func() bool { return s.restated.Load()-restated >= dirs+1 }) {
		t.Fatalf("%d of the %d directories listed were stated again", s.restated.Load()-restated, dirs+1)
	}
	getattrs := s.kernel.getattrs.Load()
	for i := range dirs {
		if _, err := os.Stat(filepath.Join(mnt, "c", fmt.Sprintf("d%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.kernel.getattrs.Load() - getattrs; n != 0 {
		t.Errorf("stating the %d directories listed asked the mount %d times", dirs, n)
	}
}
