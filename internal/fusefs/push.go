package fusefs

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
)

// pages is what the mount knows of the kernel's pages of a file, for
// push: whether the kernel holds the file's content (read with a READ,
// or given unasked), and a count of the events after which pages given
// may be stale (dropped by a change, or written here).
type pages struct {
	held atomic.Bool
	gen  atomic.Uint64
}

// dropped records that the kernel's pages of the file go, or may no
// longer be the file's content.
func (p *pages) dropped() {
	p.gen.Add(1)
	p.held.Store(false)
}

// pushMax bounds the files push gives the kernel, and pushListing what
// it gives for one listing: the listing's answer waits for them.
const (
	pushMax     = 1 << 20
	pushListing = 16 << 20
)

// push gives the kernel, unasked (FUSE's notify store), the content of
// the files in dn that the kernel knows and has not read, where the cache
// holds it. It runs when the kernel has read dn's listing to its end,
// before the kernel has that end, so a program that lists a directory
// and then reads its files (grep -r, git status) finds them in the
// kernel's pages; files that arrive later are given as they arrive
// (pushArrivals). A file read with a READ instead costs a request, and
// the kernel then holds its access time for stale, so the next stat of
// it asks the mount again (see readFiles). Only once the kernel opens
// files by itself: an open without FOPEN_KEEP_CACHE drops the pages.
//
// A store waits for the pages it fills that a READ holds locked, until
// that READ is answered, so no READ's answer may wait for a store: stores
// run in a listing's answer and in pushArrivals, never in a READ's.
//
// A file changed meanwhile (a WRITE here, an event from the server) may
// have been given stale: its pages are then dropped again. The kernel
// overwrites what it holds with what it is given, so a page a program
// dirtied through a shared mapping between the check and the store would
// be lost; a mapping's first touch of a page the kernel lacks is a READ,
// which marks the file held, so that needs the page faulted in and
// written within the store's microseconds.
func (s *Server) push(dn *dirNode) {
	if !s.kernel.noOpen.Load() {
		return
	}
	budget := int64(pushListing)
	for _, c := range dn.Children() {
		budget -= s.pushFile(c, budget)
	}
}

// pushFile gives the kernel the content of the file c, if it is a file
// the kernel has not read, with no write buffer, whose content the cache
// holds and is no larger than budget; it returns the bytes given.
func (s *Server) pushFile(c *fs.Inode, budget int64) int64 {
	n := nodeOf(c)
	if n == nil {
		return 0
	}
	f := n.file()
	if f == nil || f.pages.held.Load() || f.hasBuffer() {
		return 0
	}
	d := f.lastAttrs()
	if d == nil || d.Type() != ferry.TypeFile || d.Size() == 0 || d.Size() > pushMax || d.Size() > budget {
		return 0
	}
	gen := f.pages.gen.Load()
	data, ok := s.cache.Held(d)
	if !ok || int64(len(data)) != d.Size() {
		return 0
	}
	if c.WriteCache(0, data) != 0 {
		return 0
	}
	s.pushed.Add(1)
	if f.pages.gen.Load() != gen || f.hasBuffer() {
		// Changed while it was given: what was given may be stale.
		f.pages.dropped()
		c.NotifyContent(0, 0)
		return d.Size()
	}
	f.pages.held.Store(true)
	return d.Size()
}

// arrived queues the file at p, whose content the cache now holds, to
// be given to the kernel (cache.Options.Arrived). A full queue loses the
// gift, not the file: the kernel then reads it.
func (s *Server) arrived(p string) {
	select {
	case s.arrivals <- p:
	default:
	}
}

// pushArrivals gives the kernel the files queued by arrived that it
// knows, until ctx ends: a walk's files that arrive after the program
// listed their directory, before it reads them.
func (s *Server) pushArrivals(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-s.arrivals:
			if !s.kernel.noOpen.Load() || !ferry.HasPrefix(p, s.opt.Root) {
				continue
			}
			if in := s.inode(p); in != nil {
				s.pushFile(in, pushMax)
			}
		}
	}
}

// restat is a directory whose listing the kernel read to its end, or a
// file it read (readFiles), when it is to be stated, and how many times
// it was.
type restat struct {
	in    *fs.Inode
	at    time.Time
	tries int
}

// restatAfter is how long after a listing's end its directory is stated
// again: the kernel takes the access time for stale once it has the end.
// A statx the kernel answers itself came too early (a loaded machine),
// and is made again restatAfter times restatBackoff later, up to
// restatTries times in all.
const (
	restatAfter   = 20 * time.Millisecond
	restatBackoff = 5
	restatTries   = 3
)

// listed queues the directory dn, whose listing the kernel has read from
// the mount to its end, for restatQueued. A full queue loses the restat:
// the program's next stat then asks the mount.
func (s *Server) listed(dn *dirNode) {
	if !s.kernel.noOpendir.Load() || !s.cache.Leased() {
		return
	}
	s.queueRestat(restat{in: &dn.Inode, at: time.Now().Add(restatAfter)})
}

// queueRestat queues r for restatQueued, unless the queue is full.
func (s *Server) queueRestat(r restat) {
	select {
	case s.restats <- r:
	default:
	}
}

// restatQueued states again, through the mount, the directories and
// files queued by listed and restatRead, until ctx ends. A listing read
// is an access, and so is a READ: having read one from the mount, the
// kernel holds the directory's or file's access time for stale, and the
// next stat of it asks the mount, once per directory and file read in a
// second grep -r, most of what that walk would ask. Asked here, in the
// background, the kernel has the attributes again (for the lease's TTL)
// before the program comes back.
func (s *Server) restatQueued(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.restats:
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(r.at)):
			}
			// An inode no longer in the tree has no path to state.
			rel := r.in.Path(&s.root.Inode)
			if s.inode(s.treePath(rel)) != r.in {
				continue
			}
			asked := s.kernel.getattrs.Load()
			var st unix.Statx_t
			if unix.Statx(unix.AT_FDCWD, filepath.Join(s.mnt, rel), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_ATIME, &st) != nil {
				continue
			}
			if s.kernel.getattrs.Load() != asked {
				s.restated.Add(1)
			} else if r.tries++; r.tries < restatTries {
				d := restatAfter
				for range r.tries {
					d *= restatBackoff
				}
				time.AfterFunc(d, func() { s.queueRestat(restat{in: r.in, at: time.Now(), tries: r.tries}) })
			}
		}
	}
}
