package local

import (
	"encoding/base64"
	"errors"
	"io/fs"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
)

// onEntry calls fn with a name for the entry at p that the xattr system
// calls take: its directory, opened by the root without leaving it, as a
// /proc/self/fd path, joined with p's name. The l* calls do not follow a
// link at the name, and a directory's descriptor cannot lead out, so the
// calls stay in the tree as os.Root's own do.
func (t *Tree) onEntry(p string, fn func(name string) error) error {
	if p == "/" {
		dir, err := t.root.Open(".")
		if err != nil {
			return err
		}
		defer dir.Close()
		return fn("/proc/self/fd/" + strconv.Itoa(int(dir.Fd())))
	}
	return t.inDir(p, func(dir int, name string) error {
		return fn("/proc/self/fd/" + strconv.Itoa(dir) + "/" + name)
	})
}

// hasXattrs reports whether the entry d describes can have extended
// attributes that the tree carries: files and directories.
func hasXattrs(d ferry.Dir) bool {
	typ := d.Type()
	return typ == ferry.TypeFile || typ == ferry.TypeDir
}

// readXattrs adds the extended attributes of the entry at p, which d
// describes, to d.
func (t *Tree) readXattrs(p string, d ferry.Dir) {
	if !hasXattrs(d) {
		return
	}
	t.onEntry(p, func(name string) error {
		addXattrs(name, d)
		return nil
	})
}

// addXattrs adds the extended attributes of name to d. A file system
// without them, or an entry that cannot be read, adds none.
func addXattrs(name string, d ferry.Dir) {
	names, _ := listXattrs(name)
	for _, x := range names {
		if !strings.HasPrefix(x, ferry.XattrNamespace) {
			continue
		}
		if v, err := getXattr(name, x); err == nil {
			d.SetXattr(x, v)
		}
	}
}

// listXattrs returns the names of the extended attributes of name.
func listXattrs(name string) ([]string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Llistxattr(name, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Llistxattr(name, nil); err != nil {
				return nil, err
			}
			buf = make([]byte, n+64)
			continue
		}
		if err != nil || n == 0 {
			return nil, err
		}
		return strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00"), nil
	}
}

// getXattr returns the value of the extended attribute x of name.
func getXattr(name, x string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(name, x, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Lgetxattr(name, x, nil); err != nil {
				return nil, err
			}
			buf = make([]byte, n+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// setXattrs applies the extended attributes d names to the entry at p:
// sets them, or removes those set to ferry.XattrRemove.
func (t *Tree) setXattrs(p string, d ferry.Dir) error {
	var keys []string
	for k := range d {
		if strings.HasPrefix(k, ferry.XattrPrefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		if x := k[len(ferry.XattrPrefix):]; !strings.HasPrefix(x, ferry.XattrNamespace) || len(x) == len(ferry.XattrNamespace) {
			return ferry.E("", p, ferry.KindInvalid, "only extended attributes user.* are carried, not "+x)
		}
		if v := d[k]; v != ferry.XattrRemove {
			if _, err := base64.StdEncoding.DecodeString(v); err != nil {
				return ferry.E("", p, ferry.KindInvalid, "the value of "+k+" is not base64")
			}
		}
	}
	return t.onEntry(p, func(name string) error {
		for _, k := range keys {
			x := k[len(ferry.XattrPrefix):]
			var err error
			if v := d[k]; v == ferry.XattrRemove {
				err = unix.Lremovexattr(name, x)
				if errors.Is(err, unix.ENODATA) {
					err = ferry.E("", p, ferry.KindNotExist, "no extended attribute "+x)
				}
			} else {
				b, _ := base64.StdEncoding.DecodeString(v)
				err = unix.Lsetxattr(name, x, b, 0)
			}
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) && isLink(name) {
				err = ferry.E("", p, ferry.KindInvalid, "the server's file system takes no extended attribute "+x+" here")
			}
			var fe *ferry.Error
			if err != nil && !errors.As(err, &fe) {
				err = &fs.PathError{Op: "setxattr", Path: p, Err: err}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// isLink reports whether name is a symbolic link, which the kernel gives
// no user extended attributes.
func isLink(name string) bool {
	var st unix.Stat_t
	return unix.Lstat(name, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// keptXattrs prepares d, the attributes of a file that replaces the one
// at p whole, to keep the old file's extended attributes (Dir.KeepXattrs).
func (t *Tree) keptXattrs(p string, d ferry.Dir) {
	old := ferry.Dir{ferry.AttrType: ferry.TypeFile}
	t.readXattrs(p, old)
	d.KeepXattrs(old)
}
