package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
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
	if err := get(ctx, c, "/src", dst, newProgress(io.Discard, "get", 0, progressOpts{}), io.Discard); err != nil {
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

func TestSummary(t *testing.T) {
	tests := []struct {
		name string
		tr   remote.Traffic
		err  error
		want string
	}{
		{"saved", remote.Traffic{PutBytes: 1000, PutWire: 250}, nil, "ferry: put 1000 B of files, 250 B on the wire (75.0% saved)\n"},
		{"a tiny file costs more than its bytes", remote.Traffic{PutBytes: 11, PutWire: 280}, nil, "ferry: put 11 B of files, 280 B on the wire\n"},
		{"failed", remote.Traffic{PutBytes: 11, PutWire: 280}, errors.New("cut"), "ferry: stopped after moving 11 B of files, 280 B on the wire\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			summary(&b, "put", tt.tr, tt.err)
			if b.String() != tt.want {
				t.Errorf("summary = %q, want %q", b.String(), tt.want)
			}
		})
	}
}

// get downloads the tree at p from f into dst in one FindGet stream, as
// ferry get does without --split.
func get(ctx context.Context, f ferry.FS, p, dst string, prog *progress, errOut io.Writer) error {
	return getSplit(ctx, f, p, dst, getOpts{nest: true}, prog, errOut)
}

// TestPutSaysSkipped: a put of a tree with a FIFO in it puts the rest,
// says the FIFO was skipped, and fails, as sync does.
func TestPutSaysSkipped(t *testing.T) {
	s := servertest.Start(t, "")
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "data"}, time.Unix(1_700_000_000, 0))
	if err := syscall.Mkfifo(filepath.Join(src, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, "tester")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	err := put(ctx, c, src, "/dst", filter{}, progressOpts{}, &out)
	if err == nil || !strings.Contains(out.String(), "pipe") || !strings.Contains(out.String(), "skipped") {
		t.Errorf("put of a tree with a FIFO: %v, said %q; want it to fail saying the FIFO was skipped", err, out.String())
	}
	if b, err := os.ReadFile(filepath.Join(s.Dir, "dst", "a")); err != nil || string(b) != "data" {
		t.Errorf("dst/a on the server: %q, %v (put said %q)", b, err, out.String())
	}
}
