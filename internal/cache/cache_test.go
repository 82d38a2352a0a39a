package cache_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/store"
)

// stacks are the stacks the product builds with the cache on top: over a
// directory (as a library user might), and over the remote client of a
// server over the chunk store (the mount's), each write-through and
// write-behind, with the contents' memory large and tiny, with the
// client's chunk cache on disk (the mount's whole files), and in disk
// mode, the contents held in that chunk cache too (the mount's default).
var stacks = []struct {
	name   string
	remote bool
	disk   bool // A chunk cache on disk.
	// contents puts the cache in disk mode, on the chunk cache, with
	// a budget of this many bytes.
	contents int64
	opt      cache.Options
}{
	{"local", false, false, 0, cache.Options{}},
	{"local-writebehind", false, false, 0, cache.Options{WriteBehind: true}},
	{"local-disk-contents", false, true, 1 << 20, cache.Options{WriteBehind: true}},
	{"remote", true, false, 0, cache.Options{}},
	{"remote-writebehind", true, false, 0, cache.Options{WriteBehind: true}},
	{"remote-small-memory", true, false, 0, cache.Options{Memory: 64 << 10, MetaEntries: 64}},
	{"remote-disk-writebehind", true, true, 0, cache.Options{WriteBehind: true}},
	{"remote-disk-contents", true, true, 16 << 20, cache.Options{}},
	{"remote-disk-contents-writebehind", true, true, 64 << 10, cache.Options{WriteBehind: true}},
}

// below returns the tree a stack's cache goes over, and its directory.
func below(t *testing.T, served bool) (ferry.FS, string) {
	fsys, dir, _ := belowWith(t, served, false)
	return fsys, dir
}

// belowWith is below, with disk giving the remote client a chunk cache in
// a directory, which it returns (nil without).
func belowWith(t *testing.T, served, disk bool) (ferry.FS, string, store.ChunkCache) {
	var chunks *store.Cache
	if disk {
		var err error
		chunks, err = store.OpenCache(t.TempDir(), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
	}
	if served {
		s := servertest.StartChunked(t, "")
		if !disk {
			return s.Client(t, "tester"), s.Dir, nil
		}
		return s.ClientVia(t, "tester", s.Addr, func(c *remote.Config) {
			c.Cache, c.CloseCache = chunks, true
		}), s.Dir, chunks
	}
	dir := t.TempDir()
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tree.Close() })
	if chunks == nil {
		return tree, dir, nil
	}
	t.Cleanup(func() { chunks.Close() })
	return tree, dir, chunks
}

// open returns a cache over fsys that holds its lease, closed when the
// test ends.
func open(t *testing.T, fsys ferry.FS, opt cache.Options) *cache.FS {
	c := cache.New(fsys, opt)
	ctx, cancel := context.WithCancel(context.Background())
	w := c.Watch(ctx, "/")
	go func() {
		for ev := range w.All() {
			if ev.Ack != nil {
				ev.Ack()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Close()
		c.Close()
	})
	select {
	case <-c.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the cache's watch did not come")
	}
	return c
}

// TestSuite runs the shared tree suite through the cache on every stack:
// what the cache answers from memory, and what it does in the background,
// must look like the tree below.
func TestSuite(t *testing.T) {
	for _, st := range stacks {
		t.Run(st.name, func(t *testing.T) {
			fstest.Run(t, func(t *testing.T) (ferry.FS, string) {
				fsys, dir, chunks := belowWith(t, st.remote, st.disk)
				opt := st.opt
				if st.contents > 0 {
					opt.Disk, opt.DiskBytes = chunks, st.contents
				}
				return syncing{open(t, fsys, opt)}, dir
			})
		})
	}
}

// syncing waits for the cache's changes in the background before each
// read, as a program's fsync would: the suite checks the disk below
// behind the cache's back.
type syncing struct{ *cache.FS }

func (s syncing) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	f := s.FS.Put(ctx, p, d, off, data)
	return ferry.Go(func() (ferry.Dir, error) {
		got, err := f.Wait()
		if err == nil {
			err = s.FS.Sync(ctx, p)
		}
		return got, err
	})
}

func (s syncing) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	f := s.FS.Remove(ctx, p)
	return ferry.Go(func() (struct{}, error) {
		_, err := f.Wait()
		if err == nil {
			err = s.FS.Sync(ctx, p)
		}
		return struct{}{}, err
	})
}

// TestWatchPassesUp: changes made below the cache, behind its back, reach
// a watcher of the cache.
func TestWatchPassesUp(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := "local"
		if remote {
			name = "remote"
		}
		t.Run(name, func(t *testing.T) {
			fstest.RunWatch(t, func(t *testing.T) (ferry.Watcher, ferry.FS, string) {
				fsys, dir := below(t, remote)
				c := cache.New(fsys, cache.Options{})
				t.Cleanup(func() { c.Close() })
				return c, fsys, dir
			})
		})
	}
}

// TestChangeThroughOtherClient: a change made through a second client of
// the server is seen through the first client's cache as soon as the
// second client's call returns (the callback break the cache passes up
// and acknowledges), for entries and for contents held.
func TestChangeThroughOtherClient(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := open(t, s.Client(t, "a"), cache.Options{})
	other := s.Client(t, "b")
	read := func() string {
		t.Helper()
		r := c.Get(ctx, "/f", 0, -1)
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, want := range []string{"two", "three!", "4"} {
		if _, err := c.Stat(ctx, "/f").Wait(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx, "/"); err != nil {
			t.Fatal(err)
		}
		d, _ := c.Stat(ctx, "/f").Wait()
		c.Contents(ctx, d)
		if _, err := other.Put(ctx, "/f", ferry.Dir{}, ferry.Whole, stringsReader(want)).Wait(); err != nil {
			t.Fatal(err)
		}
		d, err := c.Stat(ctx, "/f").Wait()
		if err != nil {
			t.Fatal(err)
		}
		if d.Size() != int64(len(want)) {
			t.Errorf("round %d: the cache says %d bytes after the other client's put of %d", i, d.Size(), len(want))
		}
		if got := read(); got != want {
			t.Errorf("round %d: read %q through the cache, want %q", i, got, want)
		}
		if _, err := other.Put(ctx, "/new"+want, ferry.Dir{}, ferry.Whole, stringsReader(want)).Wait(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Lookup(ctx, "/", "new"+want); err != nil {
			t.Errorf("round %d: a file the other client made is not found through the cache: %v", i, err)
		}
	}
}

func stringsReader(s string) io.Reader { return &onceReader{s: s} }

// onceReader is a reader that cannot be read again, as a program's pipe.
type onceReader struct{ s string }

func (r *onceReader) Read(b []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(b, r.s)
	r.s = r.s[n:]
	return n, nil
}

// TestPutSendsOnlyChanges: a whole-file put through the cache reaches the
// client below as the data it was given (readable at offsets), so a
// chunked put sends only the chunks the server lacks: a one-byte edit of
// a 2 MiB file, written through and behind, sends a small part of it.
func TestPutSendsOnlyChanges(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("writebehind=%v", wb), func(t *testing.T) {
			s := servertest.StartChunked(t, "")
			ctx := context.Background()
			addr, n := servertest.CountProxy(t, s.Addr)
			c := open(t, s.ClientVia(t, "a", addr), cache.Options{WriteBehind: wb})
			data := make([]byte, 2<<20)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			put := func() {
				t.Helper()
				if _, err := c.Put(ctx, "/f", ferry.Dir{}, ferry.Whole, io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data)))).Wait(); err != nil {
					t.Fatal(err)
				}
				if err := c.Sync(ctx, "/"); err != nil {
					t.Fatal(err)
				}
			}
			put()
			data[len(data)/2] ^= 0xff
			before := n.Up.Load()
			put()
			sent := n.Up.Load() - before
			if got, err := os.ReadFile(filepath.Join(s.Dir, "f")); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the server's file differs from what was put (%v)", err)
			}
			if sent > int64(len(data))/8 {
				t.Errorf("a one-byte edit of a %d-byte file sent %d bytes up", len(data), sent)
			}
			t.Logf("a one-byte edit sent %d bytes up", sent)
		})
	}
}

// gets counts the Gets that reach the tree below.
type gets struct {
	ferry.FS
	n atomic.Int64
}

func (g *gets) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	g.n.Add(1)
	return g.FS.Get(ctx, p, off, count)
}

// TestKeptAcrossBackgroundChanges: a file written through the cache and
// renamed into place, then given new times, all in the background, is read
// back from the cache once those changes are stored, not fetched again
// (git writes its index so, and reads it at once).
func TestKeptAcrossBackgroundChanges(t *testing.T) {
	for _, disk := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "disk"}[disk], func(t *testing.T) {
			testKeptAcrossBackgroundChanges(t, disk)
		})
	}
}

func testKeptAcrossBackgroundChanges(t *testing.T, disk bool) {
	fsys, _, chunks := belowWith(t, false, disk)
	g := &gets{FS: fsys}
	opt := cache.Options{WriteBehind: true}
	if disk {
		opt.Disk = chunks
	}
	c := open(t, g, opt)
	ctx := context.Background()
	data := strings.Repeat("index entry\n", 1000)
	if _, err := c.List(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/index.lock", ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Move(ctx, "/index.lock", "/index").Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wstat(ctx, "/index", ferry.Dir{ferry.AttrMode: "0600"}).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(ctx, c, "/index")
	if err != nil || got != data {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(data))
	}
	if n := g.n.Load(); n != 0 {
		t.Errorf("reading back what was written took %d Gets of the tree below, want 0", n)
	}
}

// TestRemoveOfAGoneName: a removal the tree refuses because the name is
// not there makes the cache forget the name, so the next look asks the
// tree instead of finding it here again (a stale name, in a listing held
// until it changes, used to cost every later rm -rf a refused call).
func TestRemoveOfAGoneName(t *testing.T) {
	dir := t.TempDir()
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	// No watch: what the cache holds stays for the TTL.
	c := cache.New(tree, cache.Options{TTL: time.Hour})
	defer c.Close()
	ctx := context.Background()
	if err := os.Mkdir(filepath.Join(dir, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "/x").Wait(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove(ctx, "/x").Wait(); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Fatalf("removing the gone name: %v, want not found", err)
	}
	if d, err := c.Stat(ctx, "/x").Wait(); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Errorf("after the refused removal the cache still shows the name: %v, %v", d, err)
	}
}

// TestKeptGoesToDiskUnderPressure: in disk mode, what the cache keeps of
// the files written through it stays in memory until memory must make
// room, and only then goes to the disk: a file stored again and again
// (configure's config.log) is not cut, hashed and written at each store.
// Everything kept is read back with no Get of the tree below.
func TestKeptGoesToDiskUnderPressure(t *testing.T) {
	fsys, _, chunks := belowWith(t, false, true)
	g := &gets{FS: fsys}
	const memory = 64 << 10
	c := open(t, g, cache.Options{WriteBehind: true, Disk: chunks, Memory: memory})
	ctx := context.Background()
	if _, err := c.List(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	content := func(name string, n int) string {
		return strings.Repeat(fmt.Sprintf("%s line %d\n", name, n), 2000)[:16<<10]
	}
	onDisk := func(data string) bool {
		b := []byte(data)
		for len(b) > 0 {
			n := chunk.Default.Cut(b)
			if !chunks.HasMany([]chunk.Hash{chunk.Sum(b[:n])})[0] {
				return false
			}
			b = b[n:]
		}
		return true
	}
	put := func(name, data string) {
		t.Helper()
		if _, err := c.Put(ctx, name, ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	// A log rewritten ten times, well within the memory budget.
	for i := range 10 {
		put("/log", content("log", i))
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if onDisk(content("log", i)) {
			t.Errorf("version %d of a file kept in memory went to the disk", i)
		}
	}
	// Then more than memory holds: the oldest go to the disk.
	const files = 12
	for i := range files {
		put(fmt.Sprintf("/f%d", i), content("f", i))
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if !onDisk(content("log", 9)) || !onDisk(content("f", 0)) {
		t.Errorf("the oldest files kept are not on the disk once memory was full")
	}
	want := map[string]string{"/log": content("log", 9)}
	for i := range files {
		want[fmt.Sprintf("/f%d", i)] = content("f", i)
	}
	for p, data := range want {
		if got, err := readAll(ctx, c, p); err != nil || got != data {
			t.Errorf("%s read back: %d bytes (%v), want %d", p, len(got), err, len(data))
		}
	}
	if n := g.n.Load(); n != 0 {
		t.Errorf("reading back what was written took %d Gets of the tree below, want 0", n)
	}
}

// changes counts the Puts that reach the tree below, and holds its Moves
// while gate is open.
type changes struct {
	ferry.FS
	puts atomic.Int64
	gate chan struct{}
}

func (c *changes) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	if c.gate != nil {
		<-c.gate
	}
	return c.FS.Move(ctx, from, to)
}

func (c *changes) Put(ctx context.Context, p string, d ferry.Dir, off int64, r io.Reader) *ferry.Future[ferry.Dir] {
	c.puts.Add(1)
	return c.FS.Put(ctx, p, d, off, r)
}

// TestHide: Hide renames a file to a hidden name at once, in the
// background under write-behind; a file written and hidden, then
// removed, before its store started never reaches the tree below. MoveHiding keeps the file it
// replaces under a hidden name, and one that fails puts it back.
func TestHide(t *testing.T) {
	fsys, dir, _ := belowWith(t, false, false)
	// The Moves below wait until MoveHiding has returned.
	below := &changes{FS: fsys, gate: make(chan struct{})}
	c := open(t, below, cache.Options{WriteBehind: true})
	ctx := context.Background()
	for name, data := range map[string]string{"d/old": "old\n", "d/new": "new\n"} {
		if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Stat(ctx, "/"+name).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	onDisk := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return "(" + err.Error() + ")"
		}
		return string(b)
	}

	// A file written (in the background, its directory listed) and
	// hidden before its store starts.
	if _, err := c.List(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/tmp", ferry.Dir{}, ferry.Whole, strings.NewReader("never stored\n")).Wait(); err != nil {
		t.Fatal(err)
	}
	hidden, err := c.Hide(ctx, "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if !cache.Hidden(path.Base(hidden)) || path.Dir(hidden) != "/" {
		t.Errorf("hidden as %q", hidden)
	}
	if _, err := c.Stat(ctx, "/tmp").Wait(); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Errorf("the hidden file's name: %v", err)
	}
	if _, err := c.Remove(ctx, hidden).Wait(); err != nil {
		t.Fatal(err)
	}

	// A rename over d/old keeps d/old hidden, and waits for no Move
	// below: they are held until it has returned.
	var kept string
	done := make(chan error, 1)
	go func() {
		var err error
		kept, _, err = c.MoveHiding(ctx, "/d/new", "/d/old")
		done <- err
	}()
	select {
	case err := <-done:
		close(below.gate)
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(below.gate)
		t.Fatalf("MoveHiding waited for the Moves below: %v", <-done)
	}
	// One that fails (no d/new any more) puts the file it hid back.
	if h, _, err := c.MoveHiding(ctx, "/d/new", "/d/old"); !ferry.IsKind(err, ferry.KindNotExist) || h != "" {
		t.Errorf("a rename of a missing file over d/old: %q, %v", h, err)
	}
	if err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := onDisk("d/old"); got != "new\n" {
		t.Errorf("d/old below: %q, want the renamed file", got)
	}
	if got := onDisk(kept); got != "old\n" {
		t.Errorf("the hidden file below: %q, want the replaced file", got)
	}
	if got := onDisk("tmp"); !strings.HasPrefix(got, "(") {
		t.Errorf("tmp below: %q", got)
	}
	if got := onDisk(hidden); !strings.HasPrefix(got, "(") {
		t.Errorf("the file hidden and removed is below: %q", got)
	}
	if n := below.puts.Load(); n != 0 {
		t.Errorf("%d Puts reached the tree below, want none", n)
	}
}
