package fusefs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
)

// wbuf buffers a file open for writing in a local temporary file, shared by
// every descriptor open on the file, and stores it with one whole-file Put
// when a descriptor is flushed or synced.
type wbuf struct {
	mu       sync.Mutex
	f        *os.File // Removed from its directory at once.
	size     int64
	dirty    bool      // The buffer differs from the server's file.
	created  bool      // Created here; not yet on the server at all.
	unlinked bool      // Removed or replaced: never to be stored.
	refs     int       // Open descriptors; guarded by the node's mu.
	base     ferry.Dir // The attributes last known.
	set      ferry.Dir // Attributes to send with the next Put.
	mtime    time.Time // Of the last write here.
	// ctime is of the last change here, a write or one of attributes:
	// the file's status changed then, as a local disk's ctime says.
	ctime time.Time
	// snap is the content as of the last flush, as handed to the cache,
	// which keeps it: nothing writes into it below its length. low is
	// the lowest offset written or truncated to since (contentLocked).
	snap []byte
	low  int64
	// movedParent and movedName are the file's name from a rename until
	// go-fuse's tree has it, which go-fuse updates only after the
	// rename's call returns (see fileNode.pathLocked).
	movedParent *fs.Inode
	movedName   string
	// alias is another name of a file with several, taken when the name
	// removed was the one a store would use, until go-fuse's tree shows
	// the file under a name other than removed (fileNode.pathLocked).
	alias, removed string
	// last is the name the buffer was loaded or last stored under: where
	// it is stored when go-fuse's tree holds the node under no name,
	// unless that name was removed here.
	last string
}

func newWbuf(dir string, base ferry.Dir) (*wbuf, error) {
	f, err := os.CreateTemp(dir, "ferry-mount-")
	if err != nil {
		return nil, ferry.E("fusefs.Open", dir, ferry.KindIO, err)
	}
	os.Remove(f.Name())
	return &wbuf{f: f, base: base, set: ferry.Dir{}, mtime: time.Now(), last: base.Path()}, nil
}

// attrs returns the file's attributes as the buffer sees them.
func (w *wbuf) attrs() ferry.Dir {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.attrsLocked()
}

func (w *wbuf) attrsLocked() ferry.Dir {
	d := w.base.Clone()
	d.SetInt(ferry.AttrSize, w.size)
	if w.dirty {
		d.SetMtime(w.mtime)
	}
	for k, v := range w.set {
		d[k] = v
	}
	if w.ctime.After(d.Ctime()) {
		d.SetInt(ferry.AttrCtime, w.ctime.UnixNano())
	}
	if w.unlinked {
		d.SetInt(ferry.AttrNlink, 0)
	}
	return d
}

// relinked records that the stored file has the link count of d now.
func (w *wbuf) relinked(d ferry.Dir) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.base = w.base.Clone()
	w.base[ferry.AttrNlink] = d[ferry.AttrNlink]
}

func (w *wbuf) isCreated() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.created && !w.unlinked
}

// setattr applies a truncate to the buffer and records the other
// attributes for the next Put: all of them for a file not yet stored, and
// the mtime for a dirty one (whose Put would otherwise set it anew).
func (w *wbuf) setattr(want ferry.Dir, hasSize bool, size int64) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctime = time.Now()
	if hasSize {
		if err := w.f.Truncate(size); err != nil {
			return errno(ferry.E("fusefs.Setattr", "", ferry.KindIO, err))
		}
		w.size = size
		w.low = min(w.low, size)
		w.dirty = true
		w.mtime = w.ctime
		delete(w.set, ferry.AttrMtime)
	}
	if w.created {
		for k, v := range want {
			w.set[k] = v
		}
		// A file not yet stored has no extended attribute to remove.
		w.set.KeepXattrs(nil)
		return 0
	}
	for k, v := range want {
		w.base = w.base.Clone()
		w.base[k] = v
	}
	if t, ok := want[ferry.AttrMtime]; ok && w.dirty {
		w.set[ferry.AttrMtime] = t
	}
	return 0
}

func (w *wbuf) readAt(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if off >= w.size {
		return fuse.ReadResultData(nil), 0
	}
	if rest := w.size - off; int64(len(dest)) > rest {
		dest = dest[:rest]
	}
	n, err := w.f.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (w *wbuf) writeAt(data []byte, off int64) (uint32, syscall.Errno) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.low = min(w.low, off)
	n, err := w.f.WriteAt(data, off)
	if err != nil {
		return uint32(n), syscall.EIO
	}
	if end := off + int64(n); end > w.size {
		w.size = end
	}
	w.dirty = true
	w.mtime = time.Now()
	w.ctime = w.mtime
	delete(w.set, ferry.AttrMtime)
	return uint32(n), 0
}

// contentLocked returns the buffer's content as a slice the cache may keep,
// since nothing writes into it. A file that only grew since the last flush
// (a log appended to by one program after another, as configure's
// config.log) costs only what it gained: that is read in after the last
// flush's content, in the same array beyond its length. Any other file is
// read whole into a new one.
func (w *wbuf) contentLocked() ([]byte, error) {
	n := int64(len(w.snap))
	if w.snap == nil || w.low < n || w.size < n {
		w.snap = make([]byte, w.size)
		n = 0
	} else if int64(cap(w.snap)) < w.size {
		grown := make([]byte, n, max(w.size, 2*int64(cap(w.snap))))
		copy(grown, w.snap)
		w.snap = grown
	}
	w.snap = w.snap[:w.size]
	if _, err := w.f.ReadAt(w.snap[n:], n); err != nil && err != io.EOF {
		w.snap = nil
		return nil, err
	}
	w.low = w.size
	// Capped at its length, so that an append by a holder copies rather
	// than writes where the next snapshot goes.
	return w.snap[:w.size:w.size], nil
}

// snapshot is a reader of content the cache may keep as it is
// (cache.Snapshotter).
type snapshot struct {
	*bytes.Reader
	b []byte
}

func (s snapshot) Snapshot() []byte { return s.b }

// handle is an open file.
type handle struct {
	n  *fileNode
	wb *wbuf // Set for a descriptor open for writing.
	// exec is set for the open of a program being executed (execve).
	exec bool
	r    *stream // Set for one open for reading only...
	// ...unless the file's content was prefetched (the cache's Contents): then
	// r is nil and mem holds it.
	mem []byte
	// lazy is set instead, to the attributes seen at open, when the
	// kernel's cached pages were kept: the first read that misses them
	// chooses between mem and r.
	lazy ferry.Dir
	mu   sync.Mutex // Guards lazy, mem and r.
}

var (
	_ fs.FileReader   = (*handle)(nil)
	_ fs.FileWriter   = (*handle)(nil)
	_ fs.FileFlusher  = (*handle)(nil)
	_ fs.FileReleaser = (*handle)(nil)
)

// Open implements fs.NodeOpener. A file opened for writing gets (or
// shares) a buffer loaded with its content; one opened for reading streams
// from the server, keeping the kernel's cached pages only if the file has
// not changed since the last open.
func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n := f
	trunc := flags&syscall.O_TRUNC != 0
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || trunc {
		// A file being executed is not written, as on a local disk. The
		// kernel checks that only after this open, and an O_TRUNC open
		// (atomic, which the mount asks for) has by then set the size to
		// 0: the program's next page fault would kill it, and the open
		// would then succeed.
		n.mu.Lock()
		busy := n.execs > 0
		n.mu.Unlock()
		if busy {
			return nil, 0, syscall.ETXTBSY
		}
		wb, e := n.openWrite(ctx, trunc)
		if e != 0 {
			return nil, 0, e
		}
		return &handle{n: n, wb: wb}, 0, 0
	}
	h, keep, e := n.openRead(ctx)
	if e != 0 {
		return nil, 0, e
	}
	// A descriptor open for reading only has nothing to store on close:
	// the kernel need not ask (grep -r closes every file it reads).
	keep |= fuse.FOPEN_NOFLUSH
	if flags&fmodeExec != 0 {
		n.mu.Lock()
		n.execs++
		n.mu.Unlock()
		h.exec = true
	}
	return h, keep, 0
}

// fmodeExec is FMODE_EXEC, which the kernel adds to the flags of the open
// that execve(2) makes.
const fmodeExec = 0x20

// openRead opens the file for reading only.
func (n *fileNode) openRead(ctx context.Context) (*handle, uint32, syscall.Errno) {
	if n.hasBuffer() {
		return &handle{n: n, r: &stream{n: n}}, fuse.FOPEN_KEEP_CACHE, 0
	}
	p, ok := n.path()
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	var d ferry.Dir
	var err error
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	if n.s.cache.Leased() {
		d, err = n.s.cache.Stat(cctx, p).Wait()
	} else {
		// Without a watch, an open asks the server: it must see the
		// last close by anyone.
		d, err = n.s.cache.Fresh(cctx, p)
	}
	if err != nil {
		return nil, 0, errno(err)
	}
	if d.IsDir() {
		return nil, 0, syscall.EISDIR
	}
	n.remember(d)
	var keep uint32
	n.mu.Lock()
	if n.seenMtime == d[ferry.AttrMtime] && n.seenSize == d.Size() {
		keep = fuse.FOPEN_KEEP_CACHE
	}
	n.seenMtime, n.seenSize = d[ferry.AttrMtime], d.Size()
	n.mu.Unlock()
	if keep != 0 {
		// The kernel likely holds the pages: nothing is fetched unless
		// it asks for one (see handle.Read).
		return &handle{n: n, lazy: d}, keep, 0
	}
	if data, ok := n.s.cache.Contents(cctx, d); ok {
		return &handle{n: n, mem: data}, keep, 0
	}
	return &handle{n: n, r: &stream{n: n}}, keep, 0
}

// openWrite returns the node's buffer, making and loading it if needed.
func (n *fileNode) openWrite(ctx context.Context, trunc bool) (*wbuf, syscall.Errno) {
	n.mu.Lock()
	wb := n.shareLocked(trunc)
	n.mu.Unlock()
	if wb != nil {
		return wb, 0
	}
	p, ok := n.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	// Under a write lease the cache knows the file as the server will
	// have it, and holds what it keeps back of it: configure's appends to
	// config.log and confdefs.h wait for nothing.
	leased := n.s.cache.WriteLeased(p)
	if !leased {
		// Not under n.mu: the store in the background waited for
		// here records its result on the node as it ends.
		if err := n.s.cache.Settle(cctx, p); err != nil {
			return nil, errno(err)
		}
	}
	// Content that will be loaded must be the latest, so the server is
	// asked; for content that is thrown away (O_TRUNC: cp, tar, a
	// compiler's output over the last build's) the attributes the watch
	// keeps current will do, which spares a round trip per file.
	var d ferry.Dir
	var err error
	if (trunc || leased) && n.s.cache.Leased() {
		d, err = n.s.cache.Stat(cctx, p).Wait()
	} else {
		d, err = n.s.cache.Fresh(cctx, p)
	}
	if err != nil {
		return nil, errno(err)
	}
	if d.IsDir() {
		return nil, syscall.EISDIR
	}
	wb, err = newWbuf(n.s.opt.TempDir, d)
	if err != nil {
		return nil, errno(err)
	}
	// A hidden file is removed once no descriptor can be open on it
	// (gone.go): what is written to it is never stored.
	wb.unlinked = n.gone.Load() != nil
	if trunc {
		wb.dirty = d.Size() != 0
	} else if d.Size() > 0 {
		// The whole file is loaded: writes replace it whole.
		r := n.s.cache.Get(context.WithoutCancel(ctx), p, 0, -1)
		size, err := io.Copy(wb.f, r)
		r.Close()
		if err != nil {
			wb.f.Close()
			return nil, errno(err)
		}
		wb.size = size
		wb.base = d.Clone()
		wb.base.SetInt(ferry.AttrSize, size)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if shared := n.shareLocked(trunc); shared != nil {
		// Another open made one meanwhile.
		wb.f.Close()
		return shared, 0
	}
	wb.refs = 1
	n.wb = wb
	n.pages.gen.Add(1) // Writes go into the kernel's pages: none may be given.
	n.seenMtime, n.seenSize = d[ferry.AttrMtime], d.Size()
	return wb, 0
}

// shareLocked returns the node's buffer, if it has one, for one more
// descriptor, truncated with trunc. n.mu is held.
func (n *fileNode) shareLocked(trunc bool) *wbuf {
	if n.wb == nil {
		return nil
	}
	n.wb.refs++
	if trunc {
		n.wb.setattr(nil, true, 0)
	}
	return n.wb
}

// flush stores the node's buffer if it holds changes: close-to-open
// consistency, the data is on the server when close returns. With
// Options.WriteBack it is stored in the background instead, where it can.
// Either way it reports a background store of the file that failed since
// the last flush.
func (n *fileNode) flush(ctx context.Context) syscall.Errno {
	n.mu.Lock()
	wb := n.wb
	n.mu.Unlock()
	if wb == nil {
		if p, ok := n.path(); ok {
			return errno(n.s.cache.Failed(p))
		}
		return 0
	}
	// The path is taken under the buffer's lock, which an unlink or a
	// rename of the file holds across its call: a store never lands
	// under a name the file no longer has.
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return n.flushLocked(ctx, wb)
}

// flushLocked is flush with wb, the node's buffer, locked.
func (n *fileNode) flushLocked(ctx context.Context, wb *wbuf) syscall.Errno {
	p, ok := n.pathLocked(wb)
	if ok {
		if err := n.s.cache.Failed(p); err != nil {
			return errno(err)
		}
	}
	if !wb.dirty || wb.unlinked {
		return 0
	}
	if !ok {
		// The file lives on under names this mount does not know (its
		// name here was removed, the others never looked up): what was
		// written cannot be stored, and the close says so.
		wb.unlinked = true
		n.s.log.Error("a file's changes are lost: it has no name here to store them under")
		return syscall.EIO
	}
	wb.last = p
	d := ferry.Dir{ferry.AttrType: ferry.TypeFile}
	for k, v := range wb.set {
		d[k] = v
	}
	if !wb.created {
		// A whole-file Put makes a new file: keep the old owner.
		if u := wb.base.Int(ferry.AttrUid); u != n.s.rootUid {
			d.SetInt(ferry.AttrUid, u)
		}
		if g := wb.base.Int(ferry.AttrGid); g != n.s.rootGid {
			d.SetInt(ferry.AttrGid, g)
		}
	}
	// A file with other names is written in place, as on a local disk
	// (and no more atomically): a new file renamed over this name would
	// leave the other names with the old content.
	inPlace := !wb.created && wb.base.Linked()
	if n.s.opt.WriteBack {
		// The server takes the mtime the kernel has seen, so that the
		// attributes shown until a store in the background ends stay
		// true.
		if _, ok := d[ferry.AttrMtime]; !ok {
			d.SetMtime(wb.mtime)
		}
	}
	// The Put is not interrupted with the request: see Server.ctx.
	cctx := context.WithoutCancel(ctx)
	off := ferry.Whole
	if inPlace {
		off = 0
		if wb.base.Size() > wb.size {
			size := ferry.Dir{}
			size.SetInt(ferry.AttrSize, wb.size)
			if _, err := n.s.cache.Wstat(cctx, p, size).Wait(); err != nil {
				return errno(err)
			}
		}
	}
	// With write-back the cache may store it in the background (see
	// cache.FS.Put), from a snapshot of the content: got is then what
	// the file will be.
	var data io.Reader = io.NewSectionReader(wb.f, 0, wb.size)
	if n.s.opt.WriteBack && !inPlace && wb.size <= cache.SnapshotMax {
		b, err := wb.contentLocked()
		if err != nil {
			return errno(ferry.E("fusefs.Flush", p, ferry.KindIO, err))
		}
		data = snapshot{bytes.NewReader(b), b}
	}
	got, err := n.s.cache.Put(cctx, p, d, off, data).Wait()
	if err != nil {
		n.s.log.Warn("storing a file failed", "path", p, "err", err)
		if wb.created {
			// The file never reached the server: its name goes, as
			// that of a file whose creation failed, and the buffer
			// belongs to the open descriptors alone.
			wb.unlinked = true
			n.s.forgetUnstored(p, time.Second)
		}
		return errno(err)
	}
	wb.dirty, wb.created = false, false
	wb.base, wb.set = got, ferry.Dir{}
	n.remember(got)
	n.mu.Lock()
	n.seenMtime, n.seenSize = got[ferry.AttrMtime], got.Size()
	n.mu.Unlock()
	// The kernel holds the attributes of the buffer (the mtime of the
	// last write here); the server's are now the truth, unless they are
	// the same (with write-back the server takes the kernel's mtime):
	// then the next open need not ask for them again.
	if got[ferry.AttrMtime] != d[ferry.AttrMtime] || got.Size() != wb.size {
		n.NotifyContent(-1, 0)
	}
	return 0
}

// pathLocked is the file's path as a store of wb must use it: the name a
// rename gave it even before go-fuse's tree has it. wb.mu is held.
func (n *fileNode) pathLocked(wb *wbuf) (string, bool) {
	if wb.movedParent != nil {
		name, parent := n.Parent()
		if parent != wb.movedParent || name != wb.movedName {
			dir, ok := nodeOf(wb.movedParent).path()
			return path.Join(dir, wb.movedName), ok
		}
		wb.movedParent = nil
	}
	p, ok := n.path()
	if wb.alias != "" {
		if !ok || p == wb.removed {
			return wb.alias, true
		}
		wb.alias = ""
	}
	if !ok && wb.last != "" && wb.last != wb.removed {
		return wb.last, true
	}
	return p, ok
}

// forgetUnstored forgets the file at p, whose store failed, in the cache
// and the kernel: this mount shows what the server has. It waits up to
// wait for the kernel to take the notice, which is sent from a goroutine
// of its own: an fsync waiting for a store may hold the directory's lock
// that the kernel needs to take it.
func (s *Server) forgetUnstored(p string, wait time.Duration) {
	s.cache.Unstored(p)
	done := make(chan struct{})
	go func() {
		s.notify(p, false, true)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// Read implements fs.FileReader: from the buffer while the file is open
// for writing anywhere, else from the stream.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	wb := h.wb
	if wb == nil {
		h.n.mu.Lock()
		wb = h.n.wb
		h.n.mu.Unlock()
	}
	if wb != nil {
		return wb.readAt(dest, off)
	}
	h.choose(ctx)
	if h.r == nil {
		return readAt(h.mem, dest, off), 0
	}
	return h.r.read(ctx, dest, off)
}

// readToEnd reports whether a read of n bytes at off reached the end of
// the content the handle holds whole in memory.
func (h *handle) readToEnd(off int64, n int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wb == nil && h.r == nil && h.lazy == nil && off+int64(n) >= int64(len(h.mem))
}

// choose sets mem or r of a lazy handle on its first read.
func (h *handle) choose(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lazy == nil {
		return
	}
	cctx, cancel := h.n.s.ctx(ctx)
	defer cancel()
	if data, ok := h.n.s.cache.Contents(cctx, h.lazy); ok {
		h.mem = data
	} else {
		h.r = &stream{n: h.n}
	}
	h.lazy = nil
}

// Write implements fs.FileWriter.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.wb == nil {
		return 0, syscall.EBADF
	}
	written, e := h.wb.writeAt(data, off)
	if e == 0 && h.n.s.kernel.noOpen.Load() {
		// As a write with no handle (unclosed.go): this handle's
		// close stores it.
		e = h.n.written(ctx, true)
	}
	return written, e
}

// Flush implements fs.FileFlusher; close(2) calls it.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	if h.wb == nil {
		return 0
	}
	return h.n.flush(ctx)
}

// Release implements fs.FileReleaser: the last descriptor of a buffer
// stores what is left (a flush failed earlier, or a shared mapping wrote
// after the close) and drops it. An earlier one stores nothing: what the
// others wrote since its close is theirs to store on their own close (the
// kernel sends a release late, and a store then could land after an
// unlink of the file).
func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	r := h.r
	h.mu.Unlock()
	if r != nil {
		r.close()
	}
	if h.exec {
		h.n.mu.Lock()
		h.n.execs--
		h.n.mu.Unlock()
	}
	if h.wb == nil {
		return 0
	}
	h.n.mu.Lock()
	last := h.wb.refs == 1
	h.n.mu.Unlock()
	if last {
		if e := h.n.flush(ctx); e != 0 {
			h.n.s.log.Error("a file's changes are lost: storing failed on last close", "errno", e)
		}
	}
	h.n.mu.Lock()
	h.wb.refs--
	last = h.wb.refs == 0
	if last && h.n.wb == h.wb {
		h.n.wb = nil
	}
	h.n.mu.Unlock()
	if last {
		h.wb.mu.Lock()
		h.wb.f.Close()
		h.wb.snap = nil
		h.wb.mu.Unlock()
		// The file's own read handle (unopened.go) read through the
		// buffer, and would now read from the server, or what it held
		// before the writes: the next read opens one anew, from what
		// the cache keeps of the store.
		h.n.dropUnopened()
	}
	return 0
}

// stream reads a file with one Get from the offset read, and keeps reading
// ahead of the kernel in the background so the link stays busy.
type stream struct {
	n *fileNode

	mu     sync.Mutex
	ch     chan chunk
	cancel context.CancelFunc
	cur    []byte
	pos    int64 // The offset of cur[0].
	err    error // The stream's end (io.EOF) or failure, once cur is used up.
	grew   bool  // The file went on beyond a count asked for (errLimit).
}

// errLimit ends a stream whose Get asked for a count: the file may go on
// beyond it (it grew since the size the count came from), so a read that
// wants more starts a Get of the rest rather than taking it for the end.
var errLimit = errors.New("end of the bytes asked for")

type chunk struct {
	data []byte
	err  error
}

// readAhead is how many chunks of up to chunkSize the pump may hold.
const (
	readAhead = 16
	chunkSize = 256 << 10
	// maxSkip is how far ahead of the stream a read may land and still
	// be served by reading on rather than starting a new Get.
	maxSkip = 1 << 20
)

func (s *stream) start(off int64) syscall.Errno {
	s.stop()
	p, ok := s.n.path()
	if !ok {
		return syscall.ENOENT
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The pump is bounded by the connection's own timeouts (see next);
	// so is waiting for the file's background store.
	if err := s.n.s.cache.Settle(ctx, p); err != nil {
		cancel()
		return errno(err)
	}
	// A small file is asked for by its size, which lets the tree below
	// send it as a small call rather than behind bulk data (a remote
	// client's SmallGet). The size is the one the open saw; if the file
	// grew since, a read beyond it starts a new Get (errLimit).
	count := int64(-1)
	s.n.mu.Lock()
	size := s.n.seenSize
	s.n.mu.Unlock()
	if size <= cache.SmallFile && off < size && !s.grew {
		count = size - off
	}
	r := s.n.s.cache.Get(ctx, p, off, count)
	ch := make(chan chunk, readAhead)
	go func() {
		defer close(ch)
		defer r.Close()
		for {
			buf := make([]byte, chunkSize)
			n, err := io.ReadAtLeast(r, buf, 1)
			if n > 0 {
				select {
				case ch <- chunk{data: buf[:n]}:
				case <-ctx.Done():
					return
				}
			}
			if err == io.EOF && count >= 0 {
				err = errLimit
			}
			if err != nil {
				select {
				case ch <- chunk{err: err}:
				case <-ctx.Done():
				}
				return
			}
		}
	}()
	s.ch, s.cancel, s.cur, s.pos, s.err = ch, cancel, nil, off, nil
	return 0
}

func (s *stream) stop() {
	if s.cancel != nil {
		s.cancel()
		s.cancel, s.ch = nil, nil
	}
}

func (s *stream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop()
}

// next makes cur non-empty, or sets err. It does not heed the request's
// interrupts: the pump is bounded by the connection's own timeouts.
func (s *stream) next() {
	for len(s.cur) == 0 && s.err == nil {
		c, ok := <-s.ch
		switch {
		case !ok:
			s.err = io.EOF
		case c.err != nil:
			s.err = c.err
		default:
			s.cur = c.data
		}
	}
}

// readOn handles the end of a Get that asked for a count (errLimit): if
// the file is now known to be longer than the stream's position (it grew
// since the open), a Get of the rest starts at off; otherwise the stream
// has reached the file's end. The kernel asks beyond the end of a small
// file as a matter of course (a page at a time), so that costs no call.
func (s *stream) readOn(ctx context.Context, off int64) syscall.Errno {
	d, e := s.n.attrs(ctx)
	if e != 0 || d.Size() <= s.pos {
		s.err = io.EOF
		return 0
	}
	s.grew = true
	return s.start(off)
}

func (s *stream) read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil || off < s.pos || off > s.pos+int64(len(s.cur))+maxSkip || (s.err != nil && s.err != io.EOF && s.err != errLimit) {
		if e := s.start(off); e != 0 {
			return nil, e
		}
	}
	// Skip to off.
	for s.pos < off {
		s.next()
		if len(s.cur) == 0 && s.err == errLimit {
			if e := s.readOn(ctx, off); e != 0 {
				return nil, e
			}
			break
		}
		if len(s.cur) == 0 {
			break
		}
		k := min(int64(len(s.cur)), off-s.pos)
		s.cur, s.pos = s.cur[k:], s.pos+k
	}
	n := 0
	for n < len(dest) && s.pos == off+int64(n) {
		s.next()
		if len(s.cur) == 0 && s.err == errLimit {
			if e := s.readOn(ctx, s.pos); e != 0 {
				return nil, e
			}
			continue
		}
		if len(s.cur) == 0 {
			break
		}
		k := copy(dest[n:], s.cur)
		s.cur, s.pos, n = s.cur[k:], s.pos+int64(k), n+k
	}
	// A read that stops short of what was asked for tells the kernel the
	// file ends there (it trims its size), so a failure mid-read fails
	// the whole read, whatever arrived before it.
	if n < len(dest) && s.err != nil && s.err != io.EOF {
		err := s.err
		s.stop()
		return nil, errno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}
