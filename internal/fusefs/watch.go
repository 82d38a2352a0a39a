package fusefs

import (
	"context"
	"path"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/ferryfs/ferry"
)

// watch holds one watch on the mounted path for the life of the mount, if
// the tree offers watches. The watch is the cache's lease: from its first
// (Lost) event the cache is trusted and the kernel given long timeouts;
// each event drops what it names here and in the kernel. When the watch
// ends, everything is dropped and it is re-established with backoff;
// meanwhile nothing is trusted for longer than Options.TTL.
func (s *Server) watch(ctx context.Context, firstLease chan struct{}) {
	// firstLease is closed once the first watch is in place, or has
	// failed or is not to be had.
	var once sync.Once
	first := func() { once.Do(func() { close(firstLease) }) }
	defer first()
	w, ok := ferry.As[ferry.Watcher](s.fsys)
	if !ok {
		s.log.Info("the tree offers no watch: metadata is trusted for a short time only", "ttl", s.opt.TTL)
		return
	}
	root := s.opt.Root
	backoff := s.opt.WatchBackoff
	for ctx.Err() == nil {
		began := time.Now()
		st := w.Watch(ctx, root)
		leased := false
		for ev := range st.All() {
			p, err := ferry.CleanPath(ev.Path)
			if err != nil || !ferry.HasPrefix(p, root) && !(ev.Lost && ferry.HasPrefix(root, p)) {
				if ev.Ack != nil {
					ev.Ack()
				}
				continue
			}
			if ev.Ack != nil {
				if !ferry.HasPrefix(p, root) {
					p = root // A change above the root: all of it is in doubt.
				}
				s.dropBroken(ctx, p, ev.Lost)
				ev.Ack()
				continue
			}
			if ev.Lost {
				if p == root {
					s.meta.dropAll()
				} else {
					s.meta.invalidateAll(p)
				}
				s.notifyTree(p)
				if !leased && p == root {
					leased = true
					s.meta.setLease(true)
					s.log.Info("watch in place: metadata is cached until it changes")
					first()
				}
				continue
			}
			// A directory the kernel knows is checked too: its entry
			// is forgotten only if the server says it is gone.
			if in := s.inode(p); s.meta.worthChecking(p) || in != nil && in.IsDir() {
				go s.check(ctx, p)
				continue
			}
			s.meta.invalidate(p)
			s.notify(p, false, true)
		}
		err := st.Err()
		first()
		if leased {
			s.meta.setLease(false)
		}
		s.meta.dropAll()
		s.notifyTree(root)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			backoff = s.opt.WatchBackoff
		}
		s.log.Warn("watch ended; cached metadata dropped", "err", err, "retry in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// notifyWait bounds how long a callback break waits for the kernel to drop
// its entries before it is acknowledged. The kernel takes the directory's
// lock for that, and this mount's own create or rename in that directory
// may hold it while it waits on the server for the other client's
// acknowledgement of a break of ours: each would wait out the other's
// lease. After notifyWait the break is acknowledged with the drop still
// under way; what this mount had not cached stays correct, and the
// kernel's entry for the one path shows late.
const notifyWait = time.Second

// dropBroken drops p (with tree, everything below it too) here and in the
// kernel, for a callback break: another client changed it through the
// server, and that client's call waits until this returns.
func (s *Server) dropBroken(ctx context.Context, p string, tree bool) {
	s.breaks.Add(1)
	if tree {
		s.meta.invalidateAll(p)
	} else {
		s.meta.invalidate(p)
	}
	in := s.inode(p)
	dir := in != nil && in.IsDir()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A directory's entry is kept until the server says it is gone.
		s.notify(p, tree, !dir)
	}()
	select {
	case <-done:
	case <-time.After(notifyWait):
		s.log.Debug("the kernel held a callback break's drop; acknowledged it meanwhile", "path", p)
	}
	if dir {
		go s.check(ctx, p)
	}
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
		child.NotifyContent(0, 0)
		if tree {
			s.notifyBelow(child)
		}
	}
}

func (s *Server) notifyBelow(in *fs.Inode) {
	for name, c := range in.Children() {
		forgetEntry(in, name, c, false)
		c.NotifyContent(0, 0)
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

// check handles an event for p that may be the echo of this mount's own
// change, or a directory's change of times: it asks the server, and drops
// the cache only if the cache does not already agree.
func (s *Server) check(ctx context.Context, p string) {
	ctx, cancel := context.WithTimeout(ctx, s.opt.CallTimeout)
	defer cancel()
	// The server's answer is not newer than this mount's own calls on p
	// still in the background (an unlink behind a close, say): believed
	// before they are done, it would bring back what they removed.
	if s.wback.wait(ctx, p) != nil {
		return
	}
	_, _, seq := s.meta.stamp()
	d, err := s.fsys.Stat(ctx, p).Wait()
	agrees, attrs := s.meta.check(p, d, err, seq)
	switch {
	case agrees && attrs:
		if in := s.inode(p); in != nil {
			in.NotifyContent(-1, 0)
		}
	case !agrees:
		if s.meta.invalidateUnchanged(p, seq) {
			s.notify(p, false, ferry.IsKind(err, ferry.KindNotExist) || err == nil && !d.IsDir())
		}
	}
}
