package fusefs

import (
	"context"
	"path"
	"slices"
	"sync"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
)

// When the kernel opens files by itself (kernelFS) the mount hears no open
// and no close, so it cannot tell whether a descriptor is open on a file
// whose last name a program removes or a rename replaces. On a local disk
// such a descriptor reads and writes on; here, once the file's buffer is
// dropped, its reads and writes would find it by a name it no longer has.
// So the mount hides the file instead (cache.Hide, as NFS clients rename
// such files to ".nfsXXXX"): its node goes on under the hidden name, and the
// file is removed when the kernel forgets the node (no descriptor can be
// open then), when its directory is removed, or at unmount.

// goneFiles holds the nodes of hidden files not yet removed (each node's
// gone says where), and counts the removals under way
// (fileNode.OnForget starts them).
type goneFiles struct {
	mu       sync.Mutex
	files    map[*node]struct{}
	removing sync.WaitGroup
}

// hides reports whether the removal of the last name of cn, whose buffer
// is wb, leaves a hidden file rather than none (see above). A file with a
// buffer keeps it until the kernel forgets it (dropOwn), and needs no
// name.
func (s *Server) hides(cn *node, wb *wbuf, known ferry.Dir) bool {
	return s.kernel.noOpen.Load() && cn != nil && cn.file() != nil && wb == nil && !known.Linked()
}

// hidden records that n's file lives on as hidden.
func (s *Server) hidden(n *node, hidden string) {
	n.gone.Store(&hidden)
	g := &s.gone
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.files == nil {
		g.files = map[*node]struct{}{}
	}
	g.files[n] = struct{}{}
}

// removeGone removes n's hidden file, if it has one, in the background:
// the kernel's FORGET waits for no call to the server.
func (s *Server) removeGone(n *node) {
	g := &s.gone
	g.mu.Lock()
	_, ok := g.files[n]
	delete(g.files, n)
	if ok {
		g.removing.Add(1)
	}
	g.mu.Unlock()
	if ok {
		go func() {
			defer g.removing.Done()
			s.removeHidden(*n.gone.Load())
		}()
	}
}

// takeGone takes out of s.gone the hidden files that keep match.
func (s *Server) takeGone(keep func(p string) bool) []string {
	g := &s.gone
	g.mu.Lock()
	defer g.mu.Unlock()
	var ps []string
	for n := range g.files {
		if p := *n.gone.Load(); keep(p) {
			ps = append(ps, p)
			delete(g.files, n)
		}
	}
	return ps
}

// removeHidden removes the hidden file p; one already gone is no failure.
func (s *Server) removeHidden(p string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.CallTimeout)
	defer cancel()
	if _, err := s.cache.Remove(ctx, p).Wait(); err != nil && !ferry.IsKind(err, ferry.KindNotExist) {
		s.log.Warn("removing a hidden file failed", "path", p, "err", err)
	}
}

// removeAllGone removes every hidden file still there, at unmount, once
// the removals under way have ended.
func (s *Server) removeAllGone() {
	s.gone.removing.Wait()
	for _, p := range s.takeGone(func(string) bool { return true }) {
		s.removeHidden(p)
	}
}

// removeGoneIn removes the hidden files this mount made in the directory
// dir, which is to be removed: a descriptor open on one of them loses it,
// as the directory cannot go while they are there.
func (s *Server) removeGoneIn(dir string) {
	for _, p := range s.takeGone(func(p string) bool { return path.Dir(p) == dir }) {
		s.removeHidden(p)
	}
}

// removeHiddenIn removes the hidden files the cache lists in dir, which a
// removal of dir found there (another mount's, or one whose removal is
// under way), and reports whether there were any.
func (s *Server) removeHiddenIn(ctx context.Context, dir string) bool {
	ds, err := s.cache.List(ctx, dir)
	if err != nil {
		return false
	}
	var hidden []string
	for _, d := range ds {
		if cache.Hidden(d.Name()) {
			hidden = append(hidden, d.Path())
		}
	}
	s.takeGone(func(p string) bool { return slices.Contains(hidden, p) })
	for _, p := range hidden {
		s.removeHidden(p)
	}
	return len(hidden) > 0
}

// shown returns a listing without its hidden names, in a copy if any
// were there: the cache's listing is not changed.
func shown(ds []ferry.Dir) []ferry.Dir {
	if !slices.ContainsFunc(ds, func(d ferry.Dir) bool { return cache.Hidden(d.Name()) }) {
		return ds
	}
	return slices.DeleteFunc(slices.Clone(ds), func(d ferry.Dir) bool { return cache.Hidden(d.Name()) })
}
