package ferry

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestFromOS: errors of the system keep the kind their errno says and
// lose the local path the system named.
func TestFromOS(t *testing.T) {
	for _, tc := range []struct {
		errno syscall.Errno
		kind  Kind
	}{
		{syscall.ENOSPC, KindNoSpace},
		{syscall.EDQUOT, KindQuota},
		{syscall.EROFS, KindReadOnly},
		{syscall.EFBIG, KindTooLarge},
		{syscall.ENOENT, KindNotExist},
		{syscall.EIO, KindIO},
		{syscall.ENXIO, KindIO},
	} {
		local := "/srv/secret/dir/.ferry-tmp-x"
		for _, err := range []error{
			&os.PathError{Op: "write", Path: local, Err: tc.errno},
			&os.LinkError{Op: "rename", Old: local, New: local + "2", Err: tc.errno},
			os.NewSyscallError("fsync", tc.errno),
		} {
			got := FromOS("test.Put", "/f", err)
			if KindOf(got) != tc.kind {
				t.Errorf("FromOS(%v): kind %v, want %v", err, KindOf(got), tc.kind)
			}
			if strings.Contains(got.Error(), filepath.Dir(local)) {
				t.Errorf("FromOS(%v) = %q names the local path", err, got)
			}
		}
	}
}
