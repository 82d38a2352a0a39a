package local

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ferryfs/ferry"
)

// TestOpenRegular: a regular file, also through a symbolic link, opens;
// a directory, a FIFO and a symbolic link to one are refused, and the
// FIFO is not opened (an open of it to read would wait for a writer).
func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		os.Mkdir(filepath.Join(dir, "d"), 0o755),
		syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644),
		os.Symlink("f", filepath.Join(dir, "link")),
		os.Symlink("fifo", filepath.Join(dir, "fifolink")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, tc := range []struct {
		name string
		want ferry.Kind // KindOther: opens.
	}{
		{"f", ferry.KindOther},
		{"link", ferry.KindOther},
		{"d", ferry.KindIsDir},
		{"fifo", ferry.KindInvalid},
		{"fifolink", ferry.KindInvalid},
		{"missing", ferry.KindNotExist},
	} {
		f, fi, err := OpenRegular(root, tc.name)
		if tc.want == ferry.KindOther {
			if err != nil || fi.Size() != 4 {
				t.Errorf("%s: %v, %v; want the 4-byte file", tc.name, fi, err)
			}
			if f != nil {
				f.Close()
			}
			continue
		}
		if f != nil {
			f.Close()
		}
		if !ferry.IsKind(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
