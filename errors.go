package ferry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// Kind classifies an error. Kinds travel on the wire as their numbers, so the
// list is append-only: never renumber or remove a kind.
type Kind int32

// The error kinds.
const (
	KindOther       Kind = 0  // KindOther is an error of no other kind.
	KindNotExist    Kind = 1  // KindNotExist: the file does not exist.
	KindExist       Kind = 2  // KindExist: the file already exists.
	KindPermission  Kind = 3  // KindPermission: the caller may not do this.
	KindNotDir      Kind = 4  // KindNotDir: a path element is not a directory.
	KindIsDir       Kind = 5  // KindIsDir: a file operation was applied to a directory.
	KindNotEmpty    Kind = 6  // KindNotEmpty: a directory to remove is not empty.
	KindInvalid     Kind = 7  // KindInvalid: a malformed request, path or argument.
	KindIO          Kind = 8  // KindIO: the storage failed (a bad sector, a lost device).
	KindUnavailable Kind = 9  // KindUnavailable: transient; the same call may succeed later.
	KindCanceled    Kind = 10 // KindCanceled: the caller cancelled or its deadline passed.
	KindAuth        Kind = 11 // KindAuth: the peer failed authentication.
	KindNoSpace     Kind = 12 // KindNoSpace: the storage is full.
	KindQuota       Kind = 13 // KindQuota: the owner's quota is used up.
	KindReadOnly    Kind = 14 // KindReadOnly: the storage takes no writes.
	KindTooLarge    Kind = 15 // KindTooLarge: the file would exceed the storage's limit.
)

var kindNames = [...]string{
	KindOther:       "error",
	KindNotExist:    "does not exist",
	KindExist:       "already exists",
	KindPermission:  "permission denied",
	KindNotDir:      "not a directory",
	KindIsDir:       "is a directory",
	KindNotEmpty:    "directory not empty",
	KindInvalid:     "invalid argument",
	KindIO:          "I/O error",
	KindUnavailable: "unavailable",
	KindCanceled:    "canceled",
	KindAuth:        "authentication failed",
	KindNoSpace:     "no space left on the server",
	KindQuota:       "quota exceeded on the server",
	KindReadOnly:    "read-only file system",
	KindTooLarge:    "file too large",
}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int32(k))
}

// Error is the error every Ferry layer returns: what was being done (Op), to
// which path, of which Kind, and the underlying error if any. It survives the
// wire: a remote Tree returns an Error with the server's Op, Path, Kind and
// message.
type Error struct {
	Op   string // Op is the operation, as "local.Put"; may be empty.
	Path string // Path is the path concerned; may be empty.
	Kind Kind
	Err  error // Err is the underlying error; may be nil.
}

func (e *Error) Error() string {
	s := ""
	if e.Op != "" {
		s = e.Op + " "
	}
	if e.Path != "" {
		s += e.Path + ": "
	}
	if e.Err != nil {
		msg := e.Err.Error()
		// An inner error of the same kind has said it already.
		if e.Kind != KindOther && msg != e.Kind.String() && !strings.HasPrefix(msg, e.Kind.String()+": ") {
			return s + e.Kind.String() + ": " + msg
		}
		return s + msg
	}
	return s + e.Kind.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, fs.ErrNotExist) and friends work on Errors, and
// lets a bare &Error{Kind: k} serve as a target matching any error of kind k.
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Kind == KindNotExist
	case fs.ErrExist:
		return e.Kind == KindExist
	case fs.ErrPermission:
		return e.Kind == KindPermission
	case fs.ErrInvalid:
		return e.Kind == KindInvalid
	case context.Canceled:
		return e.Kind == KindCanceled
	}
	if t, ok := target.(*Error); ok && t.Op == "" && t.Path == "" && t.Err == nil {
		return e.Kind == t.Kind
	}
	return false
}

// FromOS returns err, which the operating system gave while op worked on
// the tree's path p, as an Error of the kind its errno says (KindIO if none
// does), without the local path the system named: the server's own
// directories are none of the client's business.
func FromOS(op, p string, err error) error {
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	k := KindOf(err)
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	case errors.As(err, &se):
		err = se.Err
	}
	if k == KindOther {
		k = KindIO
	}
	return E(op, p, k, err)
}

// E builds an Error. Each arg may be a Kind, an error or a string (the
// message, which becomes Err).
func E(op, path string, args ...any) error {
	e := &Error{Op: op, Path: path}
	for _, a := range args {
		switch a := a.(type) {
		case Kind:
			e.Kind = a
		case error:
			e.Err = a
			if e.Kind == KindOther {
				e.Kind = KindOf(a)
			}
		case string:
			e.Err = errors.New(a)
		}
	}
	return e
}

// KindOf returns the kind of err: the Kind of the outermost Error in its
// chain, else one derived from the errno, fs or context error it wraps.
// A nil error has KindOther.
func KindOf(err error) Kind {
	if err == nil {
		return KindOther
	}
	var fe *Error
	if errors.As(err, &fe) && fe.Kind != KindOther {
		return fe.Kind
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT:
			return KindNotExist
		case syscall.EEXIST:
			return KindExist
		case syscall.EACCES, syscall.EPERM:
			return KindPermission
		case syscall.EROFS:
			return KindReadOnly
		case syscall.ENOSPC:
			return KindNoSpace
		case syscall.EDQUOT:
			return KindQuota
		case syscall.EFBIG:
			return KindTooLarge
		case syscall.ENOTDIR, syscall.ELOOP:
			return KindNotDir
		case syscall.EISDIR:
			return KindIsDir
		case syscall.ENOTEMPTY:
			return KindNotEmpty
		case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.EXDEV:
			return KindInvalid
		case syscall.EIO:
			return KindIO
		case syscall.EAGAIN, syscall.EINTR, syscall.ECONNRESET, syscall.ETIMEDOUT:
			return KindUnavailable
		}
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return KindCanceled
	case errors.Is(err, fs.ErrNotExist):
		return KindNotExist
	case errors.Is(err, fs.ErrExist):
		return KindExist
	case errors.Is(err, fs.ErrPermission):
		return KindPermission
	case errors.Is(err, fs.ErrInvalid):
		return KindInvalid
	}
	return KindOther
}

// IsKind reports whether err is of kind k.
func IsKind(err error, k Kind) bool { return err != nil && KindOf(err) == k }
