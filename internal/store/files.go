package store

import (
	"io/fs"
	"os"
	"syscall"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
)

// RootFiles is Files over a directory opened with os.Root, which keeps every
// path below it.
type RootFiles struct {
	Root *os.Root
}

var _ Files = RootFiles{}

func rel(p string) string {
	if p == "/" || p == "" {
		return "."
	}
	return p[1:]
}

// StampOf returns the Stamp of fi.
func StampOf(fi fs.FileInfo) Stamp {
	st := Stamp{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.Ino = s.Ino
		st.Mtime = s.Mtim.Nano()
		st.Ctime = s.Ctim.Nano()
	}
	return st
}

// Open implements Files.
func (r RootFiles) Open(p string) (File, Stamp, error) {
	f, fi, err := local.OpenRegular(r.Root, rel(p))
	if err != nil {
		return nil, Stamp{}, ferry.E("store.Open", p, err)
	}
	return f, StampOf(fi), nil
}

// Stamp implements Files.
func (r RootFiles) Stamp(p string) (Stamp, error) {
	fi, err := r.Root.Lstat(rel(p))
	if err != nil {
		return Stamp{}, ferry.E("store.Stamp", p, err)
	}
	if !fi.Mode().IsRegular() {
		return Stamp{}, ferry.E("store.Stamp", p, ferry.KindInvalid, "not a regular file")
	}
	return StampOf(fi), nil
}
