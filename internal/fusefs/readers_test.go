package fusefs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// TestReadersKeepRemovedFile: a descriptor open for reading on a file
// whose last name goes, by a removal or by a rename over it, reads on
// the file it opened, as on a local disk: all of it, also what the kernel
// had not read before the name went. The server has nothing left to read
// it from, so the mount keeps a copy for such descriptors.
func TestReadersKeepRemovedFile(t *testing.T) {
	// Beyond what a descriptor reads ahead (stream: 16 pieces of 256 KiB),
	// so the rest must come from somewhere once the name is gone.
	const size = 12 << 20
	old := strings.Repeat("A", size)
	for _, writeBack := range []bool{false, true} {
		for _, how := range []string{"unlink", "rename over"} {
			t.Run(fmt.Sprintf("%s, write-back %v", how, writeBack), func(t *testing.T) {
				srv := servertest.StartChunked(t, "")
				writeFile(t, filepath.Join(srv.Dir, "f"), old)
				writeFile(t, filepath.Join(srv.Dir, "g"), strings.Repeat("B", size))
				mnt, _ := mountFS(t, srv.Client(t, "a"), Options{WriteBack: writeBack})
				f, err := os.Open(filepath.Join(mnt, "f"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				head := make([]byte, 4096)
				if _, err := io.ReadFull(f, head); err != nil {
					t.Fatal(err)
				}
				switch how {
				case "unlink":
					err = os.Remove(filepath.Join(mnt, "f"))
				case "rename over":
					err = os.Rename(filepath.Join(mnt, "g"), filepath.Join(mnt, "f"))
				}
				if err != nil {
					t.Fatal(err)
				}
				// The removal reaches the server, in the background with
				// write-back.
				if !waitFor(10*time.Second, func() bool {
					b, err := os.ReadFile(filepath.Join(srv.Dir, "f"))
					return os.IsNotExist(err) || err == nil && b[0] == 'B'
				}) {
					t.Fatal("the server still has the old f")
				}
				// Backwards, a MiB at a time: each read then starts a
				// transfer of its own rather than take what one started
				// before the name went brings.
				got := make([]byte, size)
				for off := size - 1<<20; off >= 0; off -= 1 << 20 {
					if _, err := f.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
						t.Fatalf("reading at %d after the %s: %v", off, how, err)
					}
				}
				if !bytes.Equal(got, []byte(old)) {
					t.Errorf("read after the %s: %d of %d bytes the old file's; want the old file whole", how, bytes.Count(got, []byte("A")), size)
				}
			})
		}
	}
}

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
