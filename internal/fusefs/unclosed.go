package fusefs

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ferryfs/ferry"
)

// When the kernel opens files by itself (kernelFS) on a mount that writes,
// no open and no release is heard: a write comes with no handle
// (fileNode.Write). The close is still heard, as a FLUSH with no handle
// (fileNode.Flush), and the mount keeps the kernel sending it. So a file
// written is kept in its own buffer and stored at the first of these: the
// close of a descriptor on it (which is where another client's open must
// see it: close-to-open), before the mount's next change of any other
// kind (so the tree below gets changes in the order they were made),
// before the cache waits for what it keeps back at or below the file (a
// sync; unmount; a recall or release of its write lease, but only once
// its close was heard: another client sees what the last close left, as
// with a handle), at fsync, and
// unclosedIdle after the last write (at most unclosedMax after the first
// not yet stored: a descriptor kept open for long, a shared mapping
// written after its close). Under a write lease the close stores
// nothing: what is kept back reaches the server in order, at the latest
// before another client's open (the recall). A file made by O_CREAT is stored at its
// first close too, as one made with a handle is (Create), so that what
// another client sees of it is all of what was written or none: a rename
// of it elsewhere between its making and its content would leave the
// content stored under its old name. A truncation by path (truncate(2))
// has no close to come and is stored before it returns unless kept back,
// but for one to size 0, which the kernel sends as it sends O_TRUNC
// (node.change).

// unclosedIdle is how long the writes of files with no close to come are
// kept after the last before they are stored and the files' own buffers
// dropped.
const unclosedIdle = time.Second

// unclosedMax bounds how long a file written keeps waiting for its close.
const unclosedMax = 5 * time.Second

// unclosed holds the files written with no close to come.
type unclosed struct {
	mu    sync.Mutex
	files map[*fileNode]struct{} // Written since last stored.
	// open holds the files written since their last close was heard:
	// a recall leaves them to their close (handover).
	open map[*fileNode]struct{}
	own  map[*fileNode]struct{} // With a buffer of their own (fileNode.own).
	// storing holds the files taken from files whose store is under
	// way, and stored is closed (and made anew) when one ends: a
	// recall that finds a file's store begun by another caller (the
	// idle timer, a change of another kind) waits for it rather than
	// acknowledge before the store is queued.
	storing map[*fileNode]int
	stored  chan struct{}
	timer   *time.Timer
	since   time.Time // of the first write in files
	// trimming is set while more than ownMax files have a buffer of
	// their own and a trim (trimOwn) is under way.
	trimming bool
}

var _ fs.NodeWriter = (*fileNode)(nil)

// Write implements fs.NodeWriter: through the descriptor's handle, or,
// for a write the kernel makes with none, through the file's own.
func (n *fileNode) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if w, ok := f.(fs.FileWriter); ok {
		return w.Write(ctx, data, off)
	}
	if f != nil {
		return 0, syscall.EBADF
	}
	h, e := n.ownWriter(ctx, false)
	if e != 0 {
		return 0, e
	}
	defer n.doneOwn()
	written, e := h.wb.writeAt(data, off)
	if e != 0 {
		return written, e
	}
	return written, n.written(ctx, true)
}

var _ fs.NodeFlusher = (*fileNode)(nil)

// Flush implements fs.NodeFlusher; close(2) calls it. A descriptor with a
// handle flushes that; one the kernel opened by itself has none, and its
// close stores what was written with no handle, unless a write lease
// keeps it back (see unclosed).
func (n *fileNode) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	if fl, ok := f.(fs.FileFlusher); ok {
		return fl.Flush(ctx)
	}
	if f != nil || !n.s.closed(n) {
		return 0
	}
	if p, ok := n.path(); ok && n.s.cache.KeepsBack(ctx, p) {
		return 0
	}
	return n.s.storeUnclosedWhere(ctx, func(o *fileNode) bool { return o == n })
}

// ownWriter returns the handle the file's writes with no handle go
// through, with its buffer loaded (or, with trunc, truncated), and one
// more use of it in progress, which doneOwn ends.
func (n *fileNode) ownWriter(ctx context.Context, trunc bool) (*handle, syscall.Errno) {
	n.mu.Lock()
	h := n.own
	if h != nil {
		n.ownUses++
	}
	n.mu.Unlock()
	if h != nil {
		if trunc {
			h.wb.setattr(nil, true, 0)
		}
		return h, 0
	}
	wb, e := n.openWrite(ctx, trunc)
	if e != 0 {
		return nil, e
	}
	n.s.ownMade.Add(1)
	n.mu.Lock()
	if n.own != nil {
		// Another write made one meanwhile, over the same buffer.
		wb.refs--
		h = n.own
	} else {
		h = &handle{n: n, wb: wb}
		n.own = h
	}
	n.ownUses++
	n.mu.Unlock()
	n.s.ownsBuffer(n)
	return h, 0
}

// ownsBuffer records that n has a buffer of its own (fileNode.own), for
// dropOwn to drop; past ownMax of them, the files written are stored and
// their buffers dropped at once rather than a second after the last write.
func (s *Server) ownsBuffer(n *fileNode) {
	u := &s.unclosed
	u.mu.Lock()
	u.own[n] = struct{}{}
	trim := len(u.own) > ownMax && !u.trimming
	u.trimming = u.trimming || trim
	u.mu.Unlock()
	if trim {
		go s.trimOwn()
	}
}

// trimOwn stores the files written with no close to come and drops their
// own buffers, as unclosedIdle does, when more than ownMax files have one.
func (s *Server) trimOwn() {
	s.unclosedIdle()
	u := &s.unclosed
	u.mu.Lock()
	u.trimming = false
	u.mu.Unlock()
}

// createUnopened makes a regular file for an open(O_CREAT) that the kernel
// makes by itself (it asks for a Mknod, then opens the file with no
// request): as Create does, with the file's own handle holding the buffer.
func (dn *dirNode) createUnopened(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	c, f, e := dn.create(ctx, name, mode, out)
	if e != 0 {
		return nil, e
	}
	f.mu.Lock()
	f.own = &handle{n: f, wb: f.wb}
	f.mu.Unlock()
	dn.s.ownsBuffer(f)
	return c, f.written(ctx, true)
}

// named reports whether the file of h, a handle with a buffer, has a
// name to load it by: the buffer dropped can be made again.
func (h *handle) named() bool {
	h.wb.mu.Lock()
	unlinked := h.wb.unlinked
	h.wb.mu.Unlock()
	if unlinked {
		return false
	}
	_, ok := h.n.path()
	return ok
}

var _ fs.NodeOnForgetter = (*fileNode)(nil)

// OnForget implements fs.NodeOnForgetter: the kernel holds the file no
// more, so no descriptor does; the file's own handles go, and the file
// too if it was hidden (gone.go).
func (n *fileNode) OnForget() {
	u := &n.s.unclosed
	u.mu.Lock()
	delete(u.own, n)
	delete(u.open, n)
	u.mu.Unlock()
	n.mu.Lock()
	h := n.own
	if n.ownUses == 0 {
		n.own = nil
	} else {
		h = nil
	}
	n.mu.Unlock()
	if h != nil {
		go h.Release(context.Background())
	}
	n.dropUnopened()
	n.s.removeGone(&n.node)
}

// doneOwn ends a use of the file's own handle (ownWriter).
func (n *fileNode) doneOwn() {
	n.mu.Lock()
	n.ownUses--
	n.mu.Unlock()
}

// written follows a write with no handle, or a truncation: kept back
// under a write lease, or with a close to come (closes), the file waits
// to be stored (see unclosed); otherwise it is stored now.
func (n *fileNode) written(ctx context.Context, closes bool) syscall.Errno {
	if p, ok := n.path(); closes || ok && n.s.cache.KeepsBack(ctx, p) {
		n.s.unclosedWrite(n, closes)
		return 0
	}
	return n.flush(ctx)
}

// unclosedWrite records that n was written and waits to be stored, and
// with open that its close is yet to be heard.
func (s *Server) unclosedWrite(n *fileNode, open bool) {
	u := &s.unclosed
	u.mu.Lock()
	defer u.mu.Unlock()
	if open {
		u.open[n] = struct{}{}
	}
	if len(u.files) == 0 {
		u.since = time.Now()
	}
	u.files[n] = struct{}{}
	wait := min(unclosedIdle, time.Until(u.since.Add(unclosedMax)))
	if u.timer == nil {
		u.timer = time.AfterFunc(wait, s.unclosedIdle)
	} else {
		u.timer.Reset(wait)
	}
}

// closed records that a close of n was heard, and reports whether n was
// written since it was last stored, or is being stored.
func (s *Server) closed(n *fileNode) bool {
	u := &s.unclosed
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.open, n)
	_, written := u.files[n]
	return written || u.storing[n] > 0
}

// handover stores the files written with no handle at or below root for
// the cache (cache.Options.Handover): with all false, only those whose
// last close was heard.
func (s *Server) handover(ctx context.Context, root string, all bool) {
	u := &s.unclosed
	s.storeUnclosedWhere(ctx, func(n *fileNode) bool {
		if !all {
			// (Called under u.mu.)
			if _, open := u.open[n]; open {
				return false
			}
		}
		p, ok := n.path()
		return !ok || ferry.HasPrefix(p, root)
	})
}

// storeUnclosedWhere stores the files written with no close to come that
// which (called with u.mu held) selects, and returns the first failure.
// It returns once the stores of those files begun by other callers have
// ended too, or ctx has.
func (s *Server) storeUnclosedWhere(ctx context.Context, which func(*fileNode) bool) syscall.Errno {
	u := &s.unclosed
	u.mu.Lock()
	var ns []*fileNode
	for n := range u.files {
		if which(n) {
			ns = append(ns, n)
			delete(u.files, n)
			u.storing[n]++
		}
	}
	u.mu.Unlock()
	var failed syscall.Errno
	for _, n := range ns {
		e := n.flush(ctx)
		if e != 0 {
			p, _ := n.path()
			s.log.Warn("storing a file written failed; tried again later", "path", p, "errno", e)
			s.unclosedWrite(n, false)
			if failed == 0 {
				failed = e
			}
		}
		u.mu.Lock()
		if u.storing[n]--; u.storing[n] == 0 {
			delete(u.storing, n)
		}
		close(u.stored)
		u.stored = make(chan struct{})
		u.mu.Unlock()
	}
	for {
		u.mu.Lock()
		busy := false
		for n := range u.storing {
			if busy = which(n); busy {
				break
			}
		}
		stored := u.stored
		u.mu.Unlock()
		if !busy {
			return failed
		}
		select {
		case <-stored:
		case <-ctx.Done():
			return failed
		}
	}
}

// beforeChange stores the files written with no close to come before a
// change of another kind is made: the tree below gets changes in the
// order they were made. The file of but, if not nil, is left to the
// change, which takes what it holds into account: its removal or a
// change of its attributes. keep are the files whose names or
// attributes the change touches. Own buffers stay: a file appended to
// between other changes (configure's config.log) would otherwise be
// loaded into a new one at each append. But a buffer describes its
// file, its link count among the rest, until it goes, so where a file
// the change touches has other names, the own buffers of the files
// stored go, as a close would drop them, but for those of keep, which
// the change may leave with no name: a descriptor the kernel holds on
// one may write on. Until the kernel is told it need not open files,
// every close is heard: nothing to do.
func (s *Server) beforeChange(ctx context.Context, but *node, keep ...*fs.Inode) {
	if !s.kernel.noOpen.Load() {
		return
	}
	s.storeUnclosedWhere(ctx, func(n *fileNode) bool { return &n.node != but })
	for _, in := range keep {
		if in == nil {
			continue
		}
		if n := nodeOf(in); n != nil {
			if d := n.lastAttrs(); d != nil && d.Linked() {
				s.dropOwn(ctx, keep...)
				return
			}
		}
	}
}

// unclosedIdle stores the files written with no close to come and drops
// their own buffers, unclosedIdle after the last write.
func (s *Server) unclosedIdle() {
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.CallTimeout)
	defer cancel()
	s.handover(ctx, "/", true)
	s.dropOwn(ctx)
}

// ownMax bounds the files that keep their own buffers (a temporary file
// each): an unpack writes thousands of files with no pause, and appends
// to many files may come with no other change between them
// (ownsBuffer).
const ownMax = 64

// dropOwn drops the own buffers of the files stored since their last
// write, but for those of keep.
func (s *Server) dropOwn(ctx context.Context, keep ...*fs.Inode) {
	u := &s.unclosed
	u.mu.Lock()
	var idle []*fileNode
	for n := range u.own {
		if _, written := u.files[n]; !written && !slices.Contains(keep, &n.Inode) {
			idle = append(idle, n)
			delete(u.own, n)
		}
	}
	u.mu.Unlock()
	for _, n := range idle {
		s.releaseOwn(ctx, n)
	}
}

// dropOwnOf drops the own buffer of n if it was stored since its last
// write: the file changed elsewhere, and a write here must load it anew.
func (s *Server) dropOwnOf(ctx context.Context, n *fileNode) {
	u := &s.unclosed
	u.mu.Lock()
	_, own := u.own[n]
	_, written := u.files[n]
	if !own || written {
		u.mu.Unlock()
		return
	}
	delete(u.own, n)
	u.mu.Unlock()
	s.releaseOwn(ctx, n)
}

// releaseOwn releases the own buffer of n, taken from the files that
// have one, unless it is in use or has no name left to load it again by:
// then it records it again.
func (s *Server) releaseOwn(ctx context.Context, n *fileNode) {
	u := &s.unclosed
	n.mu.Lock()
	h := n.own
	n.mu.Unlock()
	// A file with no name left to load it again by keeps its buffer: a
	// descriptor the kernel holds on it may still write or read, and the
	// buffer is all there is (see OnForget).
	if h != nil && h.named() {
		n.mu.Lock()
		if n.own != h || n.ownUses > 0 {
			// In use: its write records it again.
			h = nil
		} else {
			n.own = nil
		}
		n.mu.Unlock()
	} else {
		h = nil
	}
	if h != nil {
		h.Release(ctx)
		return
	}
	// Kept: recorded again, with no trim of its own.
	u.mu.Lock()
	u.own[n] = struct{}{}
	u.mu.Unlock()
}
