package store

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
)

// Stamp identifies one version of a file on disk. A file whose Stamp
// changed since it was indexed is indexed again before its entries are used.
// Mtime alone misses writes within the clock's resolution and files put back
// with their old mtime; the inode and change time catch those.
type Stamp struct {
	Size  int64
	Mtime int64 // Mtime is in nanoseconds since the epoch.
	Ctime int64 // Ctime is in nanoseconds since the epoch.
	Ino   uint64
}

const stampLen = 32

func (s Stamp) append(b []byte) []byte {
	b = u64(b, uint64(s.Size))
	b = u64(b, uint64(s.Mtime))
	b = u64(b, uint64(s.Ctime))
	return u64(b, s.Ino)
}

func parseStamp(b []byte) Stamp {
	be := binary.BigEndian
	return Stamp{Size: int64(be.Uint64(b)), Mtime: int64(be.Uint64(b[8:])), Ctime: int64(be.Uint64(b[16:])), Ino: be.Uint64(b[24:])}
}

// File is an open file of the indexed tree.
type File interface {
	io.ReaderAt
	io.Reader
	io.Closer
}

// Files is how an Index reads the tree it indexes. Paths are clean ferry
// paths; Open must confine them to the tree.
type Files interface {
	// Open opens the regular file at path for reading and returns its
	// Stamp as of the open.
	Open(path string) (File, Stamp, error)
	// Stamp returns the Stamp of the regular file at path.
	Stamp(path string) (Stamp, error)
}

// Loc is where a chunk's bytes lie: Len bytes at Off in the file at Path,
// as of the file's version Stamp.
type Loc struct {
	Path  string
	Off   int64
	Len   int
	Stamp Stamp
}

// Index is the server's chunk index over a tree of files. It is safe for
// concurrent use.
//
// Keys (paths are clean ferry paths, which hold no NUL byte, so the NUL
// after a path ends it unambiguously):
//
//	'f' path                   -> Stamp, chunk count, last use
//	'r' path 0 offset          -> hash, length     (the file's chunk list)
//	'c' hash path 0 offset     -> length           (where each chunk lies)
//	'u' last-use path          -> ()               (files by last use)
type Index struct {
	db    *pebble.DB
	files Files
	p     chunk.Params
	max   int64

	mu      sync.Mutex // Serialises writers of entries, n and seq.
	n       int64      // Chunk entries held.
	nfiles  int64      // Files held.
	seq     uint64
	indexed atomic.Int64 // Files chunked.
	hits    atomic.Int64 // ReadChunk calls that found verified bytes.
	misses  atomic.Int64 // ReadChunk calls that found none.
	stale   atomic.Int64 // Locations dropped because their bytes did not match.
	// chunking holds the chunks of files being chunked right now, hash
	// to Loc: a client reads a file's chunks while its list still
	// streams, before the file is indexed, and must find them.
	chunking sync.Map
}

// IndexStats reports an Index's size and use.
type IndexStats struct {
	Chunks, MaxChunks, Files int64
	Indexed                  int64 // Indexed counts files chunked since the Index was opened.
	Hits, Misses, Stale      int64
}

// OpenIndex opens the index in dir ("" for one in memory) over files,
// chunked with p, holding at most maxChunks chunk entries.
func OpenIndex(dir string, files Files, p chunk.Params, maxChunks int64) (*Index, error) {
	const op = "store.OpenIndex"
	if err := p.Check(); err != nil {
		return nil, ferry.E(op, dir, ferry.KindInvalid, err)
	}
	db, err := open(op, dir, 0)
	if err != nil {
		return nil, err
	}
	x := &Index{db: db, files: files, p: p, max: maxChunks}
	err = scan(db, []byte{'f'}, func(_, v []byte) bool {
		if len(v) == stampLen+16 {
			x.nfiles++
			x.n += int64(binary.BigEndian.Uint64(v[stampLen:]))
			x.seq = max(x.seq, binary.BigEndian.Uint64(v[stampLen+8:]))
		}
		return true
	})
	if err != nil {
		db.Close()
		return nil, ferry.E(op, dir, ferry.KindIO, err)
	}
	return x, nil
}

// Close closes the index.
func (x *Index) Close() error { return x.db.Close() }

// Params returns the chunking the index uses.
func (x *Index) Params() chunk.Params { return x.p }

func fileKey(path string) []byte { return append([]byte{'f'}, path...) }

func recipePrefix(path string) []byte { return append(append([]byte{'r'}, path...), 0) }

func locKey(h chunk.Hash, path string, off int64) []byte {
	k := append([]byte{'c'}, h[:]...)
	k = append(append(k, path...), 0)
	return u64(k, uint64(off))
}

func useKey(seq uint64, path string) []byte { return append(u64([]byte{'u'}, seq), path...) }

// fileInfo returns the stored Stamp, chunk count and last use of path.
func (x *Index) fileInfo(path string) (st Stamp, n int64, use uint64, ok bool) {
	v, ok, err := get(x.db, fileKey(path))
	if err != nil || !ok || len(v) != stampLen+16 {
		return Stamp{}, 0, 0, false
	}
	be := binary.BigEndian
	return parseStamp(v), int64(be.Uint64(v[stampLen:])), be.Uint64(v[stampLen+8:]), true
}

// Chunks calls fn with each chunk of the file at path in order: from the
// index if the file's Stamp is the one indexed, else by chunking the file
// as it goes (and then indexing it, if it did not change meanwhile). It
// stops at the first error fn returns and returns it.
func (x *Index) Chunks(ctx context.Context, path string, fn func(chunk.Ref) error) error {
	const op = "store.Index.Chunks"
	f, st, err := x.files.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if old, _, _, ok := x.fileInfo(path); ok && old == st {
		refs, err := x.recipe(path)
		if err == nil && coversExactly(refs, st.Size) {
			x.touch(path)
			for _, r := range refs {
				if err := fn(r); err != nil {
					return err
				}
			}
			return nil
		}
		// A damaged recipe: chunk the file again.
	}
	var refs []chunk.Ref
	defer func() {
		for _, r := range refs {
			x.chunking.CompareAndDelete(r.Hash, Loc{Path: path, Off: r.Off, Len: r.Len})
		}
	}()
	err = chunk.Refs(ctxReader{ctx, f}, x.p, func(r chunk.Ref, _ []byte) error {
		refs = append(refs, r)
		x.chunking.Store(r.Hash, Loc{Path: path, Off: r.Off, Len: r.Len})
		return fn(r)
	})
	if err != nil {
		if ctx.Err() != nil {
			return ferry.E(op, path, ferry.KindCanceled, ctx.Err())
		}
		return ferry.E(op, path, err)
	}
	x.indexed.Add(1)
	// Index what was read only if it is the version the Stamp names.
	if st2, err := x.files.Stamp(path); err == nil && st2 == st && coversExactly(refs, st.Size) {
		return x.Set(path, st, refs)
	}
	return nil
}

// recipe returns the chunk list the index holds for path.
func (x *Index) recipe(path string) ([]chunk.Ref, error) {
	var refs []chunk.Ref
	err := scan(x.db, recipePrefix(path), func(k, v []byte) bool {
		if len(v) < chunk.HashSize+1 {
			return false
		}
		var r chunk.Ref
		copy(r.Hash[:], v)
		l, _ := binary.Uvarint(v[chunk.HashSize:])
		r.Off, r.Len = int64(binary.BigEndian.Uint64(k[len(k)-8:])), int(l)
		refs = append(refs, r)
		return true
	})
	return refs, err
}

// coversExactly reports whether refs tile [0, size).
func coversExactly(refs []chunk.Ref, size int64) bool {
	var off int64
	for _, r := range refs {
		if r.Off != off || r.Len <= 0 {
			return false
		}
		off += int64(r.Len)
	}
	return off == size
}

// ctxReader stops a long read when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(b []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(b)
}

// Set records refs as the chunks of the file at path in its version st,
// replacing what the index held for path, and evicts the least recently
// used files if the index outgrew its bound.
func (x *Index) Set(path string, st Stamp, refs []chunk.Ref) error {
	const op = "store.Index.Set"
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.db.NewBatch()
	x.dropLocked(b, path)
	x.setLocked(b, path, st, refs)
	if err := b.Commit(noSync); err != nil {
		return ferry.E(op, path, ferry.KindIO, err)
	}
	return x.evictLocked()
}

// setLocked adds to b the entries of path, whose old entries b already
// drops. x.mu is held.
func (x *Index) setLocked(b *pebble.Batch, path string, st Stamp, refs []chunk.Ref) {
	x.seq++
	b.Set(fileKey(path), u64(u64(st.append(nil), uint64(len(refs))), x.seq), nil)
	b.Set(useKey(x.seq, path), nil, nil)
	for _, r := range refs {
		v := binary.AppendUvarint(append([]byte(nil), r.Hash[:]...), uint64(r.Len))
		b.Set(u64(recipePrefix(path), uint64(r.Off)), v, nil)
		b.Set(locKey(r.Hash, path, r.Off), binary.AppendUvarint(nil, uint64(r.Len)), nil)
	}
	x.n += int64(len(refs))
	x.nfiles++
}

// Rename moves the entries of the file at from to the file at to, as its
// version st, if the index holds from in its version old. It is for a file
// whose bytes now lie at another path (renamed, linked or copied there)
// without chunking them again. It reports whether it moved them; if not,
// the entries of from stay as they were and to is untouched.
func (x *Index) Rename(from, to string, old, st Stamp) (bool, error) {
	const op = "store.Index.Rename"
	x.mu.Lock()
	defer x.mu.Unlock()
	if have, _, _, ok := x.fileInfo(from); !ok || have != old || from == to {
		return false, nil
	}
	refs, err := x.recipe(from)
	if err != nil {
		return false, ferry.E(op, from, ferry.KindIO, err)
	}
	if !coversExactly(refs, old.Size) || st.Size != old.Size {
		return false, nil
	}
	b := x.db.NewBatch()
	x.dropLocked(b, from)
	x.dropLocked(b, to)
	x.setLocked(b, to, st, refs)
	if err := b.Commit(noSync); err != nil {
		return false, ferry.E(op, from, ferry.KindIO, err)
	}
	return true, nil
}

// Drop forgets the file at path (removed, or replaced by a Put that will
// Set it again).
func (x *Index) Drop(path string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.db.NewBatch()
	x.dropLocked(b, path)
	if err := b.Commit(noSync); err != nil {
		return ferry.E("store.Index.Drop", path, ferry.KindIO, err)
	}
	return nil
}

// dropLocked adds to b the deletion of every entry of path. x.mu is held.
func (x *Index) dropLocked(b *pebble.Batch, path string) {
	_, n, use, ok := x.fileInfo(path)
	if !ok {
		return
	}
	b.Delete(fileKey(path), nil)
	b.Delete(useKey(use, path), nil)
	rp := recipePrefix(path)
	scan(x.db, rp, func(k, v []byte) bool {
		if len(v) >= chunk.HashSize {
			h, _ := chunk.FromBytes(v[:chunk.HashSize])
			b.Delete(locKey(h, path, int64(binary.BigEndian.Uint64(k[len(k)-8:]))), nil)
		}
		return true
	})
	b.DeleteRange(rp, prefixEnd(rp), nil)
	x.n -= n
	x.nfiles--
}

// touch marks path as just used.
func (x *Index) touch(path string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	st, n, use, ok := x.fileInfo(path)
	if !ok {
		return
	}
	b := x.db.NewBatch()
	b.Delete(useKey(use, path), nil)
	x.seq++
	b.Set(useKey(x.seq, path), nil, nil)
	b.Set(fileKey(path), u64(u64(st.append(nil), uint64(n)), x.seq), nil)
	b.Commit(noSync)
}

// evictLocked drops the least recently used files until the index holds at
// most its bound, leaving room for a tenth more. x.mu is held.
func (x *Index) evictLocked() error {
	if x.n <= x.max {
		return nil
	}
	target := x.max - x.max/10
	var victims []string
	var freed int64
	err := scan(x.db, []byte{'u'}, func(k, _ []byte) bool {
		p := string(k[9:])
		_, n, _, _ := x.fileInfo(p)
		victims = append(victims, p)
		freed += n
		return x.n-freed > target
	})
	if err != nil {
		return ferry.E("store.Index.evict", "", ferry.KindIO, err)
	}
	b := x.db.NewBatch()
	for _, p := range victims {
		x.dropLocked(b, p)
	}
	if err := b.Commit(noSync); err != nil {
		return ferry.E("store.Index.evict", "", ferry.KindIO, err)
	}
	return nil
}

// Lookup returns the locations the index holds for h, unverified.
func (x *Index) Lookup(h chunk.Hash) ([]Loc, error) {
	var locs []Loc
	err := x.scanLocs(h, "", func(l Loc) bool {
		locs = append(locs, l)
		return true
	})
	for i := range locs {
		locs[i].Stamp, _, _, _ = x.fileInfo(locs[i].Path)
	}
	return locs, err
}

// scanLocs calls fn with each location of h, only those in the file path
// if path is not "", until fn returns false. The locations are unverified
// and without their Stamp.
func (x *Index) scanLocs(h chunk.Hash, path string, fn func(Loc) bool) error {
	p := append([]byte{'c'}, h[:]...)
	n := len(p)
	if path != "" {
		p = append(append(p, path...), 0)
	}
	return scan(x.db, p, func(k, v []byte) bool {
		rest := k[n:]
		if len(rest) < 9 || rest[len(rest)-9] != 0 {
			return true
		}
		l, _ := binary.Uvarint(v)
		return fn(Loc{Path: string(rest[:len(rest)-9]), Off: int64(binary.BigEndian.Uint64(rest[len(rest)-8:])), Len: int(l)})
	})
}

// Has reports whether the index knows a location of h. The location may be
// stale: ReadChunk may still miss.
func (x *Index) Has(h chunk.Hash) bool {
	found := false
	scan(x.db, append([]byte{'c'}, h[:]...), func(_, _ []byte) bool { found = true; return false })
	return found
}

// ErrMiss is ReadChunk's answer when no location of a chunk holds its bytes.
var ErrMiss = errors.New("store: chunk not found")

// ReadChunk reads the chunk h into buf (grown as needed) from a location the
// index holds, trying those in the file prefer first, and returns the bytes
// after checking they hash to h. A location whose bytes do not match is
// dropped along with every entry of its file, which the next Chunks of that
// file indexes again. If no location holds the chunk it returns ErrMiss.
// allowed, if not nil, says which files the caller may read from: others
// are neither read nor revealed.
func (x *Index) ReadChunk(h chunk.Hash, buf []byte, prefer string, allowed func(path string) bool) ([]byte, error) {
	// A file being chunked for a list comes first: its chunks are in
	// chunking from before the list names them until after the index
	// holds them, so looking there first never misses one in between
	// (looked for last, one was missed now and then: the index did not
	// hold it yet, and chunking no longer did).
	if v, ok := x.chunking.Load(h); ok {
		if l := v.(Loc); allowed == nil || allowed(l.Path) {
			if b, ok := x.readAt(h, l, buf); ok {
				x.hits.Add(1)
				return b, nil
			}
		}
	}
	// The locations are tried as the index yields them, the first that
	// holds the chunk ends the search: a chunk that many files share (a
	// licence, an empty __init__.py) costs one read, not one per file.
	var got []byte
	var stale []string
	try := func(l Loc) bool {
		if allowed != nil && !allowed(l.Path) {
			return true
		}
		if l.Len <= 0 || l.Len > chunk.MaxSize {
			stale = append(stale, l.Path)
			return true
		}
		if b, ok := x.readAt(h, l, buf); ok {
			got = b
			return false
		}
		stale = append(stale, l.Path)
		return true
	}
	var err error
	if prefer != "" {
		err = x.scanLocs(h, prefer, try)
	}
	if got == nil && err == nil {
		err = x.scanLocs(h, "", func(l Loc) bool { return l.Path == prefer || try(l) })
	}
	for _, p := range stale {
		x.dropStale(p)
	}
	if got != nil {
		x.hits.Add(1)
		return got, nil
	}
	if err != nil {
		return nil, ferry.E("store.Index.ReadChunk", h.String(), ferry.KindIO, err)
	}
	x.misses.Add(1)
	return nil, ErrMiss
}

// readAt reads the location l and reports whether it holds h.
func (x *Index) readAt(h chunk.Hash, l Loc, buf []byte) ([]byte, bool) {
	f, _, err := x.files.Open(l.Path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if cap(buf) < l.Len {
		buf = make([]byte, l.Len)
	}
	buf = buf[:l.Len]
	if _, err := f.ReadAt(buf, l.Off); err != nil {
		return nil, false
	}
	return buf, chunk.Sum(buf) == h
}

func (x *Index) dropStale(path string) {
	x.stale.Add(1)
	x.Drop(path)
}

// Reset forgets everything, for a rebuild from scratch.
func (x *Index) Reset() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.db.DeleteRange([]byte{0}, []byte{0xff}, noSync); err != nil {
		return ferry.E("store.Index.Reset", "", ferry.KindIO, err)
	}
	x.n, x.nfiles = 0, 0
	return nil
}

// Stats reports the index's size and use.
func (x *Index) Stats() IndexStats {
	x.mu.Lock()
	n, files := x.n, x.nfiles
	x.mu.Unlock()
	return IndexStats{Chunks: n, MaxChunks: x.max, Files: files, Indexed: x.indexed.Load(),
		Hits: x.hits.Load(), Misses: x.misses.Load(), Stale: x.stale.Load()}
}
