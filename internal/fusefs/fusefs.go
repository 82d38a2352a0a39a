// Package fusefs mounts a ferry.FS in the kernel with FUSE, so that programs
// that know only the one-call-at-a-time file interface (git, make, editors)
// can work in a Ferry tree.
//
// The adaptor is about the kernel: inodes, open files, the kernel's caches
// and the errno table. What the mount knows of the tree it holds in the
// cache layer (internal/cache), which it stacks over the tree it is given:
// metadata fed by Find, small files fed by FindGet, write-behind, and the
// watch as lease. The adaptor adds:
//
//   - Kernel caches. While the cache holds its lease the kernel is given
//     long entry and attribute timeouts and keeps directory listings and
//     pages across opens; each event the cache passes up through its Watch
//     drops the kernel's copies through go-fuse's notify calls (watch.go,
//     kernel.go). A callback break is acknowledged once the kernel has
//     dropped what it names: the other client's call waits for it, so an
//     open here after its close returned sees the change. Without a lease
//     nothing is trusted for longer than Options.TTL, and an open asks the
//     server (cache.FS.Fresh).
//   - Writes. A file open for writing is buffered in a local temporary file
//     shared by all its open descriptors and sent with one whole-file,
//     atomic Put (ferry.Whole) when a descriptor is closed (flush) or
//     synced: close-to-open consistency, the data is on the server when
//     close returns. A new file exists only here (cache.FS.Created) until
//     that Put, so creating a file costs one round trip, not two. With
//     Options.WriteBack the cache stores it in the background instead, and
//     fsync waits for it. A file with several names is written in place.
//   - Reads. A file open for reading streams with one Get from the offset
//     read, with read-ahead; a jump backwards or far ahead starts a new Get.
//     Gets go by path: a descriptor open for reading only whose file is
//     replaced by a rename reads the new file where the kernel's cache
//     does not answer, unlike a local disk. A small file the cache holds,
//     or fetches with its directory's, is read from memory.
//
// With Options.Control the mount shows a control file, Ctl, at its top
// (ctl.go): the mount's state, the cache's and that of the layers below,
// and commands.
//
// Errnos are made only at this boundary, from one kind-to-errno table
// (errno.go). Hard links go through the Tree's Link; the names of a file
// with several share one inode number, keyed by the server's (inoKey).
// Times (atime, mtime, ctime) and link counts are the server's. Inode
// numbers are the mount's own, one per path (or per linked file), stable
// while the mount runs.
package fusefs

import (
	"context"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
)

// Options configure a mount. The zero value is usable.
type Options struct {
	// Root is the path in the tree to mount; "/" if empty.
	Root string
	// Control, if not nil, stacks the control layers of the mount and of
	// its cache over those below (internal/ctl) and returns the top one:
	// the mount then shows a control file, Ctl, at its top, which reads
	// as that tree's ferry.CtlPath does and takes commands written to it.
	Control func(mount, cache ferry.Controller) ferry.FS
	// Log receives the adaptor's messages; nothing is logged if nil.
	Log *slog.Logger
	// Cache configures the mount's cache layer (internal/cache): its
	// prefetch depth and budget, metadata entries, memory for contents
	// and watch backoff. Its Root, Log, TTL, CallTimeout, WriteBehind,
	// owner and HeldDir are the mount's, set from these Options.
	Cache cache.Options
	// TTL is how long metadata is trusted without a watch, in the adaptor
	// and in the kernel (default 1 s).
	TTL time.Duration
	// LeaseTTL is the kernel's entry and attribute timeout while a watch
	// is in place (default 1 min). Events invalidate sooner; this bounds
	// the harm of one that never comes.
	LeaseTTL time.Duration
	// TempDir holds the buffers of files open for writing; os.TempDir()
	// if empty.
	TempDir string
	// AllowOther lets users other than the one mounting use the mount.
	AllowOther bool
	// ReadOnly mounts read-only: the kernel refuses every change with
	// EROFS before it reaches the mount.
	ReadOnly bool
	// Uid and Gid, if set, are shown as the owner and group of every
	// file instead of the server's, as sshfs's and rclone's uid and gid
	// options do: the kernel checks permissions against them, so a user
	// whose number differs from the server's can work in a tree the
	// server's user owns. New entries then get the server's default
	// owner.
	Uid, Gid *uint32
	// KernelOpens lets the kernel open, create and close files by
	// itself on a write-back mount too, once a lease is held, as it does
	// on a read-only one (kernelFS): a warm grep -r then asks the mount
	// once per directory rather than three times per file. A file whose
	// last name goes while the kernel holds it is hidden rather than
	// removed (gone.go). ferry mount sets it by default.
	KernelOpens bool
	// Debug logs every FUSE request.
	Debug bool
	// FsName is shown as the file system's source by mount and df.
	FsName string
	// WriteBack makes close return before the file is stored: the data
	// is copied into memory and stored in the background, in order with
	// the mount's other calls on the same paths, and directories are
	// made the same way. fsync still waits until the file is stored, and
	// reports a failure of the background store, as does the next close
	// of the file; otherwise a failure is only logged. Files above 16 MiB
	// and writes beyond 256 MiB not yet stored are stored on close, as
	// without WriteBack.
	WriteBack bool
	// CallTimeout is how long a call waits for the server before it
	// fails with EIO (default 1 min); meanwhile a broken connection is
	// made again. The tree's own wait for a connection to come back
	// (remote.Config.ResumeFor) should not be longer: ferry mount
	// --timeout sets both.
	CallTimeout time.Duration

	// beforeNameChange, if set, runs as an unlink or a rename of p is
	// about to be sent: tests widen races with it.
	beforeNameChange func(p string)
}

// Server is a mounted tree.
type Server struct {
	// cache is the layer the adaptor works through (internal/cache):
	// metadata, small files fetched ahead of their reads, write-behind
	// and the watch. fsys is the same, as the stack's top.
	cache  *cache.FS
	fsys   ferry.FS
	opt    Options
	log    *slog.Logger
	root   *node
	srv    *fuse.Server
	mnt    string
	cancel context.CancelFunc
	done   chan struct{} // Closed when the watch loop has ended.

	// rootUid and rootGid own the mounted root on the server. Files
	// created by that owner are created without an explicit owner, so a
	// server that is not run by root can serve them.
	rootUid, rootGid int64

	// inos numbers the paths the kernel has seen (inos.go).
	inos *inoTable

	// negs holds the paths the kernel was told do not exist, for as long
	// as the lease lasts: a drop of a whole tree has to name each (the
	// kernel keeps a missing name's entry apart from any node).
	negMu sync.Mutex
	negs  map[string]struct{}

	// readdirs counts the listings the kernel asked for, for tests.
	readdirs atomic.Int64
	// ownMade counts the own buffers made for writes with no handle
	// (unclosed.go), for tests.
	ownMade atomic.Int64
	// pushed counts the files given to the kernel unasked (push.go);
	// arrivals queues files whose content arrived, to be given.
	pushed   atomic.Int64
	arrivals chan string
	// restats queues the directories whose listings the kernel read, and
	// the files it read, to be stated again (push.go); restated counts
	// the restats that reached the mount, for tests.
	restats  chan restat
	restated atomic.Int64
	// kernel stands between the kernel and go-fuse's file system.
	kernel *kernelFS
	// unclosed holds the files written with no close to come, when the
	// kernel opens files by itself (unclosed.go).
	unclosed unclosed
	// readFiles holds files read, to be stated again (unopened.go).
	readFiles readFiles
	// gone holds the files hidden rather than removed (gone.go).
	gone goneFiles

	// ctl serves the control file (Options.Control), if set.
	ctl      ferry.FS
	ctlOnce  sync.Once
	ctlInode *fs.Inode

	// The tree's last answer to Space (see space).
	spaceMu  sync.Mutex
	spaceVal ferry.Space
	spaceOK  bool
	spaceAt  time.Time
	// spaceAsking is set while the room is asked for in the background.
	spaceAsking bool
}

// Mount mounts the tree fsys at mountpoint and serves it in the
// background until Unmount or an external unmount (ferry umount,
// fusermount3 -u). The root must be a directory.
func Mount(mountpoint string, fsys ferry.FS, opt Options) (*Server, error) {
	const op = "fusefs.Mount"
	if opt.Root == "" {
		opt.Root = "/"
	}
	root, err := ferry.CleanPath(opt.Root)
	if err != nil {
		return nil, err
	}
	opt.Root = root
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.TTL <= 0 {
		opt.TTL = time.Second
	}
	if opt.CallTimeout <= 0 {
		opt.CallTimeout = time.Minute
	}
	if opt.LeaseTTL <= 0 {
		opt.LeaseTTL = time.Minute
	}
	if opt.TempDir == "" {
		opt.TempDir = os.TempDir()
	}
	if opt.FsName == "" {
		opt.FsName = "ferry:" + root
	}
	ctx, cancel := context.WithTimeout(context.Background(), opt.CallTimeout)
	d, err := fsys.Stat(ctx, root).Wait()
	cancel()
	if err != nil {
		return nil, err
	}
	if !d.IsDir() {
		return nil, ferry.E(op, root, ferry.KindNotDir)
	}
	s := &Server{
		opt: opt, log: opt.Log,
		done:    make(chan struct{}),
		rootUid: d.Int(ferry.AttrUid), rootGid: d.Int(ferry.AttrGid),
		inos: newInoTable(3),
		negs: map[string]struct{}{},
	}
	s.unclosed.files = map[*fileNode]struct{}{}
	s.unclosed.open = map[*fileNode]struct{}{}
	s.unclosed.own = map[*fileNode]struct{}{}
	s.unclosed.storing = map[*fileNode]int{}
	s.unclosed.stored = make(chan struct{})
	co := opt.Cache
	co.Root, co.Log, co.TTL, co.CallTimeout, co.WriteBehind = root, opt.Log, opt.TTL, opt.CallTimeout, opt.WriteBack
	co.Uid, co.Gid, co.HeldDir, co.Handover = s.rootUid, s.rootGid, s.heldDir, s.handover
	s.arrivals = make(chan string, 4096)
	s.restats = make(chan restat, 4096)
	co.Arrived = s.arrived
	s.cache = cache.New(fsys, co)
	s.fsys = s.cache
	if opt.Control != nil {
		s.ctl = opt.Control(s, s.cache)
	}
	rootOp, rootNode := newNode(s, syscall.S_IFDIR)
	s.root = rootNode
	zero := time.Duration(0)
	fopt := &fs.Options{
		// Timeouts are set on each reply (see timeouts); these are the
		// fallbacks for replies that carry none.
		EntryTimeout:    &opt.TTL,
		AttrTimeout:     &opt.TTL,
		NegativeTimeout: &zero,
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName: opt.FsName,
			Name:   "ferry",
			// The kernel checks permissions against the attributes
			// the server reports, as a local file system would.
			Options: []string{"default_permissions"},
			// Many requests in flight: each waits on the network,
			// not on a disk.
			MaxBackground: 128,
			MaxWrite:      1 << 20,
			MaxReadAhead:  1 << 20,
			// The kernel sends one read at a time per open file, in
			// order, so a read continues the stream of the last.
			SyncRead:   true,
			AllowOther: opt.AllowOther,
			Debug:      opt.Debug,
			// Unmount without fusermount when running as root, which
			// is also what lets tests mount several times quickly.
			DirectMount: os.Geteuid() == 0,
		},
	}
	if opt.Debug {
		fopt.MountOptions.Logger = log.New(&slogWriter{opt.Log}, "", 0)
	}
	if opt.ReadOnly {
		fopt.MountOptions.Options = append(fopt.MountOptions.Options, "ro")
	}
	if !s.kernelOpens() || opt.ReadOnly {
		// O_TRUNC comes with the open, so writing over a file (cp,
		// tar, an assembler's output) does not fetch its old content
		// first only to truncate it after. Not when the kernel may
		// open files by itself: it then takes the truncation as done
		// by an open it never sends (it comes as a Setattr instead).
		fopt.MountOptions.ExtraCapabilities = fuse.CAP_ATOMIC_O_TRUNC
	}
	// Writes ask for no security.capability first (kernel.go).
	fopt.MountOptions.ExtraCapabilities |= fuse.CAP_HANDLE_KILLPRIV_V2
	mnt, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, ferry.E(op, mountpoint, ferry.KindInvalid, err)
	}
	s.kernel = &kernelFS{RawFileSystem: fs.NewNodeFS(rootOp, fopt), s: s}
	srv, err := fuse.NewServer(s.kernel, mnt, &fopt.MountOptions)
	if err != nil {
		s.cache.Close()
		return nil, ferry.E(op, mnt, ferry.KindIO, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		s.cache.Close()
		return nil, ferry.E(op, mnt, ferry.KindIO, err)
	}
	s.srv, s.mnt = srv, mnt
	wctx, wcancel := context.WithCancel(context.Background())
	s.cancel = wcancel
	go func() {
		defer close(s.done)
		s.watch(wctx)
	}()
	go s.pushArrivals(wctx)
	go s.restatQueued(wctx)
	go func() {
		srv.Wait()
		wcancel()
	}()
	// The first walks are worth making under the lease: one begun before
	// the watch is in place cannot be trusted past the TTL, and is made
	// again. Waiting costs a round trip here rather than in the first
	// command; a watch slow to come is not waited for long.
	select {
	case <-s.cache.Ready():
	case <-time.After(5 * time.Second):
	}
	// So are the root's attributes and listing, which the first command
	// in a fresh mount (tar x, ls) otherwise waits for, a round trip
	// each; the listing of a large tree goes on in the background.
	if s.cache.Leased() {
		fetched := make(chan struct{})
		go func() {
			defer close(fetched)
			ctx, cancel := s.ctx(context.Background())
			defer cancel()
			s.cache.Stat(ctx, root).Wait()
			s.cache.List(ctx, root)
		}()
		select {
		case <-fetched:
		case <-time.After(time.Second):
		}
	}
	opt.Log.Info("mounted", "tree", root, "at", mnt)
	return s, nil
}

// Wait blocks until the file system is unmounted.
func (s *Server) Wait() {
	s.srv.Wait()
	s.removeAllGone()
	s.drain()
	s.cancel()
	<-s.done
	s.cache.Close()
}

// drain waits, for up to a minute, for the stores write-back has in the
// background.
func (s *Server) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.cache.Drain(ctx)
}

// Unmount unmounts the file system and waits until it is no longer served.
// If programs still use it, it is detached lazily: it disappears from the
// namespace at once and is released when they are done.
func (s *Server) Unmount() error {
	s.drain()
	err := s.srv.Unmount()
	if err != nil {
		s.log.Warn("unmount failed, detaching", "at", s.mnt, "err", err)
		if derr := syscall.Unmount(s.mnt, syscall.MNT_DETACH); derr != nil {
			return ferry.E("fusefs.Unmount", s.mnt, ferry.KindIO, err)
		}
	}
	s.Wait()
	return nil
}

// Mountpoint returns where the tree is mounted.
func (s *Server) Mountpoint() string { return s.mnt }

// Counts returns how many Finds and Stats the metadata cache has issued.
func (s *Server) Counts() (finds, stats uint64) { return s.cache.Counts() }

// treePath returns the path in the tree of a path relative to the mount.
func (s *Server) treePath(rel string) string {
	if rel == "" {
		return s.opt.Root
	}
	if s.opt.Root == "/" {
		return "/" + rel
	}
	return s.opt.Root + "/" + rel
}

// timeouts returns the kernel's entry and attribute timeout and its
// negative-entry timeout: long while a watch lets the adaptor revoke them,
// short otherwise.
func (s *Server) timeouts() (ttl, negative time.Duration) {
	if s.cache.Leased() {
		return s.opt.LeaseTTL, s.opt.LeaseTTL
	}
	return s.opt.TTL, 0
}

// inoKey returns the key of d's inode number: its path, or for a file
// with several names the server's inode number, which all names share.
func inoKey(d ferry.Dir) string {
	if d.Linked() {
		return "#" + d[ferry.AttrIno]
	}
	return d.Path()
}

// shareIno gives the names of the linked file d the number ino, that of
// the node the kernel knows for it.
func (s *Server) shareIno(d ferry.Dir, ino uint64) {
	if k := inoKey(d); k != d.Path() {
		s.inos.set(k, ino)
	}
}

// slogWriter sends go-fuse's debug log to slog.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(b []byte) (int, error) {
	w.l.Debug(string(b))
	return len(b), nil
}
