package fusefs

import (
	"context"
	"hash/fnv"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
)

// node is what every kind of file of the mount has: its place in the tree,
// its attributes and extended attributes, fsync. Its path in the tree is
// found from the kernel's view of the tree each time (go-fuse moves nodes
// on rename), so a node needs no update when its parents are renamed.
// Each kind adds the calls only it takes: dirNode, fileNode, linkNode;
// devices, FIFOs and sockets (specialNode) add none, since the kernel
// serves their opens.
type node struct {
	fs.Inode
	s *Server

	mu   sync.Mutex
	last ferry.Dir // The last attributes reported, for a node that is gone.
	// gone is the hidden name of a file removed while the kernel may
	// hold it open (gone.go), where its node goes on.
	gone atomic.Pointer[string]
}

// dirNode is a directory: lookups, listings, and the calls that make,
// remove and rename the names in it.
type dirNode struct{ node }

// fileNode is a regular file, which opens. Its fields are guarded by
// node.mu.
type fileNode struct {
	node
	wb *wbuf // The write buffer, while the file is open for writing.
	// seen is the mtime and size at the last open, to tell whether the
	// kernel's cached pages may be kept.
	seenMtime string
	seenSize  int64
	// execs counts the opens of the file by execve(2) not yet released.
	execs int
	// unopened reads for the kernel when it opens files by itself
	// (unopened.go); own writes for it (unclosed.go), with ownUses
	// writes in progress through it.
	unopened *unopened
	own      *handle
	ownUses  int
	// pages is what the kernel holds of the file (push.go).
	pages pages
}

// file returns the node as a regular file's, or nil.
func (n *node) file() *fileNode {
	f, _ := n.Operations().(*fileNode)
	return f
}

// storeBuffer stores a file's write buffer (fileNode.flush); other nodes
// have none.
func (n *node) storeBuffer(ctx context.Context) syscall.Errno {
	if f := n.file(); f != nil {
		return f.flush(ctx)
	}
	return 0
}

// buffer returns the write buffer of a file's node while it has one.
func (n *node) buffer() *wbuf {
	f := n.file()
	if f == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return f.wb
}

// linkNode is a symbolic link, which reads.
type linkNode struct{ node }

// specialNode is a device, a FIFO or a socket.
type specialNode struct{ node }

var (
	_ fs.InodeEmbedder     = (*node)(nil)
	_ fs.NodeGetattrer     = (*node)(nil)
	_ fs.NodeSetattrer     = (*node)(nil)
	_ fs.NodeFsyncer       = (*node)(nil)
	_ fs.NodeStatfser      = (*node)(nil)
	_ fs.NodeGetxattrer    = (*node)(nil)
	_ fs.NodeListxattrer   = (*node)(nil)
	_ fs.NodeSetxattrer    = (*node)(nil)
	_ fs.NodeRemovexattrer = (*node)(nil)

	_ fs.NodeLookuper       = (*dirNode)(nil)
	_ fs.NodeReaddirer      = (*dirNode)(nil)
	_ fs.NodeOpendirHandler = (*dirNode)(nil)
	_ fs.NodeCreater        = (*dirNode)(nil)
	_ fs.NodeMkdirer        = (*dirNode)(nil)
	_ fs.NodeMknoder        = (*dirNode)(nil)
	_ fs.NodeUnlinker       = (*dirNode)(nil)
	_ fs.NodeRmdirer        = (*dirNode)(nil)
	_ fs.NodeRenamer        = (*dirNode)(nil)
	_ fs.NodeSymlinker      = (*dirNode)(nil)
	_ fs.NodeLinker         = (*dirNode)(nil)

	_ fs.NodeOpener = (*fileNode)(nil)

	_ fs.NodeReadlinker = (*linkNode)(nil)
)

// newNode returns a node of s for a file of the kind mode's type bits
// say, and its common part.
func newNode(s *Server, mode uint32) (fs.InodeEmbedder, *node) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		d := &dirNode{node{s: s}}
		return d, &d.node
	case syscall.S_IFREG:
		f := &fileNode{node: node{s: s}}
		return f, &f.node
	case syscall.S_IFLNK:
		l := &linkNode{node{s: s}}
		return l, &l.node
	default:
		x := &specialNode{node{s: s}}
		return x, &x.node
	}
}

// base returns the node's common part: every kind has it.
func (n *node) base() *node { return n }

// asNode returns the common part of the node of in, and false if in is not
// one of the tree's nodes (the control file).
func asNode(in *fs.Inode) (*node, bool) {
	b, ok := in.Operations().(interface{ base() *node })
	if !ok {
		return nil, false
	}
	return b.base(), true
}

// nodeOf is asNode for an inode that is one of the tree's nodes.
func nodeOf(in *fs.Inode) *node {
	n, _ := asNode(in)
	return n
}

// path returns the node's path in the tree, and false if it has been
// removed (it or a directory above it is no longer in the tree).
func (n *node) path() (string, bool) {
	if g := n.gone.Load(); g != nil {
		return *g, true
	}
	var elems []string
	in := &n.Inode
	for !in.IsRoot() {
		name, parent := in.Parent()
		if parent == nil {
			return "", false
		}
		elems = append(elems, name)
		in = parent
	}
	slices.Reverse(elems)
	rel := ""
	for i, e := range elems {
		if i > 0 {
			rel += "/"
		}
		rel += e
	}
	return n.s.treePath(rel), true
}

// ctx detaches a request's context from interrupts: the Go runtime
// interrupts its own programs' system calls all the time (SIGURG), and a
// call to the server abandoned halfway helps no one. Calls are bounded by
// the request timeout instead.
func (s *Server) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.opt.CallTimeout)
}

// typeBits returns the S_IFMT bits for an entry; one of a type the mount
// does not know is shown as a regular file.
func typeBits(d ferry.Dir) uint32 {
	if m := ferry.IFMT(d.Type()); m != 0 {
		return m
	}
	return syscall.S_IFREG
}

// modeBits returns the permission, set-id and sticky bits of d.
func modeBits(d ferry.Dir) uint32 {
	m, _ := strconv.ParseUint(d[ferry.AttrMode], 8, 32)
	return uint32(m) & 0o7777
}

// fillAttr describes d to the kernel, with the owner Options.Uid and
// Options.Gid ask for, if they do.
func (s *Server) fillAttr(d ferry.Dir, out *fuse.Attr) {
	fillAttr(d, out)
	if s.opt.Uid != nil {
		out.Uid = *s.opt.Uid
	}
	if s.opt.Gid != nil {
		out.Gid = *s.opt.Gid
	}
}

// fillAttr describes d to the kernel.
func fillAttr(d ferry.Dir, out *fuse.Attr) {
	out.Mode = typeBits(d) | modeBits(d)
	size := d.Size()
	if d.IsDir() {
		size = 4096
	}
	out.Size = uint64(size)
	out.Blksize = 4096
	out.Blocks = (uint64(size) + 511) / 512
	// A tree that keeps no atime or ctime reports the mtime for both.
	at, mt, ct := d.Atime(), d.Mtime(), d.Ctime()
	out.SetTimes(&at, &mt, &ct)
	out.Rdev = uint32(d.Int(ferry.AttrRdev))
	out.Uid = uint32(d.Int(ferry.AttrUid))
	out.Gid = uint32(d.Int(ferry.AttrGid))
	nlink := uint32(d.Int(ferry.AttrNlink))
	if _, ok := d[ferry.AttrNlink]; !ok {
		nlink = 1
		if d.IsDir() {
			nlink = 2
		}
	}
	out.Nlink = nlink
}

// attrs returns the node's current attributes: those of its write buffer
// while it has one, else the cache's (or the server's).
func (n *node) attrs(ctx context.Context) (ferry.Dir, syscall.Errno) {
	if wb := n.buffer(); wb != nil {
		d := wb.attrs()
		n.remember(d)
		return d, 0
	}
	p, ok := n.path()
	if !ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.last == nil {
			return nil, syscall.ENOENT
		}
		d := n.last.Clone()
		d.SetInt(ferry.AttrNlink, 0)
		return d, 0
	}
	ctx, cancel := n.s.ctx(ctx)
	defer cancel()
	d, err := n.s.cache.Stat(ctx, p).Wait()
	if err != nil {
		return nil, errno(err)
	}
	if n.gone.Load() != nil {
		d = d.Clone()
		d.SetInt(ferry.AttrNlink, 0)
	}
	n.remember(d)
	return d, 0
}

// relinked records that n, stored, got another name: d describes it.
func (n *node) relinked(d ferry.Dir) {
	n.remember(d)
	if wb := n.buffer(); wb != nil {
		wb.relinked(d)
	}
}

// lastAttrs returns the attributes n last had here, or nil.
func (n *node) lastAttrs() ferry.Dir {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

func (n *node) remember(d ferry.Dir) {
	n.mu.Lock()
	n.last = d
	n.mu.Unlock()
}

// child returns the node for the entry d named name in n: the one the
// kernel already knows if its type has not changed, else a new one.
func (n *node) child(ctx context.Context, name string, d ferry.Dir) *fs.Inode {
	c := n.GetChild(name)
	if c != nil && c.StableAttr().Mode == typeBits(d) {
		return c
	}
	// A node of another type at the same path is another file. The names
	// of a file with several share its number, so the kernel sees one
	// inode (go-fuse returns the node it knows under that number).
	key := inoKey(d)
	ino := n.s.inos.number(key, c != nil && key == d.Path())
	op, _ := newNode(n.s, typeBits(d))
	return n.NewInode(ctx, op, fs.StableAttr{Mode: typeBits(d), Ino: ino})
}

// entryOut fills the kernel's entry for child c described by d.
func (n *node) entryOut(c *fs.Inode, d ferry.Dir, out *fuse.EntryOut) {
	cn := nodeOf(c)
	cn.remember(d)
	n.s.fillAttr(d, &out.Attr)
	ttl, _ := n.s.timeouts()
	out.SetEntryTimeout(ttl)
	out.SetAttrTimeout(ttl)
}

// checkName refuses names the tree cannot hold.
func checkName(name string) syscall.Errno {
	if len(name) > ferry.MaxNameLen {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// Lookup implements fs.NodeLookuper.
func (dn *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := &dn.node
	if e := checkName(name); e != 0 {
		return nil, e
	}
	if n.isCtl(name) {
		return n.ctlLookup(ctx, out), 0
	}
	dir, ok := n.path()
	if !ok || cache.Hidden(name) {
		return nil, syscall.ENOENT
	}
	// A file created here and not yet stored, or open for writing, is
	// described by its buffer, unless the name no longer leads to it.
	if c := n.GetChild(name); c != nil {
		if cn := nodeOf(c); cn.namedBuffer() {
			d, _ := cn.attrs(ctx)
			n.entryOut(c, d, out)
			return c, 0
		}
	}
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	d, err := n.s.cache.Lookup(cctx, dir, name)
	if err != nil {
		if ferry.IsKind(err, ferry.KindNotExist) {
			_, neg := n.s.timeouts()
			if neg > 0 && !n.s.negative(path.Join(dir, name)) {
				neg = 0
			}
			out.SetEntryTimeout(neg)
		}
		return nil, errno(err)
	}
	c := n.child(ctx, name, d)
	n.entryOut(c, d, out)
	return c, 0
}

func (n *node) hasBuffer() bool { return n.buffer() != nil }

// namedBuffer reports whether the node has a buffer that a name still
// leads to: not one whose file was removed, replaced or never stored.
func (n *node) namedBuffer() bool {
	wb := n.buffer()
	if wb == nil {
		return false
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return !wb.unlinked
}

// Getattr implements fs.NodeGetattrer.
func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d, e := n.attrs(ctx)
	if e != 0 {
		return e
	}
	n.s.fillAttr(d, &out.Attr)
	// go-fuse sets the number in GETATTR's answer but not in SETATTR's,
	// and the kernel reports the last one it was given.
	out.Ino = n.StableAttr().Ino
	ttl, _ := n.s.timeouts()
	out.SetTimeout(ttl)
	return 0
}

// Setattr implements fs.NodeSetattrer: chmod, chown, utimens and truncate.
// A file open for writing is truncated in its buffer; a file created here
// and not yet stored takes all its attributes with its first Put.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	want := ferry.Dir{}
	if m, ok := in.GetMode(); ok {
		want[ferry.AttrMode] = "0" + strconv.FormatUint(uint64(m&0o7777), 8)
	}
	if u, ok := in.GetUID(); ok {
		want.SetInt(ferry.AttrUid, int64(u))
	}
	if g, ok := in.GetGID(); ok {
		want.SetInt(ferry.AttrGid, int64(g))
	}
	if t, ok := in.GetMTime(); ok {
		want.SetMtime(t)
	}
	if t, ok := in.GetATime(); ok {
		want.SetInt(ferry.AttrAtime, t.UnixNano())
	}
	size, hasSize := in.GetSize()
	// A descriptor's truncation (O_TRUNC, ftruncate(2)) comes with its
	// handle, none if the kernel opened the file by itself; truncate(2)
	// by path comes with none.
	_, closes := in.GetFh()
	if e := n.change(ctx, fh, closes, want, hasSize, int64(size)); e != 0 {
		return e
	}
	return n.Getattr(ctx, fh, out)
}

// change sets the attributes want, and the size if hasSize, where they
// belong: in the node's buffer while it has one (all of them for a file
// not yet stored, which takes them with its first Put), and on the server.
// closes says the change came through a descriptor, whose close will be
// heard.
func (n *node) change(ctx context.Context, fh fs.FileHandle, closes bool, want ferry.Dir, hasSize bool, size int64) syscall.Errno {
	n.s.beforeChange(ctx, n, &n.Inode)
	if f := n.file(); f != nil && hasSize && size == 0 && fh == nil && n.s.kernel.noOpen.Load() {
		// With no open heard, a truncation to nothing (O_TRUNC) goes
		// to the file's own buffer, as a write does: the file is then
		// stored once, at its close, with what is written after. The
		// kernel sends truncate(2) by path to size 0 just so, with no
		// close to come: stored at the mount's next change, or after
		// unclosedIdle (unclosed.go).
		if _, e := f.ownWriter(ctx, true); e != 0 {
			return e
		}
		defer f.doneOwn()
		closes = true
	}
	if wb := n.buffer(); wb != nil {
		if e := wb.setattr(want, hasSize, size); e != 0 {
			return e
		}
		if len(want) > 0 && !wb.isCreated() {
			if e := n.wstat(ctx, want); e != 0 {
				return e
			}
		}
		// truncate(2) by path, unlike ftruncate(2) on a descriptor
		// open for writing, is done when it returns; with no handle,
		// closes tells them apart.
		if h, ok := fh.(*handle); hasSize && (!ok || h.wb == nil) {
			if f := n.file(); f != nil && fh == nil && n.s.kernel.noOpen.Load() {
				return f.written(ctx, closes)
			}
			if e := n.storeBuffer(ctx); e != 0 {
				return e
			}
		} else if f := n.file(); f != nil && hasSize && n.s.kernel.noOpen.Load() {
			// ftruncate(2) through a handle the kernel got before it
			// opened files by itself: as a write through it
			// (unclosed.go).
			return f.written(ctx, true)
		}
	} else {
		if hasSize {
			want.SetInt(ferry.AttrSize, size)
		}
		if len(want) > 0 {
			if e := n.wstat(ctx, want); e != 0 {
				return e
			}
		}
	}
	return 0
}

// wstat changes attributes on the server.
func (n *node) wstat(ctx context.Context, want ferry.Dir) syscall.Errno {
	p, ok := n.path()
	if !ok {
		return 0 // The file is gone; only open descriptors remain.
	}
	ctx, cancel := n.s.ctx(ctx)
	defer cancel()
	if _, err := n.s.cache.Wstat(ctx, p, want).Wait(); err != nil {
		return errno(err)
	}
	return 0
}

// OpendirHandle implements fs.NodeOpendirHandler. While the watch keeps
// listings current, the kernel may keep a directory's entries across
// opens (FOPEN_CACHE_DIR): a program that lists every directory again
// (git status does) is then answered without a request to the mount. The
// kernel drops that cache itself when the directory changes through this
// mount, and on the invalidations notify sends for changes by others.
// Without a watch every open lists afresh and drops what the kernel kept.
// Once a lease is held the kernel opens directories itself (kernelFS).
func (dn *dirNode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n := &dn.node
	var fl uint32
	if n.s.cache.Leased() {
		fl = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	return &dirHandle{d: dn}, fl, 0
}

// dirHandle is an open directory: the listing Readdir makes, taken at the
// first read, as go-fuse's own handle for a NodeReaddirer does.
type dirHandle struct {
	d  *dirNode
	ds fs.DirStream
	// skipped is set by a seek past the start, gave by an entry read.
	skipped, gave bool
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
)

func (h *dirHandle) stream(ctx context.Context) syscall.Errno {
	if h.ds != nil {
		return 0
	}
	ds, e := h.d.Readdir(ctx)
	if e == 0 {
		h.ds = ds
	}
	return e
}

// Readdirent implements fs.FileReaddirenter.
func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if e := h.stream(ctx); e != 0 {
		return nil, e
	}
	if !h.ds.HasNext() {
		if h.skipped && !h.gave {
			// The kernel read the listing to its end (see push).
			h.d.s.push(h.d)
			h.d.s.listed(h.d)
		}
		return nil, 0
	}
	h.gave = true
	de, e := h.ds.Next()
	return &de, e
}

// Seekdir implements fs.FileSeekdirer: a seek to the start (rewinddir)
// lists afresh.
func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off == 0 {
		if h.ds != nil {
			h.ds.Close()
		}
		h.ds = nil
		return 0
	}
	if e := h.stream(ctx); e != 0 {
		return e
	}
	h.skipped = true
	if sd, ok := h.ds.(fs.FileSeekdirer); ok {
		return sd.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

// Releasedir implements fs.FileReleasedirer.
func (h *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if h.ds != nil {
		h.ds.Close()
	}
}

// Readdir implements fs.NodeReaddirer from the cached listing.
func (dn *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	n := &dn.node
	n.s.readdirs.Add(1)
	dir, ok := n.path()
	if !ok {
		return fs.NewListDirStream(nil), 0
	}
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	ds, err := n.s.cache.List(cctx, dir)
	if err != nil {
		return nil, errno(err)
	}
	n.expireListing()
	ds = shown(ds)
	out := make([]fuse.DirEntry, 0, len(ds)+2)
	out = append(out,
		fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: n.StableAttr().Ino},
		fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: 1})
	for _, d := range ds {
		e := fuse.DirEntry{Name: d.Name(), Mode: typeBits(d)}
		if c := n.GetChild(e.Name); c != nil {
			e.Ino = c.StableAttr().Ino
		} else {
			// Readdir needs a non-zero number; the kernel takes the
			// real one from the lookup.
			h := fnv.New64a()
			io.WriteString(h, d.Path())
			e.Ino = h.Sum64() | 1
		}
		out = append(out, e)
	}
	return fs.NewListDirStream(out), 0
}

// owner gives new entries the caller's owner, unless it is the owner of
// the mounted root, in which case the server's default is left alone (so
// a server that is not run by root can create files), or the mount shows
// owners of its own (Options.Uid, Options.Gid). In a directory n with the
// set-group-ID bit the entry takes n's group instead, and a directory
// the bit too, as on a local disk.
func (n *node) owner(ctx context.Context, d ferry.Dir) {
	c, ok := fuse.FromContext(ctx)
	if !ok || n.s.opt.Uid != nil || n.s.opt.Gid != nil {
		// Owners shown are the mount's (Options.Uid), not the
		// server's: new entries get the server's default.
		return
	}
	if int64(c.Uid) != n.s.rootUid {
		d.SetInt(ferry.AttrUid, int64(c.Uid))
	}
	if parent := n.setgidDir(); parent != nil {
		d[ferry.AttrGid] = parent[ferry.AttrGid]
		if _, ok := d[ferry.AttrMode]; ok && d.Type() == ferry.TypeDir {
			d.SetMode(d.Mode() | os.ModeSetgid)
		}
		return
	}
	if int64(c.Gid) != n.s.rootGid {
		d.SetInt(ferry.AttrGid, int64(c.Gid))
	}
}

// setgidDir returns the attributes of n, a directory, if it has the
// set-group-ID bit and a known group.
func (n *node) setgidDir() ferry.Dir {
	d := n.lastAttrs()
	if p, ok := n.path(); ok {
		if known := n.s.cache.Known(p); known != nil {
			d = known
		}
	}
	if d == nil || d.Mode()&os.ModeSetgid == 0 || d[ferry.AttrGid] == "" {
		return nil
	}
	return d
}

// Create implements fs.NodeCreater. The file exists only in this mount
// until its first flush, which stores it with one Put.
func (dn *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	c, f, e := dn.create(ctx, name, mode, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	return c, &handle{n: f, wb: f.wb}, 0, 0
}

// create makes the file name in dn with mode, in this mount only, with a
// buffer (one reference to it is the caller's).
func (dn *dirNode) create(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, *fileNode, syscall.Errno) {
	n := &dn.node
	n.s.beforeChange(ctx, nil)
	if e := checkName(name); e != 0 {
		return nil, nil, e
	}
	if n.isCtl(name) {
		return nil, nil, syscall.EEXIST
	}
	dir, ok := n.path()
	if !ok {
		return nil, nil, syscall.ENOENT
	}
	p := path.Join(dir, name)
	now := time.Now()
	d := ferry.Dir{ferry.AttrPath: p, ferry.AttrName: name, ferry.AttrType: ferry.TypeFile, ferry.AttrSize: "0"}
	d[ferry.AttrMode] = "0" + strconv.FormatUint(uint64(mode&0o7777), 8)
	d.SetMtime(now)
	set := ferry.Dir{ferry.AttrMode: d[ferry.AttrMode]}
	n.owner(ctx, set)
	d.SetInt(ferry.AttrUid, n.s.rootUid)
	d.SetInt(ferry.AttrGid, n.s.rootGid)
	for k, v := range set {
		d[k] = v
	}
	wb, err := newWbuf(n.s.opt.TempDir, d)
	if err != nil {
		return nil, nil, errno(err)
	}
	wb.created, wb.dirty, wb.set, wb.refs, wb.mtime = true, true, set, 1, now
	f := &fileNode{node: node{s: n.s}, wb: wb}
	c := n.NewInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: n.s.inos.number(p, true)})
	n.s.cache.Created(d)
	n.entryOut(c, d, out)
	return c, f, 0
}

// Mknod implements fs.NodeMknoder: empty regular files, FIFOs, sockets and
// devices, made on the server at once. Only the server's root may make a
// device, as on a local disk.
func (dn *dirNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := &dn.node
	if mode&syscall.S_IFMT == syscall.S_IFREG && n.s.kernel.noOpen.Load() {
		return dn.createUnopened(ctx, name, mode, out)
	}
	d := ferry.Dir{ferry.AttrType: ferry.TypeFile}
	if mode&syscall.S_IFMT != 0 {
		d[ferry.AttrType] = ferry.TypeOfIFMT(mode)
	}
	switch d.Type() {
	case ferry.TypeDir, ferry.TypeSymlink, ferry.TypeOther:
		return nil, syscall.EINVAL
	case ferry.TypeChar, ferry.TypeBlock:
		d.SetInt(ferry.AttrRdev, int64(dev))
	}
	return n.make(ctx, name, mode, d, out)
}

// Mkdir implements fs.NodeMkdirer.
func (dn *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := &dn.node
	return n.make(ctx, name, mode, ferry.Dir{ferry.AttrType: ferry.TypeDir}, out)
}

// Symlink implements fs.NodeSymlinker.
func (dn *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := &dn.node
	return n.make(ctx, name, 0, ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: target}, out)
}

// make creates an entry on the server at once: directories, links and
// empty files made by mknod.
func (n *node) make(ctx context.Context, name string, mode uint32, d ferry.Dir, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.s.beforeChange(ctx, nil)
	if e := checkName(name); e != 0 {
		return nil, e
	}
	if n.isCtl(name) {
		return nil, syscall.EEXIST
	}
	dir, ok := n.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	if d.Type() != ferry.TypeSymlink {
		d[ferry.AttrMode] = "0" + strconv.FormatUint(uint64(mode&0o7777), 8)
	}
	n.owner(ctx, d)
	p := path.Join(dir, name)
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	// Put would replace a link or update a directory, where mkdir and
	// symlink must fail; the lookup is usually answered from the cache.
	if _, err := n.s.cache.Lookup(cctx, dir, name); err == nil {
		return nil, syscall.EEXIST
	} else if !ferry.IsKind(err, ferry.KindNotExist) {
		return nil, errno(err)
	}
	got, err := n.s.cache.Make(cctx, p, d)
	if err != nil {
		return nil, errno(err)
	}
	c := n.child(ctx, name, got)
	n.entryOut(c, got, out)
	return c, 0
}

// Unlink implements fs.NodeUnlinker. A file created here and not yet
// stored is only forgotten.
func (dn *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	n := &dn.node
	return n.remove(ctx, name, 0)
}

// Rmdir implements fs.NodeRmdirer.
func (dn *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	n := &dn.node
	return n.remove(ctx, name, -1)
}

// remove removes name; nlink is the change to n's link count.
func (n *node) remove(ctx context.Context, name string, nlink int64) syscall.Errno {
	if n.isCtl(name) {
		return syscall.EPERM
	}
	dir, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	p := path.Join(dir, name)
	var cn *node
	c := n.GetChild(name)
	if c != nil {
		cn = nodeOf(c)
	}
	n.s.beforeChange(ctx, cn, c)
	// The buffer's lock is held across the removal, so that no store of
	// it lands after it (see fileNode.flush).
	wb := cn.lockBuffer()
	unlock := func() {
		if wb != nil {
			wb.mu.Unlock()
		}
	}
	if wb != nil && wb.created && !wb.unlinked {
		// Never stored: only forgotten.
		wb.unlinked = true
		unlock()
		n.s.cache.Discard(p)
		n.s.inos.drop(p)
		return 0
	}
	known := n.s.cache.Known(p)
	if known == nil && cn != nil {
		known = cn.lastAttrs()
	}
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	// An open file with other names is stored under one of them once
	// this one is gone; if the cache knows none, what it holds is stored
	// now, under this one.
	alias := ""
	if wb != nil && !wb.unlinked && known.Linked() {
		if alias = n.s.cache.OtherName(known, p); alias == "" && wb.dirty {
			if e := cn.file().flushLocked(ctx, wb); e != 0 {
				unlock()
				return e
			}
		}
	}
	if n.s.opt.beforeNameChange != nil {
		n.s.opt.beforeNameChange(p)
	}
	if nlink == 0 && n.s.hides(cn, wb, known) {
		// No buffer to unlock (see hides).
		hidden, err := n.s.cache.Hide(cctx, p)
		if err != nil {
			return errno(err)
		}
		n.s.hidden(cn, hidden)
		n.s.inos.drop(p)
		return 0
	}
	if nlink < 0 {
		n.s.removeGoneIn(p)
	}
	// With write-back a file's removal may go in the background, after
	// the calls on it before it (see cache.FS.Remove).
	_, err := n.s.cache.Remove(cctx, p).Wait()
	if errno(err) == syscall.ENOTEMPTY && n.s.removeHiddenIn(cctx, p) {
		// Hidden files kept it (gone.go): they go with it.
		_, err = n.s.cache.Remove(cctx, p).Wait()
	}
	if err != nil {
		unlock()
		return errno(err)
	}
	// A file with other names lives on under them: its buffer, if open,
	// is stored through those, and counts one name less (the kernel asks
	// a node with a buffer for its attributes, and a descriptor's late
	// release may keep the buffer past this).
	n.s.cache.LinkChanged(known)
	orphaned := cn != nil && (known == nil || !known.Linked())
	if orphaned && wb != nil {
		wb.unlinked = true
	} else if wb != nil {
		wb.alias, wb.removed = alias, p
	}
	unlock()
	if cn != nil && !orphaned {
		d := known.Clone()
		d.SetInt(ferry.AttrNlink, known.Int(ferry.AttrNlink)-1)
		cn.relinked(d)
	}
	n.s.inos.drop(p)
	return 0
}

// lockBuffer locks the write buffer of n, a file's node, and returns it, or
// nil if n is nil or has none.
func (n *node) lockBuffer() *wbuf {
	if n == nil {
		return nil
	}
	wb := n.buffer()
	if wb != nil {
		wb.mu.Lock()
	}
	return wb
}

// unstored reports whether the node is a file created here whose first
// Put has not happened.
func (n *node) unstored() bool {
	wb := n.buffer()
	return wb != nil && wb.isCreated()
}

// Rename implements fs.NodeRenamer with Move. RENAME_NOREPLACE is checked
// first, in the cache under a write lease and with a Stat otherwise, which
// is not atomic against other clients;
// RENAME_EXCHANGE is not supported.
func (dn *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	n := &dn.node
	// The file renamed, and the one it replaces, keep their own
	// buffers: a descriptor on the replaced one may write on.
	n.s.beforeChange(ctx, nil, n.GetChild(name), newParent.EmbeddedInode().GetChild(newName))
	const renameNoReplace, renameExchange = 1, 2
	if flags&renameExchange != 0 {
		return syscall.EINVAL
	}
	if np, ok := asNode(newParent.EmbeddedInode()); n.isCtl(name) || ok && np.isCtl(newName) {
		return syscall.EPERM
	}
	if e := checkName(newName); e != 0 {
		return e
	}
	np := nodeOf(newParent.EmbeddedInode())
	dir, ok1 := n.path()
	ndir, ok2 := np.path()
	if !ok1 || !ok2 {
		return syscall.ENOENT
	}
	from, to := path.Join(dir, name), path.Join(ndir, newName)
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	var src *node
	if c := n.GetChild(name); c != nil {
		src = nodeOf(c)
		// A file not yet stored is stored first, so there is
		// something to move.
		if src.unstored() {
			if e := src.storeBuffer(cctx); e != 0 {
				return e
			}
		}
	}
	var dst *node
	if c := np.GetChild(newName); c != nil {
		dst = nodeOf(c)
	}
	if dst != nil && dst.unstored() {
		// The target exists only here: store it, so that the Move
		// fails or replaces as POSIX says.
		if e := dst.storeBuffer(cctx); e != 0 {
			return e
		}
	}
	if flags&renameNoReplace != 0 {
		// Under a write lease no other client changes the target's
		// name, so the cache's answer is the tree's; otherwise the
		// server is asked.
		var err error
		if n.s.cache.WriteLeased(to) {
			_, err = n.s.cache.Lookup(cctx, ndir, newName)
		} else {
			_, err = n.s.cache.Fresh(cctx, to)
		}
		if err == nil {
			return syscall.EEXIST
		} else if !ferry.IsKind(err, ferry.KindNotExist) {
			return errno(err)
		}
	}
	// The Move follows every store of either name, those the flushes
	// above may just have put in the background included.
	var replaced ferry.Dir
	if dst != nil {
		replaced = dst.lastAttrs()
	}
	// The buffers' locks are held across the Move, so that no store of
	// either lands under a name it no longer has (see fileNode.flush).
	// The kernel holds both files' locks across a rename, so two renames
	// never take these in opposite orders.
	sw := src.lockBuffer()
	var dw *wbuf
	if dst != src {
		dw = dst.lockBuffer()
	}
	unlock := func() {
		for _, wb := range []*wbuf{sw, dw} {
			if wb != nil {
				wb.mu.Unlock()
			}
		}
	}
	if n.s.opt.beforeNameChange != nil {
		n.s.opt.beforeNameChange(from)
	}
	var d ferry.Dir
	var err error
	if dst != nil && dst != src && n.s.hides(dst, dw, replaced) {
		var hidden string
		hidden, d, err = n.s.cache.MoveHiding(cctx, from, to)
		if hidden != "" {
			n.s.hidden(dst, hidden)
		}
	} else {
		d, err = n.s.cache.Move(cctx, from, to).Wait()
	}
	if err != nil {
		unlock()
		return errno(err)
	}
	// A replaced file with other names lost one.
	n.s.cache.LinkChanged(replaced)
	if dw != nil {
		dw.unlinked = true
	}
	if sw != nil {
		sw.movedParent, sw.movedName = np.EmbeddedInode(), newName
	}
	unlock()
	n.s.inos.move(from, to)
	if src != nil {
		src.remember(d)
	}
	return 0
}

// Link implements fs.NodeLinker: the server makes the hard link, and the
// new name is the target's node, as on a local disk.
func (dn *dirNode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n := &dn.node
	// The target gets another name: every own buffer of a file stored
	// goes, as a close would drop it (see beforeChange).
	n.s.beforeChange(ctx, nil)
	n.s.dropOwn(ctx)
	if e := checkName(name); e != 0 {
		return nil, e
	}
	if n.isCtl(name) {
		return nil, syscall.EEXIST
	}
	dir, ok := n.path()
	tn, isNode := asNode(target.EmbeddedInode())
	if !ok || !isNode {
		return nil, syscall.ENOENT
	}
	from, ok := tn.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	// The server must hold the file, and what was written to it, before
	// it has two names: from then on the buffer is stored in place.
	if e := tn.storeBuffer(ctx); e != 0 {
		return nil, e
	}
	p := path.Join(dir, name)
	cctx, cancel := n.s.ctx(ctx)
	defer cancel()
	got, err := n.s.cache.Link(cctx, from, p).Wait()
	if err != nil {
		return nil, errno(err)
	}
	src := got.Clone()
	src[ferry.AttrPath], src[ferry.AttrName] = from, path.Base(from)
	tn.relinked(src)
	c := target.EmbeddedInode()
	n.s.shareIno(got, c.StableAttr().Ino)
	n.entryOut(c, got, out)
	return c, 0
}

// Readlink implements fs.NodeReadlinker.
func (l *linkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n := &l.node
	d, e := n.attrs(ctx)
	if e != 0 {
		return nil, e
	}
	if d.Type() != ferry.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(d[ferry.AttrTarget]), 0
}

// Fsync implements fs.NodeFsyncer: a file's buffer is stored, and the
// background stores of the file, or of everything below a directory, are
// waited for.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := fh.(*handle); ok && h.wb != nil {
		if e := h.n.flush(ctx); e != 0 {
			return e
		}
	} else if fh == nil {
		// Written with no handle (unclosed.go).
		if e := n.storeBuffer(ctx); e != 0 {
			return e
		}
	}
	p, ok := n.path()
	if !ok {
		return 0
	}
	return errno(n.s.cache.Sync(ctx, p))
}

// Statfs implements fs.NodeStatfser. The tree does not report its space,
// so the numbers are fixed: 1 TiB free of 1 TiB, a billion free inodes.
// Programs that check for room before writing will find it; a full disk
// on the server shows up as EIO on close.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const bsize = 4096
	out.Bsize = bsize
	out.Frsize = bsize
	out.NameLen = ferry.MaxNameLen
	if v, ok := n.s.space(ctx); ok {
		out.Blocks = uint64(v.Total) / bsize
		out.Bfree = uint64(v.Free) / bsize
		out.Bavail = uint64(v.Avail) / bsize
		out.Files = uint64(v.Files)
		out.Ffree = uint64(v.FilesFree)
		return 0
	}
	// A tree that cannot say: plenty, rather than a full disk.
	out.Blocks = (1 << 40) / bsize
	out.Bfree = out.Blocks
	out.Bavail = out.Blocks
	out.Files = 1 << 30
	out.Ffree = out.Files
	return 0
}

// spaceFor is how long the tree's answer to Space is kept before it is
// asked again: df and file managers ask often, and free space seldom
// matters to the second.
const spaceFor = 2 * time.Second

// space returns the room of the file system below, from the tree if it
// can say (ferry.Spacer). Only the first call waits for the tree: later
// ones get the last answer, asked again in the background once it is
// older than spaceFor (grep and find ask at each run, and would each wait
// a round trip).
func (s *Server) space(ctx context.Context) (ferry.Space, bool) {
	sp, ok := ferry.As[ferry.Spacer](s.fsys)
	if !ok {
		return ferry.Space{}, false
	}
	s.spaceMu.Lock()
	known, stale := !s.spaceAt.IsZero(), time.Since(s.spaceAt) >= spaceFor
	if known && stale && !s.spaceAsking {
		s.spaceAsking = true
		go s.askSpace(context.Background(), sp)
	}
	v, ok := s.spaceVal, s.spaceOK
	s.spaceMu.Unlock()
	if !known {
		return s.askSpace(ctx, sp)
	}
	return v, ok
}

// askSpace asks the tree for its room and keeps the answer.
func (s *Server) askSpace(ctx context.Context, sp ferry.Spacer) (ferry.Space, bool) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := sp.Space(cctx, s.opt.Root).Wait()
	if err != nil {
		s.log.Debug("the tree did not say how much room it has", "err", err)
	}
	s.spaceMu.Lock()
	defer s.spaceMu.Unlock()
	s.spaceVal, s.spaceOK, s.spaceAt, s.spaceAsking = v, err == nil, time.Now(), false
	return v, err == nil
}
