package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// TestCtimeWhileOpen: a file open for writing here shows its status
// changed (ctime) at each write and change of attributes, as a local disk
// does, before it is stored.
func TestCtimeWhileOpen(t *testing.T) {
	for _, writeBack := range []bool{false, true} {
		t.Run(fmt.Sprintf("write-back %v", writeBack), func(t *testing.T) {
			srv := servertest.Start(t, "")
			writeFile(t, filepath.Join(srv.Dir, "f"), "first\n")
			mnt, _ := mountFS(t, srv.Client(t, "a"), Options{WriteBack: writeBack})
			f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ctime := func() int64 {
				var st syscall.Stat_t
				if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
					t.Fatal(err)
				}
				return st.Ctim.Nano()
			}
			for _, change := range []struct {
				what string
				do   func() error
			}{
				{"chmod", func() error { return f.Chmod(0o600) }},
				{"write", func() error { _, err := f.WriteString("more\n"); return err }},
				{"truncate", func() error { return f.Truncate(3) }},
			} {
				before := ctime()
				time.Sleep(20 * time.Millisecond)
				if err := change.do(); err != nil {
					t.Fatal(err)
				}
				if after := ctime(); after <= before {
					t.Errorf("after a %s the ctime is %d, was %d: want it later", change.what, after, before)
				}
			}
		})
	}
}
