package local_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
)

// TestFindGoesPastUnreadableDirs checks that a walk reports a directory it
// cannot read in line and goes on. Root reads every directory, so as root
// the test runs itself again as nobody.
func TestFindGoesPastUnreadableDirs(t *testing.T) {
	if os.Getuid() == 0 && os.Getenv("FERRY_TEST_AS_NOBODY") == "" {
		runAsNobody(t, "TestFindGoesPastUnreadableDirs")
		return
	}
	dir := t.TempDir()
	for _, d := range []string{"a", "b/locked", "c"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
		os.WriteFile(filepath.Join(dir, d, "f"), []byte("x"), 0o644)
	}
	os.Chmod(filepath.Join(dir, "b/locked"), 0)
	t.Cleanup(func() { os.Chmod(filepath.Join(dir, "b/locked"), 0o755) })
	tr, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, findget := range []bool{false, true} {
		find := tr.Find
		if findget {
			find = tr.FindGet
		}
		s := find(context.Background(), "/", "type=f")
		var paths, errs []string
		for e := range s.All() {
			switch {
			case e.Err != nil:
				errs = append(errs, e.Dir.Path())
				if ferry.KindOf(e.Err) != ferry.KindPermission {
					t.Errorf("in-line error %v is of kind %v, want permission", e.Err, ferry.KindOf(e.Err))
				}
			case e.Dir != nil:
				paths = append(paths, e.Dir.Path())
			}
		}
		if err := s.Err(); err != nil {
			t.Errorf("the walk failed: %v", err)
		}
		if got, want := strings.Join(paths, " "), "/a/f /c/f"; got != want {
			t.Errorf("findget=%v found %q, want %q", findget, got, want)
		}
		if got, want := strings.Join(errs, " "), "/b/locked"; got != want {
			t.Errorf("findget=%v reported errors at %q, want %q", findget, got, want)
		}
	}
}

// runAsNobody runs the named test of this binary as the user nobody, from a
// copy of the binary that nobody may execute.
func runAsNobody(t *testing.T, name string) {
	tmp, err := os.MkdirTemp("", "ferry-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o777) // nobody makes its own temporary directories here.
	bin := filepath.Join(tmp, "test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(dst, src)
	src.Close()
	dst.Close()
	cmd := exec.Command(bin, "-test.run", "^"+name+"$", "-test.v")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "FERRY_TEST_AS_NOBODY=1", "TMPDIR="+tmp, "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}
