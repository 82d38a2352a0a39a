package local

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"time"
)

// SweepTemp removes the temporary files of Puts (TempPrefix) last written
// before before, everywhere in the tree, and returns how many it removed
// and their bytes. A server killed during a Put leaves its temporary file
// behind, up to the file's full size; one started now has no Put of its
// own in progress from before it started, so it sweeps from then. Each
// file is first passed to salvage (its tree path), if not nil, which may
// keep what a Put tried again can use. It stops when ctx is done.
func (t *Tree) SweepTemp(ctx context.Context, before time.Time, salvage func(p string)) (files int, bytes int64, err error) {
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
