package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteClearsSetID: a write or a truncation by a user without
// CAP_FSETID clears a file's set-user-ID bit, and its set-group-ID bit if
// it is group-executable, as on a local disk; the mount does it, since it
// tells the kernel it will (kernelFS.killSuidgid).
func TestWriteClearsSetID(t *testing.T) {
	needFUSE(t) // Root, which acting as another user needs too.
	const nobody = 65534
	for _, writeBack := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback=%v", writeBack), func(t *testing.T) {
			served := t.TempDir()
			os.Chmod(served, 0o777)
			mnt := serveElsewhere(t, served, writeBack)
			os.Chmod(filepath.Dir(mnt), 0o755)
			os.Chmod(filepath.Dir(filepath.Dir(mnt)), 0o755)
			for _, c := range []struct {
				name       string
				mode, want os.FileMode
				cmd        string
			}{
				{"append", 0o777 | os.ModeSetuid, 0o777, "echo more >> %s"},
				{"truncate", 0o777 | os.ModeSetgid, 0o777, "truncate -s 0 %s"},
				{"sgid not group-executable", 0o766 | os.ModeSetgid, 0o766 | os.ModeSetgid, "echo more >> %s"},
			} {
				p := filepath.Join(mnt, c.name)
				if err := os.WriteFile(p, []byte("first\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, c.mode); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command("sh", "-c", fmt.Sprintf(c.cmd, p))
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: %v %s", c.name, err, out)
				}
				// fsync waits until the server has the file.
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				err = f.Sync()
				f.Close()
				if err != nil {
					t.Fatal(err)
				}
				for _, at := range []string{mnt, served} {
					fi, err := os.Stat(filepath.Join(at, c.name))
					if err != nil {
						t.Errorf("%s in %s: %v", c.name, at, err)
					} else if fi.Mode() != c.want {
						t.Errorf("%s: mode in %s %v, want %v", c.name, at, fi.Mode(), c.want)
					}
				}
			}
		})
	}
}
