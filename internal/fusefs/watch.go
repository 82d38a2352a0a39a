package fusefs

import (
	"context"
	"path"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/ferryfs/ferry"
)

// watch passes the cache's events to the kernel for the life of the mount:
// each drops the kernel's entries, attributes and pages for what it names.
// The cache's first watcher starts its lease (internal/cache); a callback
// break is acknowledged once the kernel has dropped what it names.
func (s *Server) watch(ctx context.Context) {
	st := s.cache.Watch(ctx, s.opt.Root)
	defer st.Close()
	for ev := range st.All() {
		p := ev.Path
		if !ferry.HasPrefix(p, s.opt.Root) {
			p = s.opt.Root // A change above the root: all of it is in doubt.
		}
		switch {
		case ev.Ack != nil:
			s.dropBroken(p, ev.Lost, ev.Ack)
		case ev.Attrs:
			s.bounded(p, func() {
				if in := s.inode(p); in != nil {
					in.NotifyContent(-1, 0)
				}
			})
		case ev.Lost:
			s.bounded(p, func() { s.notifyTree(p) })
		default:
			s.bounded(p, func() { s.notify(p, false, ev.Gone) })
		}
	}
}

// notifyWait bounds how long an event waits for the kernel to drop what it
// names before the next event is taken, and a callback break before it is
// acknowledged. The kernel takes the directory's lock for an entry, and a
// page's lock for its content: this mount's own create or rename in that
// directory, or a read of that file, may hold it while it waits on the
// server, and the server on this mount's acknowledgement of a break that
// waits behind the event; each would wait out the other's lease. After
// notifyWait the event is left to finish; what this mount had not cached
// stays correct, and the kernel's entry or pages for the one path drop
// late.
const notifyWait = time.Second

// bounded runs drop, which tells the kernel to drop what it holds of p,
// and returns once it is done or notifyWait has passed.
func (s *Server) bounded(p string, drop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		drop()
	}()
	t := time.NewTimer(notifyWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Debug("the kernel held an event's drop; went on meanwhile", "path", p)
	}
}

// dropBroken drops p (with tree, everything below it too) in the kernel
// for a callback break: another client changed it through the server, and
// that client's call waits until ack is called.
func (s *Server) dropBroken(p string, tree bool, ack func()) {
	in := s.inode(p)
	dir := in != nil && in.IsDir()
	// A directory's entry is kept until the server says it is gone (the
	// cache checks, and passes up what it learns).
	s.bounded(p, func() { s.notify(p, tree, !dir) })
	ack()
}

// heldDir reports whether the kernel has a directory's node for p: an
// event for it must not make the kernel forget its name unless it is
// gone (see forgetEntry).
func (s *Server) heldDir(p string) bool {
	if !ferry.HasPrefix(p, s.opt.Root) {
		return false
	}
	in := s.inode(p)
	return in != nil && in.IsDir()
}

// inode returns the kernel's node for the tree path p, if it has one.
func (s *Server) inode(p string) *fs.Inode {
	rel := p[len(s.opt.Root):]
	in := &s.root.Inode
	for _, name := range ferry.Elems(path.Clean("/" + rel)) {
		if in = in.GetChild(name); in == nil {
			return nil
		}
	}
	return in
}

// notify tells the kernel to forget its entry for p and, if it has a node
// for p, that node's attributes and cached pages; with tree, also those of
// every node it knows below p. A directory's entry is forgotten only if
// gone says p is no longer a directory (see forgetEntry).
func (s *Server) notify(p string, tree, gone bool) {
	if tree {
		s.forgetNegatives(p)
	}
	if p == s.opt.Root {
		in := &s.root.Inode
		in.NotifyContent(0, 0)
		if tree {
			s.notifyBelow(in)
		}
		return
	}
	parent := s.inode(path.Dir(p))
	if parent == nil {
		return
	}
	name := path.Base(p)
	child := parent.GetChild(name)
	forgetEntry(parent, name, child, gone)
	// The kernel drops its copy of the parent's listing (OpendirHandle)
	// on an entry invalidation only if it holds the entry; a name it never
	// looked up, such as a new file's, needs the parent's content dropped.
	parent.NotifyContent(0, 0)
	if child != nil {
		dropContent(child)
		if tree {
			s.notifyBelow(child)
		}
	}
}

// maxNegatives bounds the missing names the kernel may keep; past it, a
// missing name is answered without a timeout.
const maxNegatives = 1 << 16

// negative records that the kernel is told p does not exist, and reports
// whether it may keep that answer.
func (s *Server) negative(p string) bool {
	s.negMu.Lock()
	defer s.negMu.Unlock()
	if len(s.negs) >= maxNegatives {
		return false
	}
	s.negs[p] = struct{}{}
	return true
}

// forgetNegatives tells the kernel to forget the missing names it keeps
// at or below p.
func (s *Server) forgetNegatives(p string) {
	s.negMu.Lock()
	var names []string
	for q := range s.negs {
		if ferry.HasPrefix(q, p) {
			names = append(names, q)
			delete(s.negs, q)
		}
	}
	s.negMu.Unlock()
	for _, q := range names {
		if q == s.opt.Root || !ferry.HasPrefix(q, s.opt.Root) {
			continue
		}
		if parent := s.inode(path.Dir(q)); parent != nil {
			parent.NotifyEntry(path.Base(q))
		}
	}
}

func (s *Server) notifyBelow(in *fs.Inode) {
	for name, c := range in.Children() {
		forgetEntry(in, name, c, false)
		dropContent(c)
		s.notifyBelow(c)
	}
}

// forgetEntry tells the kernel to forget the entry name in parent, unless
// child is a directory not known to be gone: unhashing a directory's entry
// makes getcwd fail for every process working in it (git init failed so,
// on the echo of its own mkdir). A directory kept keeps its entry, and its
// attributes and listing are dropped by the caller; nodes are found by
// path, so what is below it is asked for afresh. After a lost lease (no
// answer for each directory) one removed on the server meanwhile shows
// until its entry's timeout.
func forgetEntry(parent *fs.Inode, name string, child *fs.Inode, gone bool) {
	if child == nil || !child.IsDir() || gone {
		parent.NotifyEntry(name)
	}
}

// notifyTree is notify for p and everything below it, with no answer
// from the server for any of it.
func (s *Server) notifyTree(p string) { s.notify(p, true, false) }
