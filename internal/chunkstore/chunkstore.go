// Package chunkstore serves a local tree by content-defined chunks: it lists a
// file's chunks from a chunk index (internal/store) kept over the tree,
// reads chunks back through the index, and assembles uploaded files from the
// chunks the server already holds plus those the client sends, committing
// atomically. internal/server exposes it on the wire; internal/remote is
// the client end.
//
// Security: the server serves one tree to every authenticated user, and each
// of them may read every file of it (Get). The index holds only chunks of
// files in the tree (never temporary or staging files) and of files in the
// trash, and every answer about a chunk comes from reading it back from such
// a file, so a client learns nothing through chunk queries that it could not
// read with Get. Trash files hold the rule because each was a readable file
// of the tree until it was replaced, truncated or removed, and holds the
// bytes Get returned then; the trash lies outside the tree (Options.TrashDir)
// and the index knows its files under TrashPrefix, which no tree path
// starts with, so they cannot be named, listed or fetched, only their chunks
// read. When per-user permissions arrive, Tree.Allowed must scope ReadChunk
// and the put's index lookups to the files the user may read, and judge a
// trash file by the file it was kept from.
//
// The trash keeps the last versions of files replaced, truncated or removed
// through the Tree a while (bounded by bytes and age, oldest evicted first),
// with their chunks in the index, because the next version of a file
// usually shares most chunks with the last one: a client that puts it sends
// only what changed even when the server no longer holds the last version
// under its name (an editor that removes and rewrites, a truncation before
// a rewrite). Writes in place and files changed directly on the server's
// disk are not kept.
package chunkstore

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/store"
)

// Tree is a local tree that also serves and accepts files by chunks.
type Tree struct {
	*local.Tree
	root  *os.Root
	index *store.Index
	trash *trash
	// Allowed, if not nil, says which files chunks may be read from on
	// behalf of a caller; nil allows the whole tree.
	Allowed func(path string) bool
	// swept is closed when a Sweep in progress is done; nil if none is.
	swept atomic.Pointer[chan struct{}]
}

var (
	_ ferry.FS      = (*Tree)(nil)
	_ ferry.Watcher = (*Tree)(nil)
)

// Open returns a Tree over t configured by o.
func Open(t *local.Tree, o Options) (*Tree, error) {
	root, err := os.OpenRoot(t.Dir())
	if err != nil {
		return nil, ferry.E("chunkstore.Open", t.Dir(), err)
	}
	tr, err := openTrash(root, o)
	if err != nil {
		root.Close()
		return nil, err
	}
	fs := files{tree: store.RootFiles{Root: root}}
	if tr != nil {
		fs.trash = store.RootFiles{Root: tr.dir}
	}
	x, err := store.OpenIndex(o.IndexDir, fs, chunk.Default, o.MaxChunks)
	if err != nil {
		tr.close()
		root.Close()
		return nil, err
	}
	tr.start(x)
	return &Tree{Tree: t, root: root, index: x, trash: tr}, nil
}

// Close closes the index and the tree.
func (t *Tree) Close() error {
	t.trash.close()
	err := t.index.Close()
	t.root.Close()
	if cerr := t.Tree.Close(); err == nil {
		err = cerr
	}
	return err
}

// Index returns the chunk index, for its statistics and rebuilds.
func (t *Tree) Index() *store.Index { return t.index }

func (t *Tree) clean(ctx context.Context, op, p string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", ferry.E(op, p, ferry.KindCanceled, err)
	}
	p, err := ferry.CleanPath(p)
	if err != nil {
		return "", err
	}
	if p == ferry.CtlPath {
		return "", ferry.E(op, p, ferry.KindInvalid, "the control file has no chunks")
	}
	return p, local.Reserved(op, p)
}

// ChunkList calls dir with the entry of the regular file at path, then fn
// with each of its chunks in order. The file is indexed as a side effect if
// it changed since it was last indexed.
func (t *Tree) ChunkList(ctx context.Context, p string, dir func(ferry.Dir) error, fn func(chunk.Ref) error) error {
	const op = "chunkstore.ChunkList"
	p, err := t.clean(ctx, op, p)
	if err != nil {
		return err
	}
	d, err := t.Stat(ctx, p).Wait()
	if err != nil {
		return err
	}
	if d.Type() != ferry.TypeFile {
		return ferry.E(op, p, ferry.KindIsDir, "not a regular file")
	}
	if err := dir(d); err != nil {
		return err
	}
	return t.index.Chunks(ctx, p, fn)
}

// ReadChunk returns the bytes of chunk h, in buf if it is large enough,
// read from a file of the tree and checked against h, looking in the file
// prefer first. It fails with KindNotExist if the tree no longer holds it.
func (t *Tree) ReadChunk(ctx context.Context, h chunk.Hash, prefer string, buf []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, ferry.E("chunkstore.ReadChunk", h.String(), ferry.KindCanceled, err)
	}
	b, err := t.index.ReadChunk(h, buf, prefer, t.Allowed)
	if errors.Is(err, store.ErrMiss) {
		return nil, ferry.E("chunkstore.ReadChunk", h.String(), ferry.KindNotExist, "chunk not held")
	}
	return b, err
}

// Rebuild forgets the index and indexes every regular file of the tree
// and the trash again, for when the index is lost or suspect. It reports
// files it could not read in the returned count and goes on.
func (t *Tree) Rebuild(ctx context.Context) (files, failed int, err error) {
	if err := t.index.Reset(); err != nil {
		return 0, 0, err
	}
	t.trash.reindex(ctx)
	s := t.Find(ctx, "/", "type=f")
	for e := range s.All() {
		if e.Err != nil {
			failed++
			continue
		}
		if err := t.index.Chunks(ctx, e.Dir.Path(), func(chunk.Ref) error { return nil }); err != nil {
			if ctx.Err() != nil {
				s.Close()
				return files, failed, ferry.E("chunkstore.Rebuild", "/", ferry.KindCanceled, ctx.Err())
			}
			failed++
			continue
		}
		files++
	}
	return files, failed, s.Err()
}

// Put is an upload in progress: a temporary file (local.Tree.TempName) that
// fills up with chunks from the client and from the index, and replaces the
// target only when every chunk is there and verified.
type Put struct {
	t    *Tree
	ctx  context.Context
	path string
	d    ferry.Dir
	size int64
	tmp  string
	f    *os.File

	refs   []chunk.Ref
	off    int64                // End of the list so far.
	where  map[chunk.Hash][]int // Indexes of each hash in refs.
	filled []bool
	left   int // Chunks not yet filled.
	// examined counts the chunks of the list Need has looked at; asked
	// holds the hashes it looked at, whose bytes were then asked for
	// unless the server held them.
	examined int
	asked    map[chunk.Hash]bool
	ended    bool
	old      sync.WaitGroup // Indexing the version being replaced.
	buf      []byte
	done     bool
	fine     *fine // Fine deltas, once FineSource was asked.
}

// BeginPut starts replacing the file at path with size bytes and the
// attributes in d (mode, mtime, uid, gid; the replaced file's mode if d
// has none). The caller must end it with Commit or Abort.
func (t *Tree) BeginPut(ctx context.Context, p string, d ferry.Dir, size int64) (*Put, error) {
	const op = "chunkstore.BeginPut"
	p, err := t.clean(ctx, op, p)
	if err != nil {
		return nil, err
	}
	if p == "/" || d.Type() != ferry.TypeFile {
		return nil, ferry.E(op, p, ferry.KindInvalid, "chunked puts make regular files only")
	}
	if size < 0 {
		return nil, ferry.E(op, p, ferry.KindInvalid, "negative size")
	}
	tmp := t.Tree.TempName(p)
	f, err := t.root.OpenFile(tmp[1:], os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, ferry.FromOS(op, p, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		t.root.Remove(tmp[1:])
		return nil, ferry.FromOS(op, p, err)
	}
	u := &Put{t: t, ctx: ctx, path: p, d: d, size: size, tmp: tmp, f: f, where: map[chunk.Hash][]int{}, asked: map[chunk.Hash]bool{}}
	// The version being replaced most likely holds most chunks: index it
	// (if it changed since it was indexed) while the list arrives.
	u.old.Add(1)
	go func() {
		defer u.old.Done()
		t.index.Chunks(ctx, p, func(chunk.Ref) error { return nil })
	}()
	return u, nil
}

// AddRefs appends the next chunks of the new content's list, each at most
// chunk.MaxSize bytes, together at most the put's size.
func (u *Put) AddRefs(hashes []chunk.Hash, sizes []int) error {
	const op = "chunkstore.Put"
	if u.ended {
		return ferry.E(op, u.path, ferry.KindInvalid, "chunk list after its end")
	}
	if len(hashes) != len(sizes) {
		return ferry.E(op, u.path, ferry.KindInvalid, "as many hashes as sizes needed")
	}
	for i, h := range hashes {
		n := sizes[i]
		if n <= 0 || n > chunk.MaxSize || u.off+int64(n) > u.size {
			return ferry.E(op, u.path, ferry.KindInvalid, "chunk list does not fit the size")
		}
		u.where[h] = append(u.where[h], len(u.refs))
		u.refs = append(u.refs, chunk.Ref{Hash: h, Off: u.off, Len: n})
		u.filled = append(u.filled, false)
		u.left++
		u.off += int64(n)
		if len(u.where[h]) > 1 {
			// A later place of a chunk whose bytes are here already
			// (sent unasked, or found) is filled now: nobody sends
			// them again.
			if err := u.copyFilled(h); err != nil {
				return err
			}
		}
	}
	return nil
}

// Write supplies the bytes of a listed chunk. Bytes that do not hash to h,
// or a hash not in the list, fail with KindInvalid.
func (u *Put) Write(h chunk.Hash, data []byte) error {
	const op = "chunkstore.Put"
	at, ok := u.where[h]
	if !ok {
		return ferry.E(op, u.path, ferry.KindInvalid, "chunk "+h.String()+" is not in the list")
	}
	if len(data) != u.refs[at[0]].Len || chunk.Sum(data) != h {
		return ferry.E(op, u.path, ferry.KindInvalid, "chunk "+h.String()+": bytes do not match the hash")
	}
	return u.fill(h, data)
}

// fill writes data at every unfilled place of h.
func (u *Put) fill(h chunk.Hash, data []byte) error {
	for _, i := range u.where[h] {
		if u.filled[i] {
			continue
		}
		if _, err := u.f.WriteAt(data, u.refs[i].Off); err != nil {
			return ferry.FromOS("chunkstore.Put", u.path, err)
		}
		u.filled[i] = true
		u.left--
	}
	return nil
}

// EndList ends the list: it must cover the size exactly. It then returns
// what Need returns for the chunks listed since Need was last called.
func (u *Put) EndList() ([]int, error) {
	const op = "chunkstore.Put"
	if u.ended {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "chunk list ended twice")
	}
	u.ended = true
	if u.off != u.size {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "chunk list does not cover the size")
	}
	return u.Need()
}

// Need looks at the chunks listed since it was last called, so that a
// client may send what is missing while it still lists the rest. It fills
// those the index holds (read back and checked) and returns the index in
// the list of one place of each other chunk it was not asked about before,
// in list order: the chunks the client must send.
func (u *Put) Need() ([]int, error) {
	const op = "chunkstore.Put"
	u.old.Wait()
	u.t.awaitSweep(u.ctx)
	var need []int
	for ; u.examined < len(u.refs); u.examined++ {
		i := u.examined
		r := u.refs[i]
		if u.filled[i] {
			continue
		}
		if err := u.ctx.Err(); err != nil {
			return nil, ferry.E(op, u.path, ferry.KindCanceled, err)
		}
		if u.asked[r.Hash] {
			continue // Its bytes are still to come and fill it then.
		}
		u.asked[r.Hash] = true
		b, err := u.t.index.ReadChunk(r.Hash, u.buf, u.path, u.t.Allowed)
		if err == nil && len(b) == r.Len {
			u.buf = b
			if err := u.fill(r.Hash, b); err != nil {
				return nil, err
			}
			continue
		}
		need = append(need, i)
	}
	return need, nil
}

// copyFilled fills the places of h that are not filled from one that is,
// if there is one.
func (u *Put) copyFilled(h chunk.Hash) error {
	for _, j := range u.where[h] {
		if !u.filled[j] {
			continue
		}
		r := u.refs[j]
		b := make([]byte, r.Len)
		if _, err := u.f.ReadAt(b, r.Off); err != nil {
			return ferry.FromOS("chunkstore.Put", u.path, err)
		}
		return u.fill(h, b)
	}
	return nil
}

// Complete reports whether every chunk arrived after the list ended.
func (u *Put) Complete() bool { return u.ended && u.left == 0 }

// Refs returns the list.
func (u *Put) Refs() []chunk.Ref { return u.refs }

// Assembled is the content of a put whose every chunk arrived, ready to
// replace its target. Committing it is a Put of it through the whole stack
// (the server puts it through the tree it serves), so that every layer
// above the chunk store sees the put as any other; when it reaches this
// Tree's Put unread, its file is renamed into place, not copied. A layer
// that wants the bytes reads them from it.
type Assembled struct {
	u    *Put
	f    *os.File // For reading, opened on the first Read.
	read bool
}

// Read reads the assembled content.
func (a *Assembled) Read(b []byte) (int, error) {
	if a.f == nil {
		f, err := a.u.t.root.Open(a.u.tmp[1:])
		if err != nil {
			return 0, ferry.FromOS("chunkstore.Assembled", a.u.path, err)
		}
		a.f = f
	}
	a.read = true
	return a.f.Read(b)
}

// Close releases what reading took.
func (a *Assembled) Close() error {
	if a.f != nil {
		return a.f.Close()
	}
	return nil
}

// Assembled syncs the temporary file and returns its content to be put.
// It fails with KindInvalid unless Complete.
func (u *Put) Assembled() (*Assembled, error) {
	const op = "chunkstore.Put"
	if !u.Complete() {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "not every chunk arrived")
	}
	if err := u.ctx.Err(); err != nil {
		return nil, ferry.E(op, u.path, ferry.KindCanceled, err)
	}
	if u.f != nil {
		u.closeFine()
		if err := u.f.Sync(); err != nil {
			return nil, ferry.FromOS(op, u.path, err)
		}
		if err := u.f.Close(); err != nil {
			return nil, ferry.FromOS(op, u.path, err)
		}
		u.f = nil
	}
	return &Assembled{u: u}, nil
}

// Commit puts the assembled content (Assembled) through via, the top of
// the stack the chunk store is part of (the server passes the tree it
// serves), so that every layer above sees the put.
func (u *Put) Commit(via ferry.Tree) (ferry.Dir, error) {
	a, err := u.Assembled()
	if err != nil {
		return nil, err
	}
	defer a.Close()
	return via.Put(u.ctx, u.path, u.d, ferry.Whole, a).Wait()
}

// commit gives the temporary file the attributes in d, renames it over the
// target and indexes it.
func (u *Put) commit(ctx context.Context, d ferry.Dir) (ferry.Dir, error) {
	const op = "chunkstore.Put"
	attrs := ferry.Dir{}
	for k, v := range d {
		switch {
		case k == ferry.AttrMode, k == ferry.AttrMtime, k == ferry.AttrUid, k == ferry.AttrGid, strings.HasPrefix(k, ferry.XattrPrefix):
			attrs[k] = v
		}
	}
	// Keep the mode and extended attributes of the file being replaced,
	// as local's Put does.
	old, err := u.t.Tree.Stat(ctx, u.path).Wait()
	if ferry.IsKind(err, ferry.KindNotExist) {
		attrs = u.t.Tree.InheritGroup(u.path, attrs)
	}
	if err != nil || old.Type() != ferry.TypeFile {
		old = nil
	}
	attrs.KeepXattrs(old)
	if _, ok := attrs[ferry.AttrMode]; !ok {
		attrs.SetMode(0o644)
		if old != nil {
			attrs.SetMode(old.Mode()) // Set-ID bits too, as local's Put keeps them.
		}
	}
	if err := u.t.Tree.SetTempAttrs(u.tmp, attrs); err != nil {
		return nil, err
	}
	k := u.t.trash.keep(u.path, false)
	if err := u.t.root.Rename(u.tmp[1:], u.path[1:]); err != nil {
		k.undo()
		return nil, ferry.E(op, u.path, err)
	}
	k.done()
	u.done = true
	dir, err := u.t.Stat(ctx, u.path).Wait()
	if err != nil {
		return nil, err
	}
	if fi, err := u.t.root.Lstat(u.path[1:]); err == nil && fi.Mode().IsRegular() {
		u.t.index.Set(u.path, store.StampOf(fi), u.refs)
	}
	return dir, nil
}

// Abort abandons the put; the target keeps its old content. The temporary
// file goes to the trash with the chunks that arrived (see
// trash.keepPartial), so that the put tried again resumes. It does nothing
// after Commit.
func (u *Put) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.old.Wait()
	u.closeFine()
	if u.f != nil {
		u.f.Close()
	}
	var arrived []chunk.Ref
	for i, r := range u.refs {
		if u.filled[i] {
			arrived = append(arrived, r)
		}
	}
	u.t.trash.keepPartial(u.tmp, arrived)
	u.t.root.Remove(u.tmp[1:])
}
