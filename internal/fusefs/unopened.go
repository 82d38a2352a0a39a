package fusefs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// unopened is the handle a file's reads go through when the kernel opens
// files by itself and reads with no handle (kernelFS, read-only mounts):
// one per file, made at the first read, kept while reads come (a stream
// reads ahead across them) and released unopenedIdle after the last, or
// at once when the file changes (dropUnopened).
type unopened struct {
	h     *handle
	reads int         // In progress; guarded by the node's mu.
	idle  *time.Timer // Set while no read is in progress.
}

// unopenedIdle is how long a file's own handle outlives its last read.
const unopenedIdle = 5 * time.Second

var _ fs.NodeReader = (*fileNode)(nil)

// Read implements fs.NodeReader: through the descriptor's handle, or,
// for a read the kernel makes with none, through the file's own.
func (n *fileNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.pages.held.Store(true)
	if r, ok := f.(fs.FileReader); ok {
		return r.Read(ctx, dest, off)
	}
	if f != nil {
		return nil, syscall.EBADF
	}
	u, e := n.openUnopened(ctx)
	if e != 0 {
		return nil, e
	}
	n.s.readIn(n)
	res, e := u.h.Read(ctx, dest, off)
	n.doneUnopened(u, e == 0 && u.h.readToEnd(off, len(dest)))
	return res, e
}

// readFiles holds the files the kernel read (a READ, with no handle)
// since they were last stated again. A READ makes the kernel take the
// access time it holds of the file for stale, so the next stat of the
// file would ask the mount for its attributes: a second grep -r would ask
// once per file. So shortly after, together, they are stated again in the
// background (restatQueued), as listed directories are.
type readFiles struct {
	mu    sync.Mutex
	files map[*fs.Inode]struct{}
	timer *time.Timer
}

// restatReadAfter is how long after a READ its file is stated again,
// together with the other files read meanwhile: a file read on is stated
// once a batch, not once a READ.
const restatReadAfter = 100 * time.Millisecond

// readIn records that the kernel read the file n with a READ.
func (s *Server) readIn(n *fileNode) {
	r := &s.readFiles
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.files == nil {
		r.files = map[*fs.Inode]struct{}{}
	}
	r.files[&n.Inode] = struct{}{}
	if r.timer == nil {
		r.timer = time.AfterFunc(restatReadAfter, s.restatRead)
	}
}

// restatRead queues the files in s.readFiles to be stated again.
func (s *Server) restatRead() {
	r := &s.readFiles
	r.mu.Lock()
	files := r.files
	r.files, r.timer = nil, nil
	r.mu.Unlock()
	if !s.cache.Leased() {
		return
	}
	for in := range files {
		s.queueRestat(restat{in: in, at: time.Now()})
	}
}

// openUnopened returns the file's own handle, opening it if it has none,
// with one more read in progress on it.
func (n *fileNode) openUnopened(ctx context.Context) (*unopened, syscall.Errno) {
	n.mu.Lock()
	if u := n.useUnopenedLocked(); u != nil {
		n.mu.Unlock()
		return u, 0
	}
	n.mu.Unlock()
	h, _, e := n.openRead(ctx)
	if e != 0 {
		return nil, e
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if u := n.useUnopenedLocked(); u != nil {
		// Another read opened one meanwhile.
		go h.Release(context.Background())
		return u, 0
	}
	n.unopened = &unopened{h: h, reads: 1}
	return n.unopened, 0
}

// useUnopenedLocked returns the file's own handle, if it has one, with one
// more read in progress on it. n.mu is held.
func (n *fileNode) useUnopenedLocked() *unopened {
	u := n.unopened
	if u == nil {
		return nil
	}
	u.reads++
	if u.idle != nil {
		u.idle.Stop()
		u.idle = nil
	}
	return u
}

// doneUnopened ends a read on u, and releases u after unopenedIdle with no
// other read, or at once if it was dropped meanwhile or the read reached
// the end of a file held whole in memory (the kernel holds the pages now,
// and the file's content may leave the cache's budget).
func (n *fileNode) doneUnopened(u *unopened, ended bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	u.reads--
	if u.reads > 0 {
		return
	}
	if n.unopened != u || ended {
		if n.unopened == u {
			n.unopened = nil
		}
		go u.h.Release(context.Background())
		return
	}
	u.idle = time.AfterFunc(unopenedIdle, func() {
		n.mu.Lock()
		idle := n.unopened == u && u.reads == 0
		if idle {
			n.unopened = nil
		}
		n.mu.Unlock()
		if idle {
			u.h.Release(context.Background())
		}
	})
}

// dropUnopened forgets the file's own handle: its content changed, and
// the next read opens it anew.
func (n *fileNode) dropUnopened() {
	n.mu.Lock()
	u := n.unopened
	n.unopened = nil
	release := u != nil && u.reads == 0
	if release && u.idle != nil {
		u.idle.Stop()
	}
	n.mu.Unlock()
	if release {
		u.h.Release(context.Background())
	}
}

// dropContent tells the kernel to drop the cached pages of the node in,
// and drops a file's own read handle with them, and its own write buffer
// if that holds nothing unstored.
func dropContent(in *fs.Inode) {
	if n := nodeOf(in); n != nil {
		if f := n.file(); f != nil {
			f.pages.dropped()
			f.dropUnopened()
			f.s.dropOwnOf(context.Background(), f)
		}
	}
	in.NotifyContent(0, 0)
}
