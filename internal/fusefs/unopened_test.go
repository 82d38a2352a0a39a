package fusefs

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/servertest"
	"golang.org/x/sys/unix"
)

// TestReadOnlyOpensNothing: on a read-only mount with a lease the kernel
// opens and closes files by itself (kernelFS): reading every file again
// sends no OPEN, what is read is the server's content, small files and a
// large one read by a stream alike, a change another client makes is read
// right after its call returns, and the control file still shows the
// mount's state.
func TestReadOnlyOpensNothing(t *testing.T) {
	srv := servertest.Start(t, "")
	big := make([]byte, 3<<20)
	rand.Read(big)
	files := map[string][]byte{"d/a": []byte("a\n"), "d/b": []byte("bb\n"), "d/big": big}
	for name, data := range files {
		writeFile(t, filepath.Join(srv.Dir, name), string(data))
	}
	c := srv.Client(t, "a")
	mnt, s := mountFS(t, c, Options{TTL: time.Hour, ReadOnly: true, Control: stackCtl(ctl.New("client", c, c))})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	readAll := func() {
		t.Helper()
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(mnt, name))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s through the mount: %d bytes, %v; want the server's %d", name, len(got), err, len(want))
			}
		}
	}
	readAll()
	if !s.kernel.noOpen.Load() {
		t.Fatal("the kernel was not told it need not open files")
	}
	opens := s.kernel.opens.Load()
	readAll()
	if n := s.kernel.opens.Load() - opens; n != 0 {
		t.Errorf("reading the files again sent %d OPEN requests, want none", n)
	}

	// Another client's change is read as soon as its call returned: the
	// server broke this mount's lease first, and the mount dropped the
	// kernel's pages and its own handle before acknowledging.
	// A descriptor kept open across the changes keeps the file's node,
	// and so its own handle, which must not answer with what it held.
	held, err := os.Open(filepath.Join(mnt, "d", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	other := srv.Client(t, "b")
	for i, data := range []string{"changed\n", "changed again, longer\n"} {
		if _, err := other.Put(context.Background(), "/d/a", ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait(); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(mnt, "d", "a")); err != nil || string(got) != data {
			t.Errorf("change %d read right after it: %q, %v; want %q", i, got, err, data)
		}
		buf := make([]byte, 64)
		n, err := held.ReadAt(buf, 0)
		if got := string(buf[:n]); got != data {
			t.Errorf("change %d read through the descriptor held open: %q, %v; want %q", i, got, err, data)
		}
	}

	for range 2 {
		text := readFile(t, filepath.Join(mnt, "Ctl"))
		if !strings.Contains(text, "[mount]\n") || !strings.Contains(text, "[cache]\n") {
			t.Errorf("the control file on a mount that opens nothing:\n%s", text)
		}
	}
}

// TestSeekHoleData: SEEK_DATA and SEEK_HOLE find the whole file data, as
// the tree keeps no holes, and the kernel answers them itself after the
// first (kernelFS.Lseek).
func TestSeekHoleData(t *testing.T) {
	srv := servertest.Start(t, "")
	if err := os.WriteFile(filepath.Join(srv.Dir, "f"), make([]byte, 100_000), 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{})
	f, err := os.Open(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 3 {
		for _, c := range []struct {
			off    int64
			whence int
			want   int64
			err    error
		}{
			{0, unix.SEEK_DATA, 0, nil},
			{0, unix.SEEK_HOLE, 100_000, nil},
			{5000, unix.SEEK_DATA, 5000, nil},
			{100_000, unix.SEEK_DATA, 0, unix.ENXIO},
		} {
			got, err := unix.Seek(int(f.Fd()), c.off, c.whence)
			if err != c.err || err == nil && got != c.want {
				t.Errorf("pass %d: seek %d whence %d: %d, %v; want %d, %v", i, c.off, c.whence, got, err, c.want, c.err)
			}
		}
	}
	if n := s.kernel.lseeks.Load(); n > 1 {
		t.Errorf("%d LSEEK requests, want at most the first", n)
	}
}

// TestRereadAsksNothing: once the kernel opens files by itself, a second
// pass over a directory's files (list, stat, read: grep -r) asks the
// mount for no attributes, not once per file whose access time the first
// pass's reads made stale: the files read are stated again in the
// background (readFiles).
func TestRereadAsksNothing(t *testing.T) {
	srv := servertest.Start(t, "")
	const files = 40
	for i := range files {
		writeFile(t, filepath.Join(srv.Dir, fmt.Sprintf("f%02d", i)), fmt.Sprintf("file %d\n", i))
	}
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	pass := func() {
		t.Helper()
		ents, err := os.ReadDir(mnt)
		if err != nil || len(ents) != files {
			t.Fatalf("listing: %d entries, %v; want %d", len(ents), err, files)
		}
		for _, e := range ents {
			p := filepath.Join(mnt, e.Name())
			if _, err := os.Stat(p); err != nil {
				t.Fatal(err)
			}
			if _, err := os.ReadFile(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	pass()
	if !s.kernel.noOpen.Load() {
		t.Fatal("the kernel was not told it need not open files")
	}
	// Files given to the kernel with the listing (push) are not read.
	read := s.kernel.reads.Load()
	if read == 0 {
		t.Fatal("the first pass read no file with a READ")
	}
	// The root is stated again too: the kernel read its listing.
	if !waitFor(5*time.Second, func() bool { return s.restated.Load() >= read+1 }) {
		t.Fatalf("%d of the %d files read, and the root, were stated again", s.restated.Load(), read)
	}
	getattrs := s.kernel.getattrs.Load()
	pass()
	if n := s.kernel.getattrs.Load() - getattrs; n != 0 {
		t.Errorf("the second pass asked for attributes %d times for %d files read in the first", n, files)
	}
}
