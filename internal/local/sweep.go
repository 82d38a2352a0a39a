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
// made beside their targets (TempName) are not swept: finding them would
// take a walk of the whole tree.
func (t *Tree) SweepTemp(ctx context.Context, before time.Time, salvage func(p string)) (files int, bytes int64, err error) {
	d, err := t.root.Open(TempDir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
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
