package proto

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferryfs/ferry"
)

// FromDir converts a ferry.Dir for the wire, dropping decorations.
func FromDir(d ferry.Dir) *Dir {
	if d == nil {
		return nil
	}
	return &Dir{Attrs: d.Stored()}
}

// OmitAttrs takes the attributes keys out of d, which may be nil.
func OmitAttrs(d *Dir, keys ...string) {
	if d == nil {
		return
	}
	for _, k := range keys {
		delete(d.Attrs, k)
	}
}

// Reply makes the reply carrying d, its parent's times included.
func Reply(d ferry.Dir, zstd bool) *DirReply {
	return &DirReply{Dir: FromDir(d), Zstd: zstd,
		ParentMtime: d.Int(ferry.AttrParentMtime), ParentCtime: d.Int(ferry.AttrParentCtime)}
}

// FromReply returns the entry r carries, with its parent's times as
// decorations.
func FromReply(r *DirReply) ferry.Dir {
	d := ToDir(r.Dir)
	if d != nil && r.ParentMtime != 0 && r.ParentCtime != 0 {
		d.SetInt(ferry.AttrParentMtime, r.ParentMtime)
		d.SetInt(ferry.AttrParentCtime, r.ParentCtime)
	}
	return d
}

// ToDir converts a wire Dir; nil stays nil.
func ToDir(d *Dir) ferry.Dir {
	if d == nil {
		return nil
	}
	out := make(ferry.Dir, len(d.Attrs))
	for k, v := range d.Attrs {
		if !ferry.IsDecoration(k) {
			out[k] = v
		}
	}
	return out
}

// FromError converts an error for the wire; nil stays nil.
func FromError(err error) *Error {
	if err == nil {
		return nil
	}
	e := &Error{Kind: int32(ferry.KindOf(err)), Msg: err.Error()}
	var fe *ferry.Error
	if errors.As(err, &fe) {
		e.Op, e.Path = fe.Op, fe.Path
		e.Msg = ""
		if fe.Err != nil {
			e.Msg = fe.Err.Error()
		}
	}
	return e
}

// ToError converts a wire Error back into a *ferry.Error; nil stays nil.
func ToError(e *Error) error {
	if e == nil {
		return nil
	}
	fe := &ferry.Error{Op: e.Op, Path: e.Path, Kind: ferry.Kind(e.Kind)}
	if e.Op == BusyOp {
		fe.Err = busyError(e.Msg)
	} else if e.Msg != "" {
		fe.Err = errors.New(e.Msg)
	}
	return fe
}

var kindCodes = map[ferry.Kind]codes.Code{
	ferry.KindNotExist:    codes.NotFound,
	ferry.KindExist:       codes.AlreadyExists,
	ferry.KindPermission:  codes.PermissionDenied,
	ferry.KindNotDir:      codes.FailedPrecondition,
	ferry.KindIsDir:       codes.FailedPrecondition,
	ferry.KindNotEmpty:    codes.FailedPrecondition,
	ferry.KindInvalid:     codes.InvalidArgument,
	ferry.KindIO:          codes.Internal,
	ferry.KindUnavailable: codes.Unavailable,
	ferry.KindCanceled:    codes.Canceled,
	ferry.KindAuth:        codes.Unauthenticated,
	ferry.KindNoSpace:     codes.ResourceExhausted,
	ferry.KindQuota:       codes.ResourceExhausted,
	ferry.KindReadOnly:    codes.FailedPrecondition,
	ferry.KindTooLarge:    codes.OutOfRange,
}

// Status turns an error into a gRPC status error that carries the ferry
// error as a detail, so the client can rebuild it exactly.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isFerry(err) {
		return err
	}
	code, ok := kindCodes[ferry.KindOf(err)]
	if !ok {
		code = codes.Unknown
	}
	st, derr := status.New(code, err.Error()).WithDetails(FromError(err))
	if derr != nil {
		return status.Error(code, err.Error())
	}
	return st.Err()
}

func isFerry(err error) bool {
	var fe *ferry.Error
	return errors.As(err, &fe)
}

// FromStatus turns an error returned by a gRPC call into a *ferry.Error:
// from the detail the server attached, else from the status code (a broken
// connection becomes KindUnavailable, a cancelled call KindCanceled).
func FromStatus(op, path string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ferry.E(op, path, ferry.KindCanceled, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return ferry.E(op, path, err)
	}
	for _, d := range st.Details() {
		if e, ok := d.(*Error); ok {
			return ToError(e)
		}
	}
	if st.Code() == codes.ResourceExhausted {
		// Not a full disk or a quota, which carry their Error: the
		// server refused the call for want of memory (see SizeKey).
		return ferry.E(op, path, ferry.KindUnavailable, busyError(st.Message()))
	}
	k := ferry.KindOther
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded:
		k = ferry.KindCanceled
	case codes.Unavailable, codes.Aborted:
		k = ferry.KindUnavailable
	case codes.Unauthenticated:
		k = ferry.KindAuth
	case codes.PermissionDenied:
		k = ferry.KindPermission
	case codes.InvalidArgument:
		k = ferry.KindInvalid
	case codes.NotFound:
		k = ferry.KindNotExist
	}
	return ferry.E(op, path, k, st.Message())
}

// BusyOp is the op of an error by which the server refuses a call for want
// of memory after the call began; ToError makes it ErrBusy.
const BusyOp = "server.busy"

// ErrBusy is what errors.Is finds in the error of a call the server refused
// because its memory budget was taken: the same call may go through once
// other calls have ended.
var ErrBusy = errors.New("the server is busy")

// busyError is the server's message for a refusal that is ErrBusy.
type busyError string

func (e busyError) Error() string        { return string(e) }
func (e busyError) Is(target error) bool { return target == ErrBusy }
