package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// TestGetTreeTraffic: a tree's get counts every file's bytes as got, those
// of the small files that came with their entries (FindGet) too, so that
// its summary says what it moved.
func TestGetTreeTraffic(t *testing.T) {
	s := servertest.StartChunked(t, "")
	files := map[string]string{}
	var total int64
	for i := range 20 {
		content := strings.Repeat(fmt.Sprintf("line of file %d\n", i), 50*(i+1))
		files[fmt.Sprintf("src/d%d/f%d.txt", i%3, i)] = content
		total += int64(len(content))
	}
	writeTree(t, s.Dir, files, time.Unix(1_700_000_000, 0))
	c := s.Client(t, "tester")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := filepath.Join(t.TempDir(), "copy")
	before := c.Traffic()
	if err := get(ctx, c, "/src", dst, newProgress(io.Discard, "get", 0), io.Discard); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "copy", snapshot(t, dst), snapshot(t, filepath.Join(s.Dir, "src")))
	tr := c.Traffic().Sub(before)
	if tr.GetBytes != total {
		t.Errorf("got %d bytes of files, want the tree's %d", tr.GetBytes, total)
	}
	if tr.GetWire <= 0 || tr.GetWire >= total {
		t.Errorf("%d bytes on the wire for %d of repetitive text, want fewer but some", tr.GetWire, total)
	}
}
