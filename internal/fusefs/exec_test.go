package fusefs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestExecutingNotTruncated: a program being run from the mount cannot be
// opened with O_TRUNC (ETXTBSY, as on a local disk), and the attempt leaves
// both the program running and the server's copy whole. The kernel checks
// this only after the mount's open, which with atomic O_TRUNC has already
// set the file's size to 0: the program then died at its next page fault
// and the open succeeded, about one try in twenty (pjdfstest's
// open::etxtbsy failed so). Once the program has exited the file can be
// written again.
func TestExecutingNotTruncated(t *testing.T) {
	served := t.TempDir()
	mnt := serveElsewhere(t, served, false)
	prog, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		name := fmt.Sprintf("sleep%d", i)
		p := filepath.Join(mnt, name)
		copyFile(t, prog, p)
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(p, "10")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_TRUNC, 0)
		if f != nil {
			f.Close()
		}
		alive := cmd.Process.Signal(syscall.Signal(0)) == nil
		cmd.Process.Kill()
		cmd.Wait()
		if !errors.Is(err, syscall.ETXTBSY) || !alive {
			t.Fatalf("try %d: open(O_TRUNC) of a running program: %v, want ETXTBSY; program still running: %v", i, err, alive)
		}
		if fi, err := os.Stat(filepath.Join(served, name)); err != nil || fi.Size() == 0 {
			t.Fatalf("try %d: the server's copy: %v, %v; want it whole", i, fi, err)
		}
	}
	// The kernel releases the program's file a moment after it exits.
	p := filepath.Join(mnt, "sleep0")
	for i := 0; ; i++ {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err == nil {
			f.Close()
			break
		}
		if !errors.Is(err, syscall.ETXTBSY) || i == 100 {
			t.Fatalf("open for writing after the program exited: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
