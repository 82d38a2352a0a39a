package fusefs

import (
	"syscall"

	"github.com/ferryfs/ferry"
)

// kindErrno is the one table from error kinds to the errnos the kernel
// passes to programs. A kind not listed becomes EIO.
var kindErrno = map[ferry.Kind]syscall.Errno{
	ferry.KindNotExist:   syscall.ENOENT,
	ferry.KindExist:      syscall.EEXIST,
	ferry.KindPermission: syscall.EACCES,
	ferry.KindNotDir:     syscall.ENOTDIR,
	ferry.KindIsDir:      syscall.EISDIR,
	ferry.KindNotEmpty:   syscall.ENOTEMPTY,
	ferry.KindInvalid:    syscall.EINVAL,
	ferry.KindIO:         syscall.EIO,
	// A server that cannot be reached is an I/O error to programs, as on
	// NFS: EAGAIN would make some of them spin.
	ferry.KindUnavailable: syscall.EIO,
	// The mount's calls are not cancelled by programs (the kernel
	// answers an interrupted one itself): a canceled call is one that
	// ran out of Options.CallTimeout, or the mount going away.
	ferry.KindCanceled: syscall.EIO,
	ferry.KindAuth:     syscall.EACCES,
	ferry.KindNoSpace:  syscall.ENOSPC,
	ferry.KindQuota:    syscall.EDQUOT,
	ferry.KindReadOnly: syscall.EROFS,
	ferry.KindTooLarge: syscall.EFBIG,
}

// errno converts an error of the tree to the errno of a FUSE reply: 0 for
// nil, else by kind from kindErrno, EIO by default.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := kindErrno[ferry.KindOf(err)]; ok {
		return e
	}
	return syscall.EIO
}
