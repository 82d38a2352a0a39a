package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
				// Each command prints the mode the mount shows at once,
				// with the file still open and not yet stored.
				{"append", 0o777 | os.ModeSetuid, 0o777, "exec 3>>'%[1]s'; echo more >&3; stat -c %%a '%[1]s'"},
				{"truncate", 0o777 | os.ModeSetgid, 0o777, "truncate -s 0 '%[1]s'; stat -c %%a '%[1]s'"},
				{"sgid not group-executable", 0o766 | os.ModeSetgid, 0o766 | os.ModeSetgid, "exec 3>>'%[1]s'; echo more >&3; stat -c %%a '%[1]s'"},
			} {
				p := filepath.Join(mnt, c.name)
				if err := os.WriteFile(p, []byte("first\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, c.mode); err != nil {
					t.Fatal(err)
				}
				// The kernel holds the mode it was last told, set-ID bits
				// and all.
				if fi, err := os.Stat(p); err != nil || fi.Mode() != c.mode {
					t.Fatalf("%s: mode before %v, %v; want %v", c.name, fi.Mode(), err, c.mode)
				}
				cmd := exec.Command("sh", "-c", fmt.Sprintf(c.cmd, p))
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v %s", c.name, err, out)
				}
				if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("%o", octal(c.want)); got != want {
					t.Errorf("%s: the mount showed mode %s at once, want %s", c.name, got, want)
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

// octal returns m as the octal mode stat -c %a prints.
func octal(m os.FileMode) uint32 {
	o := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		o |= syscall.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		o |= syscall.S_ISGID
	}
	return o
}
