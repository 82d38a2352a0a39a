package fusefs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// TestListingGivesContents: once the kernel opens files by itself, a
// listing read to its end gives the kernel the content the cache holds
// of the files in it (push), so reading them asks the mount nothing; a
// change on the server drops what was given, and a file written here is
// never given the server's older content over the kernel's pages.
func TestListingGivesContents(t *testing.T) {
	srv := servertest.Start(t, "")
	const files = 30
	want := map[string]string{}
	for i := range files {
		name := fmt.Sprintf("f%02d", i)
		want[name] = fmt.Sprintf("file %d of b\n", i)
		writeFile(t, filepath.Join(srv.Dir, "b", name), want[name])
	}
	writeFile(t, filepath.Join(srv.Dir, "a", "f"), "a file\n")
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	readFile(t, filepath.Join(mnt, "a", "f"))
	if !s.kernel.noOpen.Load() {
		t.Fatal("the kernel was not told it need not open files")
	}
	ctx := context.Background()
	hold := func(name string) {
		t.Helper()
		d, err := s.cache.Lookup(ctx, "/b", name)
		if err != nil {
			t.Fatal(err)
		}
		if !waitFor(5*time.Second, func() bool { _, ok := s.cache.Contents(ctx, d); return ok }) {
			t.Fatalf("the cache does not hold b/%s", name)
		}
	}
	for name := range want {
		hold(name)
	}

	ents, err := os.ReadDir(filepath.Join(mnt, "b"))
	if err != nil || len(ents) != files {
		t.Fatalf("listing b: %d entries, %v; want %d", len(ents), err, files)
	}
	if n := s.pushed.Load(); n != files {
		t.Errorf("%d files given with the listing, want %d", n, files)
	}
	reads := s.kernel.reads.Load()
	for name, w := range want {
		if got := readFile(t, filepath.Join(mnt, "b", name)); got != w {
			t.Errorf("b/%s: %q, want %q", name, got, w)
		}
	}
	if n := s.kernel.reads.Load() - reads; n != 0 {
		t.Errorf("reading the files given asked the mount %d times", n)
	}

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
	hold("new")
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
	pushed := s.pushed.Load()
	if _, err := os.ReadDir(filepath.Join(mnt, "b")); err != nil {
		t.Fatal(err)
	}
	if n := s.pushed.Load() - pushed; n != 0 {
		t.Errorf("%d files given with a listing, want none (b/new has writes here)", n)
	}
	if got := readFile(t, filepath.Join(mnt, "b", "new")); got != "THIS MOUNT'S\n" {
		t.Errorf("b/new reads %q after a write here", got)
	}
}
