package cache

import (
	"bytes"
	"context"
	"io"
	"path"
	"strconv"
	"time"

	"github.com/ferryfs/ferry"
)

// Put implements ferry.Tree. The call follows this cache's changes of p in
// the background, and records what it made. With Options.WriteBehind a
// whole file of up to 16 MiB whose data can say its size (a
// *bytes.Reader, an *io.SectionReader) is stored in the background from a
// copy: the Future holds at once what the file will be.
func (c *FS) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	if ferry.IsCtl(p) {
		return c.below.Put(ctx, p, d, off, data)
	}
	if c.opt.WriteBehind && off == ferry.Whole && d.Type() == ferry.TypeFile {
		if f, ok := c.putBehind(ctx, p, d, data); ok {
			return f
		}
	}
	return ferry.Go(func() (ferry.Dir, error) {
		return c.putSettled(ctx, p, d, off, data)
	})
}

// putSettled makes the Put once the changes of p in the background are
// done.
func (c *FS) putSettled(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) (ferry.Dir, error) {
	if err := c.wback.follow(ctx, p); err != nil {
		return nil, err
	}
	return c.putNow(ctx, p, d, off, data)
}

// putNow makes the Put and records it.
func (c *FS) putNow(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) (ferry.Dir, error) {
	got, kept, err := c.store(ctx, c.below, p, d, off, data)
	return c.recordPut(p, got, off, kept, err)
}

// recordPut records a Put of p at off made at once, which gave got (whose
// content is kept, if not nil) or failed with err.
func (c *FS) recordPut(p string, got ferry.Dir, off int64, kept []byte, err error) (ferry.Dir, error) {
	c.stored(p)
	if err != nil {
		return nil, err
	}
	if off != ferry.Whole {
		// Written in place: a file with other names changed under
		// all of them.
		c.meta.dropLinked(got)
	}
	c.meta.set(got)
	c.meta.dropPending(p)
	if kept != nil {
		c.data.keep(got, kept)
	}
	return got, nil
}

// sized is data that can say how much of it there is.
type sized interface{ Size() int64 }

// Snapshotter is a reader of a whole file whose content is a slice that no
// one writes into: Put keeps that slice to store in the background instead
// of copying it.
type Snapshotter interface {
	Snapshot() []byte
}

// putBehind stores a whole file in the background, from a copy of data
// taken now, if the write-back budget takes it and the cache knows what
// the file is (the entry it shows until the store is done).
func (c *FS) putBehind(ctx context.Context, p string, d ferry.Dir, data io.Reader) (*ferry.Future[ferry.Dir], bool) {
	var size int64
	if data != nil {
		s, ok := data.(sized)
		if !ok {
			return nil, false
		}
		size = s.Size()
	}
	base := c.meta.last(p)
	if base == nil && !c.meta.absent(p) {
		return nil, false // What the file is now is not known here.
	}
	creates := base == nil || c.unmade(p)
	if base == nil {
		// A new file: what the tree gives one made without attributes,
		// until the store says.
		base = ferry.Dir{ferry.AttrType: ferry.TypeFile, ferry.AttrMode: "0644"}
		base.SetInt(ferry.AttrUid, c.opt.Uid)
		base.SetInt(ferry.AttrGid, c.opt.Gid)
		base.SetInt(ferry.AttrNlink, 1)
	}
	if size > SnapshotMax || base.IsDir() {
		return nil, false
	}
	var buf []byte
	if s, ok := data.(Snapshotter); ok {
		buf = s.Snapshot()
	} else if size > 0 {
		buf = make([]byte, size)
		if _, err := io.ReadFull(data, buf); err != nil {
			return ferry.Resolved[ferry.Dir](nil, ferry.E("cache.Put", p, ferry.KindIO, err)), true
		}
	}
	// now stores the copy at once, where the file cannot go behind.
	now := func() *ferry.Future[ferry.Dir] {
		return ferry.Go(func() (ferry.Dir, error) {
			return c.putSettled(ctx, p, d, ferry.Whole, bytes.NewReader(buf))
		})
	}
	queued, ok := c.behind(ctx, p)
	if !ok {
		return now(), true
	}
	defer queued()
	// The tree takes the mtime shown here until the store is done, so
	// that what this cache shows meanwhile stays true.
	d = d.Clone()
	if _, ok := d[ferry.AttrMtime]; !ok {
		d.SetMtime(time.Now())
	}
	local := base.Clone()
	for k, v := range d {
		local[k] = v
	}
	local[ferry.AttrPath], local[ferry.AttrName] = p, path.Base(p)
	local.SetInt(ferry.AttrSize, size)
	gen := c.nextGen(p)
	// Recorded as pending before the store can start: one that ends at
	// once drops the pending entry, which recording it after would bring
	// back for good (git then found its renamed lock files still there).
	c.meta.set(local)
	c.meta.addPending(local)
	// Read back from here until stored (a build reads what it wrote).
	c.data.keep(local, buf)
	ok = c.queueFile(p, &fileStore{d: d, buf: buf, gen: gen, creates: creates})
	if !ok {
		c.meta.dropPending(p)
		return now(), true
	}
	return ferry.Resolved(local, nil), true
}

// queueFile makes f what the file p is left as in the background: in
// place of a store or removal of p not yet started, or by a new one.
func (c *FS) queueFile(p string, f *fileStore) bool {
	if old, ok := c.wback.rewrite(p, func(old *fileStore) *fileStore {
		if old.gone && !old.creates && !f.gone {
			// A stored file removed, then made again: a put over it
			// would keep its mode and extended attributes, so the
			// removal goes first.
			return nil
		}
		f.creates = old.creates
		// The file keeps the mode and owner the store it replaces
		// was to give it (a chmod kept back with it), as a put over
		// the stored file keeps that file's.
		for _, k := range []string{ferry.AttrMode, ferry.AttrUid, ferry.AttrGid} {
			if _, ok := f.d[k]; !ok && !f.gone && old.d[k] != "" {
				f.d[k] = old.d[k]
			}
		}
		return f
	}); ok {
		switch {
		case f.gone && f.creates && !old.gone:
			// Created and removed before its store started:
			// neither crosses the wire.
			c.unsentFiles.Add(1)
			c.unsentBytes.Add(int64(len(old.buf)))
		case !old.gone:
			c.coalesced.Add(1)
		}
		return true
	}
	return c.wback.startFile(p, f, func(ctx context.Context, t changer, f *fileStore) error { return c.storeFile(ctx, t, p, f) })
}

// storeFile leaves the file p as f says, through t.
func (c *FS) storeFile(ctx context.Context, t changer, p string, f *fileStore) error {
	if f.gone {
		if f.creates {
			return nil
		}
		_, err := t.Remove(ctx, p).Wait()
		if err != nil {
			c.log.Error("removing a file in the background failed", "path", p, "err", err)
		}
		if c.lastGen(p, f.gen) {
			// Whatever a store before it recorded is gone now.
			c.meta.forget(p)
			go c.emit(ferry.Event{Path: p, Gone: true})
		}
		return err
	}
	got, _, err := c.store(ctx, t, p, f.d, ferry.Whole, bytes.NewReader(f.buf))
	if err == nil {
		c.storedFiles.Add(1)
		c.storedBytes.Add(int64(len(f.buf)))
	}
	if c.landed("storing a file", p, f.gen, got, err) {
		c.data.keep(got, f.buf)
	}
	return err
}

// landed records how a change of p made in the background (the gen'th,
// see nextGen) ended. A failure is logged, and p and the other paths the
// change touched are forgotten here and above: they show what the tree
// below has. A success records got, unless a later change of p is queued
// (what the cache shows is then newer); it reports whether it did.
func (c *FS) landed(what, p string, gen uint64, got ferry.Dir, err error, also ...string) bool {
	if err != nil {
		c.log.Error(what+" in the background failed: the change is lost", "path", p, "err", err)
		for _, q := range append([]string{p}, also...) {
			c.Unstored(q)
			// Not from here: an fsync waiting for this call may hold
			// the directory's lock that the kernel needs to take the
			// notice.
			go c.emit(ferry.Event{Path: q, Gone: true})
		}
		return false
	}
	if !c.lastGen(p, gen) {
		return false
	}
	// Recording drops the content held for p; a rename or a change of
	// attributes did not change it (git's index, renamed into place, is
	// read again at once).
	held, _ := c.data.held(p)
	c.meta.set(got)
	c.meta.dropPending(p)
	if held != nil && held.size == got.Size() {
		c.data.keepHeld(got, held)
	}
	return true
}

// store makes a Put below. A whole-file Put that a connection broke under
// (it may have looked alive a moment after the server went) is made again
// for up to Options.CallTimeout, if its data can be read again; a Put
// whose owner the tree refuses (chown by a server not run by root) is made
// again without it. It returns the content put if the file is one the
// cache keeps.
func (c *FS) store(ctx context.Context, t changer, p string, d ferry.Dir, off int64, data io.Reader) (ferry.Dir, []byte, error) {
	var start int64
	seeker, canRewind := data.(io.Seeker)
	if canRewind {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			canRewind = false
		}
	}
	// The data goes below as it came: a layer below may need more of it
	// than a reader (a chunked put reads it at offsets).
	attempt := func(d ferry.Dir) (ferry.Dir, error) {
		return t.Put(ctx, p, d, off, data).Wait()
	}
	// A group's changes are made at its Commit, which rides out a broken
	// connection itself: a change cannot be made in it again.
	if _, grouped := t.(*recorder); grouped {
		canRewind = false
	}
	rewind := func() bool {
		if data == nil {
			return true
		}
		if !canRewind {
			return false
		}
		_, err := seeker.Seek(start, io.SeekStart)
		return err == nil
	}
	until := time.Now().Add(c.opt.CallTimeout)
	got, err := attempt(d)
	for off == ferry.Whole && ferry.IsKind(err, ferry.KindUnavailable) && ctx.Err() == nil && time.Now().Before(until) && rewind() {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		c.log.Debug("storing again after a broken connection", "path", p, "err", err)
		got, err = attempt(d)
	}
	_, hasU := d[ferry.AttrUid]
	_, hasG := d[ferry.AttrGid]
	if ferry.IsKind(err, ferry.KindPermission) && (hasU || hasG) && rewind() {
		d = d.Clone()
		delete(d, ferry.AttrUid)
		delete(d, ferry.AttrGid)
		c.log.Debug("put without the owner", "path", p, "err", err)
		got, err = attempt(d)
	}
	if err != nil {
		return nil, nil, err
	}
	// A file the cache keeps is read back from data where it can be,
	// without a copy on the way down.
	if ra, ok := data.(io.ReaderAt); ok && off == ferry.Whole && got.Size() <= treeFile {
		kept := make([]byte, got.Size())
		if n, err := ra.ReadAt(kept, start); int64(n) == got.Size() && (err == nil || err == io.EOF) {
			return got, kept, nil
		}
	}
	return got, nil, nil
}

// Make creates the entry d describes at p, where there is none (mkdir,
// symlink, mknod): unlike Put, it knows that a directory it makes is
// empty. With Options.WriteBehind a directory is made in the background.
func (c *FS) Make(ctx context.Context, p string, d ferry.Dir) (ferry.Dir, error) {
	defer c.meta.expect(p)()
	var got ferry.Dir
	var queued func()
	behind := false
	if d.IsDir() || d.Type() == ferry.TypeSymlink {
		queued, behind = c.behind(ctx, p)
	}
	if behind {
		got = c.makeBehind(p, d)
		queued()
	} else {
		if err := c.wback.follow(ctx, p); err != nil {
			return nil, err
		}
		var err error
		if got, _, err = c.store(ctx, c.below, p, d, ferry.Whole, nil); err != nil {
			return nil, err
		}
	}
	c.meta.set(got)
	var nlink int64
	if got.IsDir() {
		c.meta.created(p)
		nlink = 1 // The new directory's "..".
	}
	c.meta.touch(path.Dir(p), nlink, got)
	return got, nil
}

// makeBehind makes the directory or symbolic link p with the attributes d
// in the background and returns what it will be. configure makes and
// removes a symbolic link in every run of some of its checks.
func (c *FS) makeBehind(p string, d ferry.Dir) ferry.Dir {
	local := d.Clone()
	local[ferry.AttrPath], local[ferry.AttrName] = p, path.Base(p)
	if _, ok := local[ferry.AttrUid]; !ok {
		local.SetInt(ferry.AttrUid, c.opt.Uid)
	}
	if _, ok := local[ferry.AttrGid]; !ok {
		local.SetInt(ferry.AttrGid, c.opt.Gid)
	}
	local.SetMtime(time.Now())
	if d.IsDir() {
		local.SetInt(ferry.AttrNlink, 2)
	} else {
		// A symbolic link: its size is its target's, and Linux shows
		// every link with all permissions.
		local.SetInt(ferry.AttrNlink, 1)
		local.SetInt(ferry.AttrSize, int64(len(d[ferry.AttrTarget])))
		if _, ok := local[ferry.AttrMode]; !ok {
			local[ferry.AttrMode] = "0777"
		}
	}
	// A change of p kept back after this one (a chmod of the new
	// directory) must not be undone by this one's answer, which may be
	// recorded after that change's.
	gen := c.nextGen(p)
	c.wback.start(p, 0, func(ctx context.Context, t changer) error {
		got, _, err := c.store(ctx, t, p, d, ferry.Whole, nil)
		if err != nil {
			c.log.Error("making a directory or link in the background failed", "path", p, "err", err)
			c.meta.forget(p)
			// Not from here: an fsync waiting for this call may hold
			// the directory's lock that the kernel needs to take the
			// notice.
			go c.emit(ferry.Event{Path: p, Gone: true})
			return err
		}
		if c.lastGen(p, gen) {
			c.meta.set(got)
		}
		return nil
	})
	return local
}

// Remove implements ferry.Tree. With Options.WriteBehind a file with one
// name is removed in the background, after the calls on it before it; so
// is a directory under a write lease that the cache knows to be empty
// (no other client adds to it while the lease lasts). Any other rmdir
// must hear from the tree whether the directory was empty.
func (c *FS) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	dir := path.Dir(p)
	d := c.meta.known(p)
	if d != nil && d.IsDir() && c.leases != nil && c.meta.emptyDir(p) {
		if queued, ok := c.behind(ctx, p); ok {
			defer queued()
			c.removeDirBehind(p)
			return ferry.Resolved(struct{}{}, nil)
		}
	}
	if d != nil && !d.IsDir() && !d.Linked() {
		if queued, ok := c.behind(ctx, p); ok {
			defer queued()
			// A store of the file still under way must not record it
			// again when it ends.
			c.queueFile(p, &fileStore{gone: true, gen: c.nextGen(p)})
			c.meta.dropPending(p)
			c.meta.forget(p)
			c.meta.touch(dir, 0, nil)
			return ferry.Resolved(struct{}{}, nil)
		}
	}
	return ferry.Go(func() (struct{}, error) {
		known := c.meta.known(p)
		if err := c.wback.follow(ctx, p); err != nil {
			return struct{}{}, err
		}
		if _, err := c.below.Remove(ctx, p).Wait(); err != nil {
			if ferry.IsKind(err, ferry.KindNotExist) && known != nil {
				// The cache held a name the tree does not have:
				// forgotten, the next look asks the tree rather
				// than find it here again; above, the kernel's
				// entry goes too (not from here, as in
				// makeBehind).
				c.meta.invalidate(p)
				go c.emit(ferry.Event{Path: p, Gone: true})
			}
			return struct{}{}, err
		}
		if known != nil {
			c.meta.dropLinked(known)
		} else {
			c.meta.dropAllLinked()
		}
		c.meta.forget(p)
		var nlink int64
		if known != nil && known.IsDir() {
			nlink = -1 // Its "..".
		}
		c.meta.touch(dir, nlink, nil)
		return struct{}{}, nil
	})
}

// removeDirBehind removes the empty directory p in the background. If the
// tree refuses, the directory is still there: the cache forgets what it
// thought and says so above.
func (c *FS) removeDirBehind(p string) {
	// The answer of a making of p still in the background (the mkdir
	// of a directory removed soon after, as configure's conftest.dir)
	// must not record p again when it lands.
	c.nextGen(p)
	c.wback.start(p, 0, func(ctx context.Context, t changer) error {
		_, err := t.Remove(ctx, p).Wait()
		if err != nil {
			c.log.Error("removing a directory in the background failed", "path", p, "err", err)
			c.meta.invalidateAll(p)
			// Not from here, as in makeBehind.
			go c.emit(ferry.Event{Path: p})
		}
		return err
	})
	c.meta.forget(p)
	c.meta.touch(path.Dir(p), -1, nil) // Its "..".
}

// RemoveAll implements ferry.Tree.
func (c *FS) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	return ferry.Go(func() (struct{}, error) {
		if err := c.wback.follow(ctx, p); err != nil {
			return struct{}{}, err
		}
		if _, err := c.below.RemoveAll(ctx, p).Wait(); err != nil {
			return struct{}{}, err
		}
		c.meta.forget(p)
		return struct{}{}, nil
	})
}

// Move implements ferry.Tree.
func (c *FS) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return c.move(ctx, from, to, false)
}

// move is Move; free says the caller knows no file is at to (see Hide).
func (c *FS) move(ctx context.Context, from, to string, free bool) *ferry.Future[ferry.Dir] {
	if f, ok := c.moveBehind(ctx, from, to, free); ok {
		return f
	}
	return ferry.Go(func() (ferry.Dir, error) {
		// The Move follows every change of either name in the
		// background: a store of the target landing after it would
		// undo it.
		if err := c.wback.follow(ctx, from, to); err != nil {
			return nil, err
		}
		kept, _ := c.data.held(from)
		replaced := c.meta.known(to)
		defer c.meta.expect(from, to)()
		d, err := c.below.Move(ctx, from, to).Wait()
		c.stored(from, to)
		if err != nil {
			return nil, err
		}
		// A replaced file with other names lost one.
		if replaced != nil {
			c.meta.dropLinked(replaced)
		} else {
			c.meta.dropAllLinked()
		}
		c.meta.renamed(from, d)
		if kept != nil && kept.mtime == d[ferry.AttrMtime] && kept.size == d.Size() {
			// A file written and renamed into place (git's
			// index.lock, an editor's save) is read back under its
			// new name.
			c.data.keepHeld(d, kept)
		}
		var nlink int64
		if d.IsDir() && path.Dir(from) != path.Dir(to) {
			nlink = 1 // The directory's ".." moved.
		}
		c.meta.touch(path.Dir(from), -nlink, nil)
		c.meta.touch(path.Dir(to), nlink, d)
		return d, nil
	})
}

// Link implements ferry.Tree.
func (c *FS) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		if err := c.wback.follow(ctx, from, to); err != nil {
			return nil, err
		}
		defer c.meta.expect(from, to)()
		got, err := c.below.Link(ctx, from, to).Wait()
		c.stored(from, to)
		if err != nil {
			return nil, err
		}
		// The target's link count and ctime moved too, under all its
		// names.
		c.meta.dropLinked(got)
		src := got.Clone()
		src[ferry.AttrPath], src[ferry.AttrName] = from, path.Base(from)
		c.meta.set(src)
		c.meta.set(got)
		c.meta.touch(path.Dir(to), 0, got)
		return got, nil
	})
}

// moveBehind renames a file or directory the cache knows in the
// background, if it may (see behind); free is as in move.
func (c *FS) moveBehind(ctx context.Context, from, to string, free bool) (*ferry.Future[ferry.Dir], bool) {
	base := c.meta.last(from)
	if base == nil || base.Linked() || ferry.HasPrefix(to, from) || base.IsDir() && c.meta.pendingBelow(from) {
		return nil, false
	}
	r := c.meta.last(to)
	if r.Linked() {
		// A file with other names loses one, as in a removal of one
		// of its names: those names show the tree's link count and
		// ctime only once it has the rename.
		return nil, false
	}
	// Only a rename that cannot fail goes behind: onto a name known to
	// be free, or a file over a file.
	if r == nil && !free && !c.meta.absent(to) || r != nil && (r.IsDir() || base.IsDir()) {
		return nil, false
	}
	queued, ok := c.behind(ctx, from, to)
	if !ok {
		return nil, false
	}
	defer queued()
	local := base.Clone()
	local[ferry.AttrPath], local[ferry.AttrName] = to, path.Base(to)
	kept, _ := c.data.held(from)
	replaced := c.meta.known(to)
	if replaced != nil {
		c.meta.dropLinked(replaced)
	} else {
		c.meta.dropAllLinked()
	}
	toCreates := c.meta.last(to) == nil || c.unmade(to)
	fromGen := c.nextGen(from)
	gen := c.nextGen(to)
	var moved *fileStore
	// The rename of a file whose store has not started is two ops, the
	// store's removal and a store under the new name: no group may be
	// cut between them.
	hold := c.wback.cutting.RLocker()
	hold.Lock()
	held := true
	defer func() {
		if held {
			hold.Unlock()
		}
	}()
	if !base.IsDir() {
		// A file whose store has not started is stored under its new
		// name instead (configure's mv conftest.er1 conftest.err).
		moved, _ = c.wback.rewrite(from, func(old *fileStore) *fileStore {
			if old.gone {
				return nil
			}
			return &fileStore{gone: true, gen: fromGen, creates: old.creates}
		})
	}
	c.meta.renamed(from, local)
	if !local.IsDir() {
		// Until the rename is done the tree below has no file at to.
		c.meta.addPending(local)
	}
	if kept != nil {
		c.data.keepHeld(local, kept)
	}
	var nlink int64
	if local.IsDir() && path.Dir(from) != path.Dir(to) {
		nlink = 1
	}
	c.meta.touch(path.Dir(from), -nlink, nil)
	c.meta.touch(path.Dir(to), nlink, nil)
	if moved != nil {
		// It keeps its own mode: a put over a file keeps that file's.
		d := moved.d.Clone()
		if _, ok := d[ferry.AttrMode]; !ok && base[ferry.AttrMode] != "" {
			d[ferry.AttrMode] = base[ferry.AttrMode]
		}
		f := &fileStore{d: d, buf: moved.buf, gen: gen, creates: toCreates}
		queued := c.queueFile(to, f)
		hold.Unlock()
		held = false
		if !queued {
			// The budget is full: stored at once, after what it
			// must follow.
			if err := c.wback.follow(ctx, to); err != nil {
				return ferry.Resolved[ferry.Dir](nil, err), true
			}
			if err := c.storeFile(ctx, c.below, to, f); err != nil {
				return ferry.Resolved[ferry.Dir](nil, err), true
			}
		}
		return ferry.Resolved(local, nil), true
	}
	c.wback.startAll([]string{from, to}, 0, func(ctx context.Context, t changer) error {
		got, err := t.Move(ctx, from, to).Wait()
		c.landed("renaming", to, gen, got, err, from)
		return err
	})
	return ferry.Resolved(local, nil), true
}

// wstatBehind changes attributes other than the size in the background,
// if it may (see behind).
func (c *FS) wstatBehind(ctx context.Context, p string, d ferry.Dir) (*ferry.Future[ferry.Dir], bool) {
	base := c.meta.last(p)
	if base == nil || base.Linked() {
		return nil, false
	}
	// Only times and the mode go behind, and the owner where the tree
	// below has let this cache give a file away: a change of size or
	// extended attributes may be refused, and must be refused at once.
	owners := c.owners.Load() || c.setter != nil && c.setter.SetsOwners()
	for k := range d {
		owner := (k == ferry.AttrUid || k == ferry.AttrGid) && owners
		if k != ferry.AttrMode && k != ferry.AttrMtime && k != ferry.AttrAtime && !owner {
			return nil, false
		}
	}
	queued, ok := c.behind(ctx, p)
	if !ok {
		return nil, false
	}
	defer queued()
	local := base.Clone()
	for k, v := range d {
		local[k] = v
	}
	// A change of attributes changes the ctime, as the tree's will when
	// it is stored.
	local.SetInt(ferry.AttrCtime, time.Now().UnixNano())
	gen := c.nextGen(p)
	// The content is as it was: what is held of it stays.
	held, _ := c.data.held(p)
	c.meta.update(local)
	if held != nil {
		c.data.keepHeld(local, held)
	}
	// A file whose store has not started is stored with the new
	// attributes (a linker's chmod of what it wrote).
	if _, ok := c.wback.rewrite(p, func(f *fileStore) *fileStore {
		if f.gone {
			return nil
		}
		nd := f.d.Clone()
		for k, v := range d {
			nd[k] = v
		}
		return &fileStore{d: nd, buf: f.buf, gen: gen, creates: f.creates}
	}); ok {
		return ferry.Resolved(local, nil), true
	}
	c.wback.start(p, 0, func(ctx context.Context, t changer) error {
		got, err := t.Wstat(ctx, p, d).Wait()
		c.landed("changing attributes", p, gen, got, err)
		return err
	})
	return ferry.Resolved(local, nil), true
}

// ownerSetter is a tree that says whether it gives files to other owners
// when asked (remote.Client, from what its server said): owner changes
// then go behind from the first, instead of from the first that took.
type ownerSetter interface {
	SetsOwners() bool
}

// Wstat implements ferry.Tree.
func (c *FS) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	if f, ok := c.wstatBehind(ctx, p, d); ok {
		return f
	}
	return ferry.Go(func() (ferry.Dir, error) {
		if err := c.wback.follow(ctx, p); err != nil {
			return nil, err
		}
		got, err := c.below.Wstat(ctx, p, d).Wait()
		if err != nil {
			return nil, err
		}
		if u, ok := d[ferry.AttrUid]; ok && u != strconv.FormatInt(c.opt.Uid, 10) {
			// Only a privileged user gives a file away: the tree
			// below will take the owner changes that follow (tar
			// run by root sets every directory's).
			c.owners.Store(true)
		}
		c.meta.set(got)
		return got, nil
	})
}
