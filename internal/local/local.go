// Package local implements a ferry.FS over a directory on disk.
//
// Every path is resolved below the root with openat-style resolution
// (os.Root): "..", absolute paths and symbolic links never reach outside the
// root, whatever the path says. A whole-file Put writes a temporary file in
// the tree's temporary directory (TempDir), syncs it and renames it over
// the target, so a reader or a crash sees the old content or the new, never
// a mix.
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/pred"
)

// TempPrefix starts the names of the temporary files of Puts and of their
// directory. Find and Watch do not show them.
const TempPrefix = ".ferry-tmp-"

// TempDir is the directory, at the root of the served directory, that holds
// the temporary files of Puts: one place to sweep at start instead of a
// walk of the whole tree, nothing left in the directories people use, and,
// being on the tree's own file system, a rename from it into the tree is
// atomic. No client can reach it (Reserved).
const TempDir = TempPrefix + "puts"

// Reserved fails with KindPermission if the clean path p lies in TempDir,
// which clients may neither read nor change.
func Reserved(op, p string) error {
	if p == "/"+TempDir || strings.HasPrefix(p, "/"+TempDir+"/") {
		return ferry.E(op, p, ferry.KindPermission, "reserved for the server's temporary files")
	}
	return nil
}

// ioChunk is how much Get and FindGet read from disk at once.
const ioChunk = 256 << 10

// Tree is a ferry.FS over a directory.
type Tree struct {
	root *os.Root

	apart   bool // Temporary files go in TempDir (NewServed).
	tempMu  sync.Mutex
	tempDev uint64 // TempDir's device, once made; 0 before.

	watchMu sync.Mutex
	watch   *watch // The Watches' shared inotify instance, while any runs.
}

var _ ferry.FS = (*Tree)(nil)

// New returns a Tree serving the directory dir, which must exist.
func New(dir string) (*Tree, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, ferry.E("local.New", dir, err)
	}
	return &Tree{root: r}, nil
}

// NewServed returns a Tree serving the directory dir for a server: the
// temporary files of its Puts are kept apart, in TempDir. A Tree from New,
// the CLI's view of a local directory, writes them beside their targets
// and leaves nothing else in the user's directory.
func NewServed(dir string) (*Tree, error) {
	t, err := New(dir)
	if err == nil {
		t.apart = true
	}
	return t, err
}

// Close releases the directory.
func (t *Tree) Close() error { return t.root.Close() }

// Dir returns the directory the tree serves.
func (t *Tree) Dir() string { return t.root.Name() }

// rel turns a ferry path into one relative to the root, as os.Root wants.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// clean checks ctx and cleans p.
func clean(ctx context.Context, op, p string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", ferry.E(op, p, ferry.KindCanceled, err)
	}
	p, err := ferry.CleanPath(p)
	if err == nil {
		err = Reserved(op, p)
	}
	return p, err
}

// fail wraps err as a ferry error. os.Root reports a path that escapes the
// root with an error that is no errno; such errors are permission errors.
func fail(op, p string, err error) error {
	var pe *fs.PathError
	var errno syscall.Errno
	if errors.As(err, &pe) && ferry.KindOf(err) == ferry.KindOther && !errors.As(pe.Err, &errno) {
		return ferry.E(op, p, ferry.KindPermission, "path escapes the served root")
	}
	return ferry.FromOS(op, p, err)
}

// dirOf describes the entry at p from its lstat info.
func (t *Tree) dirOf(p string, fi fs.FileInfo) ferry.Dir {
	d := ferry.Dir{
		ferry.AttrPath: p,
		ferry.AttrName: path.Base(p),
	}
	if p == "/" {
		d[ferry.AttrName] = "/"
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		d[ferry.AttrType] = ferry.TypeDir
	case m.IsRegular():
		d[ferry.AttrType] = ferry.TypeFile
	case m&fs.ModeSymlink != 0:
		d[ferry.AttrType] = ferry.TypeSymlink
		if target, err := t.root.Readlink(rel(p)); err == nil {
			d[ferry.AttrTarget] = target
		}
	case m&fs.ModeNamedPipe != 0:
		d[ferry.AttrType] = ferry.TypeFifo
	case m&fs.ModeSocket != 0:
		d[ferry.AttrType] = ferry.TypeSocket
	case m&fs.ModeCharDevice != 0:
		d[ferry.AttrType] = ferry.TypeChar
	case m&fs.ModeDevice != 0:
		d[ferry.AttrType] = ferry.TypeBlock
	default:
		d[ferry.AttrType] = ferry.TypeOther
	}
	d.SetInt(ferry.AttrSize, fi.Size())
	d.SetMtime(fi.ModTime())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		d[ferry.AttrMode] = ferry.ModeBits(st.Mode)
		d.SetInt(ferry.AttrUid, int64(st.Uid))
		d.SetInt(ferry.AttrGid, int64(st.Gid))
		d.SetInt(ferry.AttrNlink, int64(st.Nlink))
		d.SetInt(ferry.AttrMtime, st.Mtim.Nano())
		d.SetInt(ferry.AttrAtime, st.Atim.Nano())
		d.SetInt(ferry.AttrCtime, st.Ctim.Nano())
		d.SetInt(ferry.AttrIno, int64(st.Ino))
		if ferry.IsSpecial(d.Type()) {
			d.SetInt(ferry.AttrRdev, int64(st.Rdev))
		}
	} else {
		d.SetMode(fi.Mode())
	}
	return d
}

func (t *Tree) stat(op, p string) (ferry.Dir, error) {
	fi, err := t.root.Lstat(rel(p))
	if err != nil {
		return nil, fail(op, p, err)
	}
	d := t.dirOf(p, fi)
	t.readXattrs(p, d)
	return d, nil
}

// made describes p, just made or changed, with the times of its directory
// (ferry.AttrParentMtime, AttrParentCtime).
func (t *Tree) made(op, p string) (ferry.Dir, error) {
	d, err := t.stat(op, p)
	if err != nil || p == "/" {
		return d, err
	}
	if fi, err := t.root.Lstat(rel(path.Dir(p))); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			d.SetInt(ferry.AttrParentMtime, st.Mtim.Nano())
			d.SetInt(ferry.AttrParentCtime, st.Ctim.Nano())
		}
	}
	return d, nil
}

// Stat implements ferry.Tree.
func (t *Tree) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	const op = "local.Stat"
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	return ferry.Resolved(t.stat(op, p))
}

// Get implements ferry.Tree. The file is opened by the first Read.
func (t *Tree) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	return &reader{t: t, ctx: ctx, path: p, off: off, left: count}
}

type reader struct {
	t    *Tree
	ctx  context.Context
	path string
	off  int64
	left int64 // left < 0 reads to the end.
	f    *os.File
	err  error
}

func (r *reader) open() error {
	const op = "local.Get"
	p, err := clean(r.ctx, op, r.path)
	if err != nil {
		return err
	}
	r.path = p
	if r.off < 0 {
		return ferry.E(op, p, ferry.KindInvalid, "negative offset")
	}
	f, _, err := OpenRegular(r.t.root, rel(p))
	if err != nil {
		return fail(op, p, err)
	}
	r.f = f
	return nil
}

func (r *reader) Read(b []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.f == nil {
		if r.err = r.open(); r.err != nil {
			return 0, r.err
		}
	}
	if err := r.ctx.Err(); err != nil {
		r.err = ferry.E("local.Get", r.path, ferry.KindCanceled, err)
		return 0, r.err
	}
	if r.left == 0 {
		return 0, io.EOF
	}
	if r.left > 0 && int64(len(b)) > r.left {
		b = b[:r.left]
	}
	n, err := r.f.ReadAt(b, r.off)
	r.off += int64(n)
	if r.left > 0 {
		r.left -= int64(n)
	}
	if err != nil && err != io.EOF {
		err = fail("local.Get", r.path, err)
	}
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (r *reader) Close() error {
	if r.err == nil {
		r.err = ferry.E("local.Get", r.path, ferry.KindInvalid, "reader closed")
	}
	if r.f != nil {
		return r.f.Close()
	}
	return nil
}

// Put implements ferry.Tree.
func (t *Tree) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	const op = "local.Put"
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		if p == "/" && d.Type() != ferry.TypeDir {
			return nil, ferry.E(op, p, ferry.KindIsDir)
		}
		var err error
		if p != "/" {
			d = t.InheritGroup(p, d)
		}
		switch d.Type() {
		case ferry.TypeDir:
			err = t.putDir(p, d)
		case ferry.TypeSymlink:
			err = t.putLink(p, d)
		case ferry.TypeFifo, ferry.TypeSocket, ferry.TypeChar, ferry.TypeBlock:
			err = t.putSpecial(p, d)
		case ferry.TypeFile:
			if off == ferry.Whole {
				err = t.putWhole(ctx, p, d, data)
			} else {
				err = t.putAt(ctx, p, d, off, data)
			}
		default:
			err = ferry.E(op, p, ferry.KindInvalid, "cannot create entries of type "+d.Type())
		}
		if err != nil {
			return nil, fail(op, p, err)
		}
		return t.made(op, p)
	})
}

// InheritGroup returns the attributes of an entry to be made at p, d, with
// what a local disk gives one made in a directory with the set-group-ID
// bit, if nothing is at p yet: the directory's group, if d names none, and
// for a directory the bit too. The kernel cannot do it here: entries are
// made under a temporary name elsewhere and renamed into place, and a
// directory's mode is set after it is made.
func (t *Tree) InheritGroup(p string, d ferry.Dir) ferry.Dir {
	fi, err := t.root.Stat(rel(path.Dir(p)))
	if err != nil || fi.Mode()&fs.ModeSetgid == 0 {
		return d
	}
	if _, err := t.root.Lstat(rel(p)); !errors.Is(err, fs.ErrNotExist) {
		return d
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return d
	}
	d = d.Clone()
	if _, ok := d[ferry.AttrGid]; !ok {
		d.SetInt(ferry.AttrGid, int64(st.Gid))
	}
	if _, ok := d[ferry.AttrMode]; ok && d.Type() == ferry.TypeDir {
		d.SetMode(d.Mode() | fs.ModeSetgid)
	}
	return d
}

func (t *Tree) putDir(p string, d ferry.Dir) error {
	mode := d.Mode()
	if _, ok := d[ferry.AttrMode]; !ok {
		mode = 0o755
	}
	// os.Root takes permission bits only; setAttrs sets the others.
	err := t.root.Mkdir(rel(p), mode.Perm())
	if errors.Is(err, fs.ErrExist) {
		fi, serr := t.root.Lstat(rel(p))
		if serr != nil {
			return serr
		}
		if !fi.IsDir() {
			return ferry.E("", p, ferry.KindExist, "exists and is not a directory")
		}
	} else if err != nil {
		return err
	}
	return t.setAttrs(p, d, true)
}

// putLink makes a symbolic link under a temporary name and renames it into
// place, so that an existing entry is replaced atomically.
func (t *Tree) putLink(p string, d ferry.Dir) error {
	target, ok := d[ferry.AttrTarget]
	if !ok || target == "" || strings.IndexByte(target, 0) >= 0 {
		return ferry.E("", p, ferry.KindInvalid, "a symbolic link needs a target")
	}
	tmp := t.TempName(p)
	if err := t.root.Symlink(target, rel(tmp)); err != nil {
		return err
	}
	if err := t.root.Rename(rel(tmp), rel(p)); err != nil {
		t.root.Remove(rel(tmp))
		return err
	}
	return t.setAttrs(p, d, false)
}

// putSpecial makes a pipe, socket or device node under a temporary name
// and renames it into place, as putLink does. Making a device needs the
// privilege the server runs with (KindPermission otherwise).
func (t *Tree) putSpecial(p string, d ferry.Dir) error {
	mode := uint32(d.Mode().Perm())
	if _, ok := d[ferry.AttrMode]; !ok {
		mode = 0o644
	}
	var dev int64
	if typ := d.Type(); typ == ferry.TypeChar || typ == ferry.TypeBlock {
		dev = d.Int(ferry.AttrRdev)
	}
	tmpPath := t.TempName(p)
	err := t.inDir(tmpPath, func(dir int, name string) error {
		return syscall.Mknodat(dir, name, ferry.IFMT(d.Type())|mode, int(dev))
	})
	if err != nil {
		return &fs.PathError{Op: "mknod", Path: p, Err: err}
	}
	// The umask applied to mknod; the mode asked for is set whole.
	d = d.Clone()
	if _, ok := d[ferry.AttrMode]; !ok {
		d[ferry.AttrMode] = ferry.ModeBits(mode)
	}
	if err := t.setAttrs(tmpPath, d, true); err != nil {
		t.root.Remove(rel(tmpPath))
		return err
	}
	if err := t.root.Rename(rel(tmpPath), rel(p)); err != nil {
		t.root.Remove(rel(tmpPath))
		return err
	}
	return nil
}

// inDir calls fn with p's directory, opened by the root without leaving
// itself, and p's name in it: the system calls that os.Root lacks (mknod,
// utimensat of a link itself) are made relative to that directory, and
// must not follow a link at the name (which could lead out).
func (t *Tree) inDir(p string, fn func(dir int, name string) error) error {
	if p == "/" {
		return ferry.E("", p, ferry.KindInvalid, "the root has no directory")
	}
	dir, err := t.root.Open(rel(path.Dir(p)))
	if err != nil {
		return err
	}
	defer dir.Close()
	return fn(int(dir.Fd()), path.Base(p))
}

// TempName returns a new tree path for a temporary file to be renamed over
// p once written: for a served tree, in TempDir if that is on the same
// file system as p's directory (so that the rename is atomic), else beside
// p (a file system mounted inside the tree, or a tree where TempDir cannot
// be made, or a tree from New). Its
// name is no longer than a name may be however long p's is. If p's
// directory does not exist it names a file beside p, so that creating it
// fails at once rather than after the data arrived.
func (t *Tree) TempName(p string) string {
	var b [8]byte
	rand.Read(b[:])
	suffix := "-" + hex.EncodeToString(b[:])
	base := path.Base(p)
	if n := ferry.MaxNameLen - len(TempPrefix) - len(suffix); len(base) > n {
		base = base[:n]
	}
	name := TempPrefix + base + suffix
	if !t.apart {
		return path.Join(path.Dir(p), name)
	}
	if dev := t.tempDir(); dev != 0 {
		var st unix.Stat_t
		if err := t.inDir(p, func(dir int, _ string) error { return unix.Fstat(dir, &st) }); err == nil && st.Dev == dev {
			return "/" + TempDir + "/" + name
		}
	}
	return path.Join(path.Dir(p), name)
}

// tempDir makes TempDir if it is not there and returns its device, or 0 if
// it cannot be made (a read-only tree: Puts fail there anyway).
func (t *Tree) tempDir() uint64 {
	t.tempMu.Lock()
	defer t.tempMu.Unlock()
	if t.tempDev != 0 {
		return t.tempDev
	}
	if err := t.root.Mkdir(TempDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0
	}
	fi, err := t.root.Lstat(TempDir)
	if err != nil || !fi.IsDir() {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		t.tempDev = uint64(st.Dev)
	}
	return t.tempDev
}

// putWhole writes data to a temporary file (TempName), syncs it, sets its
// attributes and renames it over p. On any failure the temporary file is
// removed and p is untouched.
func (t *Tree) putWhole(ctx context.Context, p string, d ferry.Dir, data io.Reader) (err error) {
	mode := d.Mode()
	if _, ok := d[ferry.AttrMode]; !ok {
		mode = 0o644
		// Keep the mode of the file being replaced, as editors expect,
		// set-ID bits too: a front end that must clear them (a write by
		// a caller without CAP_FSETID) does so itself.
		if fi, err := t.root.Lstat(rel(p)); err == nil && fi.Mode().IsRegular() {
			mode = fi.Mode()
		}
	}
	tmp := t.TempName(p)
	f, err := t.root.OpenFile(rel(tmp), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode&fs.ModePerm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			t.root.Remove(rel(tmp))
		}
	}()
	if data != nil {
		if _, err = copyCtx(ctx, f, data); err != nil {
			return err
		}
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	d = d.Clone()
	if _, ok := d[ferry.AttrMode]; !ok {
		d.SetMode(mode)
	}
	t.keptXattrs(p, d)
	if err = t.setAttrs(tmp, d, true); err != nil {
		return err
	}
	if err = ctx.Err(); err != nil {
		return err
	}
	return t.root.Rename(rel(tmp), rel(p))
}

// putAt writes data in place at off, creating the file if needed.
func (t *Tree) putAt(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) error {
	if off < 0 {
		return ferry.E("", p, ferry.KindInvalid, "negative offset")
	}
	mode := d.Mode()
	if _, ok := d[ferry.AttrMode]; !ok {
		mode = 0o644
	}
	// O_NONBLOCK: a named pipe without a reader fails at once instead of
	// holding the call.
	f, err := t.root.OpenFile(rel(p), os.O_WRONLY|os.O_CREATE|syscall.O_NONBLOCK, mode&fs.ModePerm)
	if err != nil {
		return err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = ferry.E("", p, ferry.KindInvalid, "not a regular file")
		}
		return err
	}
	if data != nil {
		_, err = copyCtx(ctx, io.NewOffsetWriter(f, off), data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return t.setAttrs(p, d, true)
}

// copyCtx copies src to dst, checking ctx between blocks so that a cancelled
// Put stops early.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, ioChunk)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, err := src.Read(buf)
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// setAttrs applies the owner, mode, extended attributes, atime and mtime
// that d names. With follow false p is a symbolic link, which has no mode
// of its own on Linux and whose own times are set. The owner goes first:
// a chown clears set-ID bits, which the mode may then set (as tar and
// rsync order them).
func (t *Tree) setAttrs(p string, d ferry.Dir, follow bool) error {
	r := rel(p)
	_, hasUid := d[ferry.AttrUid]
	_, hasGid := d[ferry.AttrGid]
	if hasUid || hasGid {
		uid, gid := -1, -1
		if hasUid {
			uid = int(d.Int(ferry.AttrUid))
		}
		if hasGid {
			gid = int(d.Int(ferry.AttrGid))
		}
		if err := t.root.Lchown(r, uid, gid); err != nil {
			return err
		}
	}
	if _, ok := d[ferry.AttrMode]; ok && follow {
		if err := t.root.Chmod(r, d.Mode()); err != nil {
			return err
		}
	}
	// Before the times: setting an extended attribute moves the ctime
	// only.
	if err := t.setXattrs(p, d); err != nil {
		return err
	}
	_, hasM := d[ferry.AttrMtime]
	_, hasA := d[ferry.AttrAtime]
	if !hasM && !hasA {
		return nil
	}
	if follow {
		// A zero time leaves that time as it is.
		var mt, at time.Time
		if hasM {
			mt = d.Mtime()
		}
		if hasA {
			at = d.Atime()
		}
		return t.root.Chtimes(r, at, mt)
	}
	// The link's own times: os.Root has no Lchtimes. UTIME_OMIT leaves
	// a time that d does not name as it is.
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if hasA {
		ts[0] = unix.NsecToTimespec(d.Atime().UnixNano())
	}
	if hasM {
		ts[1] = unix.NsecToTimespec(d.Mtime().UnixNano())
	}
	return t.inDir(p, func(dir int, name string) error {
		if err := unix.UtimesNanoAt(dir, name, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &fs.PathError{Op: "utimensat", Path: p, Err: err}
		}
		return nil
	})
}

// Move implements ferry.Tree.
func (t *Tree) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	const op = "local.Move"
	from, to, err := cleanPair(ctx, op, from, to)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	if from == "/" || to == "/" {
		return ferry.Resolved[ferry.Dir](nil, ferry.E(op, from, ferry.KindPermission, "cannot move the root"))
	}
	if err := t.root.Rename(rel(from), rel(to)); err != nil {
		return ferry.Resolved[ferry.Dir](nil, fail(op, from, err))
	}
	return ferry.Resolved(t.made(op, to))
}

// cleanPair is clean for the two paths of a Move or Link.
func cleanPair(ctx context.Context, op, from, to string) (string, string, error) {
	from, err := clean(ctx, op, from)
	if err == nil {
		to, err = clean(ctx, op, to)
	}
	return from, to, err
}

// Link implements ferry.Tree.
func (t *Tree) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	const op = "local.Link"
	from, to, err := cleanPair(ctx, op, from, to)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	if err := t.root.Link(rel(from), rel(to)); err != nil {
		return ferry.Resolved[ferry.Dir](nil, fail(op, from, err))
	}
	return ferry.Resolved(t.made(op, to))
}

// Remove implements ferry.Tree.
func (t *Tree) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	const op = "local.Remove"
	p, err := clean(ctx, op, p)
	if err == nil && p == "/" {
		err = ferry.E(op, p, ferry.KindPermission, "cannot remove the root")
	}
	if err == nil {
		if err = t.root.Remove(rel(p)); err != nil {
			err = fail(op, p, err)
		}
	}
	return ferry.Resolved(struct{}{}, err)
}

// RemoveAll implements ferry.Tree.
func (t *Tree) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	const op = "local.RemoveAll"
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.Resolved(struct{}{}, err)
	}
	if p == "/" {
		return ferry.Resolved(struct{}{}, ferry.E(op, p, ferry.KindPermission, "cannot remove the root"))
	}
	return ferry.Go(func() (struct{}, error) {
		if err := t.root.RemoveAll(rel(p)); err != nil {
			return struct{}{}, fail(op, p, err)
		}
		return struct{}{}, nil
	})
}

// Wstat implements ferry.Tree.
func (t *Tree) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	const op = "local.Wstat"
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	old, err := t.stat(op, p)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	if s, ok := d[ferry.AttrSize]; ok {
		if old.Type() != ferry.TypeFile {
			return ferry.Resolved[ferry.Dir](nil, ferry.E(op, p, ferry.KindIsDir, "size of a non-file"))
		}
		size := d.Int(ferry.AttrSize)
		if size < 0 || s == "" {
			return ferry.Resolved[ferry.Dir](nil, ferry.E(op, p, ferry.KindInvalid, "bad size "+s))
		}
		f, err := t.root.OpenFile(rel(p), os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			err = f.Truncate(size)
			f.Close()
		}
		if err != nil {
			return ferry.Resolved[ferry.Dir](nil, fail(op, p, err))
		}
	}
	if err := t.setAttrs(p, d, old.Type() != ferry.TypeSymlink); err != nil {
		return ferry.Resolved[ferry.Dir](nil, fail(op, p, err))
	}
	return ferry.Resolved(t.stat(op, p))
}

// Find implements ferry.Finder.
func (t *Tree) Find(ctx context.Context, p, predicate string) *ferry.Stream[ferry.Entry] {
	return t.find(ctx, "local.Find", p, predicate, false)
}

// FindGet implements ferry.Finder.
func (t *Tree) FindGet(ctx context.Context, p, predicate string) *ferry.Stream[ferry.Entry] {
	return t.find(ctx, "local.FindGet", p, predicate, true)
}

func (t *Tree) find(ctx context.Context, op, p, predicate string, data bool) *ferry.Stream[ferry.Entry] {
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.ErrStream[ferry.Entry](err)
	}
	pr, err := pred.Parse(predicate)
	if err != nil {
		return ferry.ErrStream[ferry.Entry](err)
	}
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		d, err := t.stat(op, p)
		if err != nil {
			return err
		}
		w := walker{t: t, op: op, pred: pr, data: data, send: send, ctx: ctx}
		w.maxDepth, w.bounded = pr.MaxDepth()
		return w.visit(p, d, 0)
	})
}

type walker struct {
	t        *Tree
	op       string
	pred     *pred.Pred
	data     bool
	send     func(ferry.Entry) error
	ctx      context.Context
	maxDepth int
	bounded  bool
}

// visit evaluates the predicate on d, sends it if it matches (with its data
// for FindGet) and descends into it if it is a directory not pruned.
func (w *walker) visit(p string, d ferry.Dir, depth int) error {
	match, prune := w.pred.Eval(d, depth)
	if match {
		if err := w.send(ferry.Entry{Dir: d}); err != nil {
			return err
		}
		if w.data && d.Type() == ferry.TypeFile {
			if err := w.sendData(p); err != nil {
				return err
			}
		}
	}
	if !d.IsDir() || prune || (w.bounded && depth >= w.maxDepth) {
		return nil
	}
	f, err := w.t.root.Open(rel(p))
	if err != nil {
		return w.inline(p, err)
	}
	// The directory stays open for its entries' extended attributes,
	// read through it (see Tree.onEntry).
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return w.inline(p, err)
	}
	at := "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) + "/"
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		cp := path.Join(p, e.Name())
		fi, err := e.Info()
		if err != nil {
			if err := w.inline(cp, err); err != nil {
				return err
			}
			continue
		}
		d := w.t.dirOf(cp, fi)
		if hasXattrs(d) {
			addXattrs(at+e.Name(), d)
		}
		if err := w.visit(cp, d, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// inline reports an entry that could not be read and lets the walk go on,
// unless the stream itself has been cancelled.
func (w *walker) inline(p string, err error) error {
	if cerr := w.ctx.Err(); cerr != nil {
		return cerr
	}
	return w.send(ferry.Entry{Dir: ferry.Dir{ferry.AttrPath: p, ferry.AttrName: path.Base(p)}, Err: fail(w.op, p, err)})
}

// sendData streams the content of the file at p in data Entries. A file
// that cannot be read is reported in line after its entry.
func (w *walker) sendData(p string) error {
	f, _, err := OpenRegular(w.t.root, rel(p))
	if err != nil {
		return w.inline(p, err)
	}
	defer f.Close()
	for {
		buf := make([]byte, ioChunk)
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			if serr := w.send(ferry.Entry{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return w.inline(p, err)
		}
	}
}

var _ ferry.Spacer = (*Tree)(nil)

// Space implements ferry.Spacer: the room of the file system holding the
// root (the whole file system, whatever path is asked about in it).
func (t *Tree) Space(ctx context.Context, p string) *ferry.Future[ferry.Space] {
	const op = "local.Space"
	return ferry.Go(func() (ferry.Space, error) {
		if _, err := clean(ctx, op, p); err != nil {
			return ferry.Space{}, err
		}
		f, err := t.root.Open(".")
		if err != nil {
			return ferry.Space{}, ferry.FromOS(op, p, err)
		}
		defer f.Close()
		var st unix.Statfs_t
		if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
			return ferry.Space{}, ferry.FromOS(op, p, err)
		}
		bs := st.Bsize
		return ferry.Space{Total: int64(st.Blocks) * bs, Free: int64(st.Bfree) * bs, Avail: int64(st.Bavail) * bs,
			Files: int64(st.Files), FilesFree: int64(st.Ffree)}, nil
	})
}
