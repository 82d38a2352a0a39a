package chunkstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/store"
)

// TrashPrefix starts the paths under which the index knows the files of
// the trash. A tree path is rooted ("/..."), so none starts with it: trash
// files cannot be named, listed or fetched through the Tree, only their
// chunks read.
const TrashPrefix = "trash:"

// The trash's default bounds.
const (
	// DefaultTrashMax is the most bytes of files the trash keeps.
	DefaultTrashMax = 1 << 30
	// DefaultTrashAge is how long the trash keeps a file.
	DefaultTrashAge = 24 * time.Hour
	// DefaultTrashMin is the smallest file the trash keeps: smaller files
	// go whole on the wire anyway (remote.DefaultChunkMin).
	DefaultTrashMin = 64 << 10
)

// Options configure a Tree.
type Options struct {
	// IndexDir is the directory of the chunk index; "" keeps it in memory.
	IndexDir string
	// MaxChunks bounds the chunk entries of the index.
	MaxChunks int64
	// TrashDir is the directory of the trash, outside the served tree. It
	// defaults to IndexDir with ".trash" appended, or, for an index in
	// memory, to a temporary directory removed on Close. On the served
	// tree's file system, files go to the trash as hard links; elsewhere
	// they are copied.
	TrashDir string
	// TrashMax bounds the bytes of files the trash keeps, the oldest
	// evicted first: 0 means DefaultTrashMax, a negative value turns the
	// trash off.
	TrashMax int64
	// TrashAge is how long the trash keeps a file: 0 means DefaultTrashAge.
	TrashAge time.Duration
	// TrashMin is the smallest file the trash keeps: 0 means
	// DefaultTrashMin.
	TrashMin int64
}

// trashItem is a file in the trash.
type trashItem struct {
	name string // The time it was trashed in nanoseconds, 20 digits, then a random suffix.
	size int64
}

// path returns the path under which the index knows the item.
func (it trashItem) path() string { return TrashPrefix + it.name }

// at returns when the item was trashed, from its name.
func (it trashItem) at() time.Time {
	ns, _ := strconv.ParseInt(strings.SplitN(it.name, "-", 2)[0], 10, 64)
	return time.Unix(0, ns)
}

// trash keeps the last versions of replaced and removed files in a
// directory outside the tree, with their chunks in the index, bounded by
// bytes and age. A nil *trash keeps nothing.
type trash struct {
	tree  *os.Root // The served tree.
	dir   *os.Root // The trash directory.
	temp  bool     // dir is a temporary directory, removed on close.
	index *store.Index
	max   int64
	min   int64
	age   time.Duration

	mu    sync.Mutex
	items []trashItem // Oldest first.
	bytes int64

	ctx    context.Context // Ends with the Tree, stopping background work.
	cancel context.CancelFunc
	bg     sync.WaitGroup
	sem    chan struct{} // Bounds background indexing to one file at a time.
}

// TrashStats reports what the trash holds.
type TrashStats struct {
	Files int
	Bytes int64
}

// files is the index's view of the tree and the trash: paths that start
// with TrashPrefix name files of the trash.
type files struct {
	tree, trash store.RootFiles
}

func (f files) pick(p string) (store.RootFiles, string) {
	if name, ok := strings.CutPrefix(p, TrashPrefix); ok && f.trash.Root != nil {
		return f.trash, "/" + name
	}
	return f.tree, p
}

// Open implements store.Files.
func (f files) Open(p string) (store.File, store.Stamp, error) {
	r, q := f.pick(p)
	return r.Open(q)
}

// Stamp implements store.Files.
func (f files) Stamp(p string) (store.Stamp, error) {
	r, q := f.pick(p)
	return r.Stamp(q)
}

// openTrash opens the trash that o configures, dropping what outlived its
// age, and starts the sweep that evicts files as they age. It returns nil
// if o turns the trash off.
func openTrash(tree *os.Root, o Options) (*trash, error) {
	const op = "chunkstore.Open"
	if o.TrashMax < 0 {
		return nil, nil
	}
	tr := &trash{tree: tree, max: o.TrashMax, min: o.TrashMin, age: o.TrashAge, sem: make(chan struct{}, 1)}
	if tr.max == 0 {
		tr.max = DefaultTrashMax
	}
	if tr.age <= 0 {
		tr.age = DefaultTrashAge
	}
	if tr.min <= 0 {
		tr.min = DefaultTrashMin
	}
	dir := o.TrashDir
	switch {
	case dir == "" && o.IndexDir != "":
		dir = filepath.Clean(o.IndexDir) + ".trash"
	case dir == "":
		d, err := os.MkdirTemp("", "ferry-trash-")
		if err != nil {
			return nil, ferry.E(op, d, ferry.KindIO, err)
		}
		dir, tr.temp = d, true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, ferry.E(op, dir, err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, ferry.E(op, dir, err)
	}
	tr.dir = r
	tr.ctx, tr.cancel = context.WithCancel(context.Background())
	return tr, nil
}

// start loads what the trash holds, drops what its bounds no longer allow,
// and starts the sweep that evicts files as they age.
func (tr *trash) start(index *store.Index) {
	if tr == nil {
		return
	}
	tr.index = index
	var ents []os.DirEntry
	if d, err := tr.dir.Open("."); err == nil {
		ents, _ = d.ReadDir(-1)
		d.Close()
	}
	for _, de := range ents {
		it := trashItem{name: de.Name()}
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() || it.at().Unix() == 0 || strings.HasSuffix(it.name, partSuffix) {
			// A copy cut short by a crash, or something that is not ours.
			tr.dir.RemoveAll(it.name)
			index.Drop(it.path())
			continue
		}
		it.size = fi.Size()
		tr.items = append(tr.items, it)
		tr.bytes += it.size
	}
	sort.Slice(tr.items, func(i, j int) bool { return tr.items[i].name < tr.items[j].name })
	tr.evict(time.Now())
	tick := min(tr.age/4, time.Hour)
	tr.bg.Add(1)
	go func() {
		defer tr.bg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-tr.ctx.Done():
				return
			case now := <-t.C:
				tr.evict(now)
			}
		}
	}()
}

// close stops the sweep and background indexing, and removes a temporary
// trash.
func (tr *trash) close() {
	if tr == nil {
		return
	}
	tr.cancel()
	tr.bg.Wait()
	name := tr.dir.Name()
	tr.dir.Close()
	if tr.temp {
		os.RemoveAll(name)
	}
}

// rel turns a clean tree path into one relative to the tree's root.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// partSuffix ends the name of a copy into the trash until it is complete.
const partSuffix = ".part"

// pending is a file put in the trash before the operation that replaces or
// removes it, so that a failed operation can take it back.
type pending struct {
	tr   *trash
	from string      // The tree path it was kept from.
	old  store.Stamp // The version of from it holds.
	item trashItem
}

// keep puts the regular file at the tree path p in the trash before an
// operation replaces or removes it: as a hard link if the file will not
// change in place (it is renamed over or unlinked) and the trash is on the
// same file system, else as a copy. It returns nil if the file is not kept
// (absent, not a regular file, out of the trash's bounds, or an error:
// keeping is best effort and never fails the operation). The caller must
// end a pending keep with done or undo.
func (tr *trash) keep(p string, inPlace bool) *pending {
	if tr == nil {
		return nil
	}
	// The file is opened through the tree's os.Root and linked by its
	// descriptor, so a path that a client bends with symbolic links can
	// never make the trash take a file from outside the tree.
	f, fi, err := local.OpenRegular(tr.tree, rel(p))
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi.Size() < tr.min || fi.Size() > tr.max {
		return nil
	}
	it := newTrashItem(fi.Size())
	if (inPlace || !tr.link(f, it)) && !tr.copyFile(f, it.name) {
		return nil
	}
	return &pending{tr: tr, from: p, old: store.StampOf(fi), item: it}
}

// newTrashItem names a file of size bytes trashed now.
func newTrashItem(size int64) trashItem {
	var rnd [4]byte
	rand.Read(rnd[:])
	return trashItem{name: fmt.Sprintf("%020d-%s", time.Now().UnixNano(), hex.EncodeToString(rnd[:])), size: size}
}

// link makes it a hard link to the open file f, if the trash is on f's
// file system.
func (tr *trash) link(f *os.File, it trashItem) bool {
	dst := filepath.Join(tr.dir.Name(), it.name)
	return unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW) == nil
}

// keepPartial moves the temporary file tmp (a tree path) of an aborted
// put into the trash, with the chunks that had arrived, refs, in the
// index: a put cut short by a broken connection and tried again then finds
// them there and does not send them again. The file's other bytes are
// holes that no index entry points into. The caller removes tmp
// afterwards, kept or not; keeping is best effort, as for keep.
func (tr *trash) keepPartial(tmp string, refs []chunk.Ref) {
	if tr == nil {
		return
	}
	var n int64
	for _, r := range refs {
		n += int64(r.Len)
	}
	if n < tr.min {
		return
	}
	f, err := tr.tree.Open(rel(tmp))
	if err != nil {
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > tr.max {
		return
	}
	it := newTrashItem(fi.Size())
	if !tr.link(f, it) {
		return // A copy would cost what resending saves.
	}
	// The stamp is taken once tmp is gone: removing it changes the
	// link count, and so the stamp, of the trash's link.
	tr.tree.Remove(rel(tmp))
	tfi, err := tr.dir.Lstat(it.name)
	if err != nil || tr.index.Set(it.path(), store.StampOf(tfi), refs) != nil {
		tr.dir.Remove(it.name)
		return
	}
	tr.add(it)
}

// copyFile copies f into the trash as name, under a temporary name until
// complete.
func (tr *trash) copyFile(f *os.File, name string) bool {
	dst, err := tr.dir.OpenFile(name+partSuffix, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false
	}
	_, err = io.Copy(dst, io.NewSectionReader(f, 0, 1<<62))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = tr.dir.Rename(name+partSuffix, name)
	}
	if err != nil {
		tr.dir.Remove(name + partSuffix)
		return false
	}
	return true
}

// undo takes the kept file back out of the trash: the operation failed and
// the file is still where it was. It does nothing on nil.
func (k *pending) undo() {
	if k != nil {
		k.tr.dir.Remove(k.item.name)
	}
}

// done records the kept file once the operation replaced or removed the
// original: the index entries of the original move to the trash copy, or,
// if the index did not hold that version, the copy is indexed in the
// background. It then evicts what the bounds no longer allow. It does
// nothing on nil.
func (k *pending) done() {
	if k == nil {
		return
	}
	tr, tp := k.tr, k.item.path()
	fi, err := tr.dir.Lstat(k.item.name)
	if err != nil {
		return
	}
	moved, _ := tr.index.Rename(k.from, tp, k.old, store.StampOf(fi))
	tr.add(k.item)
	if !moved {
		tr.bg.Add(1)
		go func() {
			defer tr.bg.Done()
			select {
			case tr.sem <- struct{}{}:
			case <-tr.ctx.Done():
				return
			}
			defer func() { <-tr.sem }()
			tr.index.Chunks(tr.ctx, tp, func(chunk.Ref) error { return nil })
		}()
	}
}

// add counts it among the files of the trash, then evicts what the
// bounds no longer allow.
func (tr *trash) add(it trashItem) {
	tr.mu.Lock()
	tr.items = append(tr.items, it)
	tr.bytes += it.size
	tr.mu.Unlock()
	tr.evict(time.Now())
}

// wait waits for f, the operation that replaces or removes the kept file,
// and ends k by its outcome.
func wait[T any](k *pending, f *ferry.Future[T]) (T, error) {
	v, err := f.Wait()
	if err != nil {
		k.undo()
	} else {
		k.done()
	}
	return v, err
}

// evict removes the oldest files until the trash is within its bounds of
// bytes and age at now.
func (tr *trash) evict(now time.Time) {
	tr.mu.Lock()
	var out []trashItem
	for len(tr.items) > 0 && (tr.bytes > tr.max || now.Sub(tr.items[0].at()) > tr.age) {
		out = append(out, tr.items[0])
		tr.bytes -= tr.items[0].size
		tr.items = tr.items[1:]
	}
	tr.mu.Unlock()
	for _, it := range out {
		tr.dir.Remove(it.name)
		tr.index.Drop(it.path())
	}
}

// empty removes every file of the trash and returns how many and their
// bytes.
func (tr *trash) empty() (files int, bytes int64) {
	if tr == nil {
		return 0, 0
	}
	tr.mu.Lock()
	out := tr.items
	files, bytes = len(tr.items), tr.bytes
	tr.items, tr.bytes = nil, 0
	tr.mu.Unlock()
	for _, it := range out {
		tr.dir.Remove(it.name)
		tr.index.Drop(it.path())
	}
	return files, bytes
}

// reindex indexes every file of the trash again, for a rebuild of the
// index.
func (tr *trash) reindex(ctx context.Context) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	items := append([]trashItem(nil), tr.items...)
	tr.mu.Unlock()
	for _, it := range items {
		if ctx.Err() != nil {
			return
		}
		tr.index.Chunks(ctx, it.path(), func(chunk.Ref) error { return nil })
	}
}

// EmptyTrash removes every file the trash keeps, freeing their space at
// once; later puts of their content then send it whole. It returns how many
// files and bytes went.
func (t *Tree) EmptyTrash() (files int, bytes int64) { return t.trash.empty() }

// Trash reports what the trash holds.
func (t *Tree) Trash() TrashStats {
	tr := t.trash
	if tr == nil {
		return TrashStats{}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return TrashStats{Files: len(tr.items), Bytes: tr.bytes}
}

// cleanPath cleans p for an operation that may put a file in the trash.
// An unclean path is left for the local tree to refuse.
func cleanPath(p string) (string, bool) {
	c, err := ferry.CleanPath(p)
	return c, err == nil
}

// Put implements ferry.Tree. A whole-file Put over a regular file keeps
// the old version in the trash. The Assembled content of one of this
// Tree's chunked puts, unread, is renamed into place.
func (t *Tree) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	c, ok := cleanPath(p)
	if a, is := data.(*Assembled); is && ok && a.u.t == t && !a.read && c == a.u.path && off == ferry.Whole && !a.u.done {
		return ferry.Go(func() (ferry.Dir, error) {
			if err := ctx.Err(); err != nil {
				return nil, ferry.E("chunkstore.Put", c, ferry.KindCanceled, err)
			}
			return a.u.commit(ctx, d)
		})
	}
	if !ok || t.trash == nil || d.Type() != ferry.TypeFile && d.Type() != ferry.TypeSymlink || d.Type() == ferry.TypeFile && off != ferry.Whole || ctx.Err() != nil {
		return t.Tree.Put(ctx, p, d, off, data)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		return wait(t.trash.keep(c, false), t.Tree.Put(ctx, p, d, off, data))
	})
}

// Move implements ferry.Tree. A regular file that the move replaces goes to
// the trash, and the index follows the moved file.
func (t *Tree) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	cf, ok1 := cleanPath(from)
	ct, ok2 := cleanPath(to)
	if !ok1 || !ok2 || ctx.Err() != nil || cf == ct {
		return t.Tree.Move(ctx, from, to)
	}
	var k *pending
	fromFi, ferr := t.root.Lstat(rel(cf))
	if toFi, err := t.root.Lstat(rel(ct)); ferr == nil && err == nil && !os.SameFile(fromFi, toFi) {
		k = t.trash.keep(ct, false)
	}
	d, err := wait(k, t.Tree.Move(ctx, from, to))
	if err != nil {
		return ferry.Resolved(d, err)
	}
	if ferr == nil && fromFi.Mode().IsRegular() {
		if fi, err := t.root.Lstat(rel(ct)); err == nil {
			t.index.Rename(cf, ct, store.StampOf(fromFi), store.StampOf(fi))
		}
	}
	return ferry.Resolved(d, nil)
}

// Remove implements ferry.Tree. A removed regular file goes to the trash.
func (t *Tree) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	c, ok := cleanPath(p)
	if !ok || ctx.Err() != nil || c == "/" {
		return t.Tree.Remove(ctx, p)
	}
	_, err := wait(t.trash.keep(c, false), t.Tree.Remove(ctx, p))
	if err != nil {
		return ferry.Resolved(struct{}{}, err)
	}
	t.index.Drop(c)
	return ferry.Resolved(struct{}{}, nil)
}

// RemoveAll implements ferry.Tree. The regular files removed go to the
// trash, as many as its bound on bytes takes.
func (t *Tree) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	c, ok := cleanPath(p)
	if !ok || ctx.Err() != nil || c == "/" || t.trash == nil {
		return t.Tree.RemoveAll(ctx, p)
	}
	return ferry.Go(func() (struct{}, error) {
		var ks []*pending
		var bytes int64
		s := t.Tree.Find(ctx, c, fmt.Sprintf("type=f & size>=%d", t.trash.min))
		for e := range s.All() {
			if e.Err != nil || bytes+e.Dir.Size() > t.trash.max {
				continue
			}
			if k := t.trash.keep(e.Dir.Path(), false); k != nil {
				ks = append(ks, k)
				bytes += e.Dir.Size()
			}
		}
		_, err := t.Tree.RemoveAll(ctx, p).Wait()
		for _, k := range ks {
			if _, serr := t.root.Lstat(rel(k.from)); err != nil && serr == nil {
				k.undo()
				continue
			}
			k.done()
		}
		return struct{}{}, err
	})
}

// Wstat implements ferry.Tree. A file truncated shorter is first copied to
// the trash.
func (t *Tree) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	c, ok := cleanPath(p)
	if _, trunc := d[ferry.AttrSize]; !ok || !trunc || ctx.Err() != nil {
		return t.Tree.Wstat(ctx, p, d)
	}
	var k *pending
	if fi, err := t.root.Lstat(rel(c)); err == nil && fi.Mode().IsRegular() && d.Size() < fi.Size() && d.Size() >= 0 {
		k = t.trash.keep(c, true)
	}
	return ferry.Resolved(wait(k, t.Tree.Wstat(ctx, p, d)))
}
