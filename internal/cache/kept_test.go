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
	ctx := context.Background()
	disk, err := store.OpenCache(t.TempDir(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	chunks := &losingCache{ChunkCache: disk, lost: map[chunk.Hash]bool{}}
	s := servertest.StartChunked(t, "")
	cl := s.ClientVia(t, "tester", s.Addr, func(c *remote.Config) { c.Cache, c.CloseCache = chunks, true })
	// A short TTL: an entry fetched while the file's own event was on its
	// way is trusted only for it, and fetched again under the lease.
	const ttl = 50 * time.Millisecond
	c := open(t, cl, cache.Options{TTL: ttl})
	rnd := rand.New(rand.NewPCG(1, 2))
	content := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}
	want := content(3 << 20)
	if err := os.WriteFile(filepath.Join(s.Dir, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(off, count int64) []byte {
		t.Helper()
		r := c.Get(ctx, "/big", off, count)
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatalf("reading /big at %d: %v", off, err)
		}
		return b
	}
	// stat waits until the cache sees the file as ok says, under the
	// lease, and returns its entry.
	stat := func(ok func(ferry.Dir) bool) ferry.Dir {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			d, err := c.Stat(ctx, "/big").Wait()
			if err == nil && ok(d) {
				time.Sleep(2 * ttl)
				d, _ = c.Stat(ctx, "/big").Wait()
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cache does not see the change of /big: %v, %v", d, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	sized := func(n int) func(ferry.Dir) bool { return func(d ferry.Dir) bool { return d.Size() == int64(n) } }
	stat(sized(len(want)))
	if !bytes.Equal(read(0, -1), want) {
		t.Fatal("the first read differs from the file")
	}
	reads := []struct{ off, count int64 }{{0, -1}, {1 << 20, 100_000}, {2<<20 + 5, -1}, {int64(len(want)) - 1, 10}, {int64(len(want)), -1}}
	check := func(round string) {
		t.Helper()
		for _, r := range reads {
			end := int64(len(want))
			if r.count >= 0 {
				end = min(end, r.off+r.count)
			}
			if got := read(r.off, r.count); !bytes.Equal(got, want[r.off:end]) {
				t.Errorf("%s: %d bytes at %d: got %d bytes, not the file's", round, r.count, r.off, len(got))
			}
		}
	}
	before := s.Srv.Calls()
	check("read again")
	for _, op := range []string{"get", "chunklist", "readchunks", "stat"} {
		if n := servertest.CallsSince(s.Srv, before, op, 0); n != 0 {
			t.Errorf("reading again asked the server %d %s calls", n, op)
		}
	}

	// A chunk the cache lost: the bytes from it on come from the server.
	chunks.lose()
	before = s.Srv.Calls()
	check("with a chunk lost")
	if n := servertest.CallsSince(s.Srv, before, "get", 1); n == 0 {
		t.Error("with a chunk lost, nothing was read from the server")
	}

	// Changed on the server: read anew.
	want = content(2<<20 + 17)
	if err := os.WriteFile(filepath.Join(s.Dir, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	d := stat(sized(len(want)))
	reads = reads[:len(reads)-2]
	check("after a change on the server")

	// Changed again, at the same size, its mtime set back: the ctime
	// tells the versions apart.
	want = content(len(want))
	if err := os.WriteFile(filepath.Join(s.Dir, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(s.Dir, "big"), time.Time{}, d.Mtime()); err != nil {
		t.Fatal(err)
	}
	stat(func(e ferry.Dir) bool {
		return e[ferry.AttrCtime] != d[ferry.AttrCtime] && e[ferry.AttrMtime] == d[ferry.AttrMtime]
	})
	check("after a change with the mtime set back")
}

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
