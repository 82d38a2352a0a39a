package cache_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/store"
)

// TestLargeFileReadAgainAsksNothing: a large file read once by chunks is
// read again, whole or from any offset, from the chunk cache with no call
// to the server while the lease vouches for it (the kernel drops pages of
// large files and reads them again); a change on the server, or a chunk
// the cache lost, is read from the server.
func TestLargeFileReadAgainAsksNothing(t *testing.T) {
	k := newKept(t, 3<<20)
	if !bytes.Equal(k.read(0, -1), k.want) {
		t.Fatal("the first read differs from the file")
	}
	before := k.s.Srv.Calls()
	k.check("read again")
	k.askedNothing(before, "reading again")

	// A chunk the cache lost: the bytes from it on come from the server.
	k.chunks.lose()
	before = k.s.Srv.Calls()
	k.check("with a chunk lost")
	if n := servertest.CallsSince(k.s.Srv, before, "get", 1); n == 0 {
		t.Error("with a chunk lost, nothing was read from the server")
	}

	// Changed on the server: read anew.
	d := k.write(k.content(2<<20+17), func(d ferry.Dir) bool { return d.Size() == 2<<20+17 })
	k.check("after a change on the server")

	// Changed again, at the same size, its mtime set back: the ctime
	// tells the versions apart.
	k.write(k.content(len(k.want)), func(e ferry.Dir) bool {
		return e[ferry.AttrCtime] != d[ferry.AttrCtime] && e[ferry.AttrMtime] == d[ferry.AttrMtime]
	}, d.Mtime())
	k.check("after a change with the mtime set back")
}

// TestScatteredReadsFetchWhole: a large file read past its start a
// second time is fetched whole by chunks, once, and every read after, at
// any offset, asks the server nothing: no ranged Get, whose stream would
// carry bytes past the read that the next read at another offset throws
// away. A file read once, at its end (tail), is not fetched whole.
func TestScatteredReadsFetchWhole(t *testing.T) {
	k := newKept(t, 3<<20)
	calls := func(what string, before map[string]int64, want map[string]int64) {
		t.Helper()
		for op, w := range want {
			if n := servertest.CallsSince(k.s.Srv, before, op, w); n != w {
				t.Errorf("%s asked the server %d %s calls, want %d", what, n, op, w)
			}
		}
	}
	before := k.s.Srv.Calls()
	size := int64(len(k.want))
	if got := k.read(size-100, -1); !bytes.Equal(got, k.want[size-100:]) {
		t.Fatalf("the last 100 bytes: got %d bytes, not the file's", len(got))
	}
	calls("reading the end", before, map[string]int64{"get": 1, "chunklist": 0})

	before = k.s.Srv.Calls()
	k.check("read at scattered offsets")
	calls("the scattered reads", before, map[string]int64{"get": 0, "chunklist": 1})
	before = k.s.Srv.Calls()
	k.check("read again")
	k.askedNothing(before, "reading again")
}

// TestWholeFetchHoldsNoReadBack: a read that would wait longer than a
// second for its file's whole fetch (a slow link, here a long round
// trip) is a ranged Get instead, and the fetch goes on for the reads
// after it.
func TestWholeFetchHoldsNoReadBack(t *testing.T) {
	k := newKept(t, 3<<20, 400*time.Millisecond)
	before := k.s.Srv.Calls()
	size := int64(len(k.want))
	for _, off := range []int64{size / 2, size / 3} {
		if got := k.read(off, 1000); !bytes.Equal(got, k.want[off:off+1000]) {
			t.Fatalf("1000 bytes at %d: got %d bytes, not the file's", off, len(got))
		}
	}
	if n := servertest.CallsSince(k.s.Srv, before, "get", 2); n != 2 {
		t.Errorf("the reads past the start asked for %d ranged Gets, want 2 (the second not waiting for the whole fetch)", n)
	}
	// The fetch ends: its chunk list is kept, and reads ask nothing.
	deadline := time.Now().Add(10 * time.Second)
	for {
		before = k.s.Srv.Calls()
		k.read(size/4, 1000)
		if servertest.CallsSince(k.s.Srv, before, "get", 0) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the whole fetch did not end")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before = k.s.Srv.Calls()
	k.check("after the whole fetch")
	k.askedNothing(before, "reading after the whole fetch")
}

// kept is a large file on a server, read through a cache (keptSetup).
type kept struct {
	t       *testing.T
	s       *servertest.Server
	c       *cache.FS
	chunks  *losingCache
	content func(n int) []byte
	want    []byte
}

// newKept makes the file /big of size random bytes on a new server and
// waits until the cache sees it.
func newKept(t *testing.T, size int, oneWay ...time.Duration) *kept {
	k := &kept{t: t}
	k.s, k.c, k.chunks, k.content = keptSetup(t, oneWay...)
	k.write(k.content(size), func(d ferry.Dir) bool { return d.Size() == int64(size) })
	return k
}

// write writes data to /big on the server, with mtime if given, and
// returns its entry once the cache sees it as ok says, under the lease.
func (k *kept) write(data []byte, ok func(ferry.Dir) bool, mtime ...time.Time) ferry.Dir {
	t := k.t
	t.Helper()
	k.want = data
	name := filepath.Join(k.s.Dir, "big")
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range mtime {
		if err := os.Chtimes(name, time.Time{}, m); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := k.c.Stat(ctx, "/big").Wait()
		if err == nil && ok(d) {
			time.Sleep(2 * keptTTL)
			d, _ = k.c.Stat(ctx, "/big").Wait()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache does not see the change of /big: %v, %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// read reads count bytes of /big from off (to the end if count < 0)
// through the cache.
func (k *kept) read(off, count int64) []byte {
	k.t.Helper()
	r := k.c.Get(context.Background(), "/big", off, count)
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		k.t.Fatalf("reading /big at %d: %v", off, err)
	}
	return b
}

// check reads /big at scattered offsets, whole last, and compares.
func (k *kept) check(round string) {
	k.t.Helper()
	size := int64(len(k.want))
	for _, r := range []struct{ off, count int64 }{{1 << 20, 100_000}, {size - 1, 10}, {2<<20 + 5, -1}, {size, -1}, {5, 1 << 20}, {0, -1}} {
		end := size
		if r.count >= 0 {
			end = min(end, r.off+r.count)
		}
		if got := k.read(r.off, r.count); !bytes.Equal(got, k.want[min(r.off, end):end]) {
			k.t.Errorf("%s: %d bytes at %d: got %d bytes, not the file's", round, r.count, r.off, len(got))
		}
	}
}

// askedNothing checks that the server was asked nothing about /big's
// content since before.
func (k *kept) askedNothing(before map[string]int64, what string) {
	k.t.Helper()
	for _, op := range []string{"get", "chunklist", "readchunks", "stat"} {
		if n := servertest.CallsSince(k.s.Srv, before, op, 0); n != 0 {
			k.t.Errorf("%s asked the server %d %s calls", what, n, op)
		}
	}
}

// keptSetup serves a new directory to a client with a chunk cache (which
// can lose chunks) under a cache with a short TTL: an entry fetched while
// the file's own event was on its way is trusted only for it, and fetched
// again under the lease. content makes n random bytes.
func keptSetup(t *testing.T, oneWay ...time.Duration) (s *servertest.Server, c *cache.FS, chunks *losingCache, content func(n int) []byte) {
	disk, err := store.OpenCache(t.TempDir(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	chunks = &losingCache{ChunkCache: disk, lost: map[chunk.Hash]bool{}}
	s = servertest.StartChunked(t, "")
	addr := s.Addr
	for _, d := range oneWay {
		addr = servertest.DelayProxy(t, s.Addr, d)
	}
	cl := s.ClientVia(t, "tester", addr, func(c *remote.Config) { c.Cache, c.CloseCache = chunks, true })
	c = open(t, cl, cache.Options{TTL: keptTTL})
	rnd := rand.New(rand.NewPCG(1, 2))
	content = func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}
	return s, c, chunks, content
}

// keptTTL is the cache's TTL in keptSetup.
const keptTTL = 50 * time.Millisecond

// losingCache is a chunk cache that can lose a chunk it holds.
type losingCache struct {
	store.ChunkCache
	mu    sync.Mutex
	added []chunk.Hash
	lost  map[chunk.Hash]bool
}

// lose has the cache lose the middle one of the chunks added to it.
func (l *losingCache) lose() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost[l.added[len(l.added)/2]] = true
}

func (l *losingCache) isLost(h chunk.Hash) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost[h]
}

func (l *losingCache) Add(h chunk.Hash, data []byte) {
	l.mu.Lock()
	l.added = append(l.added, h)
	l.mu.Unlock()
	l.ChunkCache.Add(h, data)
}

func (l *losingCache) AddFixed(h chunk.Hash, data []byte) {
	l.mu.Lock()
	l.added = append(l.added, h)
	l.mu.Unlock()
	l.ChunkCache.AddFixed(h, data)
}

func (l *losingCache) HasMany(hs []chunk.Hash) []bool {
	has := l.ChunkCache.HasMany(hs)
	for i, h := range hs {
		has[i] = has[i] && !l.isLost(h)
	}
	return has
}

func (l *losingCache) GetMany(ctx context.Context, hs []chunk.Hash) func() ([]byte, bool) {
	next := l.ChunkCache.GetMany(ctx, hs)
	i := 0
	return func() ([]byte, bool) {
		if i < len(hs) && l.isLost(hs[i]) {
			return nil, false
		}
		i++
		return next()
	}
}
