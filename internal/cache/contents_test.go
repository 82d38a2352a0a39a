package cache

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/store"
)

// chunkCache returns disk as a store.ChunkCache: nil (memory mode) if it
// is nil.
func chunkCache(disk *store.Cache) store.ChunkCache {
	if disk == nil {
		return nil
	}
	return disk
}

// sentBytes is a tree that counts the bytes of file data it sends, by
// path, through FindGet and Get.
type sentBytes struct {
	ferry.FS
	mu       sync.Mutex
	sent     map[string]int64
	findGets int
}

func (s *sentBytes) count(p string, n int) {
	s.mu.Lock()
	s.sent[p] += int64(n)
	s.mu.Unlock()
}

func (s *sentBytes) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	s.mu.Lock()
	s.findGets++
	s.mu.Unlock()
	in := s.FS.FindGet(ctx, p, pred)
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		defer in.Close()
		var cur string
		for e := range in.All() {
			if e.Dir != nil {
				cur = e.Dir.Path()
			} else if e.Err == nil {
				s.count(cur, len(e.Data))
			}
			if err := send(e); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

func (s *sentBytes) Get(ctx context.Context, p string, off, n int64) io.ReadCloser {
	return &countedReader{ReadCloser: s.FS.Get(ctx, p, off, n), s: s, p: p}
}

type countedReader struct {
	io.ReadCloser
	s *sentBytes
	p string
}

func (r *countedReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	r.s.count(r.p, n)
	return n, err
}

// testTree writes a tree of about size bytes in many directories, most
// files small, some up to treeFile and a few above it.
func testTree(t *testing.T, dir string, size int64, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var total int64
	for i := 0; total < size; i++ {
		// Names that sort differently as paths and as walks: "d1" and
		// "d1.x" beside each other, as "net" and "net.go" are.
		d := filepath.Join(fmt.Sprintf("d%d", i%7), fmt.Sprintf("e%d", i%5), fmt.Sprintf("f%d", i%11))
		switch {
		case i%13 == 0:
			d = fmt.Sprintf("d%d.x", i%7)
		case i%23 == 0:
			d = "."
		case i%3 == 0:
			d = filepath.Dir(filepath.Dir(d))
		}
		n := r.IntN(8 << 10)
		switch {
		case i%97 == 0:
			n = treeFile + r.IntN(treeFile)
		case i%17 == 0:
			n = SmallFile + r.IntN(treeFile-SmallFile)
		}
		// Files of a directory come before and after its
		// subdirectories, as go/src's Make.dist and make.bash do.
		name := filepath.Join(dir, d, fmt.Sprintf("%c%03d", "Az"[i%2], i))
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		for j := range b {
			b[j] = byte('a' + r.IntN(26))
		}
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		total += int64(n)
	}
}

// walkFiles returns the files of the tree in the order grep -r reads
// them, with their attributes.
func walkFiles(t *testing.T, fsys ferry.Finder) []ferry.Dir {
	t.Helper()
	var out []ferry.Dir
	st := fsys.Find(context.Background(), "/", "type=f")
	for e := range st.All() {
		if e.Dir != nil {
			out = append(out, e.Dir)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(out); i++ {
		if !walkLess(out[i-1].Path(), out[i].Path()) {
			t.Fatalf("the server's walk gives %s before %s, which walkLess orders the other way", out[i-1].Path(), out[i].Path())
		}
	}
	return out
}

// TestWalkSendsEachFileOnce reads every file of a tree many times the
// prefetch's memory budget in walk order, as grep -r does, taking what the
// prefetch brought and asking for the rest: no file's data may cross
// twice, every read must return the file, the memory held must stay
// within the budget, and a program that pauses and reads on must find the
// walk resumed where it stopped.
//
// In disk mode the budget is the disk's, and memory holds no file's data
// once read, and no more than its own budget of files not yet read; with
// a budget larger than the tree, a second walk sends nothing. With a
// disk that drops chunks the budget still counts as held (its own
// eviction, or a backlog it could not write), the files it lost are read
// again, correctly.
func TestWalkSendsEachFileOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
		pause  bool  // The program stops for longer than idleStop halfway.
		disk   int64 // In disk mode, the bytes the disk holds; 0 in memory mode.
		again  bool  // A second walk must send nothing.
	}{
		{"budget-4M", 4 << 20, false, 0, false},
		{"budget-16M", 16 << 20, false, 0, false},
		{"budget-4M-pause", 4 << 20, true, 0, false},
		{"disk-4M", 4 << 20, false, 64 << 20, false},
		{"disk-64M-again", 64 << 20, false, 128 << 20, true},
		{"disk-losing", 16 << 20, false, 2 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pause && testing.Short() {
				t.Skip("waits out idleStop; not run with -short")
			}
			dir := t.TempDir()
			testTree(t, dir, 24<<20, 7)
			tree, err := local.New(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer tree.Close()
			s := &sentBytes{FS: tree, sent: map[string]int64{}}
			var disk *store.Cache
			if tc.disk > 0 {
				disk, err = store.OpenCache(t.TempDir(), tc.disk)
				if err != nil {
					t.Fatal(err)
				}
				defer disk.Close()
			}
			c := newContents(s, testLog(t), tc.budget, chunkCache(disk), 1<<20)
			defer c.close()
			files := walkFiles(t, tree)
			var total int64
			readAll := func() {
				for i, d := range files {
					if tc.pause && i == len(files)/2 {
						time.Sleep(idleStop + time.Second)
					}
					readChecked(t, c, s, dir, d)
				}
			}
			for _, d := range files {
				total += d.Size()
			}
			readAll()
			if disk != nil {
				c.mu.Lock()
				var inMem int64
				for p, e := range c.ents {
					f := e.Value.(*content)
					if !f.onDisk || f.read && f.data != nil {
						t.Errorf("%s: held in memory after its read in disk mode", p)
					}
					if f.data != nil {
						inMem += f.size
					}
				}
				if inMem != c.inMem || inMem > c.memMax {
					t.Errorf("in disk mode memory holds %d bytes of files (counted %d), over %d", inMem, c.inMem, c.memMax)
				}
				c.mu.Unlock()
			}
			var sent int64
			var twice []string
			for _, d := range files {
				n := s.sent[d.Path()]
				sent += n
				if n > d.Size() {
					twice = append(twice, fmt.Sprintf("%s (%d of %d bytes)", d.Path(), n, d.Size()))
				}
			}
			st := c.report()
			t.Logf("%d files, %d bytes; sent %d bytes in %d FindGets; walks %d, directories %d, hits %d, peak %d",
				len(files), total, sent, s.findGets, st.walks, st.dirFetches, st.hits, st.peak)
			// A walk stopped by the pause had the file after the last
			// it took on its way (here exactly one; over a network what
			// the connection's window held): that one crosses again.
			allowed := 0
			if tc.pause {
				allowed = 1
			}
			losing := tc.disk > 0 && tc.disk < tc.budget
			if losing {
				// Each file lost is read again by a Get.
				allowed = int(st.lost)
			}
			if len(twice) > allowed {
				t.Errorf("%d files sent more than once: %s", len(twice), strings.Join(twice[:min(len(twice), 10)], ", "))
			}
			if st.peak > tc.budget {
				t.Errorf("held %d bytes at the peak, over the budget of %d", st.peak, tc.budget)
			}
			if st.hits < int64(len(files))*9/10 && !losing {
				t.Errorf("only %d of %d files came from the prefetch", st.hits, len(files))
			}
			if losing && st.lost == 0 {
				t.Errorf("a disk of 2 MiB lost no file of %d bytes", total)
			}
			if !tc.again {
				return
			}
			before := sent
			s.mu.Lock()
			clear(s.sent)
			s.mu.Unlock()
			readAll()
			var again int64
			for _, d := range files {
				if d.Size() <= treeFile {
					again += s.sent[d.Path()]
				}
			}
			if again > 0 {
				t.Errorf("a second walk sent %d bytes of files of 1 MiB or less (the first %d)", again, before)
			}
		})
	}
}

// readChecked reads the file d describes as the mount does, from c or
// else by a Get of s, and fails unless it reads what the file in dir
// holds.
func readChecked(t *testing.T, c *contents, s ferry.FS, dir string, d ferry.Dir) {
	t.Helper()
	data, ok := c.open(context.Background(), d)
	if !ok {
		r := s.Get(context.Background(), d.Path(), 0, -1)
		var err error
		data, err = io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(filepath.Join(dir, d.Path()))
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(want) {
		t.Fatalf("%s: read %d bytes unlike the file's %d", d.Path(), len(data), len(want))
	}
}

// TestWalkLess checks the walk order against the server's walk of a tree
// whose names sort differently as whole paths.
func TestWalkLess(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		less bool
	}{
		{"/a", "/b", true},
		{"/a/x", "/a.c", true}, // "/a.c" < "/a/x" as strings.
		{"/a", "/a/x", true},
		{"/a/x", "/a", false},
		{"/a", "/a", false},
		{"/", "/a", true},
		{"/a-b/c", "/a/c", false},
		{"", "/a", true},
	} {
		if got := walkLess(tc.a, tc.b); got != tc.less {
			t.Errorf("walkLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.less)
		}
	}
}

// TestWalkFrom checks that the predicate of a walk resumed at a file
// matches exactly the files the whole walk reaches from that file on.
func TestWalkFrom(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"a/x", "a/y/z", "a.c", "a-b/c", "b/[*]/q", "b/[*]/r", "b/c d/'e\"", "c"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	all := walkFiles(t, tree)
	for _, root := range []string{"/", "/b"} {
		for i, from := range all {
			if !ferry.HasPrefix(from.Path(), root) {
				continue
			}
			var want []string
			for _, d := range all[i:] {
				if ferry.HasPrefix(d.Path(), root) {
					want = append(want, d.Path())
				}
			}
			var got []string
			st := tree.Find(context.Background(), root, walkFrom(root, from.Path(), "type=f"))
			for e := range st.All() {
				got = append(got, e.Dir.Path())
			}
			if err := st.Err(); err != nil {
				t.Fatalf("from %s: %v", from.Path(), err)
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("walk of %s from %s: got %v, want %v", root, from.Path(), got, want)
			}
		}
	}
}

func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
