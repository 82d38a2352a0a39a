package store

import (
	crand "crypto/rand"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/chunk"
)

// BenchmarkCachePut stores 128 MiB of random 8 KiB chunks in a fresh cache
// on disk, Close (which waits for pebble's flushes) included: what a
// download or upload of that size costs the client's CPU besides the link.
func BenchmarkCachePut(b *testing.B) {
	const size, n = 128 << 20, 8 << 10
	data := make([]byte, size)
	crand.Read(data)
	hs := make([]chunk.Hash, 0, size/n)
	for off := 0; off < size; off += n {
		hs = append(hs, chunk.Sum(data[off:off+n]))
	}
	b.SetBytes(size)
	for b.Loop() {
		c, err := OpenCache(b.TempDir(), 1<<40)
		if err != nil {
			b.Fatal(err)
		}
		for i, h := range hs {
			if err := c.Put(h, data[i*n:(i+1)*n]); err != nil {
				b.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAddDoesNotWaitForStore: Add hands a chunk to the background writer
// without waiting while the store is busy (here: its lock held, as the
// writer holds it through each commit), and Has and Get see the chunk at
// once.
func TestAddDoesNotWaitForStore(t *testing.T) {
	c, err := OpenCache("", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	data := []byte("a chunk added while the store is busy")
	h := chunk.Sum(data)
	c.mu.Lock()
	done := make(chan struct{})
	go func() {
		c.Add(h, data)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.mu.Unlock()
		t.Fatal("Add waited for the store's lock")
	}
	if !c.Has(h) {
		t.Error("Has: false for a chunk Add holds, want true")
	}
	c.mu.Unlock()
	if got, ok := c.Get(h); !ok || string(got) != string(data) {
		t.Errorf("Get = %q, %v; want %q, true", got, ok, data)
	}
}

// TestSmallMemTable: a cache with small memtables (a mount with a small
// memory budget) stores more than they hold, and keeps it across a reopen.
func TestSmallMemTable(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCacheMem(dir, 1<<30, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 8<<20)
	crand.Read(data)
	var hs []chunk.Hash
	for off := 0; off < len(data); off += 8 << 10 {
		h := chunk.Sum(data[off : off+8<<10])
		hs = append(hs, h)
		if err := c.Put(h, data[off:off+8<<10]); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c, err = OpenCacheMem(dir, 1<<30, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, h := range hs {
		if b, ok := c.Get(h); !ok || string(b) != string(data[i*8<<10:(i+1)*8<<10]) {
			t.Fatalf("chunk %d lost after a reopen", i)
		}
	}
}
