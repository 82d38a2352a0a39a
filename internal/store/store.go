// Package store keeps Ferry's chunk indexes in pebble: the server's Index
// (chunk hash to the places in the served files where those bytes lie) and
// the client's Cache (chunk hash to the bytes themselves).
//
// Neither is trusted. Every chunk read through either is hashed again before
// it is returned; a mismatch drops the entry and reports a miss. So a stale
// index (a file changed behind the server's back, a crash between a write
// and its index update, a flipped bit on disk) costs bandwidth, never
// correctness, and both are written without fsync.
//
// Both are bounded: the Index by its number of chunk entries, the Cache by
// its bytes; each evicts the least recently used files or chunks beyond its
// bound.
package store

import (
	"encoding/binary"
	"errors"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ferryfs/ferry"
)

// Quiet is a pebble logger that drops pebble's informational logs; errors
// reach the caller anyway. Every pebble store of Ferry's uses it.
type Quiet struct{}

func (Quiet) Infof(string, ...any)  {}
func (Quiet) Errorf(string, ...any) {}
func (Quiet) Fatalf(format string, args ...any) {
	panic(errors.New("pebble: fatal: " + format))
}

// open opens (creating if needed) the pebble database in dir, or an
// in-memory one if dir is "". Bulk tunes it for values of kilobytes that
// arrive at link speed (the Cache's chunks): with pebble's 4 MiB memtables
// every byte was flushed and compacted again and again: storing 128 MiB of
// 8 KiB chunks took 1.75 s of a core (BenchmarkCachePut, 77 MB/s), which on
// a 2-core client made an upload 10% slower than a bare TCP stream. With
// 32 MiB memtables, which pebble grows to from 256 KiB only under load, and
// no block compression (much chunk data is compressed already, and the
// Cache's bound counts raw bytes) it takes 0.8 s (160-170 MB/s).
// A memtable of memtable bytes (0 for pebble's own sizes) makes it a bulk
// store, tuned so.
func open(op, dir string, memtable int64) (*pebble.DB, error) {
	opts := &pebble.Options{Logger: Quiet{}, CacheSize: 8 << 20}
	// Many lookups are of a hash not there (the index asked for the
	// chunks of a new file): a bloom filter per table answers them
	// without reading the table's blocks.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if bulk := memtable > 0; bulk {
		opts.MemTableSize = uint64(memtable)
		// Chunks are large values written once: fewer, larger
		// compactions and blocks rewrite them less often (with 4 MiB
		// memtables, a mount's at 128M, Puts went from 30 to 52 MB/s),
		// and a walk that writes a tree's files through a mount's small
		// memtables does not wait on compactions (at 100 ms, a cold
		// grep -r of Go's src took about 2 s longer with a threshold
		// of 8).
		opts.L0CompactionThreshold = 32
		opts.L0StopWritesThreshold = 128
		opts.LBaseMaxBytes = 256 << 20
		for i := range opts.Levels {
			opts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
			opts.Levels[i].BlockSize = 32 << 10
		}
	}
	if dir == "" {
		opts.FS = vfs.NewMem()
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, ferry.E(op, dir, ferry.KindIO, err)
	}
	return db, nil
}

// noSync is how both stores write: losing the last writes in a crash only
// costs bandwidth.
var noSync = pebble.NoSync

// u64 appends v big-endian, so keys sort by number.
func u64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// prefixEnd returns the first key after every key starting with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// scan calls fn for each key and value with the prefix p, in order, until fn
// returns false. Key and value are valid only during the call.
func scan(db *pebble.DB, p []byte, fn func(k, v []byte) bool) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		if !fn(it.Key(), it.Value()) {
			break
		}
	}
	return it.Close()
}

// get returns a copy of the value at k, or nil and false.
func get(db *pebble.DB, k []byte) ([]byte, bool, error) {
	v, closer, err := db.Get(k)
	if err == pebble.ErrNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out, true, nil
}
