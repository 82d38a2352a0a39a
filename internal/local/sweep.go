package local

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/ferryfs/ferry"
)

// SweepTemp removes the temporary files of Puts in TempDir last written
// before before and returns how many it removed and their bytes. A server
// killed during a Put leaves its temporary file behind, up to the file's
// full size; one started now has no Put of its own in progress from before
// it started, so it sweeps from then. Each regular file is first passed to
// salvage (its tree path), if not nil, which may keep what a Put tried
// again can use. It stops when ctx is done. Temporary files that had to be
// made beside their targets (TempName: a file system mounted inside the
// tree) are not swept, finding them taking a walk of the whole tree, but
// for once: in a served tree without TempDir yet (first served by a
// version without it), which it walks, then makes TempDir.
func (t *Tree) SweepTemp(ctx context.Context, before time.Time, salvage func(p string)) (files int, bytes int64, err error) {
	d, err := t.root.Open(TempDir)
	if errors.Is(err, fs.ErrNotExist) {
		if !t.apart {
			return 0, 0, nil
		}
		// A tree served before there was a TempDir: its servers left
		// their temporary files beside their targets. Walk it once;
		// TempDir, made now, says it was done.
		files, bytes, err = t.sweepBeside(ctx, before, salvage)
		if err == nil {
			t.tempDir()
		}
		return files, bytes, err
	}
	if err != nil {
		return 0, 0, fail("local.SweepTemp", "/"+TempDir, err)
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return 0, 0, fail("local.SweepTemp", "/"+TempDir, err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return files, bytes, err
		}
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue // Not a Put's: leave what someone else put there.
		}
		fi, err := e.Info()
		if err != nil || e.IsDir() || !fi.ModTime().Before(before) {
			continue
		}
		p := path.Join("/", TempDir, e.Name())
		if salvage != nil && fi.Mode().IsRegular() {
			salvage(p)
		}
		err = t.root.Remove(rel(p))
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			files++
			bytes += fi.Size()
		}
	}
	return files, bytes, nil
}

// SetTempAttrs gives the temporary file tmp, named by TempName, the
// attributes in d (mode, owner, times, extended attributes), as Wstat
// would; Wstat refuses paths in TempDir.
func (t *Tree) SetTempAttrs(tmp string, d ferry.Dir) error {
	if err := t.setAttrs(tmp, d, true); err != nil {
		return fail("local.SetTempAttrs", tmp, err)
	}
	return nil
}

// sweepBeside is SweepTemp for temporary files beside their targets,
// everywhere in the tree.
func (t *Tree) sweepBeside(ctx context.Context, before time.Time, salvage func(p string)) (files int, bytes int64, err error) {
	err = fs.WalkDir(t.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil {
			// An unreadable directory holds nothing to sweep that
			// this server could have written.
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(d.Name(), TempPrefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil || !fi.ModTime().Before(before) {
			return nil
		}
		if salvage != nil {
			salvage("/" + p)
		}
		err = t.root.Remove(p)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			files++
			bytes += fi.Size()
		}
		return nil
	})
	return files, bytes, err
}
