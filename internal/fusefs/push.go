package fusefs

import (
	"sync/atomic"

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
// kernel's pages. A file the kernel reads with a READ costs a request,
// and the kernel then takes the file's access time for stale: the next
// stat of it asks the mount again (see relists). Only once the kernel
// opens files by itself: otherwise an open without FOPEN_KEEP_CACHE drops
// the pages given.
//
// A file changed meanwhile (a WRITE here, an event from the server) may
// have been given stale: its pages are then dropped again. The kernel
// overwrites what it holds with what it is given, so a page a program
// dirtied through a shared mapping between the check and the store would
// be lost; a mapping's first touch of a page the kernel lacks is a READ,
// which marks the file held, so that needs the page faulted in and
// written within the store's microseconds.
func (s *Server) push(dn *dirNode) {
	if s.kernel == nil || !s.kernel.noOpen.Load() {
		return
	}
	budget := int64(pushListing)
	for _, c := range dn.Children() {
		n := nodeOf(c)
		if n == nil {
			continue
		}
		f := n.file()
		if f == nil || f.pages.held.Load() || f.hasBuffer() {
			continue
		}
		d := f.lastAttrs()
		if d == nil || d.Type() != ferry.TypeFile || d.Size() == 0 || d.Size() > pushMax || d.Size() > budget {
			continue
		}
		gen := f.pages.gen.Load()
		data, ok := s.cache.Held(d)
		if !ok || int64(len(data)) != d.Size() {
			continue
		}
		if c.WriteCache(0, data) != 0 {
			continue
		}
		budget -= d.Size()
		s.pushed.Add(1)
		if f.pages.gen.Load() != gen || f.hasBuffer() {
			// Changed while it was given: what was given may be stale.
			f.pages.dropped()
			c.NotifyContent(0, 0)
			continue
		}
		f.pages.held.Store(true)
	}
}
