package fusefs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestTwoMounts checks coherence through the server's watch: two mounts of
// one server, with metadata trusted for an hour without a watch, see each
// other's changes, and changes made directly in the served directory, at
// once rather than after a timeout.
func TestTwoMounts(t *testing.T) {
	needFUSE(t)
	srv := servertest.Start(t, "")
	ca, cb := srv.Client(t, "a"), srv.Client(t, "b")
	if _, ok := ferry.FS(ca).(ferry.Watcher); !ok {
		t.Skip("skipping: the remote client offers no watch yet")
	}
	writeFile(t, filepath.Join(srv.Dir, "f"), "v1")
	opt := Options{TTL: time.Hour}
	a, sa := mountFS(t, ca, opt)
	b, sb := mountFS(t, cb, opt)
	if !waitFor(5*time.Second, func() bool { return sa.meta.leased() && sb.meta.leased() }) {
		t.Fatal("the mounts got no watch")
	}
	if got := readFile(t, filepath.Join(b, "f")); got != "v1" {
		t.Fatalf("b reads %q", got)
	}
	seen := func(p, want string) bool {
		return waitFor(3*time.Second, func() bool {
			got, _ := os.ReadFile(p)
			return string(got) == want
		})
	}
	// A close in one mount is seen by an open in the other.
	if err := os.WriteFile(filepath.Join(a, "f"), []byte("v2 from a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !seen(filepath.Join(b, "f"), "v2 from a") {
		t.Errorf("b does not see a's change")
	}
	// A new file and a new directory.
	os.Mkdir(filepath.Join(b, "dir"), 0o755)
	os.WriteFile(filepath.Join(b, "dir/new"), []byte("new from b"), 0o644)
	if !seen(filepath.Join(a, "dir/new"), "new from b") {
		t.Errorf("a does not see b's new file")
	}
	// A process writing directly into the served directory.
	writeFile(t, filepath.Join(srv.Dir, "f"), "v3 on the server")
	if !seen(filepath.Join(a, "f"), "v3 on the server") || !seen(filepath.Join(b, "f"), "v3 on the server") {
		t.Errorf("the mounts do not see a change made on the server")
	}
	// A removal.
	os.Remove(filepath.Join(a, "dir/new"))
	if !waitFor(3*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(b, "dir/new"))
		return os.IsNotExist(err)
	}) {
		t.Errorf("b still sees a removed file")
	}
}
