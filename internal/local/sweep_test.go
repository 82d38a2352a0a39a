package local

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// TestSweepTemp: the temporary files in TempDir older than the sweep's
// time go; newer ones (a Put in progress), files in TempDir that are no
// Put's, and every file in the tree stay.
func TestSweepTemp(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	files := map[string]bool{ // Path to whether it must stay.
		TempDir + "/" + TempPrefix + "a-0123": false,
		TempDir + "/" + TempPrefix + "b":      false,
		TempDir + "/" + TempPrefix + "new":    true,
		TempDir + "/someone-elses":            true,
		"sub/plain":                           true,
		"sub/x" + TempPrefix:                  true,
	}
	for p := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("some bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(p, "new") {
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
	var salvaged []string
	n, bytes, err := tree.SweepTemp(context.Background(), time.Now().Add(-time.Minute), func(p string) { salvaged = append(salvaged, p) })
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || bytes != 2*int64(len("some bytes")) || len(salvaged) != 2 {
		t.Errorf("swept %d files of %d bytes, salvaged %v; want 2 of %d, both salvaged", n, bytes, salvaged, 2*len("some bytes"))
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

// TestTempDir: a Put writes its temporary file in TempDir, never beside
// its target, and no client call reaches TempDir or shows it.
func TestTempDir(t *testing.T) {
	dir := t.TempDir()
	tree, err := NewServed(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	ctx := context.Background()
	if _, err := tree.Put(ctx, "/sub", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait(); err != nil {
		t.Fatal(err)
	}

	// A Put in progress: its data arrives through a pipe held open.
	pr, pw := io.Pipe()
	put := tree.Put(ctx, "/sub/f", ferry.Dir{ferry.AttrType: ferry.TypeFile}, ferry.Whole, pr)
	if _, err := pw.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	in, _ := filepath.Glob(filepath.Join(dir, TempDir, TempPrefix+"f-*"))
	beside, _ := filepath.Glob(filepath.Join(dir, "sub", "*"))
	if len(in) != 1 || len(beside) != 0 {
		t.Errorf("during the put: %v in the temporary directory, %v beside the target; want one and none", in, beside)
	}
	pw.Write([]byte(" and the rest"))
	pw.Close()
	if _, err := put.Wait(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sub", "f")); err != nil || string(b) != "half and the rest" {
		t.Fatalf("after the put: %q, %v", b, err)
	}
	if in, _ := filepath.Glob(filepath.Join(dir, TempDir, "*")); len(in) != 0 {
		t.Errorf("after the put the temporary directory holds %v", in)
	}

	p := "/" + TempDir
	calls := map[string]func() error{
		"stat": func() error { _, err := tree.Stat(ctx, p).Wait(); return err },
		"get":  func() error { _, err := io.ReadAll(tree.Get(ctx, p+"/x", 0, -1)); return err },
		"put": func() error {
			_, err := tree.Put(ctx, p+"/x", ferry.Dir{ferry.AttrType: ferry.TypeFile}, ferry.Whole, strings.NewReader("x")).Wait()
			return err
		},
		"move into": func() error { _, err := tree.Move(ctx, "/sub/f", p+"/f").Wait(); return err },
		"remove":    func() error { _, err := tree.RemoveAll(ctx, p).Wait(); return err },
		"find":      func() error { _, err := collect(tree.Find(ctx, p, "")); return err },
	}
	for name, call := range calls {
		if err := call(); ferry.KindOf(err) != ferry.KindPermission {
			t.Errorf("%s in %s: %v, want a permission error", name, p, err)
		}
	}
	ents, err := collect(tree.Find(ctx, "/", ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Dir.Path(), TempPrefix) {
			t.Errorf("find / shows %s", e.Dir.Path())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", "f")); err != nil {
		t.Errorf("the refused move lost its source: %v", err)
	}
}

// collect returns every entry of s and its error.
func collect(s *ferry.Stream[ferry.Entry]) ([]ferry.Entry, error) {
	var out []ferry.Entry
	for e := range s.All() {
		out = append(out, e)
	}
	return out, s.Err()
}

// TestSweepLegacy: a tree first served by a version that wrote temporary
// files beside their targets is walked once, at the first sweep, which
// removes them and makes TempDir; later sweeps read TempDir alone.
func TestSweepLegacy(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	write := func(p string) {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("some bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(full, old, old)
	}
	write("sub/deep/" + TempPrefix + "left")
	write("sub/plain")
	tree, err := NewServed(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	ctx := context.Background()
	if n, _, err := tree.SweepTemp(ctx, time.Now(), nil); err != nil || n != 1 {
		t.Fatalf("first sweep: %d files, %v; want the one left beside its target", n, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, TempDir)); err != nil || !fi.IsDir() {
		t.Fatalf("no %s after the first sweep: %v", TempDir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub/plain")); err != nil {
		t.Errorf("the sweep removed a plain file: %v", err)
	}
	write("sub/" + TempPrefix + "later")
	if n, _, err := tree.SweepTemp(ctx, time.Now(), nil); err != nil || n != 0 {
		t.Errorf("second sweep: %d files, %v; want none (it reads %s alone)", n, err, TempDir)
	}
}
