package fusefs

import (
	"sync"
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
// File opens: the same for files, on a read-only mount and, with
// Options.KernelOpens, on one that writes back. Once a lease
// is held, kernelFS answers OPEN with ENOSYS (FUSE_NO_OPEN_SUPPORT, Linux
// 4.19 on): the kernel then opens files with no request (a warm grep -r
// asks the mount one FLUSH a file), keeps their pages until notify drops
// them, reads and writes with no handle, which fileNode.Read and
// fileNode.Write serve with handles of their own, and reports each close
// as a FLUSH with no handle. A file written is stored when unclosed.go
// says: at that close, unless the write lease keeps it back, and then
// close-to-open between clients holds through the lease's recall, which
// stores it first. A mount that writes through (no write-back) has no
// lease to hold writes back under, and keeps hearing opens.
type kernelFS struct {
	fuse.RawFileSystem
	s *Server
	// noOpendir is set once the kernel was told it need not open
	// directories, noOpen once it was told so of files.
	noOpendir, noOpen atomic.Bool
	// handles counts the file handles given out (and being made) and
	// not yet released, under mu. The kernel is told it need not open
	// files only while there are none: once told, it sends no FLUSH and
	// no RELEASE for a handle it got before (Linux 6.18), so the file a
	// handle created and the writes it buffered would never be stored.
	mu      sync.Mutex
	handles int
	// opendirs, opens, creates, flushes, lookups, lseeks, getattrs and
	// reads count the OPENDIR, OPEN, CREATE, FLUSH, LOOKUP, LSEEK,
	// GETATTR and READ requests that came, for tests; getattrs also tells
	// restatQueued whether its statx reached the mount.
	opendirs, opens, creates, flushes, lookups, lseeks, getattrs, reads atomic.Int64
	// srv is the server the kernel's requests come from, for the
	// notifications a request's answer makes (Init sets it before the
	// first request).
	srv *fuse.Server
}

// Init implements fuse.RawFileSystem.
func (k *kernelFS) Init(srv *fuse.Server) {
	k.srv = srv
	k.RawFileSystem.Init(srv)
}

// GetAttr implements fuse.RawFileSystem.
func (k *kernelFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	k.getattrs.Add(1)
	return k.RawFileSystem.GetAttr(cancel, in, out)
}

// Read implements fuse.RawFileSystem.
func (k *kernelFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	k.reads.Add(1)
	return k.RawFileSystem.Read(cancel, in, buf)
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
	return s.opt.ReadOnly || s.opt.WriteBack && s.opt.KernelOpens
}

// Open answers ENOSYS while a lease is held, if the kernel is to open
// files by itself (see kernelFS).
func (k *kernelFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	k.opens.Add(1)
	if in.Mode&fuse.OPEN_KILL_SUIDGID != 0 {
		if st := k.killSuidgid(cancel, in.InHeader, nil); !st.Ok() {
			return st
		}
	}
	if !k.handle(k.s.kernelOpens() && k.s.cache.Leased()) {
		return fuse.ENOSYS
	}
	st := k.RawFileSystem.Open(cancel, in, out)
	if !st.Ok() {
		k.released()
	}
	return st
}

// handle reports whether a request is to get a handle, and counts one
// if so: not once the kernel opens files by itself, nor when it may be
// told to (mayTell) and no handle is out, which tells it.
func (k *kernelFS) handle(mayTell bool) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.noOpen.Load() {
		return false
	}
	if mayTell && k.handles == 0 {
		k.noOpen.Store(true)
		return false
	}
	k.handles++
	return true
}

// released counts a handle fewer.
func (k *kernelFS) released() {
	k.mu.Lock()
	k.handles--
	k.mu.Unlock()
}

// Release implements fuse.RawFileSystem.
func (k *kernelFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	k.RawFileSystem.Release(cancel, in)
	k.released()
}

// Create answers ENOSYS once the kernel opens files by itself on a mount
// that writes: a file it creates would have a handle that is never
// released. The kernel then asks for a Mknod and opens the file itself
// (dirNode.Mknod, createUnopened).
func (k *kernelFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	k.creates.Add(1)
	if !k.handle(false) {
		return fuse.ENOSYS
	}
	st := k.RawFileSystem.Create(cancel, in, name, out)
	if !st.Ok() {
		k.released()
	}
	return st
}

// Flush implements fuse.RawFileSystem. It is never answered ENOSYS,
// which would stop the kernel sending it: once the kernel opens files by
// itself, the close it reports is the only one heard (unclosed.go).
func (k *kernelFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	k.flushes.Add(1)
	return k.RawFileSystem.Flush(cancel, in)
}

// The mount clears the set-user-ID and set-group-ID bits itself when a
// caller without CAP_FSETID writes or truncates a file
// (FUSE_HANDLE_KILLPRIV_V2; the kernel says which with
// WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID and OPEN_KILL_SUIDGID). In
// return the kernel marks its inodes S_NOSEC, and a write no longer
// asks for the file's security.capability first (a GETXATTR per write).

// Writev implements fuse.RawFileSystem, which go-fuse calls for WRITE.
func (k *kernelFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		if st := k.killSuidgid(cancel, in.InHeader, nil); !st.Ok() {
			return 0, st
		}
	}
	return k.RawFileSystem.Writev(cancel, in, data)
}

// SetAttr implements fuse.RawFileSystem.
func (k *kernelFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 {
		set := *in
		set.Valid &^= fuse.FATTR_KILL_SUIDGID
		if st := k.killSuidgid(cancel, in.InHeader, &set); !st.Ok() {
			return st
		}
		return k.RawFileSystem.SetAttr(cancel, &set, out)
	}
	return k.RawFileSystem.SetAttr(cancel, in, out)
}

// killSuidgid clears the set-user-ID bit of the node h names, and its
// set-group-ID bit if it is group-executable, as a write or truncation by
// a caller without CAP_FSETID does on a local disk. With set, the mode
// goes into that change of attributes instead of one of its own.
func (k *kernelFS) killSuidgid(cancel <-chan struct{}, h fuse.InHeader, set *fuse.SetAttrIn) fuse.Status {
	mode := uint32(0)
	if set != nil && set.Valid&fuse.FATTR_MODE != 0 {
		mode = set.Mode
	} else {
		var attr fuse.AttrOut
		if st := k.RawFileSystem.GetAttr(cancel, &fuse.GetAttrIn{InHeader: h}, &attr); !st.Ok() {
			return st
		}
		mode = attr.Mode
	}
	kill := uint32(syscall.S_ISUID)
	if mode&syscall.S_IXGRP != 0 {
		kill |= syscall.S_ISGID
	}
	if mode&kill == 0 {
		return fuse.OK
	}
	if set != nil {
		set.Valid |= fuse.FATTR_MODE
		set.Mode = mode &^ kill
		return fuse.OK
	}
	var in fuse.SetAttrIn
	in.InHeader, in.Valid, in.Mode = h, fuse.FATTR_MODE, mode&^kill
	var out fuse.AttrOut
	st := k.RawFileSystem.SetAttr(cancel, &in, &out)
	if st.Ok() {
		// The kernel did not ask for this change, and keeps the mode it
		// had until told to ask again.
		k.srv.InodeNotify(h.NodeId, -1, 0)
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
