package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
)

// Cache is the client's persistent content-addressed chunk cache, bounded in
// bytes. It is safe for concurrent use.
//
// Keys: 'd'+hash holds the chunk's bytes; 'a'+hash holds its last use (a
// sequence number) and length; 'u'+use+hash orders chunks by last use for
// eviction; 'n'+path holds a record of Names.
type Cache struct {
	db  *pebble.DB
	max int64

	mu    sync.Mutex // mu orders the store's writes and guards seq, bytes and names.
	seq   uint64
	bytes int64
	// held maps the first 8 bytes of each chunk's hash to its length,
	// so that finding whether a chunk is held reads no table: with many
	// small tables (a mount's small memtables), each such read cost
	// several block reads. Two chunks whose hashes begin alike count as
	// one: the second is then not cached, and a Get of it misses. It is
	// changed with mu held too, and read without mu, which a write
	// holds through its commit. Its size is the count of chunks.
	hmu   sync.RWMutex
	held  map[uint64]uint32
	names int64 // The records of Names.

	hits, misses, corrupt atomic.Int64

	// qmu guards what Add shares with the background writer, apart
	// from mu so that Add never waits for the store: an upload that adds
	// its chunks as it cuts them took three times as long to cut a file
	// while the writer held mu through each pebble commit.
	qmu sync.Mutex
	// The chunks Add hands to the background writer, and the bytes
	// of them not yet written.
	adds chan added // Made by the first Add.
	// queued holds the chunks in adds, which Has and Get serve as if
	// they were stored. Under qmu.
	queued      map[chunk.Hash][]byte
	queuedBytes int64 // The bytes of queued.
	dropped     atomic.Int64
	writer      sync.WaitGroup
	closed      bool // Set by Close, under qmu.
	// unshare stops what Share serves, at Close. Under qmu.
	unshare []func()
}

// added is a chunk on its way to the store, or a record of Names (name
// set, with data nil for a removal).
type added struct {
	h    chunk.Hash
	data []byte
	name string
}

// AddBacklog bounds the bytes that Add holds for the background writer:
// about what a 100 Mbit/s link brings in 3 s. The store takes some
// 160 MB/s of one core (BenchmarkCachePut), so on faster links a transfer
// may outrun it, and what does not fit is not cached.
const AddBacklog = 32 << 20

// CacheStats reports a Cache's size and hit rate.
type CacheStats struct {
	Bytes, Chunks, MaxBytes int64
	Hits, Misses            int64
	Corrupt                 int64 // Corrupt counts entries dropped because their bytes did not match their hash.
	Dropped                 int64 // Dropped counts chunks Add did not cache: the backlog was full.
}

// OpenCache opens the cache in dir ("" for one in memory) holding at most
// maxBytes of chunk data, writing through memtables of DefaultCacheMemTable.
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	return OpenCacheMem(dir, maxBytes, DefaultCacheMemTable)
}

// DefaultCacheMemTable is the size of the cache's memtables, where chunks
// wait in memory to be written out (up to two of them): 32 MiB, where
// 4 MiB cost an upload 10% of its speed in flushes and compactions (see
// open).
const DefaultCacheMemTable = 32 << 20

// OpenCacheMem is OpenCache with memtables of memtable bytes, for a
// process whose memory is counted (a mount with a small budget).
func OpenCacheMem(dir string, maxBytes, memtable int64) (*Cache, error) {
	const op = "store.OpenCache"
	db, err := open(op, dir, memtable)
	if err != nil {
		return nil, err
	}
	c := &Cache{db: db, max: maxBytes, held: map[uint64]uint32{}}
	err = scan(db, []byte{'a'}, func(k, v []byte) bool {
		if len(v) == 12 && len(k) == 1+chunk.HashSize {
			c.seq = max(c.seq, binary.BigEndian.Uint64(v))
			n := binary.BigEndian.Uint32(v[8:])
			c.held[binary.BigEndian.Uint64(k[1:])] = n
			c.bytes += int64(n)
		}
		return true
	})
	if err == nil {
		c.names, err = countNames(db)
	}
	if err != nil {
		db.Close()
		return nil, ferry.E(op, dir, ferry.KindIO, err)
	}
	return c, nil
}

// Close stops sharing the cache, waits for the chunks Add holds to be
// stored and closes the cache. Closing it again does nothing.
func (c *Cache) Close() error {
	c.qmu.Lock()
	if c.closed {
		c.qmu.Unlock()
		return nil
	}
	c.closed = true
	unshare := c.unshare
	c.unshare = nil
	c.qmu.Unlock()
	for _, stop := range unshare {
		stop()
	}
	c.qmu.Lock()
	if c.adds != nil {
		close(c.adds)
	}
	c.qmu.Unlock()
	c.writer.Wait()
	return c.db.Close()
}

// Add is Put in the background, for transfers that should not wait for the
// store: it copies data and returns at once. The caller has checked that
// data hashes to h: the chunk is served from the queue until it is
// written, and only then checked again (off the caller's path; the
// transfers that add chunks have hashed them already). A chunk that would
// take the backlog over AddBacklog, or comes after Close, is not cached
// (counted in CacheStats.Dropped); nor is one whose bytes do not match h.
func (c *Cache) Add(h chunk.Hash, data []byte) { c.add(h, data, true) }

// AddFixed is Add of data the caller never changes, which it keeps
// without copying: the cache layer's contents, which it holds as they
// came, spare the collector a copy of every file they write.
func (c *Cache) AddFixed(h chunk.Hash, data []byte) { c.add(h, data, false) }

// add is Add, copying data if clone is set.
func (c *Cache) add(h chunk.Hash, data []byte, clone bool) {
	n := int64(len(data))
	if n > c.max {
		return // Put would not keep it either.
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if _, ok := c.queued[h]; ok {
		return
	}
	if c.closed || c.queuedBytes+n > AddBacklog {
		c.dropped.Add(1)
		return
	}
	c.startWriter()
	if clone {
		data = bytes.Clone(data)
	}
	a := added{h: h, data: data}
	select {
	case c.adds <- a:
		c.queued[h] = a.data
		c.queuedBytes += n
	default:
		c.dropped.Add(1)
	}
}

// startWriter starts the background writer of what Add and Names hand
// it, if it has not started. c.qmu is held.
func (c *Cache) startWriter() {
	if c.adds != nil {
		return
	}
	c.adds = make(chan added, AddBacklog/chunk.Default.Min)
	c.queued = map[chunk.Hash][]byte{}
	c.writer.Add(1)
	go func() {
		defer c.writer.Done()
		for a := range c.adds {
			if a.name != "" {
				c.writeName(a.name, a.data)
				continue
			}
			c.Put(a.h, a.data)
			c.qmu.Lock()
			delete(c.queued, a.h)
			c.queuedBytes -= int64(len(a.data))
			c.qmu.Unlock()
		}
	}()
}

// fromQueue returns a copy of the chunk h if Add holds it.
func (c *Cache) fromQueue(h chunk.Hash) ([]byte, bool) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	b, ok := c.queued[h]
	return bytes.Clone(b), ok
}

func key(tag byte, h chunk.Hash) []byte { return append([]byte{tag}, h[:]...) }

// Has reports whether the cache holds the chunk, without reading or checking
// it: Get may still miss.
func (c *Cache) Has(h chunk.Hash) bool {
	c.qmu.Lock()
	_, ok := c.queued[h]
	c.qmu.Unlock()
	return ok || c.stored(h)
}

// GetMany returns what Gets hs one after another.
func (c *Cache) GetMany(ctx context.Context, hs []chunk.Hash) func() ([]byte, bool) {
	i := 0
	return func() ([]byte, bool) {
		if i >= len(hs) || ctx.Err() != nil {
			return nil, false
		}
		i++
		return c.Get(hs[i-1])
	}
}

// HasMany is Has of each of hs, in order.
func (c *Cache) HasMany(hs []chunk.Hash) []bool {
	has := make([]bool, len(hs))
	for i, h := range hs {
		has[i] = c.Has(h)
	}
	return has
}

// stored reports whether the store holds the chunk.
func (c *Cache) stored(h chunk.Hash) bool {
	c.hmu.RLock()
	defer c.hmu.RUnlock()
	_, ok := c.held[prefix(h)]
	return ok
}

// prefix is the key of h in Cache.held.
func prefix(h chunk.Hash) uint64 { return binary.BigEndian.Uint64(h[:8]) }

// Get returns the chunk's bytes, which the caller owns, after checking that
// they hash to h. A corrupt entry is dropped and reported as a miss. Get
// counts as a use for eviction.
func (c *Cache) Get(h chunk.Hash) ([]byte, bool) {
	if data, ok := c.fromQueue(h); ok {
		c.hits.Add(1)
		return data, true
	}
	data, ok, err := get(c.db, key('d', h))
	if err != nil || !ok {
		c.misses.Add(1)
		return nil, false
	}
	if chunk.Sum(data) != h {
		c.corrupt.Add(1)
		c.misses.Add(1)
		c.drop(h)
		return nil, false
	}
	c.hits.Add(1)
	c.touch(h, len(data))
	return data, true
}

// touch makes h the most recently used chunk.
func (c *Cache) touch(h chunk.Hash, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok, err := get(c.db, key('a', h))
	if err != nil || !ok || len(old) != 12 {
		return
	}
	b := c.db.NewBatch()
	b.Delete(append(u64([]byte{'u'}, binary.BigEndian.Uint64(old)), h[:]...), nil)
	c.seq++
	b.Set(append(u64([]byte{'u'}, c.seq), h[:]...), nil, nil)
	b.Set(key('a', h), binary.BigEndian.AppendUint32(u64(nil, c.seq), uint32(n)), nil)
	b.Commit(noSync)
}

// Put adds a chunk. It refuses (KindInvalid) bytes that do not hash to h, so
// the cache never holds what it cannot serve. Adding a chunk that is there
// counts as a use. The oldest chunks are evicted to stay within the bound.
func (c *Cache) Put(h chunk.Hash, data []byte) error {
	const op = "store.Cache.Put"
	if chunk.Sum(data) != h {
		return ferry.E(op, h.String(), ferry.KindInvalid, "bytes do not match the hash")
	}
	if int64(len(data)) > c.max {
		return nil
	}
	if c.stored(h) {
		c.touch(h, len(data))
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stored(h) {
		return nil // Added meanwhile.
	}
	b := c.db.NewBatch()
	c.seq++
	b.Set(key('d', h), data, nil)
	b.Set(append(u64([]byte{'u'}, c.seq), h[:]...), nil, nil)
	b.Set(key('a', h), binary.BigEndian.AppendUint32(u64(nil, c.seq), uint32(len(data))), nil)
	if err := b.Commit(noSync); err != nil {
		return ferry.E(op, h.String(), ferry.KindIO, err)
	}
	c.hmu.Lock()
	c.held[prefix(h)] = uint32(len(data))
	c.hmu.Unlock()
	c.bytes += int64(len(data))
	return c.evict()
}

// evict drops the least recently used chunks until the cache fits its
// bound. c.mu is held.
func (c *Cache) evict() error {
	if c.bytes <= c.max {
		return nil
	}
	b := c.db.NewBatch()
	err := scan(c.db, []byte{'u'}, func(k, _ []byte) bool {
		if c.bytes <= c.max {
			return false
		}
		h, _ := chunk.FromBytes(k[9:])
		c.hmu.Lock()
		if n, ok := c.held[prefix(h)]; ok {
			c.bytes -= int64(n)
			delete(c.held, prefix(h))
		}
		c.hmu.Unlock()
		b.Delete(append([]byte(nil), k...), nil)
		b.Delete(key('a', h), nil)
		b.Delete(key('d', h), nil)
		return true
	})
	if err == nil {
		err = b.Commit(noSync)
	}
	if err != nil {
		return ferry.E("store.Cache.evict", "", ferry.KindIO, err)
	}
	return nil
}

// drop removes a chunk.
func (c *Cache) drop(h chunk.Hash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok, _ := get(c.db, key('a', h))
	b := c.db.NewBatch()
	if ok && len(a) == 12 {
		b.Delete(append(u64([]byte{'u'}, binary.BigEndian.Uint64(a)), h[:]...), nil)
		c.bytes -= int64(binary.BigEndian.Uint32(a[8:]))
		c.hmu.Lock()
		delete(c.held, prefix(h))
		c.hmu.Unlock()
	}
	b.Delete(key('a', h), nil)
	b.Delete(key('d', h), nil)
	b.Commit(noSync)
}

// Stats reports the cache's size and hit counts since it was opened.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hmu.RLock()
	n := int64(len(c.held))
	c.hmu.RUnlock()
	return CacheStats{Bytes: c.bytes, Chunks: n, MaxBytes: c.max,
		Hits: c.hits.Load(), Misses: c.misses.Load(), Corrupt: c.corrupt.Load(), Dropped: c.dropped.Load()}
}
