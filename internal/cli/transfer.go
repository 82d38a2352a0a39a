package cli

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
)

// putParallel bounds the file Puts of a tree upload in flight at once: enough
// to keep a long fat pipe busy with small files, few enough that memory and
// open files stay modest.
const putParallel = 128

func getCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get HOST:PATH [LOCAL]",
		Short: "Download a file or a whole tree in one request",
		Long: `Get copies the file or tree at PATH to LOCAL (default "."). If LOCAL is an
existing directory the copy is made inside it under PATH's name. A tree is
one FindGet request that streams every entry and its data; each file is
written to a temporary name and renamed into place when complete, so an
interrupted get leaves no half-written file. Modes and times are kept.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dst := "."
			if len(args) == 2 {
				dst = args[1]
			}
			return withRemote(cmd, args[0], func(ctx context.Context, c *remote.Client, t Target) error {
				return get(ctx, c, t.Path, dst, newProgress(cmd.ErrOrStderr(), "get", -1), cmd.ErrOrStderr())
			})
		},
	}
}

// get downloads the tree at p from f into dst.
func get(ctx context.Context, f ferry.Finder, p, dst string, prog *progress, errOut io.Writer) error {
	defer prog.Finish()
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
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
	s := f.FindGet(ctx, p, "")
	for e := range s.All() {
		if err := w.entry(e); err != nil {
			s.Close()
			w.abort()
			return err
		}
		prog.Add(int64(len(e.Data)))
	}
	if err := s.Err(); err != nil {
		w.abort()
		return err
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
	tmp := tempFor(rel)
	if err := w.root.Chmod(tmp, w.cur.Mode()); err != nil {
		return err
	}
	if err := w.root.Chtimes(tmp, w.cur.Mtime(), w.cur.Mtime()); err != nil {
		return err
	}
	return w.root.Rename(tmp, rel)
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
		Use:   "put LOCAL HOST:PATH",
		Short: "Upload a file or a whole tree without waiting for each file",
		Long: `Put copies the local file or tree LOCAL to PATH on the server. If PATH is an
existing directory the copy is made inside it under LOCAL's name. Each file
is one request carrying its attributes and data, committed atomically on the
server; a tree's directories are made first, one request per level of depth,
then all its files are sent with up to 128 requests in flight, without
waiting for each. Errors are reported at the end.

Limitations: owners are not copied (the server's user owns what it writes);
hard links are copied as separate files.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[1], func(ctx context.Context, c *remote.Client, t Target) error {
				dst := t.Path
				if d, err := c.Stat(ctx, dst).Wait(); err == nil && d.IsDir() {
					dst = path.Join(dst, filepath.Base(filepath.Clean(args[0])))
				}
				return put(ctx, c, args[0], dst, cmd.ErrOrStderr())
			})
		},
	}
}

// localEntry is a local file or directory to upload.
type localEntry struct {
	path string // local
	dst  string // remote
	d    ferry.Dir
}

// put uploads the local tree src to dst on t.
func put(ctx context.Context, t ferry.Tree, src, dst string, errOut io.Writer) error {
	var dirs, files []localEntry
	var total int64
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
		}
		return nil
	})
	if err != nil {
		return err
	}
	prog := newProgress(errOut, "put", total)
	defer prog.Finish()
	errs := errorList{w: errOut}

	// Directories first, one level of depth at a time, so that each level's
	// parents exist; the levels' puts are all in flight at once.
	byLevels(dirs, func(e localEntry) string { return e.dst }, false, true, &errs,
		func(e localEntry) *ferry.Future[ferry.Dir] { return t.Put(ctx, e.dst, e.d, 0, nil) })
	if len(errs.errs) > 0 {
		return errs.err()
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, putParallel)
	for _, e := range files {
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
			err := putOne(ctx, t, e, prog)
			mu.Lock()
			errs.add(err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Directory times last: creating entries inside changed them.
	futs := make([]*ferry.Future[ferry.Dir], len(dirs))
	for i, d := range dirs {
		futs[i] = t.Wstat(ctx, d.dst, ferry.Dir{ferry.AttrMtime: d.d[ferry.AttrMtime]})
	}
	for _, f := range futs {
		_, err := f.Wait()
		errs.add(err)
	}
	return errs.err()
}

func putOne(ctx context.Context, t ferry.Tree, e localEntry, prog *progress) error {
	if e.d.Type() != ferry.TypeFile {
		_, err := t.Put(ctx, e.dst, e.d, 0, nil).Wait()
		return err
	}
	f, err := os.Open(e.path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = t.Put(ctx, e.dst, e.d, ferry.Whole, prog.Reader(f)).Wait()
	return err
}
