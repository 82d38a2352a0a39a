package fusefs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/testenv"
)

// needFUSE skips a test that needs to mount, unless CI=true, where a
// machine that cannot mount is a failure.
func needFUSE(t *testing.T) {
	t.Helper()
	reason := ""
	if os.Geteuid() != 0 {
		reason = "mounting needs root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		reason = "no /dev/fuse: " + err.Error()
	}
	testenv.Require(t, reason)
}

// counting is a tree that counts the calls made to it.
type counting struct {
	ferry.FS
	finds, stats, gets, puts, wstats, findgets atomic.Int64
	lastCount                                  atomic.Int64 // The count of the last Get.
}

func (c *counting) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	c.findgets.Add(1)
	return c.FS.FindGet(ctx, p, pred)
}

func (c *counting) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	c.finds.Add(1)
	return c.FS.Find(ctx, p, pred)
}

func (c *counting) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	c.stats.Add(1)
	return c.FS.Stat(ctx, p)
}

func (c *counting) Get(ctx context.Context, p string, off, n int64) io.ReadCloser {
	c.gets.Add(1)
	c.lastCount.Store(n)
	return c.FS.Get(ctx, p, off, n)
}

func (c *counting) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	c.puts.Add(1)
	return c.FS.Put(ctx, p, d, off, data)
}

func (c *counting) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	c.wstats.Add(1)
	return c.FS.Wstat(ctx, p, d)
}

func (c *counting) reset() {
	c.finds.Store(0)
	c.stats.Store(0)
	c.gets.Store(0)
	c.puts.Store(0)
	c.wstats.Store(0)
	c.findgets.Store(0)
}

func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// mountFS mounts fsys on a new temporary directory until the test ends.
func mountFS(t *testing.T, fsys ferry.FS, opt Options) (string, *Server) {
	t.Helper()
	needFUSE(t)
	mnt := t.TempDir()
	if opt.Log == nil {
		opt.Log = testLog(t)
	}
	if opt.TempDir == "" {
		opt.TempDir = t.TempDir()
	}
	s, err := Mount(mnt, fsys, opt)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return mnt, s
}

// localTree is a local tree over a new temporary directory, closed when
// the test ends.
func localTree(t *testing.T) (string, *local.Tree) {
	t.Helper()
	needFUSE(t)
	dir := t.TempDir()
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tree.Close() })
	return dir, tree
}

// heldStats is a tree that watches like the tree below it, so that a
// mount of it holds a lease, and whose Stat waits while hold is set,
// until released.
type heldStats struct {
	*counting
	w        ferry.Watcher
	hold     atomic.Bool
	released chan struct{}
}

func (h *heldStats) Watch(ctx context.Context, p string) *ferry.Stream[ferry.Event] {
	return h.w.Watch(ctx, p)
}

func (h *heldStats) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	if h.hold.Load() {
		select {
		case <-h.released:
		case <-ctx.Done():
			return ferry.Go(func() (ferry.Dir, error) { return nil, ctx.Err() })
		}
	}
	return h.counting.Stat(ctx, p)
}

// TestOverwrite: writing over a file (O_TRUNC) on a leased mount neither
// fetches its old content, nor waits for the server's answer about its
// attributes (the watch keeps them current), nor truncates it on the
// server before storing the new content: one put.
func TestOverwrite(t *testing.T) {
	dir, tree := localTree(t)
	c := &counting{FS: tree}
	h := &heldStats{counting: c, w: tree, released: make(chan struct{})}
	writeFile(t, filepath.Join(dir, "over.txt"), strings.Repeat("old content\n", 1000))
	mnt, _ := mountFS(t, h, Options{})
	if _, err := os.Stat(filepath.Join(mnt, "over.txt")); err != nil {
		t.Fatal(err)
	}
	h.hold.Store(true)
	release := sync.OnceFunc(func() { close(h.released) })
	t.Cleanup(release)
	gets, stores := c.gets.Load(), c.puts.Load()+c.wstats.Load()
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(filepath.Join(mnt, "over.txt"), []byte("new\n"), 0o644) }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("writing over a file waited for a Stat")
	}
	if got := readFile(t, filepath.Join(dir, "over.txt")); got != "new\n" {
		t.Errorf("after writing over it, server has %q", got)
	}
	if n := c.gets.Load() - gets; n != 0 {
		t.Errorf("writing over a file fetched it %d times, want 0", n)
	}
	if n := c.puts.Load() + c.wstats.Load() - stores; n != 1 {
		t.Errorf("writing over a file took %d puts and wstats, want 1", n)
	}
}

// mountLocal serves a new temporary directory through the adaptor over
// the local tree, counting calls.
func mountLocal(t *testing.T, opt Options) (dir, mnt string, c *counting, s *Server) {
	t.Helper()
	dir, tree := localTree(t)
	c = &counting{FS: tree}
	mnt, s = mountFS(t, c, opt)
	return dir, mnt, c, s
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got %v, want %v", what, err, want)
	}
}

func TestFiles(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	writeFile(t, filepath.Join(dir, "a.txt"), "alpha\n")

	// Read what is on the server.
	if got := readFile(t, filepath.Join(mnt, "a.txt")); got != "alpha\n" {
		t.Errorf("read a.txt = %q", got)
	}
	// Create: on the server when close returns.
	f, err := os.Create(filepath.Join(mnt, "b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("beta\n"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "b.txt")); err != nil || fi.Size() != 5 {
		t.Errorf("stat of a file being written: %v, %v", fi, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "b.txt")); got != "beta\n" {
		t.Errorf("after close, server has %q", got)
	}
	// Append and overwrite in place.
	f, err = os.OpenFile(filepath.Join(mnt, "a.txt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("more\n")
	f.Close()
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "alpha\nmore\n" {
		t.Errorf("after append, server has %q", got)
	}
	f, _ = os.OpenFile(filepath.Join(mnt, "a.txt"), os.O_RDWR, 0)
	f.WriteAt([]byte("ALP"), 0)
	b := make([]byte, 5)
	f.ReadAt(b, 0)
	if string(b) != "ALPha" {
		t.Errorf("read back through O_RDWR: %q", b)
	}
	f.Close()
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "ALPha\nmore\n" {
		t.Errorf("after write at 0, server has %q", got)
	}
	// Truncate, by path and by O_TRUNC.
	if err := os.Truncate(filepath.Join(mnt, "a.txt"), 3); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "ALP" {
		t.Errorf("after truncate, server has %q", got)
	}
	if err := os.WriteFile(filepath.Join(mnt, "a.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "" {
		t.Errorf("after O_TRUNC, server has %q", got)
	}

	// An empty new file exists after close.
	f, _ = os.Create(filepath.Join(mnt, "empty"))
	f.Close()
	if fi, err := os.Stat(filepath.Join(dir, "empty")); err != nil || fi.Size() != 0 {
		t.Errorf("empty file on server: %v %v", fi, err)
	}
	// fsync stores before close.
	f, _ = os.Create(filepath.Join(mnt, "synced"))
	f.WriteString("synced")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "synced")); got != "synced" {
		t.Errorf("after fsync, server has %q", got)
	}
	f.Close()
	// A change on the server is seen by the next open once the
	// metadata timeout has passed (no watch here).
	writeFile(t, filepath.Join(dir, "b.txt"), "beta changed\n")
	time.Sleep(1100 * time.Millisecond)
	if got := readFile(t, filepath.Join(mnt, "b.txt")); got != "beta changed\n" {
		t.Errorf("after a change on the server, read %q", got)
	}
}

func TestLargeFile(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	data := make([]byte, 20<<20+12345)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(mnt, "big"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "big"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("server copy differs (%d bytes, %v)", len(got), err)
	}
	// Read back through a fresh open, and at scattered offsets.
	got, err = os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through the mount differs (%d bytes, %v)", len(got), err)
	}
	f, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range []int64{15 << 20, 1 << 20, 20 << 20, 0, 7777777} {
		b := make([]byte, 100000)
		n, err := f.ReadAt(b, off)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if !bytes.Equal(b[:n], data[off:off+int64(n)]) {
			t.Errorf("ReadAt %d differs", off)
		}
	}
}

func TestNamespace(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	m := func(p string) string { return filepath.Join(mnt, p) }
	if err := os.Mkdir(m("d"), 0o750); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "d")); err != nil || fi.Mode().Perm() != 0o750 || !fi.IsDir() {
		t.Errorf("mkdir on server: %v %v", fi, err)
	}
	wantErrno(t, "mkdir of an existing dir", os.Mkdir(m("d"), 0o755), syscall.EEXIST)
	writeFile(t, m("d/f"), "f")
	wantErrno(t, "rmdir of a non-empty dir", os.Remove(m("d")), syscall.ENOTEMPTY)
	wantErrno(t, "mkdir below a file", os.Mkdir(m("d/f/x"), 0o755), syscall.ENOTDIR)
	_, err := os.Stat(m("nope"))
	wantErrno(t, "stat of a missing file", err, syscall.ENOENT)
	_, err = os.Stat(m(strings.Repeat("n", 256)))
	wantErrno(t, "a name too long", err, syscall.ENAMETOOLONG)

	// Symbolic links.
	if err := os.Symlink("d/f", m("link")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(m("link")); err != nil || got != "d/f" {
		t.Errorf("readlink = %q, %v", got, err)
	}
	if got, err := os.Readlink(filepath.Join(dir, "link")); err != nil || got != "d/f" {
		t.Errorf("readlink on the server = %q, %v", got, err)
	}
	if got := readFile(t, m("link")); got != "f" {
		t.Errorf("read through the link: %q", got)
	}
	wantErrno(t, "symlink over an existing name", os.Symlink("x", m("link")), syscall.EEXIST)

	// Hard links: TestHardLinks.
	wantErrno(t, "link over an existing name", os.Link(m("d/f"), m("link")), syscall.EEXIST)

	// Rename: a file, over a file, a directory with content.
	writeFile(t, m("g"), "g")
	if err := os.Rename(m("g"), m("d/f")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "d/f")); got != "g" {
		t.Errorf("after rename over, server has %q", got)
	}
	if _, err := os.Stat(m("g")); !os.IsNotExist(err) {
		t.Errorf("old name still there: %v", err)
	}
	if err := os.Rename(m("d"), m("e")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, m("e/f")); got != "g" {
		t.Errorf("read after renaming the directory: %q", got)
	}
	if _, err := os.Stat(m("d/f")); !os.IsNotExist(err) {
		t.Errorf("old directory still there: %v", err)
	}
	// A file created and renamed before it is closed.
	f, err := os.Create(m("tmp"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("early")
	if err := os.Rename(m("tmp"), m("e/final")); err != nil {
		t.Fatal(err)
	}
	f.WriteString(" and late")
	f.Close()
	if got := readFile(t, filepath.Join(dir, "e/final")); got != "early and late" {
		t.Errorf("renamed while open: server has %q", got)
	}

	// Readdir.
	ents, err := os.ReadDir(m("e"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), "f final"; got != want {
		t.Errorf("readdir = %q, want %q", got, want)
	}

	// Unlink and rmdir.
	if err := os.Remove(m("e/f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m("e/final")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m("e")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "e")); !os.IsNotExist(err) {
		t.Errorf("rmdir left the directory on the server: %v", err)
	}
	// A file created and removed before close never reaches the server.
	f, _ = os.Create(m("ghost"))
	os.Remove(m("ghost"))
	f.WriteString("boo")
	f.Close()
	if _, err := os.Stat(filepath.Join(dir, "ghost")); !os.IsNotExist(err) {
		t.Errorf("a removed file was stored: %v", err)
	}
}

func TestAttributes(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	writeFile(t, filepath.Join(dir, "f"), "content")
	p := filepath.Join(mnt, "f")
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	if err := os.Chtimes(p, mt, mt); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{p, filepath.Join(dir, "f")} {
		fi, err := os.Stat(q)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != 0o640 || st.Uid != 65534 || st.Gid != 65534 || !fi.ModTime().Equal(mt) {
			t.Errorf("%s: mode %v uid %d gid %d mtime %v", q, fi.Mode(), st.Uid, st.Gid, fi.ModTime())
		}
	}
	// A file created with a mode and times set before close (as tar does).
	f, err := os.OpenFile(filepath.Join(mnt, "g"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("g")
	f.Chmod(0o751)
	os.Chtimes(filepath.Join(mnt, "g"), mt, mt)
	f.Close()
	fi, err := os.Stat(filepath.Join(dir, "g"))
	if err != nil || fi.Mode().Perm() != 0o751 || !fi.ModTime().Equal(mt) {
		t.Errorf("created file on the server: %v %v", fi, err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil || st.Bsize == 0 || st.Bavail == 0 {
		t.Errorf("statfs: %+v %v", st, err)
	}
}

// TestPrefetch checks that a walk of a tree costs a few Finds, not a call
// per entry.
func TestPrefetch(t *testing.T) {
	dir, mnt, c, s := mountLocal(t, Options{})
	var want []string
	for i := 0; i < 20; i++ {
		for j := 0; j < 5; j++ {
			for k := 0; k < 3; k++ {
				p := filepath.Join("d"+string(rune('a'+i)), "e"+string(rune('a'+j)), "f"+string(rune('a'+k)))
				writeFile(t, filepath.Join(dir, p), p)
				want = append(want, p)
			}
		}
	}
	c.reset()
	var got []string
	err := filepath.Walk(mnt, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			rel, _ := filepath.Rel(mnt, p)
			got = append(got, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("walk found %d files, want %d", len(got), len(want))
	}
	finds, stats := c.finds.Load(), c.stats.Load()
	t.Logf("a walk of %d entries: %d finds, %d stats", len(want)+20*5+20, finds, stats)
	if finds > 2 || stats > 2 {
		t.Errorf("a walk of 20x5x3 files took %d finds and %d stats, want at most 2 of each", finds, stats)
	}
	_ = s
	// A missing name in a listed directory costs nothing.
	c.reset()
	for i := 0; i < 10; i++ {
		os.Stat(filepath.Join(mnt, "da", "missing"+string(rune('0'+i))))
	}
	if n := c.finds.Load() + c.stats.Load(); n != 0 {
		t.Errorf("negative lookups in a listed directory made %d calls", n)
	}
}

func TestSmallFiles(t *testing.T) {
	dir, mnt, c, s := mountLocal(t, Options{TTL: 50 * time.Millisecond})
	want := map[string]string{}
	for i := range 30 {
		name := fmt.Sprintf("f%02d.c", i)
		want[name] = strings.Repeat(name+" ", i*100)
		writeFile(t, filepath.Join(dir, "src", name), want[name])
	}
	big := strings.Repeat("big ", cache.SmallFile/2)
	writeFile(t, filepath.Join(dir, "src", "big"), big)
	readAll := func() {
		t.Helper()
		for name, w := range want {
			if got := readFile(t, filepath.Join(mnt, "src", name)); got != w {
				t.Errorf("%s: got %.20q... (%d bytes), want %.20q... (%d bytes)", name, got, len(got), w, len(w))
			}
		}
	}
	c.reset()
	if got := readFile(t, filepath.Join(mnt, "src", "f00.c")); got != want["f00.c"] {
		t.Fatalf("f00.c: got %q", got)
	}
	// The other files arrive with the first one's prefetch.
	held := func() int { _, _, n := s.cache.ContentCounts(); return n }
	if !waitFor(5*time.Second, func() bool { return held() >= 30 }) {
		t.Fatalf("prefetch brought %d files, want 30", held())
	}
	readAll()
	if got := readFile(t, filepath.Join(mnt, "src", "big")); got != big {
		t.Errorf("big: got %d bytes, want %d", len(got), len(big))
	}
	hits, fetches, _ := s.cache.ContentCounts()
	if fg, g := c.findgets.Load(), c.gets.Load(); fg != 1 || g > 2 || fetches != 1 || hits < 29 {
		t.Errorf("reading 30 small files and a big one: %d FindGets, %d Gets, %d prefetches, %d hits; want 1, at most 2, 1, at least 29", fg, g, fetches, hits)
	}

	// A file changed behind the mount's back is read anew once its
	// attributes are, even at the same size.
	want["f03.c"] = strings.ToUpper(want["f03.c"])
	writeFile(t, filepath.Join(dir, "src", "f03.c"), want["f03.c"])
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(dir, "src", "f03.c"), later, later)
	time.Sleep(100 * time.Millisecond)
	readAll()
	// So is one replaced here by a rename, whatever its attributes.
	os.Chtimes(filepath.Join(dir, "src", "f04.c"), later, later)
	time.Sleep(100 * time.Millisecond)
	readAll()
	writeFile(t, filepath.Join(mnt, "src", "new"), strings.ToUpper(want["f04.c"]))
	os.Chtimes(filepath.Join(mnt, "src", "new"), later, later)
	if err := os.Rename(filepath.Join(mnt, "src", "new"), filepath.Join(mnt, "src", "f04.c")); err != nil {
		t.Fatal(err)
	}
	want["f04.c"] = strings.ToUpper(want["f04.c"])
	readAll()
}

// watching is a tree with a Watch the test drives: each watch's events
// come from the channel the test sends on.
type watching struct {
	ferry.FS
	watches chan chan ferry.Event // A new channel per Watch call.
}

func (w *watching) Watch(ctx context.Context, p string) *ferry.Stream[ferry.Event] {
	ch := make(chan ferry.Event, 16)
	ch <- ferry.Event{Path: p, Lost: true}
	w.watches <- ch
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Event) error) error {
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					return ferry.E("fake.Watch", p, ferry.KindUnavailable, "watch ended")
				}
				if err := send(ev); err != nil {
					return err
				}
			case <-ctx.Done():
				return nil
			}
		}
	})
}

func TestWatch(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	c := &counting{FS: tree}
	w := &watching{FS: c, watches: make(chan chan ferry.Event, 4)}
	writeFile(t, filepath.Join(dir, "a"), "one")
	writeFile(t, filepath.Join(dir, "d/b"), "b")
	// Without events nothing would ever be refreshed.
	mnt, s := mountFS(t, w, Options{TTL: time.Hour, Cache: cache.Options{WatchBackoff: 10 * time.Millisecond}})
	events := <-w.watches
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("no lease after the watch's first event")
	}
	if got := readFile(t, filepath.Join(mnt, "a")); got != "one" {
		t.Fatalf("read a = %q", got)
	}
	// Warm: stats and opens cost no calls.
	c.reset()
	for i := 0; i < 5; i++ {
		os.Stat(filepath.Join(mnt, "d/b"))
		readFile(t, filepath.Join(mnt, "a"))
		os.Stat(filepath.Join(mnt, "nope"))
	}
	if n := c.finds.Load() + c.stats.Load(); n > 1 {
		t.Errorf("warm stats under a lease made %d metadata calls", n)
	}
	if n := c.gets.Load(); n > 0 {
		t.Errorf("warm reads under a lease made %d gets", n)
	}

	// A change behind the mount's back is seen once its event arrives.
	writeFile(t, filepath.Join(dir, "a"), "two!")
	writeFile(t, filepath.Join(dir, "d/new"), "new")
	if got := readFile(t, filepath.Join(mnt, "a")); got != "one" {
		t.Logf("before the event the mount already sees %q (allowed)", got)
	}
	events <- ferry.Event{Path: "/a"}
	events <- ferry.Event{Path: "/d/new"}
	if !waitFor(2*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(mnt, "a"))
		return string(b) == "two!"
	}) {
		b, _ := os.ReadFile(filepath.Join(mnt, "a"))
		t.Errorf("after the event, a = %q", b)
	}
	if !waitFor(2*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(mnt, "d/new"))
		return err == nil
	}) {
		t.Errorf("after the event, d/new is not there")
	}
	ents, _ := os.ReadDir(filepath.Join(mnt, "d"))
	if len(ents) != 2 {
		t.Errorf("readdir after a create event: %v", ents)
	}
	os.Remove(filepath.Join(dir, "d/new"))
	events <- ferry.Event{Path: "/d/new"}
	if !waitFor(2*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(mnt, "d/new"))
		return os.IsNotExist(err)
	}) {
		t.Errorf("after the remove event, d/new is still there")
	}

	// The stream ends: the lease is gone, and the watch comes back.
	close(events)
	select {
	case events = <-w.watches:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch was not re-established")
	}
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("no lease after the watch came back")
	}
	writeFile(t, filepath.Join(dir, "a"), "three")
	events <- ferry.Event{Path: "/", Lost: true}
	if !waitFor(2*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(mnt, "a"))
		return string(b) == "three"
	}) {
		t.Errorf("after a Lost event, a is stale")
	}
}

func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// TestTreeFetch checks that a program going through a tree (reading the
// files of a directory, then one in the directory beside it) gets the rest
// of the tree's files, big ones included, with one more request.
func TestTreeFetch(t *testing.T) {
	dir, mnt, c, s := mountLocal(t, Options{})
	want := map[string]string{}
	for i := range 6 {
		for j := range 4 {
			rel := fmt.Sprintf("t/d%d/f%d", i, j)
			want[rel] = strings.Repeat(rel+" ", 1+j*(cache.SmallFile/8))
			writeFile(t, filepath.Join(dir, rel), want[rel])
		}
	}
	c.reset()
	// d0's files, then d1's first: the second directory starts a walk
	// of t from there on. d0's files above cache.SmallFile are Gets of their
	// own.
	for _, rel := range []string{"t/d0/f0", "t/d0/f1", "t/d0/f2", "t/d0/f3", "t/d1/f0"} {
		if got := readFile(t, filepath.Join(mnt, rel)); got != want[rel] {
			t.Fatalf("%s: got %d bytes, want %d", rel, len(got), len(want[rel]))
		}
	}
	// Wait for the whole fetch: a file read before it arrives would be
	// taken from the stream, but this test counts what the walk brought.
	brought := len(want)
	for j := range 4 {
		if len(want[fmt.Sprintf("t/d0/f%d", j)]) > cache.SmallFile {
			brought--
		}
	}
	if !waitFor(5*time.Second, func() bool { _, _, n := s.cache.ContentCounts(); return n >= brought }) {
		_, _, n := s.cache.ContentCounts()
		t.Fatalf("the fetches brought %d files, want %d", n, brought)
	}
	gets := c.gets.Load()
	readAll(t, mnt, want)
	if g, fg := c.gets.Load()-gets, c.findgets.Load(); g != 0 || fg != 2 {
		t.Errorf("reading the tree after two directories: %d more Gets, %d FindGets in all; want 0 and 2", g, fg)
	}
}

// TestTreeFetchClimbs: a program going through one top directory after
// another (git status, grep -r) gets the whole tree above them after the
// second, rather than two fetches per top directory.
func TestTreeFetchClimbs(t *testing.T) {
	dir, mnt, c, s := mountLocal(t, Options{})
	want := map[string]string{}
	for i := range 5 {
		for j := range 3 {
			for k := range 2 {
				rel := fmt.Sprintf("r/d%d/e%d/f%d", i, j, k)
				want[rel] = strings.Repeat(rel+" ", 100+k)
				writeFile(t, filepath.Join(dir, rel), want[rel])
			}
		}
	}
	c.reset()
	held := func(n int) {
		t.Helper()
		if !waitFor(5*time.Second, func() bool { _, _, h := s.cache.ContentCounts(); return h >= n }) {
			_, _, h := s.cache.ContentCounts()
			t.Fatalf("fetches brought %d files, want at least %d", h, n)
		}
	}
	// d0/e0, then d0/e1 (d0's tree), then d1/e0, then d1/e1: a tree
	// beside d1 was fetched, so the fetch climbs to r.
	for i, rel := range []string{"r/d0/e0/f0", "r/d0/e1/f0", "r/d1/e0/f0", "r/d1/e1/f0"} {
		if got := readFile(t, filepath.Join(mnt, rel)); got != want[rel] {
			t.Fatalf("%s: got %d bytes, want %d", rel, len(got), len(want[rel]))
		}
		held([]int{2, 6, 8, 30}[i])
	}
	gets := c.gets.Load()
	readAll(t, mnt, want)
	if g, fg := c.gets.Load()-gets, c.findgets.Load(); g != 0 || fg != 4 {
		t.Errorf("reading the tree: %d more Gets, %d FindGets in all; want 0 and 4", g, fg)
	}
}

// TestReadBackWritten: a file this mount stored is read back without a
// Get (the linker reads the objects the compiler just wrote), with strict
// close-to-open and with write-back; a change on the server still shows.
func TestReadBackWritten(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback=%v", wb), func(t *testing.T) {
			dir, tree := localTree(t)
			c := &counting{FS: tree}
			h := &heldStats{counting: c, w: tree, released: make(chan struct{})}
			mnt, _ := mountFS(t, h, Options{WriteBack: wb})
			files := map[string]string{
				"obj/a.o": strings.Repeat("object a\n", 300),
				"obj/b.o": strings.Repeat("object b, larger\n", 12000),
			}
			if err := os.Mkdir(filepath.Join(mnt, "obj"), 0o755); err != nil {
				t.Fatal(err)
			}
			for name, content := range files {
				if err := os.WriteFile(filepath.Join(mnt, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := syncDir(mnt); err != nil {
				t.Fatal(err)
			}
			// Written under a temporary name and renamed into place,
			// as git and editors do.
			files["obj/c.o"] = "renamed into place\n"
			if err := os.WriteFile(filepath.Join(mnt, "obj/c.tmp"), []byte(files["obj/c.o"]), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(mnt, "obj/c.tmp"), filepath.Join(mnt, "obj/c.o")); err != nil {
				t.Fatal(err)
			}
			gets := c.gets.Load()
			for name, want := range files {
				if got := readFile(t, filepath.Join(mnt, name)); got != want {
					t.Errorf("%s read back: %d bytes, want %d", name, len(got), len(want))
				}
			}
			if n := c.gets.Load() - gets; n != 0 {
				t.Errorf("reading back files this mount wrote took %d Gets, want 0", n)
			}
			// Changed on the server, at the same size: the watch drops
			// what the mount kept.
			changed := strings.ToUpper(files["obj/a.o"])
			writeFile(t, filepath.Join(dir, "obj/a.o"), changed)
			if !waitFor(5*time.Second, func() bool { return readFile(t, filepath.Join(mnt, "obj/a.o")) == changed }) {
				t.Errorf("a change on the server is not read after 5 s: %.20q", readFile(t, filepath.Join(mnt, "obj/a.o")))
			}
		})
	}
}

// slowFetch is a tree whose FindGets start late, as over a long round
// trip.
type slowFetch struct {
	*counting
	delay time.Duration
}

func (s *slowFetch) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	time.Sleep(s.delay)
	return s.counting.FindGet(ctx, p, pred)
}

// TestAwaitFetch: a small file read while a fetch that brings it is on its
// way is taken from that fetch, not asked for on its own.
func TestAwaitFetch(t *testing.T) {
	dir, tree := localTree(t)
	c := &counting{FS: tree}
	want := map[string]string{}
	for i := range 10 {
		rel := fmt.Sprintf("src/f%d.c", i)
		want[rel] = strings.Repeat(rel+" ", 50+i)
		writeFile(t, filepath.Join(dir, rel), want[rel])
	}
	mnt, _ := mountFS(t, &slowFetch{counting: c, delay: 300 * time.Millisecond}, Options{})
	if _, err := os.ReadDir(filepath.Join(mnt, "src")); err != nil {
		t.Fatal(err)
	}
	gets := c.gets.Load()
	readAll(t, mnt, want)
	if g, fg := c.gets.Load()-gets, c.findgets.Load(); g != 0 || fg != 1 {
		t.Errorf("reading a directory's files while its fetch was on its way: %d Gets, %d FindGets; want 0 and 1", g, fg)
	}
}

// TestSmallReadCount: a small file read with a Get of its own (its
// directory's fetch too slow to wait for) asks for its size, so that a
// remote tree sends it on the call connection, not behind bulk data.
func TestSmallReadCount(t *testing.T) {
	want := "a small file\n"
	_, mnt, c := mountSlowFetch(t, want)
	gets := c.gets.Load()
	if got := readFile(t, filepath.Join(mnt, "s/small")); got != want {
		t.Fatalf("read %q, want %q", got, want)
	}
	if n, count := c.gets.Load()-gets, c.lastCount.Load(); n != 1 || count != int64(len(want)) {
		t.Errorf("%d Gets, the last for %d bytes; want 1 for %d", n, count, len(want))
	}
}

// TestSmallReadGrown: a file that grew on the server after it was opened
// here is read whole through that open, though its first Get asked for
// the size the open saw.
func TestSmallReadGrown(t *testing.T) {
	short := "a small file\n"
	dir, mnt, _ := mountSlowFetch(t, short)
	f, err := os.Open(filepath.Join(mnt, "s/small"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	long := strings.Repeat(short, 300)
	writeFile(t, filepath.Join(dir, "s/small"), long)
	if !waitFor(5*time.Second, func() bool {
		st, err := os.Stat(filepath.Join(mnt, "s/small"))
		return err == nil && st.Size() == int64(len(long))
	}) {
		t.Fatal("the mount does not see the file grow")
	}
	got, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != long {
		t.Errorf("read %d bytes through the earlier open (%q...), want %d", len(got), got[:min(len(got), 20)], len(long))
	}
}

// mountSlowFetch mounts a tree holding s/small with content, whose small
// file fetches are too slow to wait for, so that reads take Gets of their
// own.
func mountSlowFetch(t *testing.T, content string) (dir, mnt string, c *counting) {
	dir, tree := localTree(t)
	c = &counting{FS: tree}
	writeFile(t, filepath.Join(dir, "s/small"), content)
	mnt, _ = mountFS(t, &slowFetch{counting: c, delay: cache.AwaitMax + 500*time.Millisecond}, Options{})
	return dir, mnt, c
}

// readAll reads each file of want (by path below mnt) through the mount and
// checks its content.
func readAll(t *testing.T, mnt string, want map[string]string) {
	t.Helper()
	for rel, w := range want {
		if got := readFile(t, filepath.Join(mnt, rel)); got != w {
			t.Errorf("%s: got %d bytes, want %d", rel, len(got), len(w))
		}
	}
}

// TestOwnerShown: with Uid and Gid set (ferry mount -o uid=,gid=), every
// file shows that owner and group whatever the server's; without, the
// server's.
func TestOwnerShown(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "f"), 1234, 1235); err != nil {
		testenv.Require(t, "chown needs root: "+err.Error())
	}
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := uint32(4321), uint32(4322)
	for _, tc := range []struct {
		name     string
		opt      Options
		uid, gid uint32
	}{
		{"server's", Options{}, 1234, 1235},
		{"the mount's", Options{Uid: &uid, Gid: &gid}, uid, gid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, _ := mountFS(t, tree, tc.opt)
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(mnt, "f"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != tc.uid || st.Gid != tc.gid {
				t.Errorf("f shows %d:%d, want %d:%d", st.Uid, st.Gid, tc.uid, tc.gid)
			}
		})
	}
}
