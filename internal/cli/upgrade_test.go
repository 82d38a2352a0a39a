package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestMeasureUpgrade counts the bytes that ferry sync --delete moves each
// way to upgrade a server's copy of a real Go module from one release to
// the next (the benchmark's upgrade workload), over loopback, beside what
// rsync -a --delete moves for the same upgrade ("Total bytes sent" and
// "received" of rsync --stats: its protocol, without ssh). Ferry's count is
// the TCP payload, TLS records included. It needs the two releases in the
// module cache or from the module proxy:
//
//	FERRY_MEASURE=1 go test -run MeasureUpgrade -v ./internal/cli
func TestMeasureUpgrade(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" {
		t.Skip("set FERRY_MEASURE=1 to measure an upgrade's bytes")
	}
	const module = "github.com/prometheus/client_golang"
	versions := map[string]time.Time{
		"v1.15.0": time.Date(2023, 4, 18, 12, 0, 0, 0, time.UTC),
		"v1.16.0": time.Date(2023, 6, 30, 12, 0, 0, 0, time.UTC),
	}
	base := t.TempDir()
	dirs := map[string]string{}
	for v, at := range versions {
		out, err := exec.Command("go", "mod", "download", "-json", module+"@"+v).Output()
		var m struct{ Dir string }
		if err != nil || json.Unmarshal(out, &m) != nil || m.Dir == "" {
			t.Fatalf("go mod download %s@%s: %v", module, v, err)
		}
		dst := filepath.Join(base, v)
		if out, err := exec.Command("cp", "-a", m.Dir, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		if out, err := exec.Command("chmod", "-R", "u+w", dst).CombinedOutput(); err != nil {
			t.Fatalf("chmod: %v %s", err, out)
		}
		err = filepath.Walk(dst, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Chtimes(p, at, at)
		})
		if err != nil {
			t.Fatal(err)
		}
		dirs[v] = dst
	}
	a, b := dirs["v1.15.0"], dirs["v1.16.0"]

	// rsync's own protocol bytes for the same upgrade.
	ra := filepath.Join(base, "rsync")
	if out, err := exec.Command("cp", "-a", a, ra).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	out, err := exec.Command("rsync", "-a", "--delete", "--no-whole-file", "--stats", b+"/", ra+"/").CombinedOutput()
	if err != nil {
		t.Fatalf("rsync: %v %s", err, out)
	}
	rsyncNum := func(name string) int64 {
		m := regexp.MustCompile(name + `: ([0-9,]+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("rsync --stats has no %q:\n%s", name, out)
		}
		n, _ := strconv.ParseInt(strings.ReplaceAll(string(m[1]), ",", ""), 10, 64)
		return n
	}

	s := servertest.StartChunked(t, a)
	addr, n := servertest.CountProxy(t, s.Addr)
	// As ferry sync dials (briefFinds).
	c := s.ClientVia(t, "measure", addr, func(cfg *remote.Config) { cfg.FindOmit = remote.BriefAttrs })
	ctx := context.Background()
	if _, err := c.Stat(ctx, "/").Wait(); err != nil {
		t.Fatal(err)
	}
	up0, down0 := n.Up.Load(), n.Down.Load()
	src, closeSrc, err := localSide(b, "/")
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrc()
	var msg bytes.Buffer
	st, err := syncTrees(ctx, src, syncSide{fs: c, root: "/", c: c}, syncOpts{delete: true, out: io.Discard, errOut: &msg})
	if err != nil {
		t.Fatalf("sync: %v %s", err, msg.String())
	}
	up, down := n.Up.Load()-up0, n.Down.Load()-down0
	got, want := snapshot(t, a), snapshot(t, b)
	// The server's own directory of puts in progress is no part of the
	// tree clients see.
	delete(got, local.TempDir)
	if !equalMaps(got, want) {
		for k, v := range got {
			if want[k] != v {
				t.Logf("server has %s: %.80q, want %.80q", k, v, want[k])
			}
		}
		for k := range want {
			if _, ok := got[k]; !ok {
				t.Logf("server lacks %s", k)
			}
		}
		t.Fatalf("after the sync the server's tree differs from %s", b)
	}
	t.Logf("ferry sync --delete: %d files sent, %d deleted, %d unchanged; %d B up, %d B down (file data %d B)",
		st.files, st.deleted, st.unchanged, up, down, st.wire)
	t.Logf("rsync -a --delete: %d B sent, %d B received (literal data %d B)",
		rsyncNum("Total bytes sent"), rsyncNum("Total bytes received"), rsyncNum("Literal data"))
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
