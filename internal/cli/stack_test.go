package cli

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestNativeChangesThroughLayers: a tree put and then synced through the
// native commands' stack (the cache layer over the client) reaches a
// layer stacked between the server and the chunk store as changes it
// sees: a put of every directory and file, small files on one batch and a
// large one by chunks, the directories' times, and the removal of what
// the sync deletes.
func TestNativeChangesThroughLayers(t *testing.T) {
	s, rec := servertest.StartRecording(t)
	st := newStack(s.Client(t, "tester"), cache.Options{})
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	src := t.TempDir()
	big := make([]byte, 300<<10)
	rand.Read(big)
	writeTree(t, src, map[string]string{"a.txt": "a\n", "d/b.txt": "b\n", "d/e/c.txt": "c\n", "big.bin": string(big)}, time.Unix(1_600_000_000, 0))

	before := s.Srv.Calls()
	if err := put(ctx, st, src, "/up", filter{}, progressOpts{}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"put /up", "put /up/d", "put /up/d/e", "put /up/a.txt", "put /up/d/b.txt", "put /up/d/e/c.txt", "put /up/big.bin", "wstat /up/d"} {
		if !rec.Saw(want) {
			t.Errorf("after put, the layer did not see %q; it saw %q", want, rec.Ops())
		}
	}
	if n := servertest.CallsSince(s.Srv, before, "putbatch", 1); n < 1 {
		t.Errorf("the put's files went on %d batches, want 1", n)
	}

	// A changed file and a removed one, synced with --delete.
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("changed\n"), 0o644)
	os.Remove(filepath.Join(src, "d/b.txt"))
	local, closeLocal, err := localSide(src, "/")
	if err != nil {
		t.Fatal(err)
	}
	defer closeLocal()
	var out strings.Builder
	if _, err := syncTrees(ctx, local, syncSide{fs: st, root: "/up", c: st.client}, syncOpts{delete: true, out: &out, errOut: &out}); err != nil {
		t.Fatalf("sync: %v: %s", err, out.String())
	}
	puts := 0
	for _, op := range rec.Ops() {
		if op == "put /up/a.txt" {
			puts++
		}
	}
	if puts != 2 || !rec.Saw("remove /up/d/b.txt") {
		t.Errorf("after sync, the layer saw %d puts of /up/a.txt (want 2) and the removal of /up/d/b.txt: %v; it saw %q", puts, rec.Saw("remove /up/d/b.txt"), rec.Ops())
	}
	if got, err := os.ReadFile(filepath.Join(s.Dir, "up/a.txt")); err != nil || string(got) != "changed\n" {
		t.Errorf("the server holds %q, %v", got, err)
	}
}
