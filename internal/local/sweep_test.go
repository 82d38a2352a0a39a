package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepTemp: the temporary files of Puts older than the sweep's time
// go, wherever they are; newer ones (a Put in progress) and every other
// file stay.
func TestSweepTemp(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	files := map[string]bool{ // Path to whether it must stay.
		TempPrefix + "a-0123":          false,
		"sub/deep/" + TempPrefix + "b": false,
		"sub/" + TempPrefix + "new":    true,
		"sub/plain":                    true,
		"sub/x" + TempPrefix:           true,
	}
	for p, stays := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("some bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !stays || p == "sub/plain" || p == "sub/x"+TempPrefix {
			if err := os.Chtimes(full, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	tree, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	n, bytes, err := tree.SweepTemp(context.Background(), time.Now().Add(-time.Minute), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || bytes != 2*int64(len("some bytes")) {
		t.Errorf("swept %d files of %d bytes, want 2 of %d", n, bytes, 2*len("some bytes"))
	}
	for p, stays := range files {
		_, err := os.Stat(filepath.Join(dir, p))
		if stays && err != nil {
			t.Errorf("%s is gone: %v", p, err)
		}
		if !stays && err == nil {
			t.Errorf("%s is still there", p)
		}
	}
}
