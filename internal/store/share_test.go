package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
)

// TestShare: a process that cannot open a cache another holds uses it
// through the holder's socket: what either adds, both read; bytes that do
// not match their hash are not kept; the socket is its owner's alone; and
// once the holder closes, calls miss at once rather than hang.
func TestShare(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCache(dir, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock := filepath.Join(dir, ShareSocket)
	if err := c.Share(sock); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("the socket: %v, %v; want one for its owner alone", fi.Mode(), err)
	}
	if _, err := OpenCache(dir, 64<<20); err == nil {
		t.Fatal("a second open of a held cache succeeded; the test needs pebble's lock")
	}
	s, err := DialShared(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	mine, theirs := []byte("added by the holder"), []byte("added through the socket")
	hm, ht := chunk.Sum(mine), chunk.Sum(theirs)
	c.Add(hm, mine)
	s.Add(ht, theirs)
	bad := chunk.Sum([]byte("something else"))
	s.Add(bad, []byte("not what the hash says"))
	// Refused before they are queued, where they would be served
	// unchecked until written.
	if _, err := (&sharer{c: c}).Add(context.Background(), &proto.CacheChunk{Hash: bad[:], Data: []byte("not it either")}); !ferry.IsKind(err, ferry.KindInvalid) {
		t.Errorf("the socket took bytes that do not match their hash: %v", err)
	}
	for _, cc := range []ChunkCache{c, s} {
		for h, want := range map[chunk.Hash][]byte{hm: mine, ht: theirs} {
			if !cc.HasMany([]chunk.Hash{h})[0] {
				t.Errorf("%T lacks %s", cc, h)
			}
			if got, ok := cc.GetMany(context.Background(), []chunk.Hash{h})(); !ok || !bytes.Equal(got, want) {
				t.Errorf("%T.GetMany(%s) = %q, %v; want %q", cc, h, got, ok, want)
			}
		}
	}
	for _, cc := range []ChunkCache{c, s} {
		next := cc.GetMany(context.Background(), []chunk.Hash{ht, hm})
		for i, want := range [][]byte{theirs, mine} {
			if got, ok := next(); !ok || !bytes.Equal(got, want) {
				t.Errorf("%T.GetMany, chunk %d: %q, %v; want %q", cc, i, got, ok, want)
			}
		}
		if _, ok := next(); ok {
			t.Errorf("%T.GetMany read past the chunks asked for", cc)
		}
	}
	unknown := chunk.Sum([]byte("never added"))
	for _, cc := range []ChunkCache{c, s} {
		next := cc.GetMany(context.Background(), []chunk.Hash{hm, unknown})
		if _, ok := next(); !ok {
			t.Errorf("%T.GetMany missed a chunk it holds", cc)
		}
		if _, ok := next(); ok {
			t.Errorf("%T.GetMany answered for a chunk it lacks", cc)
		}
	}
	for _, cc := range []ChunkCache{c, s} {
		if got := cc.HasMany([]chunk.Hash{hm, unknown, ht}); !slices.Equal(got, []bool{true, false, true}) {
			t.Errorf("%T.HasMany = %v, want [true false true]", cc, got)
		}
	}
	// Add keeps in the background: wait until the holder has written.
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().Chunks < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.HasMany([]chunk.Hash{bad})[0] {
		t.Error("bytes that do not match their hash were kept")
	}
	if st := s.Stats(); st.Chunks != 2 || st.MaxBytes != 64<<20 {
		t.Errorf("the stats through the socket: %+v, want 2 chunks of at most 64 MiB", st)
	}

	c.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the cache: %v", err)
	}
	start := time.Now()
	if _, ok := s.GetMany(context.Background(), []chunk.Hash{hm})(); ok {
		t.Error("GetMany answered after the holder closed")
	}
	if got := s.HasMany([]chunk.Hash{hm}); !slices.Equal(got, []bool{false}) {
		t.Errorf("HasMany after the holder closed: %v", got)
	}
	s.Add(hm, mine)
	if took := time.Since(start); took > sharedTimeout {
		t.Errorf("calls to a closed holder took %v", took)
	}
	if _, err := DialShared(context.Background(), sock); err == nil {
		t.Error("DialShared succeeded with no one sharing")
	}
}
