package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/pred"
	"github.com/ferryfs/ferry/internal/remote"
)

// putParallel bounds the file Puts of a tree upload in flight at once: enough
// to keep a long fat pipe busy with small files, few enough that memory and
// open files stay modest.
const putParallel = 128

func getCmd() *cobra.Command {
	return &cobra.Command{
		Use:         "get HOST:PATH [LOCAL]",
		Annotations: map[string]string{briefFinds: ""},
		Short:       "Download a file or a whole tree in one request",
		Long: `Get copies the file or tree at PATH to LOCAL (default "."). If LOCAL is an
existing directory the copy is made inside it under PATH's name, unless
PATH ends with a slash (host:/src/): then what src holds goes into LOCAL,
as rsync does. A tree is
one FindGet request that streams every entry and its data; with the chunk
cache, files above the chunk threshold are left out of it and fetched
beside it, up to 8 at a time, each by its chunks. Each file is written to a
temporary name and renamed into place when complete, so an interrupted get
leaves no half-written file. Modes and times are kept. The summary line
says how many bytes crossed the wire for how many bytes of files.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dst := "."
			if len(args) == 2 {
				dst = args[1]
			}
			return withRemote(cmd, args[0], func(ctx context.Context, c *stack, t Target) error {
				var split int64
				if c.HasCache() {
					split = remote.DefaultChunkMin
				}
				before := c.Traffic()
				// host:/src/ copies what src holds into an existing
				// LOCAL, not src itself (rsync's convention).
				o := getOpts{nest: !contentsOf(args[0]), split: split, filter: filterOf(cmd)}
				err := getSplit(ctx, c, t.Path, dst, o, newProgress(cmd.ErrOrStderr(), "get", -1, progressOptsOf(cmd)), cmd.ErrOrStderr())
				summary(cmd.ErrOrStderr(), "got", c.Traffic().Sub(before), err)
				return err
			})
		},
	}
}

// getParallel bounds the files fetched by chunks at once in a tree
// download: each costs a few round trips, so several in flight hide them.
const getParallel = 8

// getOpts are a get's choices: whether an existing directory dst receives
// p itself (nest) or what p holds; the size above which files go by chunks
// beside the stream (split, 0 for none); what to leave out (filter).
type getOpts struct {
	nest   bool
	split  int64
	filter filter
}

// getSplit is get that, if o.split > 0, fetches files larger than split
// bytes each by a whole-file Get (which moves them by chunks through the
// client's cache) rather than in the FindGet stream.
func getSplit(ctx context.Context, f ferry.FS, p, dst string, o getOpts, prog *progress, errOut io.Writer) error {
	defer prog.Finish()
	split := o.split
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() && o.nest {
		name := path.Base(p)
		if p == "/" {
			name = "."
		}
		dst = filepath.Join(dst, name)
	}
	parent := filepath.Dir(dst)
	root, err := os.OpenRoot(parent)
	if err != nil {
		return err
	}
	defer root.Close()
	w := &treeWriter{root: root, base: filepath.Base(dst), src: p, errs: errorList{w: errOut}}
	pred := ""
	var big *ferry.Stream[ferry.Entry]
	if split > 0 {
		pred = fmt.Sprintf("type!=f | size<=%d", split)
		big = f.Find(ctx, p, filterPred(p, fmt.Sprintf("type=f & size>%d", split), o.filter))
		defer big.Close()
	}
	s := f.FindGet(ctx, p, filterPred(p, pred, o.filter))
	for e := range s.All() {
		if err := w.entry(e); err != nil {
			s.Close()
			w.abort()
			return err
		}
		if e.Dir != nil && e.Dir.Type() == ferry.TypeFile {
			prog.Expect(e.Dir.Size())
			prog.Current(e.Dir.Path())
		}
		prog.Add(int64(len(e.Data)))
	}
	if err := s.Err(); err != nil {
		w.abort()
		return err
	}
	if err := w.closeFile(); err != nil {
		return err
	}
	if big != nil {
		// Every directory exists now: fetch the large files into them.
		if err := w.fetchAll(ctx, f, big, prog); err != nil {
			return err
		}
	}
	if err := w.finish(); err != nil {
		return err
	}
	return w.errs.err()
}

// treeWriter writes the entries of a FindGet below a local root. Writes go
// through os.Root, so a hostile server cannot make it write outside.
type treeWriter struct {
	root *os.Root
	base string // The name of the copy in root.
	src  string // The remote path the copy is of.
	errs errorList

	file   *os.File  // The file being received, under a temporary name.
	cur    ferry.Dir // Its entry.
	curRel string
	dirs   []dirAttrs // Directory attributes, set last since writing inside changes mtimes.
}

type dirAttrs struct {
	rel string
	d   ferry.Dir
}

func (w *treeWriter) rel(p string) (string, error) {
	if !ferry.HasPrefix(p, w.src) {
		return "", ferry.E("get", p, ferry.KindInvalid, "server sent an entry outside "+w.src)
	}
	return filepath.Join(w.base, filepath.FromSlash(strings.TrimPrefix(strings.TrimPrefix(p, w.src), "/"))), nil
}

func (w *treeWriter) entry(e ferry.Entry) error {
	if e.Dir == nil {
		if w.file == nil {
			return ferry.E("get", "", ferry.KindInvalid, "server sent data without an entry")
		}
		_, err := w.file.Write(e.Data)
		return err
	}
	if err := w.closeFile(); err != nil {
		return err
	}
	if e.Err != nil {
		w.errs.add(e.Err)
		return nil
	}
	rel, err := w.rel(e.Dir.Path())
	if err != nil {
		return err
	}
	switch e.Dir.Type() {
	case ferry.TypeDir:
		if err := w.root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		w.dirs = append(w.dirs, dirAttrs{rel, e.Dir})
	case ferry.TypeSymlink:
		w.root.Remove(rel)
		if err := w.root.Symlink(e.Dir[ferry.AttrTarget], rel); err != nil {
			w.errs.add(err)
		}
	case ferry.TypeFile:
		f, err := w.root.OpenFile(tempFor(rel), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		w.file, w.cur, w.curRel = f, e.Dir, rel
	}
	return nil
}

func tempFor(rel string) string {
	return filepath.Join(filepath.Dir(rel), ".ferry-get-"+filepath.Base(rel))
}

// closeFile completes the file being received: close, set mode and time,
// rename into place.
func (w *treeWriter) closeFile() error {
	if w.file == nil {
		return nil
	}
	f, rel := w.file, w.curRel
	w.file = nil
	if err := f.Close(); err != nil {
		w.root.Remove(tempFor(rel))
		return err
	}
	return w.install(rel, w.cur)
}

// install gives the received temporary file of rel the mode and time of d
// and renames it into place.
func (w *treeWriter) install(rel string, d ferry.Dir) error {
	tmp := tempFor(rel)
	if err := w.root.Chmod(tmp, d.Mode()); err != nil {
		return err
	}
	if err := w.root.Chtimes(tmp, d.Mtime(), d.Mtime()); err != nil {
		return err
	}
	return w.root.Rename(tmp, rel)
}

// fetchAll fetches the files that s lists, getParallel at a time, each by
// a whole-file Get. Errors of single files are reported and the others go
// on; a failed listing stops it.
func (w *treeWriter) fetchAll(ctx context.Context, t ferry.Tree, s *ferry.Stream[ferry.Entry], prog *progress) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, getParallel)
	for e := range s.All() {
		if e.Err != nil {
			mu.Lock()
			w.errs.add(e.Err)
			mu.Unlock()
			continue
		}
		prog.Expect(e.Dir.Size())
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := w.fetch(ctx, t, e.Dir, prog)
			mu.Lock()
			w.errs.add(err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return s.Err()
}

// fetch gets the file d into its place below the root.
func (w *treeWriter) fetch(ctx context.Context, t ferry.Tree, d ferry.Dir, prog *progress) error {
	rel, err := w.rel(d.Path())
	if err != nil {
		return err
	}
	f, err := w.root.OpenFile(tempFor(rel), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	r := t.Get(ctx, d.Path(), 0, -1)
	_, err = io.Copy(f, prog.Reader(r))
	r.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		w.root.Remove(tempFor(rel))
		return err
	}
	return w.install(rel, d)
}

// summary prints what a transfer moved: the files' bytes and what crossed
// the wire for them, after chunking and compression. A transfer that
// failed (err) says so rather than what it did as if it were done; a
// saving is shown only where there is one (a tiny file costs more on the
// wire than its bytes).
func summary(w io.Writer, verb string, tr remote.Traffic, err error) {
	files, wire := tr.GetBytes+tr.PutBytes, tr.GetWire+tr.PutWire
	saved := ""
	if files > 0 && wire < files {
		saved = fmt.Sprintf(" (%.1f%% saved)", 100*float64(files-wire)/float64(files))
	}
	if err != nil {
		fmt.Fprintf(w, "ferry: stopped after moving %s of files, %s on the wire\n", sizeString(files), sizeString(wire))
		return
	}
	fmt.Fprintf(w, "ferry: %s %s of files, %s on the wire%s\n", verb, sizeString(files), sizeString(wire), saved)
}

// sizeString formats n bytes for people.
func sizeString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (w *treeWriter) finish() error {
	if err := w.closeFile(); err != nil {
		return err
	}
	for i := len(w.dirs) - 1; i >= 0; i-- {
		d := w.dirs[i]
		if err := w.root.Chmod(d.rel, d.d.Mode()); err != nil {
			return err
		}
		if err := w.root.Chtimes(d.rel, d.d.Mtime(), d.d.Mtime()); err != nil {
			return err
		}
	}
	return nil
}

// abort removes the partly received file.
func (w *treeWriter) abort() {
	if w.file != nil {
		w.file.Close()
		w.root.Remove(tempFor(w.curRel))
		w.file = nil
	}
}

func putCmd() *cobra.Command {
	return &cobra.Command{
		Use:         "put LOCAL HOST:PATH",
		Annotations: map[string]string{briefFinds: ""},
		Short:       "Upload a file or a whole tree without waiting for each file",
		Long: `Put copies the local file or tree LOCAL to PATH on the server. If PATH is an
existing directory the copy is made inside it under LOCAL's name, unless
LOCAL ends with a slash (DIR/): then DIR's contents go into PATH, as rsync
does, so that the same put tried again after an interruption lands in the
same place. Each file
is committed atomically on the server. A tree's directories are made first,
one request per level of depth, then all its files are sent with up to 128
in flight, without waiting for each, on one stream whose messages are
batched and compressed together: a small file goes whole with its
attributes, one of 64 KiB or more by the chunks the server lacks. Errors
are reported at the end.

Limitations: owners are not copied (the server's user owns what it writes);
hard links are copied as separate files.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[1], func(ctx context.Context, c *stack, t Target) error {
				dst := t.Path
				if d, err := c.Stat(ctx, dst).Wait(); err == nil && d.IsDir() && !contentsOf(args[0]) {
					dst = path.Join(dst, filepath.Base(filepath.Clean(args[0])))
				}
				before := c.Traffic()
				err := put(ctx, c, args[0], dst, filterOf(cmd), progressOptsOf(cmd), cmd.ErrOrStderr())
				summary(cmd.ErrOrStderr(), "put", c.Traffic().Sub(before), err)
				return err
			})
		},
	}
}

// contentsOf reports whether the source argument s names a directory's
// contents rather than the directory (a trailing slash, or "/." as cp
// takes it): rsync's convention, under which a copy tried again lands in
// the same place instead of nesting a second copy inside the first.
func contentsOf(s string) bool {
	return strings.HasSuffix(s, "/") || strings.HasSuffix(s, "/.")
}

// localEntry is a local file or directory to upload.
type localEntry struct {
	path string // local
	dst  string // remote
	d    ferry.Dir
}

// put uploads the local tree src to dst on t.
func put(ctx context.Context, c ferry.FS, src, dst string, f filter, po progressOpts, errOut io.Writer) error {
	var dirs, files []localEntry
	var skipped []string
	var total int64
	// What is excluded is decided as the server decides for get and sync,
	// by the same predicate, on the paths as they will be under dst.
	var skip *pred.Pred
	if fp := filterPred(dst, "", f); fp != "" {
		var err error
		if skip, err = pred.Parse(fp); err != nil {
			return err
		}
	}
	err := filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		e := localEntry{path: p, dst: path.Join(dst, filepath.ToSlash(rel)), d: ferry.Dir{}}
		if skip != nil && rel != "." {
			d := ferry.Dir{ferry.AttrPath: e.dst, ferry.AttrName: de.Name(), ferry.AttrType: ferry.TypeFile}
			if de.IsDir() {
				d[ferry.AttrType] = ferry.TypeDir
			}
			if match, prune := skip.Eval(d, strings.Count(filepath.ToSlash(rel), "/")+1); !match {
				if prune && de.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		e.d.SetMode(fi.Mode())
		e.d.SetMtime(fi.ModTime())
		switch {
		case fi.IsDir():
			e.d[ferry.AttrType] = ferry.TypeDir
			dirs = append(dirs, e)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			delete(e.d, ferry.AttrMode)
			delete(e.d, ferry.AttrMtime)
			e.d[ferry.AttrType] = ferry.TypeSymlink
			e.d[ferry.AttrTarget] = target
			files = append(files, e)
		case fi.Mode().IsRegular():
			e.d[ferry.AttrType] = ferry.TypeFile
			total += fi.Size()
			files = append(files, e)
		default:
			// Said, as sync says it, rather than left out unseen.
			skipped = append(skipped, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	prog := newProgress(errOut, "put", total, po)
	defer prog.Finish()
	errs := errorList{w: errOut}

	// Directories first, one level of depth at a time, so that each level's
	// parents exist; the levels' puts are all in flight at once.
	byLevels(dirs, func(e localEntry) string { return e.dst }, false, true, &errs,
		func(e localEntry) *ferry.Future[ferry.Dir] { return c.Put(ctx, e.dst, e.d, 0, nil) })
	if len(errs.errs) > 0 {
		return errs.err()
	}

	// To a server, the files' puts share one stream, so that what they send
	// compresses together and none pays a call of its own.
	var rp replacer
	if len(files) > 1 {
		if b := batchOf(ctx, c); b != nil {
			defer b.Close()
			rp = freshPuts{b}
		}
	}
	if err := inFlight(ctx, files, putParallel, &errs, func(e localEntry) error { return putOne(ctx, c, e, prog, rp) }); err != nil {
		return err
	}
	// Directory times last: creating entries inside changed them.
	futs := make([]*ferry.Future[ferry.Dir], len(dirs))
	for i, d := range dirs {
		futs[i] = c.Wstat(ctx, d.dst, ferry.Dir{ferry.AttrMtime: d.d[ferry.AttrMtime]})
	}
	for _, f := range futs {
		_, err := f.Wait()
		errs.add(err)
	}
	for _, p := range skipped {
		errs.add(skippedErr("put", p))
	}
	return errs.err()
}

// skippedErr says that an upload left out the local entry at p, which is
// neither a file, a directory nor a symbolic link (a FIFO, a socket, a
// device).
func skippedErr(op, p string) error {
	return ferry.E(op, p, ferry.KindInvalid, "not a file, directory or link; skipped")
}

// inFlight calls fn for each item with up to n calls running at once, so
// that a slow link carries many requests without waiting for each, and adds
// their errors to errs. It returns ctx's error if ctx ends first, once the
// calls started have ended.
func inFlight[E any](ctx context.Context, items []E, n int, errs *errorList, fn func(E) error) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, n)
	for _, e := range items {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := fn(e)
			mu.Lock()
			errs.add(err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return nil
}

// freshPuts replaces by Put: a new tree's files are most likely new to the
// server.
type freshPuts struct{ b ferry.Batch }

func (f freshPuts) Replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return f.b.Put(ctx, p, d, src)
}

// putOne puts the local entry e, a regular file by rp if it is not nil.
func putOne(ctx context.Context, t ferry.Tree, e localEntry, prog *progress, rp replacer) error {
	prog.Current(e.dst)
	if e.d.Type() != ferry.TypeFile {
		_, err := t.Put(ctx, e.dst, e.d, 0, nil).Wait()
		return err
	}
	f, err := os.Open(e.path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return putLocal(ctx, t, e.dst, e.d, &progressFile{f: f, p: prog, size: fi.Size()}, fi.Size(), rp)
}

// localFile is a local file being put: read in order by a plain Put,
// at offsets by a chunked one.
type localFile interface {
	io.ReadSeeker
	io.ReaderAt
}

// putLocal puts the first size bytes of r at p of t with the attributes d:
// by rp if it is not nil (only what the server lacks crosses the link),
// else by one whole-file Put.
func putLocal(ctx context.Context, t ferry.Tree, p string, d ferry.Dir, r localFile, size int64, rp replacer) error {
	var err error
	if rp != nil {
		_, err = rp.Replace(ctx, p, d, io.NewSectionReader(r, 0, size)).Wait()
	} else {
		_, err = t.Put(ctx, p, d, ferry.Whole, r).Wait()
	}
	return err
}

// progressFile is a local file being put that counts toward the progress
// the furthest byte read, by Read or by ReadAt. It reads at offsets and
// seeks, so that the remote client can put it by chunks and resume it; a
// byte read twice counts once. A chunked put, which reads the whole file
// to cut it before it sends anything, counts through remote.PutProgress
// instead: the bytes it has sent or found on the server.
type progressFile struct {
	f        *os.File
	p        *progress
	size     int64
	mu       sync.Mutex
	pos      int64 // The offset of the next Read.
	furthest int64
	byPut    bool // Counting by Done, not by reads.
}

var _ remote.PutProgress = (*progressFile)(nil)

// Uncounted implements remote.PutProgress: from now on reads do not count.
func (r *progressFile) Uncounted() io.ReaderAt {
	r.mu.Lock()
	r.byPut = true
	r.mu.Unlock()
	return r.f
}

// Done implements remote.PutProgress; a put tried again counts no further
// than the file's size.
func (r *progressFile) Done(n int64) {
	r.mu.Lock()
	r.reached(min(r.furthest+n, r.size))
	r.mu.Unlock()
}

func (r *progressFile) reached(end int64) {
	if end > r.furthest {
		r.p.Add(end - r.furthest)
		r.furthest = end
	}
}

func (r *progressFile) Read(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, err := r.f.Read(b)
	r.pos += int64(n)
	r.reached(r.pos)
	return n, err
}

func (r *progressFile) ReadAt(b []byte, off int64) (int, error) {
	n, err := r.f.ReadAt(b, off)
	r.mu.Lock()
	if !r.byPut {
		r.reached(off + int64(n))
	}
	r.mu.Unlock()
	return n, err
}

func (r *progressFile) Seek(off int64, whence int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pos, err := r.f.Seek(off, whence)
	if err == nil {
		r.pos = pos
	}
	return pos, err
}
