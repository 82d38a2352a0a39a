package local

import (
	"io/fs"
	"os"
	"syscall"

	"github.com/ferryfs/ferry"
)

// OpenRegular opens the regular file name in root for reading, and fails,
// opening nothing, for anything else: KindIsDir for a directory,
// KindInvalid for the rest. Symbolic links within root are followed, as
// os.Root does. A server opens only regular files of the tree it serves:
// clients make device nodes and FIFOs there, and opening one can wait for
// a writer (a FIFO) or act on a device. The file is checked before the
// open, and the file opened checked again, so one of another kind put in
// its place meanwhile is not read either; the open does not block
// (O_NONBLOCK), whatever it meets.
func OpenRegular(root *os.Root, name string) (*os.File, fs.FileInfo, error) {
	const op = "local.OpenRegular"
	fi, err := root.Stat(name)
	if err != nil {
		return nil, nil, err
	}
	if err := regular(op, name, fi); err != nil {
		return nil, nil, err
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	// A file renamed into place meanwhile (a save, a store) is read as
	// it is; one of another kind is refused.
	opened, err := f.Stat()
	if err == nil {
		err = regular(op, name, opened)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, opened, nil
}

// regular fails unless fi is a regular file's.
func regular(op, name string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return ferry.E(op, name, ferry.KindIsDir)
	case !fi.Mode().IsRegular():
		return ferry.E(op, name, ferry.KindInvalid, "not a regular file")
	}
	return nil
}
