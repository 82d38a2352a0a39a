package fusefs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"
)

// TestPjdfstest runs the POSIX conformance suite (the Rust pjdfstest) on a
// mount of a real server over the wire. The failures that the adaptor
// cannot avoid are listed, with their reasons, in CONFORMANCE.md and in
// scripts/pjdfstest-ferry.toml as expected failures; any other failure, or
// an expected failure that passes, fails this test.
func TestPjdfstest(t *testing.T) {
	needFUSE(t)
	bin, err := exec.LookPath("pjdfstest")
	if err != nil {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cargo/bin/pjdfstest")
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("pjdfstest is not installed (cargo install pjdfstest)")
			}
			t.Skip("skipping: pjdfstest is not installed (cargo install pjdfstest)")
		}
	}
	_, file, _, _ := runtime.Caller(0)
	conf := filepath.Join(filepath.Dir(file), "../../scripts/pjdfstest-ferry.toml")
	served := t.TempDir()
	os.Chmod(served, 0o755)
	mnt := serveElsewhere(t, served)
	// The suite acts as other users too, who must reach the mount.
	os.Chmod(filepath.Dir(mnt), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(mnt)), 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-c", conf, "-p", mnt)
	cmd.Dir = mnt
	out, err := cmd.CombinedOutput()
	m := regexp.MustCompile(`Summary: (\d+) failed, (\d+) skipped, (\d+) passed, (\d+) expected failures, (\d+) total`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("pjdfstest: %v, no summary:\n%s", err, out)
	}
	t.Logf("pjdfstest on the mount: %s failed, %s skipped, %s passed, %s expected failures, %s total",
		m[1], m[2], m[3], m[4], m[5])
	if err != nil || string(m[1]) != "0" {
		fails := regexp.MustCompile(`(?m)^.*(FAILED|failed|unexpectedly).*$`).FindAll(out, -1)
		for _, f := range fails {
			t.Errorf("%s", f)
		}
		if len(fails) == 0 {
			t.Errorf("pjdfstest: %v\n%s", err, out)
		}
	}
}
