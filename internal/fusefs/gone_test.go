package fusefs

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestRemovedWhileOpen: when the kernel opens files by itself the mount
// cannot tell whether a descriptor is open on a file, and a file removed,
// or replaced by a rename, while one is must still read and write through
// it as on a local disk. The mount hides such a file (gone.go): no listing
// shows it, the server has it under a hidden name while the descriptor is
// open, and not once it is closed. A directory whose only file left is
// hidden is removed with it.
func TestRemovedWhileOpen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(at func(string) string) error
	}{
		{"unlink", func(at func(string) string) error { return os.Remove(at("d/f")) }},
		{"rename over", func(at func(string) string) error { return os.Rename(at("d/new"), at("d/f")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := servertest.Start(t, "")
			writeFile(t, filepath.Join(srv.Dir, "d", "f"), "the old content\n")
			writeFile(t, filepath.Join(srv.Dir, "d", "new"), "new\n")
			writeFile(t, filepath.Join(srv.Dir, "e", "f"), "in e\n")
			mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: true, KernelOpens: true})
			if !waitFor(5*time.Second, s.cache.Leased) {
				t.Fatal("the mount got no watch")
			}
			at := func(name string) string { return filepath.Join(mnt, filepath.FromSlash(name)) }
			if got := readFile(t, at("e/f")); got != "in e\n" {
				t.Fatalf("e/f: %q", got)
			}
			if !s.kernel.noOpen.Load() {
				t.Fatal("the kernel was not told it need not open files")
			}
			f, err := os.OpenFile(at("d/f"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := tc.remove(at); err != nil {
				t.Fatal(err)
			}
			// The descriptor writes on and reads back what it wrote,
			// though the file has no name left.
			if _, err := f.WriteAt([]byte("THE"), 0); err != nil {
				t.Fatalf("writing after the removal: %v", err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 64)
			k, err := f.ReadAt(b, 0)
			if err != nil && err != io.EOF {
				t.Fatalf("reading after the removal: %v", err)
			}
			if got := string(b[:k]); got != "THE old content\n" {
				t.Errorf("read through the descriptor: %q", got)
			}
			var st syscall.Stat_t
			if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			if st.Nlink != 0 {
				t.Errorf("fstat says %d links, want 0", st.Nlink)
			}
			names := func(dir string) []string {
				es, err := os.ReadDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				var ns []string
				for _, e := range es {
					ns = append(ns, e.Name())
				}
				return ns
			}
			want := "new"
			if tc.name == "rename over" {
				want = "f"
			}
			if got := strings.Join(names(at("d")), " "); got != want {
				t.Errorf("the mount lists d as %q, want %q", got, want)
			}
			hiddenOnServer := func() int {
				n := 0
				for _, name := range names(filepath.Join(srv.Dir, "d")) {
					if cache.Hidden(name) {
						n++
					}
				}
				return n
			}
			if got := hiddenOnServer(); got != 1 {
				t.Errorf("the server holds %d hidden files while the descriptor is open, want 1", got)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if !waitFor(5*time.Second, func() bool { return hiddenOnServer() == 0 }) {
				t.Errorf("the server still holds %d hidden files after the close", hiddenOnServer())
			}
			if tc.name == "rename over" {
				if got := readFile(t, at("d/f")); got != "new\n" {
					t.Errorf("d/f after the rename: %q", got)
				}
				return
			}

			// A directory removed while a descriptor is open on its
			// last file, removed too.
			g, err := os.OpenFile(at("e/f"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := os.Remove(at("e/f")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(at("e")); err != nil {
				t.Fatalf("rmdir of a directory holding only a hidden file: %v", err)
			}
			if err := syncDir(mnt); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(srv.Dir, "e")); !os.IsNotExist(err) {
				t.Errorf("e on the server after its removal: %v", err)
			}
		})
	}
}
