package fusefs

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestWritesOpenNothing: on a write-back mount with a lease and
// Options.KernelOpens the kernel opens and creates files by itself
// (kernelFS) and reports only their closes, and what is written with no
// handle reaches the server as a
// local disk would have it: a shorter file written over a longer one
// (O_TRUNC comes as a truncation, not with an open), an append, a
// truncate(2), a file created, written and renamed, one created and
// removed, each exactly once a sync written to the control file (with no
// handle either) returns.
func TestWritesOpenNothing(t *testing.T) {
	srv := servertest.Start(t, "")
	for name, data := range map[string]string{"d/long": "a longer first content\n", "d/log": "one\n", "d/cut": "0123456789"} {
		writeFile(t, filepath.Join(srv.Dir, name), data)
	}
	mnt, s := kernelOpensMount(t, srv, "d/long")
	opens, creates, flushes := s.kernel.opens.Load(), s.kernel.creates.Load(), s.kernel.flushes.Load()

	at := func(name string) string { return filepath.Join(mnt, filepath.FromSlash(name)) }
	if err := os.WriteFile(at("d/long"), []byte("short\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(at("d/log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"two\n", "three\n"} {
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(at("d/cut"), 4); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(at("d/new.tmp"), []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(at("d/new.tmp"), at("d/new")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(at("d/gone"), []byte("never stored\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(at("d/gone")); err != nil {
		t.Fatal(err)
	}
	// Read back through the mount at once, before anything is stored.
	want := map[string]string{"d/long": "short\n", "d/log": "one\ntwo\nthree\n", "d/cut": "0123", "d/new": "new\n"}
	for name, data := range want {
		if got := readFile(t, at(name)); got != data {
			t.Errorf("%s through the mount: %q, want %q", name, got, data)
		}
	}
	if err := os.WriteFile(at("Ctl"), []byte("sync\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(srv.Dir, filepath.FromSlash(name)))
		if err != nil || string(got) != data {
			t.Errorf("%s on the server after sync: %q, %v; want %q", name, got, err, data)
		}
	}
	for _, name := range []string{"d/new.tmp", "d/gone"} {
		if _, err := os.Stat(filepath.Join(srv.Dir, filepath.FromSlash(name))); !os.IsNotExist(err) {
			t.Errorf("%s on the server: %v, want none", name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(srv.Dir, "d", "new")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("d/new on the server: %v, %v; want mode 0600", fi, err)
	}
	for _, c := range []struct {
		what       string
		now, since int64
	}{
		{"OPEN", s.kernel.opens.Load(), opens},
		{"CREATE", s.kernel.creates.Load(), creates},
	} {
		// The first CREATE is the one the kernel is told it need not
		// send.
		if n := c.now - c.since; n > 1 {
			t.Errorf("%d %s requests after the first open, want at most one", n, c.what)
		}
	}
	// Each close is heard, with no handle: four writers' and four
	// readers' at least.
	if n := s.kernel.flushes.Load() - flushes; n < 8 {
		t.Errorf("%d FLUSH requests after the first open, want one a close", n)
	}
}

// TestTruncateThroughHandle: the kernel is told it need not open files
// only while no descriptor has a handle: once told, it sends no FLUSH and
// no RELEASE for one it got before, and what that descriptor did would
// never be stored. A descriptor created with a handle, truncated through
// it (ftruncate(2) comes with the handle) and closed is stored before
// another client's read, and so is each later one, opened by the kernel
// itself.
func TestTruncateThroughHandle(t *testing.T) {
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "other"), "other\n")
	mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	reader := srv.Client(t, "b")
	for i := range 10 {
		name := fmt.Sprintf("f%d", i)
		// Created before the kernel opens files by itself: a handle.
		f, err := os.OpenFile(filepath.Join(mnt, name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// An open while a handle is out is heard.
			readFile(t, filepath.Join(mnt, "other"))
			if s.kernel.noOpen.Load() {
				t.Fatal("the kernel was told it need not open files while a handle was out")
			}
		}
		size := int64(1000 + i)
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// With none out (the RELEASE comes after close
			// returns), an open tells the kernel it need open
			// and close nothing more.
			if !waitFor(5*time.Second, func() bool {
				readFile(t, filepath.Join(mnt, "other"))
				return s.kernel.noOpen.Load()
			}) {
				t.Fatal("the kernel was not told it need not open files")
			}
		}
		d, err := reader.Stat(t.Context(), "/"+name).Wait()
		if err != nil || d.Size() != size {
			t.Errorf("%s read by another client right after the close: %v, %v; want size %d", name, d, err, size)
		}
	}
}

// TestOwnBuffersBounded: appends to many files with no other change
// between them, on a mount where the kernel opens files by itself, keep
// at most about ownMax buffers of their own (a temporary file each), not
// one per file until a second after the last write.
func TestOwnBuffersBounded(t *testing.T) {
	srv := servertest.Start(t, "")
	const files = 3 * ownMax
	for i := range files {
		writeFile(t, filepath.Join(srv.Dir, "d", fmt.Sprintf("f%d", i)), "first\n")
	}
	mnt, s := kernelOpensMount(t, srv, "d/f0")
	own := func() int {
		s.unclosed.mu.Lock()
		defer s.unclosed.mu.Unlock()
		return len(s.unclosed.own)
	}
	most := 0
	for i := range files {
		f, err := os.OpenFile(filepath.Join(mnt, "d", fmt.Sprintf("f%d", i)), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("more\n"); err != nil {
			t.Fatal(err)
		}
		f.Close()
		most = max(most, own())
	}
	// A trim runs in the background; the last one may still be under way.
	if !waitFor(unclosedIdle/2, func() bool { return own() <= ownMax }) {
		t.Errorf("%d files keep buffers of their own half a second after %d appends, want at most %d", own(), files, ownMax)
	}
	if most > 2*ownMax {
		t.Errorf("up to %d files kept buffers of their own during %d appends, want about %d at most", most, files, ownMax)
	}
	if err := os.WriteFile(filepath.Join(mnt, "Ctl"), []byte("sync\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if got, err := os.ReadFile(filepath.Join(srv.Dir, "d", fmt.Sprintf("f%d", i))); err != nil || string(got) != "first\nmore\n" {
			t.Fatalf("f%d on the server: %q, %v", i, got, err)
		}
	}
}

// seenThrough is counting with the tree below it found through it, as a
// layer is: the cache takes its watch from the client below.
type seenThrough struct{ *counting }

func (s seenThrough) Unwrap() ferry.FS { return s.FS }

// TestReadBackAfterStore: with the kernel opening files by itself, a file
// written here is read back, once stored and its buffer dropped, from what
// the cache keeps of the store, not from the server: a handle the file
// had for reads while the buffer was there (an assembler reads back what
// it writes) used to go on reading from the server, a round trip per
// read (make -j2 took twice as long).
func TestReadBackAfterStore(t *testing.T) {
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "other"), "other\n")
	c := &counting{FS: srv.Client(t, "a")}
	mnt, s := mountFS(t, seenThrough{c}, Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	if !waitFor(5*time.Second, func() bool {
		readFile(t, filepath.Join(mnt, "other"))
		return s.kernel.noOpen.Load()
	}) {
		t.Fatal("the kernel was not told it need not open files")
	}
	f, err := os.OpenFile(filepath.Join(mnt, "out.o"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	readBack := func(want string) {
		t.Helper()
		// The kernel's copy of the page goes, so the read reaches the
		// mount.
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 64)
		k, err := f.ReadAt(b, 0)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if got := string(b[:k]); got != want {
			t.Fatalf("read back %q, want %q", got, want)
		}
	}
	if _, err := f.WriteString("first part\n"); err != nil {
		t.Fatal(err)
	}
	readBack("first part\n")
	// A change of another kind stores the file and drops its buffer.
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool {
		s.unclosed.mu.Lock()
		defer s.unclosed.mu.Unlock()
		return len(s.unclosed.own) == 0
	}) {
		t.Fatal("the file's buffer was not dropped")
	}
	c.reset()
	readBack("first part\n")
	if _, err := f.WriteString("second\n"); err != nil {
		t.Fatal(err)
	}
	readBack("first part\nsecond\n")
	if err := os.Mkdir(filepath.Join(mnt, "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	readBack("first part\nsecond\n")
	if n := c.gets.Load(); n != 0 {
		t.Errorf("reading back what was written fetched from the server %d times", n)
	}
}

// TestAppendsKeepTheirBuffer: a file appended to between changes of
// other files (configure's config.log between its conftest files) keeps
// its own buffer, rather than being loaded into a new one at each
// append; another client's change of it drops that buffer, and the next
// append goes after the other client's content.
func TestAppendsKeepTheirBuffer(t *testing.T) {
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "d", "config.log"), "start\n")
	mnt, s := kernelOpensMount(t, srv, "d/config.log")
	log := filepath.Join(mnt, "d", "config.log")
	appendTo := func(line string) {
		t.Helper()
		f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	made := s.ownMade.Load()
	want := "start\n"
	const rounds = 10
	for i := range rounds {
		line := fmt.Sprintf("checking %d\n", i)
		appendTo(line)
		want += line
		conftest := filepath.Join(mnt, "d", "conftest.c")
		writeFile(t, conftest, "int main(void){return 0;}\n")
		if err := os.Remove(conftest); err != nil {
			t.Fatal(err)
		}
	}
	// The log's buffer, conftest.c's first and any the idle timer let go.
	if n := s.ownMade.Load() - made; n > rounds/2 {
		t.Errorf("%d own buffers made for %d appends to one file and %d files made", n, rounds, rounds)
	}
	syncCtl(t, mnt)
	if got := readFile(t, filepath.Join(srv.Dir, "d", "config.log")); got != want {
		t.Errorf("the server has %q, want %q", got, want)
	}

	// Another client writes it (a direct change on the server's disk,
	// made while this mount writes there, passes for an echo of its own).
	other := srv.Client(t, "b")
	if _, err := other.Put(context.Background(), "/d/config.log", ferry.Dir{}, ferry.Whole, strings.NewReader("replaced on the server\n")).Wait(); err != nil {
		t.Fatal(err)
	}
	// Its Put returned once this mount let go of what it held of the
	// file: an open now sees it (close-to-open).
	if got := readFile(t, log); got != "replaced on the server\n" {
		t.Fatalf("the mount reads %q after another client's close", got)
	}
	appendTo("after\n")
	syncCtl(t, mnt)
	if got, want := readFile(t, filepath.Join(srv.Dir, "d", "config.log")), "replaced on the server\nafter\n"; got != want {
		t.Errorf("after an append to the server's change, the server has %q, want %q", got, want)
	}
}

// syncCtl writes sync to the control file of the mount at mnt, which
// returns once what the mount holds back is on the server.
func syncCtl(t *testing.T, mnt string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(mnt, "Ctl"), []byte("sync\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRecallLeavesOpenFile: on a mount where the kernel opens files, a
// file rewritten under the mount's write lease and not yet closed is not
// stored when another client's read recalls the lease: that client reads
// what the last close left, not the file cut short by O_TRUNC or half
// written, and the new content once the writer closes.
func TestRecallLeavesOpenFile(t *testing.T) {
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "d", "x"), "the old content\n")
	mnt, s := kernelOpensMount(t, srv, "d/x")
	reader := srv.Client(t, "b")
	read := func() string {
		r := reader.Get(t.Context(), "/d/x", 0, -1)
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for round := range 3 {
		before := read()
		// A file written and closed in d takes the write lease there
		// (the read recalled it).
		if err := os.WriteFile(filepath.Join(mnt, "d", "other"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !s.cache.WriteLeased("/d/x") {
			t.Fatalf("round %d: no write lease over d", round)
		}
		f, err := os.OpenFile(filepath.Join(mnt, "d", "x"), os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		now := fmt.Sprintf("round %d: the first half,", round)
		if _, err := f.WriteString(now); err != nil {
			t.Fatal(err)
		}
		if got := read(); got != before {
			t.Errorf("round %d: read %q while the file was open for writing, want %q as its last close left it", round, got, before)
		}
		now += " the second half\n"
		if _, err := f.WriteString(" the second half\n"); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got := read(); got != now {
			t.Errorf("round %d: read %q after the close, want %q", round, got, now)
		}
	}
}

// kernelOpensMount mounts srv for client "a", write-back with a watch and
// Options.KernelOpens, and reads first, the file the kernel is told at
// its open that it need not open files.
func kernelOpensMount(t *testing.T, srv *servertest.Server, first string) (string, *Server) {
	t.Helper()
	c := srv.Client(t, "a")
	mnt, s := mountFS(t, c, Options{TTL: time.Hour, WriteBack: true, KernelOpens: true, Control: stackCtl(ctl.New("client", c, c))})
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	readFile(t, filepath.Join(mnt, filepath.FromSlash(first)))
	if !s.kernel.noOpen.Load() {
		t.Fatal("the kernel was not told it need not open files")
	}
	return mnt, s
}
