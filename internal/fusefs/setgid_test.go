package fusefs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// TestSetgidDirectory: in a directory with the set-group-ID bit, files,
// directories and links made through the mount take its group, and
// directories the bit too, on the mount at once and on the server once
// stored, as on a local disk.
func TestSetgidDirectory(t *testing.T) {
	needFUSE(t) // Root, which giving a directory another group needs too.
	const group = 65534
	for _, writeBack := range []bool{false, true} {
		srv := servertest.StartChunked(t, "")
		mnt, _ := mountFS(t, srv.Client(t, "a"), Options{WriteBack: writeBack})
		d := filepath.Join(mnt, "d")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, -1, group); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755|os.ModeSetgid); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(d, "f"), "data")
		if err := os.Mkdir(filepath.Join(d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("f", filepath.Join(d, "l")); err != nil {
			t.Fatal(err)
		}
		check := func(where, dir string) {
			for _, name := range []string{"f", "sub", "l"} {
				fi, err := os.Lstat(filepath.Join(dir, name))
				if err != nil {
					t.Fatalf("write-back %v, %s: %v", writeBack, where, err)
				}
				if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != group {
					t.Errorf("write-back %v, %s: %s has group %d, want the directory's, %d", writeBack, where, name, gid, group)
				}
				if name == "sub" && fi.Mode() != os.ModeDir|os.ModeSetgid|0o700 {
					t.Errorf("write-back %v, %s: sub is %v, want drwx--S---", writeBack, where, fi.Mode())
				}
			}
		}
		check("on the mount", d)
		if err := syscall.Fsync(mustOpen(t, mnt)); err != nil {
			t.Fatal(err)
		}
		if !waitFor(5*time.Second, func() bool { _, err := os.Lstat(filepath.Join(srv.Dir, "d", "l")); return err == nil }) {
			t.Fatal("the server did not get d/l")
		}
		check("on the server", filepath.Join(srv.Dir, "d"))
	}
}

// mustOpen opens p for reading and returns its descriptor, closed when
// the test ends.
func mustOpen(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}
