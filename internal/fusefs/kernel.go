package fusefs

import (
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// kernelFS stands between the kernel and go-fuse's node file system for
// two things go-fuse does not offer, both of which let the kernel answer
// a warm git status by itself (bench/REPORT-mount-compile-git.md).
//
// Negative entries: go-fuse turns a failed lookup into a cached "no such
// name" only with the mount-wide NegativeTimeout, and replies a bare
// ENOENT, which the kernel does not keep, when a lookup set a timeout of
// its own. Lookup sets one while a lease is held (node.Lookup), and
// kernelFS sends it the way the kernel keeps it: success with node 0.
//
// Directory opens: even with a listing the kernel keeps (FOPEN_CACHE_DIR),
// every opendir and closedir is a request to the mount; git status opens
// all 712 directories of a 4,355-file repository, 1,424 of its 1,700
// requests. Once a lease is held, kernelFS answers OPENDIR with ENOSYS,
// which the kernel (Linux 5.1 on, FUSE_NO_OPENDIR_SUPPORT) takes to mean
// that directories need no opening: from then on it opens them itself,
// keeps their listings across opens until they change or notify drops
// them, and reads a listing with no handle (Fh 0), which kernelFS serves
// with a handle of its own for that one read. The kernel does not ask
// again, so the choice lasts for the mount's life; a listing read while no
// lease is held is dropped after Options.TTL (node.expireListing), as the
// entries are.
//
// File opens: the same for files, on a read-only mount and on one that
// writes back (Options.WriteBack), unless Options.OpenEach. Once a lease
// is held, kernelFS answers OPEN with ENOSYS (FUSE_NO_OPEN_SUPPORT, Linux
// 4.19 on) and FLUSH with ENOSYS too: the kernel then opens and closes
// files with no request at all (a warm grep -r asks the mount nothing),
// keeps their pages until notify drops them, and reads and writes with no
// handle, which fileNode.Read and fileNode.Write serve with handles of
// their own. With no close to hear, a file written is stored when
// unclosed.go says; close-to-open between clients holds through the write
// lease's recall, which stores it first. A mount that writes through
// (no write-back) has no lease to hold writes back under, and keeps
// hearing closes.
type kernelFS struct {
	fuse.RawFileSystem
	s *Server
	// noOpendir is set once the kernel was told it need not open
	// directories, noOpen once it was told so of files.
	noOpendir, noOpen atomic.Bool
	// opendirs, opens, creates, flushes, lookups, lseeks and getattrs
	// count the OPENDIR, OPEN, CREATE, FLUSH, LOOKUP, LSEEK and GETATTR
	// requests that came, for tests.
	opendirs, opens, creates, flushes, lookups, lseeks, getattrs atomic.Int64
}

// GetAttr implements fuse.RawFileSystem.
func (k *kernelFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	k.getattrs.Add(1)
	return k.RawFileSystem.GetAttr(cancel, in, out)
}

// Lseek answers ENOSYS: the tree has no holes to report, and the kernel
// then answers SEEK_DATA and SEEK_HOLE itself from the size it holds,
// with no request (grep -r asks for every file of some size).
func (k *kernelFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	k.lseeks.Add(1)
	return fuse.ENOSYS
}

// kernelOpens reports whether the kernel is to open files by itself once
// a lease is held (see kernelFS).
func (s *Server) kernelOpens() bool {
	return !s.opt.OpenEach && (s.opt.ReadOnly || s.opt.WriteBack)
}

// Open answers ENOSYS while a lease is held, if the kernel is to open
// files by itself (see kernelFS).
func (k *kernelFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	k.opens.Add(1)
	if k.s.kernelOpens() && k.s.cache.Leased() {
		k.noOpen.Store(true)
		return fuse.ENOSYS
	}
	return k.RawFileSystem.Open(cancel, in, out)
}

// Create answers ENOSYS once the kernel opens files by itself on a mount
// that writes: a file it creates would have a handle that is never
// released. The kernel then asks for a Mknod and opens the file itself
// (dirNode.Mknod, createUnopened).
func (k *kernelFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	k.creates.Add(1)
	if k.noOpen.Load() {
		return fuse.ENOSYS
	}
	return k.RawFileSystem.Create(cancel, in, name, out)
}

// Flush answers ENOSYS once the kernel opens files by itself, after
// storing what a handle it opened holds: the kernel then asks no more.
func (k *kernelFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	k.flushes.Add(1)
	if in.Fh == 0 {
		return fuse.ENOSYS
	}
	st := k.RawFileSystem.Flush(cancel, in)
	if st.Ok() && k.noOpen.Load() {
		return fuse.ENOSYS
	}
	return st
}

// Lookup implements fuse.RawFileSystem (see kernelFS).
func (k *kernelFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	k.lookups.Add(1)
	st := k.RawFileSystem.Lookup(cancel, h, name, out)
	if st == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId = 0
		return fuse.OK
	}
	return st
}

// OpenDir answers ENOSYS while a lease is held (see kernelFS).
func (k *kernelFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	k.opendirs.Add(1)
	if k.s.cache.Leased() {
		k.noOpendir.Store(true)
		return fuse.ENOSYS
	}
	return k.RawFileSystem.OpenDir(cancel, in, out)
}

// ReadDir implements fuse.RawFileSystem.
func (k *kernelFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Fh != 0 {
		return k.RawFileSystem.ReadDir(cancel, in, out)
	}
	return k.unopened(cancel, in, func(in *fuse.ReadIn) fuse.Status { return k.RawFileSystem.ReadDir(cancel, in, out) })
}

// ReadDirPlus implements fuse.RawFileSystem.
func (k *kernelFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Fh != 0 {
		return k.RawFileSystem.ReadDirPlus(cancel, in, out)
	}
	return k.unopened(cancel, in, func(in *fuse.ReadIn) fuse.Status { return k.RawFileSystem.ReadDirPlus(cancel, in, out) })
}

// unopened serves one read of a directory the kernel did not open: it
// opens it, reads from the offset asked for (a fresh listing seeks to it)
// and releases it. A listing read in several parts is made once per part;
// the kernel keeps the whole, so that happens on first use and after a
// change, not on every open.
func (k *kernelFS) unopened(cancel <-chan struct{}, in *fuse.ReadIn, read func(*fuse.ReadIn) fuse.Status) fuse.Status {
	open := fuse.OpenIn{InHeader: in.InHeader, Flags: syscall.O_RDONLY | syscall.O_DIRECTORY}
	var opened fuse.OpenOut
	if st := k.RawFileSystem.OpenDir(cancel, &open, &opened); !st.Ok() {
		return st
	}
	defer k.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: in.InHeader, Fh: opened.Fh})
	rd := *in
	rd.Fh = opened.Fh
	return read(&rd)
}

// expireListing drops the kernel's copy of n's listing after Options.TTL
// if it was made while no lease is held: the kernel keeps the listings of
// directories it did not open (kernelFS) until told otherwise.
func (n *node) expireListing() {
	if !n.s.kernel.noOpendir.Load() || n.s.cache.Leased() {
		return
	}
	time.AfterFunc(n.s.opt.TTL, func() { n.NotifyContent(0, 0) })
}
