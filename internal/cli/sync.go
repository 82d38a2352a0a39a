package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/remote"
)

func syncCmd() *cobra.Command {
	var o syncOpts
	c := &cobra.Command{
		Use:         "sync SRC DST",
		Annotations: map[string]string{briefFinds: ""},
		Short:       "Update the tree DST to match SRC, sending only what changed",
		Long: `Sync makes DST a copy of SRC, as rsync -a SRC/ DST/ does: it copies the files
whose size or modification time differ and the symbolic links whose target
differs, makes missing directories, and gives files and directories SRC's
modes and times. Either side, or both, may be remote (HOST[:PORT]:PATH) or
local. With --delete it also removes what DST holds that SRC does not.

Each tree is listed with one Find request, both at once; then the removals
are sent all at once, the missing directories one request per level of
depth, and the files with up to 128 in flight, without waiting for each.
Whole files go through the chunk cache: only the chunks the other side
lacks cross the wire, and of a changed chunk of a file the server holds,
only the pieces of about 1 KiB that changed. To a server, all the files go
on one stream whose messages are batched and compressed together, so an
unchanged file costs about its chunk list. With -n it prints what it would do and changes
nothing. The summary line says how many files were sent and their bytes,
how many entries were removed and how many were left as they were, and what
crossed the wire for the files' data.

Limitations: files are compared by size and modification time only (there
is no --checksum: neither side reports content hashes yet), so a change
that keeps both is missed; owners are not copied, nor hard links (each link
is a separate file), devices, pipes or sockets; a directory that SRC has as
a file or link is replaced only with --delete; changes made to either tree
while it runs may or may not be carried over.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.out, o.errOut = cmd.OutOrStdout(), cmd.ErrOrStderr()
			o.filter = filterOf(cmd)
			return runSync(cmd, args[0], args[1], o)
		},
	}
	c.Flags().BoolVarP(&o.dryRun, "dry-run", "n", false, "print what would be done and change nothing")
	c.Flags().BoolVar(&o.delete, "delete", false, "remove what DST holds that SRC does not")
	c.Flags().BoolVarP(&o.verbose, "verbose", "v", false, "print each change made")
	return c
}

// syncOpts are the choices of one sync.
type syncOpts struct {
	dryRun, delete, verbose bool
	filter                  filter // Left out on both sides (filterPred): neither copied nor deleted.
	out, errOut             io.Writer
}

// syncSide is one side of a sync: a tree and the path in it.
type syncSide struct {
	fs   ferry.FS
	root string
	// open, if not nil, opens a file of the side for reading at offsets,
	// so that a remote Put can send it by chunks and resume it.
	open func(p string) (*os.File, error)
	// c is the side's client if it is remote, for its traffic counts.
	c *remote.Client
}

// runSync opens both sides of a sync, remote or local, and runs it.
func runSync(cmd *cobra.Command, srcArg, dstArg string, o syncOpts) error {
	ctx := cmd.Context()
	src, closeSrc, err := openSide(cmd, srcArg, false, o.dryRun)
	if err != nil {
		return err
	}
	defer closeSrc()
	d, err := src.fs.Stat(ctx, src.root).Wait()
	if err != nil {
		return err
	}
	dst, closeDst, err := openSide(cmd, dstArg, d.IsDir(), o.dryRun)
	if err != nil {
		return err
	}
	defer closeDst()
	if !d.IsDir() {
		// A file synced to a directory goes inside it, as with cp.
		if dd, err := dst.fs.Stat(ctx, dst.root).Wait(); err == nil && dd.IsDir() {
			dst.root = path.Join(dst.root, path.Base(src.root))
		}
	}
	start := time.Now()
	st, err := syncTrees(ctx, src, dst, o)
	verb := "synced"
	if o.dryRun {
		verb = "would sync"
	}
	fmt.Fprintf(o.errOut, "ferry: %s %d files (%s), %d deleted, %d unchanged; %s on the wire in %v\n",
		verb, st.files, sizeString(st.bytes), st.deleted, st.unchanged, sizeString(st.wire), time.Since(start).Round(time.Millisecond))
	return err
}

// openSide opens the remote target or local path arg as a sync side. A
// local side is a Tree over the directory arg (made if dir and it is
// missing, unless dryRun) or, for a file, over its parent. The returned
// function closes what it opened.
func openSide(cmd *cobra.Command, arg string, dir, dryRun bool) (syncSide, func(), error) {
	if IsRemote(arg) {
		t, err := ParseTarget(arg)
		if err != nil {
			return syncSide{}, nil, err
		}
		s, err := openStack(cmd, t.Addr)
		if err != nil {
			return syncSide{}, nil, err
		}
		return syncSide{fs: s, root: t.Path, c: s.client}, func() { s.Close() }, nil
	}
	base, root := arg, "/"
	if fi, err := os.Stat(arg); err == nil && !fi.IsDir() || err != nil && !dir {
		base, root = filepath.Dir(arg), "/"+filepath.Base(arg)
	} else if err != nil && !dryRun {
		if err := os.MkdirAll(arg, 0o755); err != nil {
			return syncSide{}, nil, err
		}
	} else if err != nil {
		// A dry run into a directory that does not exist: it is empty.
		base = filepath.Dir(filepath.Clean(arg))
		root = "/" + filepath.Base(filepath.Clean(arg))
	}
	return localSide(base, root)
}

// localSide returns a side over the local directory base at root.
func localSide(base, root string) (syncSide, func(), error) {
	t, err := local.New(base)
	if err != nil {
		return syncSide{}, nil, err
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		t.Close()
		return syncSide{}, nil, err
	}
	open := func(p string) (*os.File, error) { return r.Open(strings.TrimPrefix(p, "/")) }
	return syncSide{fs: t, root: root, open: open}, func() { r.Close(); t.Close() }, nil
}

// syncStats counts what a sync did or would do.
type syncStats struct {
	files     int   // Files and links copied, or given new attributes.
	bytes     int64 // The bytes of the files copied.
	deleted   int   // Entries removed from the destination.
	unchanged int   // Entries left as they were.
	wire      int64 // Bytes of file data on the wire, after chunking and compression.
}

// syncItem is one entry of the source and what the destination holds at
// its place.
type syncItem struct {
	rel      string // The path below the roots: "" for the roots, else "/a/b".
	src, dst ferry.Dir
}

// listing is a tree listed with Find: the entries by relative path, in
// the walk's order.
type listing struct {
	order  []string
	byRel  map[string]ferry.Dir
	failed []string // Relative paths that could not be read.
}

// list lists the tree at s.root in one Find request. A root that does not
// exist is an empty listing when missingOK.
func list(ctx context.Context, s syncSide, missingOK bool, f filter) (*listing, error) {
	l := &listing{byRel: map[string]ferry.Dir{}}
	if s.fs == nil {
		return l, nil
	}
	st := s.fs.Find(ctx, s.root, filterPred(s.root, "", f))
	for e := range st.All() {
		p := e.Dir.Path()
		if !ferry.HasPrefix(p, s.root) {
			st.Close()
			return nil, ferry.E("sync", p, ferry.KindInvalid, "an entry outside "+s.root)
		}
		rel := strings.TrimPrefix(p, s.root)
		if s.root == "/" && p == "/" {
			rel = ""
		} else if s.root == "/" {
			rel = p
		}
		if e.Err != nil {
			l.failed = append(l.failed, rel)
			continue
		}
		l.order = append(l.order, rel)
		l.byRel[rel] = e.Dir
	}
	err := st.Err()
	if err != nil && missingOK && ferry.KindOf(err) == ferry.KindNotExist && len(l.order) == 0 {
		err = nil
	}
	return l, err
}

// syncTrees makes dst a copy of src, or with o.dryRun says how.
func syncTrees(ctx context.Context, src, dst syncSide, o syncOpts) (syncStats, error) {
	var st syncStats
	before := wireOf(src, dst)
	var sl, dl *listing
	var serr, derr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); dl, derr = list(ctx, dst, true, o.filter) }()
	sl, serr = list(ctx, src, false, o.filter)
	wg.Wait()
	if serr != nil {
		return st, serr
	}
	if derr != nil {
		return st, derr
	}
	errs := errorList{w: o.errOut}
	for _, rel := range sl.failed {
		errs.add(ferry.E("sync", path.Join(src.root, rel), ferry.KindIO, "could not be read; left as it is"))
	}
	dstPath := func(rel string) string { return path.Join(dst.root, rel) }
	say := func(format string, args ...any) {
		if o.verbose || o.dryRun {
			fmt.Fprintf(o.out, format+"\n", args...)
		}
	}

	// The plan: what to remove, the directories to make, the files and
	// links to copy, the entries to give new attributes.
	var removes []ferry.Dir
	var mkdirs, copies, attrs []syncItem
	changed := map[string]bool{} // Directories in which an entry is made or removed.
	removed := map[string]bool{}
	for _, rel := range sl.order {
		s, d := sl.byRel[rel], dl.byRel[rel]
		it := syncItem{rel: rel, src: s, dst: d}
		if d != nil && d.Type() != s.Type() && (d.IsDir() || s.IsDir()) {
			if d.IsDir() && !o.delete {
				errs.add(ferry.E("sync", dstPath(rel), ferry.KindIsDir, "a directory where the source has a "+typeName(s)+"; --delete replaces it"))
				continue
			}
			removes = append(removes, d)
			removed[rel] = true
			it.dst = nil
		}
		switch s.Type() {
		case ferry.TypeDir:
			if it.dst == nil {
				mkdirs = append(mkdirs, it)
				changed[parentRel(rel)] = true
			}
		case ferry.TypeSymlink:
			if it.dst != nil && it.dst.Type() == ferry.TypeSymlink && it.dst[ferry.AttrTarget] == s[ferry.AttrTarget] {
				st.unchanged++
				continue
			}
			copies = append(copies, it)
			changed[parentRel(rel)] = true
		case ferry.TypeFile:
			switch {
			case it.dst == nil || it.dst.Type() != ferry.TypeFile || it.dst.Size() != s.Size() || !it.dst.Mtime().Equal(s.Mtime()):
				// The new file is renamed into place, which changes
				// its directory's mtime.
				copies = append(copies, it)
				changed[parentRel(rel)] = true
			case it.dst[ferry.AttrMode] != s[ferry.AttrMode]:
				attrs = append(attrs, it)
			default:
				st.unchanged++
			}
		default:
			errs.add(skippedErr("sync", path.Join(src.root, rel)))
		}
	}
	if o.delete {
		var gone string // The last entry removed, whose subtree goes with it.
		for _, rel := range dl.order {
			if gone != "" && ferry.HasPrefix(rel, gone) {
				st.deleted++
				continue
			}
			if removed[rel] {
				gone = rel
				continue
			}
			if _, ok := sl.byRel[rel]; ok || keptFailed(sl.failed, rel) {
				continue
			}
			gone = rel
			removes = append(removes, dl.byRel[rel])
			changed[parentRel(rel)] = true
			st.deleted++
		}
	}
	for _, d := range removes {
		say("delete %s", d.Path())
	}
	// A directory's attributes are set last, since making and removing
	// entries in it changes its mtime.
	var dirAttrs []syncItem
	for _, rel := range sl.order {
		s, d := sl.byRel[rel], dl.byRel[rel]
		if !s.IsDir() {
			continue
		}
		if d == nil || removed[rel] || changed[rel] || d[ferry.AttrMode] != s[ferry.AttrMode] || !d.Mtime().Equal(s.Mtime()) {
			dirAttrs = append(dirAttrs, syncItem{rel: rel, src: s})
		} else {
			st.unchanged++
		}
	}
	for _, it := range mkdirs {
		say("mkdir %s", dstPath(it.rel))
	}
	for _, it := range copies {
		st.files++
		if it.src.Type() == ferry.TypeSymlink {
			say("link %s -> %s", dstPath(it.rel), it.src[ferry.AttrTarget])
			continue
		}
		st.bytes += it.src.Size()
		say("copy %s (%s)", dstPath(it.rel), sizeString(it.src.Size()))
	}
	for _, it := range attrs {
		st.files++
		say("attrs %s", dstPath(it.rel))
	}
	if o.dryRun {
		return st, errs.err()
	}

	// Removals all at once: none is below another.
	futs := make([]*ferry.Future[struct{}], len(removes))
	for i, d := range removes {
		if d.IsDir() {
			futs[i] = dst.fs.RemoveAll(ctx, d.Path())
		} else {
			futs[i] = dst.fs.Remove(ctx, d.Path())
		}
	}
	for _, f := range futs {
		_, err := f.Wait()
		errs.add(err)
	}
	// Directories a level of depth at a time, so that parents exist.
	byLevels(mkdirs, func(it syncItem) string { return dstPath(it.rel) }, false, false, &errs,
		func(it syncItem) *ferry.Future[ferry.Dir] {
			// Owner-writable until its own mode is set, last, so that
			// entries can be made in it.
			return dst.fs.Put(ctx, dstPath(it.rel), ferry.Dir{ferry.AttrType: ferry.TypeDir, ferry.AttrMode: "0700"}, 0, nil)
		})
	// Files and links without waiting for each; to a server, the files'
	// puts share one stream, so that what they send compresses together.
	var rp replacer
	if b := batchOf(ctx, dst.fs); b != nil {
		defer b.Close()
		rp = b
	}
	if err := inFlight(ctx, copies, putParallel, &errs, func(it syncItem) error { return syncCopy(ctx, src, dst, it, rp) }); err != nil {
		return st, err
	}
	var afuts []*ferry.Future[ferry.Dir]
	for _, it := range append(attrs, dirAttrs...) {
		afuts = append(afuts, dst.fs.Wstat(ctx, dstPath(it.rel), ferry.Dir{ferry.AttrMode: it.src[ferry.AttrMode], ferry.AttrMtime: it.src[ferry.AttrMtime]}))
	}
	for _, f := range afuts {
		_, err := f.Wait()
		errs.add(err)
	}
	st.wire = wireOf(src, dst) - before
	return st, errs.err()
}

// replacer replaces a file a server holds, or makes it, by sending only the
// chunks the server lacks (a ferry.Batch).
type replacer interface {
	Replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir]
}

// syncCopy copies the file or link of it from src to dst, with its mode
// and mtime. A local file goes to rp, if not nil, by chunks whatever its
// size: only what the server lacks crosses the link.
func syncCopy(ctx context.Context, src, dst syncSide, it syncItem, rp replacer) error {
	to := path.Join(dst.root, it.rel)
	if it.src.Type() == ferry.TypeSymlink {
		_, err := dst.fs.Put(ctx, to, ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: it.src[ferry.AttrTarget]}, 0, nil).Wait()
		return err
	}
	d := ferry.Dir{ferry.AttrType: ferry.TypeFile, ferry.AttrMode: it.src[ferry.AttrMode], ferry.AttrMtime: it.src[ferry.AttrMtime]}
	if src.open != nil {
		f, err := src.open(it.src.Path())
		if err != nil {
			return ferry.E("sync", it.src.Path(), err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return ferry.E("sync", it.src.Path(), err)
		}
		return putLocal(ctx, dst.fs, to, d, f, fi.Size(), rp)
	}
	r := src.fs.Get(ctx, it.src.Path(), 0, -1)
	defer r.Close()
	_, err := dst.fs.Put(ctx, to, d, ferry.Whole, r).Wait()
	return err
}

// wireOf sums the bytes of file data that the remote sides' clients moved.
func wireOf(sides ...syncSide) int64 {
	var n int64
	for _, s := range sides {
		if s.c != nil {
			tr := s.c.Traffic()
			n += tr.GetWire + tr.PutWire
		}
	}
	return n
}

// parentRel returns the relative path of rel's directory.
func parentRel(rel string) string {
	if rel == "" {
		return ""
	}
	p := path.Dir(rel)
	if p == "/" {
		return ""
	}
	return p
}

// keptFailed reports whether rel is at or below a source entry that could
// not be read: what the destination holds there is not removed.
func keptFailed(failed []string, rel string) bool {
	for _, f := range failed {
		if f == "" || ferry.HasPrefix(rel, f) {
			return true
		}
	}
	return false
}

func typeName(d ferry.Dir) string {
	switch d.Type() {
	case ferry.TypeDir:
		return "directory"
	case ferry.TypeSymlink:
		return "link"
	case ferry.TypeFile:
		return "file"
	}
	return "special file"
}
