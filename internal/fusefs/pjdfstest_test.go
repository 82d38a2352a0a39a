package fusefs

import (
	"bytes"
	"context"
	"github.com/ferryfs/ferry/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"
)

// TestPjdfstest runs the POSIX conformance suite (the Rust pjdfstest) on a
// mount of a real server over the wire, one that stores at each close and
// one that writes back (ferry mount's default). The failures that the
// adaptor cannot avoid are listed, with their reasons, in CONFORMANCE.md
// and in scripts/pjdfstest-ferry.toml as expected failures; any other
// failure fails this test.
func TestPjdfstest(t *testing.T) {
	for _, c := range []struct {
		name      string
		writeBack bool
		// noRace serves the mount from a helper built without the
		// race detector: the suite takes six times as long under it,
		// and the write-back mount, whose stores run in the
		// background, is the one it has more to look at in.
		noRace bool
	}{
		{"strict", false, true},
		{"write-back", true, false},
	} {
		t.Run(c.name, func(t *testing.T) { testPjdfstest(t, c.writeBack, c.noRace) })
	}
}

func testPjdfstest(t *testing.T, writeBack, noRace bool) {
	needFUSE(t)
	bin, err := exec.LookPath("pjdfstest")
	if err != nil {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cargo/bin/pjdfstest")
		if _, err := os.Stat(bin); err != nil {
			testenv.Require(t, "pjdfstest is not installed (cargo install pjdfstest)")
		}
	}
	_, file, _, _ := runtime.Caller(0)
	conf := filepath.Join(filepath.Dir(file), "../../scripts/pjdfstest-ferry.toml")
	served := t.TempDir()
	os.Chmod(served, 0o755)
	h := helper{dir: served, writeBack: writeBack}
	if noRace {
		h.bin = withoutRace(t)
	}
	mnt := serveHelper(t, h)
	// The suite acts as other users too, who must reach the mount.
	os.Chmod(filepath.Dir(mnt), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(mnt)), 0o755)
	// The suite alone takes about 150 s here with a race-detecting
	// helper; beside the other packages' tests, CI once took over 180 s.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
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
	// A listed failure that passes is only reported: some of them depend
	// on timing (see CONFORMANCE.md).
	for _, l := range regexp.MustCompile(`(?m)^(\S+)\s+PASSED UNEXPECTEDLY`).FindAllSubmatch(out, -1) {
		t.Logf("listed as an expected failure, but passed: %s", l[1])
	}
	// A failure is run again alone, up to twice, a moment apart: a few
	// tests compare timestamps taken a moment apart, and a directory's
	// times here move to the server's when its change's echo arrives
	// (see CONFORMANCE.md), so under load (make test runs packages side
	// by side) they can fail by a hair, and once in make test
	// link::unchanged_ctime_fails::socket failed a second time at once.
	// One that fails three times fails.
	fails := regexp.MustCompile(`(?m)^(\S+)\s+FAILED\s*\n((?:.*\n){1,6})`).FindAllSubmatch(out, -1)
	for _, f := range fails {
		name := string(f[1])
		t.Logf("pjdfstest: %s failed: %s", name, bytes.TrimSpace(f[2]))
		var out2 []byte
		passed := false
		for try := 0; try < 2 && !passed; try++ {
			time.Sleep(time.Duration(try) * time.Second)
			again := exec.CommandContext(ctx, bin, "-c", conf, "-p", mnt, name)
			again.Dir = mnt
			out2, _ = again.CombinedOutput()
			passed = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+ok\s*$`).Match(out2)
		}
		if passed {
			t.Logf("pjdfstest: %s failed, then passed when run again alone", name)
			continue
		}
		t.Errorf("pjdfstest: %s failed, and twice more when run alone:\n%s", name, out2)
	}
	if len(fails) == 0 && m[1][0] != '0' && err != nil && !regexp.MustCompile(`PASSED UNEXPECTEDLY`).Match(out) {
		t.Errorf("pjdfstest: %v\n%s", err, out)
	}
}
