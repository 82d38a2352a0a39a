package fusefs

import (
	"context"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
)

// Getxattr implements fs.NodeGetxattrer from the node's attributes, so a
// file's extended attributes come with its metadata and are as coherent.
// Names outside ferry.XattrNamespace, the only one the tree carries, are
// answered at once with ENOTSUP, without looking anything up. That
// matters: the kernel asks for security.capability before every write,
// and ls -l asks for security.selinux and the ACLs of every file unless
// told, by ENOTSUP, that the file system has none (then it stops asking
// for the whole mount: ls -lR of 3,773 entries at 100 ms took 1.02 s with
// ENODATA, 0.82 s with ENOTSUP, as before the mount served extended
// attributes).
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !strings.HasPrefix(attr, ferry.XattrNamespace) {
		return 0, syscall.ENOTSUP
	}
	d, e := n.attrs(ctx)
	if e != 0 {
		return 0, e
	}
	v, ok := d.Xattr(attr)
	if !ok {
		return 0, syscall.ENODATA
	}
	return fill(dest, v)
}

// Listxattr implements fs.NodeListxattrer.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	d, e := n.attrs(ctx)
	if e != 0 {
		return 0, e
	}
	var list []byte
	for _, x := range d.Xattrs() {
		list = append(append(list, x...), 0)
	}
	return fill(dest, list)
}

// fill copies v to dest as the xattr calls return values: only the size if
// dest is empty, ERANGE if it is too small.
func fill(dest, v []byte) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// Setxattr implements fs.NodeSetxattrer.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	n.s.beforeChange(ctx, nil)
	if !strings.HasPrefix(attr, ferry.XattrNamespace) || len(attr) == len(ferry.XattrNamespace) {
		return syscall.ENOTSUP
	}
	if len(attr) > 255 {
		return syscall.ERANGE
	}
	if flags&(unix.XATTR_CREATE|unix.XATTR_REPLACE) != 0 {
		d, e := n.attrs(ctx)
		if e != 0 {
			return e
		}
		_, has := d.Xattr(attr)
		if has && flags&unix.XATTR_CREATE != 0 {
			return syscall.EEXIST
		}
		if !has && flags&unix.XATTR_REPLACE != 0 {
			return syscall.ENODATA
		}
	}
	want := ferry.Dir{}
	want.SetXattr(attr, data)
	return n.change(ctx, nil, false, want, false, 0)
}

// Removexattr implements fs.NodeRemovexattrer.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	n.s.beforeChange(ctx, nil)
	if !strings.HasPrefix(attr, ferry.XattrNamespace) {
		return syscall.ENOTSUP
	}
	d, e := n.attrs(ctx)
	if e != 0 {
		return e
	}
	if _, has := d.Xattr(attr); !has {
		return syscall.ENODATA
	}
	return n.change(ctx, nil, false, ferry.Dir{ferry.XattrPrefix + attr: ferry.XattrRemove}, false, 0)
}
