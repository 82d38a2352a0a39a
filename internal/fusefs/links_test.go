package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/testenv"
)

// lstat returns the kernel's view of p.
func lstat(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestHardLinks checks that link(2) on the mount makes one file with two
// names, on the mount and on the server, through writes and removals.
func TestHardLinks(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	writeFile(t, filepath.Join(dir, "a"), "A")
	a, b, c := filepath.Join(mnt, "a"), filepath.Join(mnt, "b"), filepath.Join(mnt, "sub", "c")
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{b, c} {
		if err := os.Link(a, to); err != nil {
			t.Fatalf("link %s: %v", to, err)
		}
	}
	// A chmod's answer carries the number too (the kernel keeps the last).
	if err := os.Chmod(b, 0o640); err != nil {
		t.Fatal(err)
	}
	sa, sb, sc := lstat(t, a), lstat(t, b), lstat(t, c)
	if sa.Ino == 0 || sa.Ino != sb.Ino || sa.Ino != sc.Ino || sa.Nlink != 3 || sb.Nlink != 3 || sc.Nlink != 3 {
		t.Errorf("after two links: ino %d %d %d, nlink %d %d %d; want one ino, nlink 3", sa.Ino, sb.Ino, sc.Ino, sa.Nlink, sb.Nlink, sc.Nlink)
	}
	fa, _ := os.Lstat(filepath.Join(dir, "a"))
	fc, _ := os.Lstat(filepath.Join(dir, "sub", "c"))
	if !os.SameFile(fa, fc) {
		t.Errorf("on the server, a and sub/c are different files")
	}

	// A write through one name, by a program that opens without O_TRUNC
	// and one that truncates, shows through every name, here and on the
	// server: the file is written in place, not replaced.
	f, err := os.OpenFile(b, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("B")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{c, filepath.Join(dir, "a"), filepath.Join(dir, "sub", "c")} {
		if got := readFile(t, p); got != "AB" {
			t.Errorf("after appending B through b, %s holds %q, want AB", p, got)
		}
	}
	if err := os.WriteFile(c, []byte("C"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, b, filepath.Join(dir, "a"), filepath.Join(dir, "b")} {
		if got := readFile(t, p); got != "C" {
			t.Errorf("after writing C through sub/c, %s holds %q, want C", p, got)
		}
	}

	// Removing names counts down on the others.
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, c); st.Nlink != 2 || st.Ino != sb.Ino {
		t.Errorf("after removing a, sub/c has nlink %d ino %d; want 2 and %d", st.Nlink, st.Ino, sb.Ino)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, c); st.Nlink != 1 {
		t.Errorf("after removing b, sub/c has nlink %d, want 1", st.Nlink)
	}
	if err := os.Link(filepath.Join(mnt, "sub"), filepath.Join(mnt, "sub2")); err == nil {
		t.Errorf("link of a directory succeeded")
	}
	if err := os.Link(c, c); !os.IsExist(err) {
		t.Errorf("link over an existing name: %v, want EEXIST", err)
	}
}

// TestSpecialFiles checks that FIFOs, sockets and devices made on the
// mount are made on the server, and that a FIFO works as one.
func TestSpecialFiles(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	fifo := filepath.Join(mnt, "fifo")
	if err := unix.Mkfifo(fifo, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(mnt, "sock"), unix.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	dev := int(unix.Mkdev(1, 3))
	devErr := unix.Mknod(filepath.Join(mnt, "null"), unix.S_IFCHR|0o644, dev)
	if os.Geteuid() == 0 && devErr != nil {
		t.Errorf("mknod of a character device as root: %v", devErr)
	}
	cases := []struct {
		name string
		mode os.FileMode
		perm os.FileMode
	}{
		{"fifo", os.ModeNamedPipe, 0o640},
		{"sock", os.ModeSocket, 0o600},
	}
	if devErr == nil {
		cases = append(cases, struct {
			name string
			mode os.FileMode
			perm os.FileMode
		}{"null", os.ModeDevice | os.ModeCharDevice, 0o644})
	}
	for _, c := range cases {
		for _, p := range []string{filepath.Join(mnt, c.name), filepath.Join(dir, c.name)} {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Errorf("%s: %v", p, err)
				continue
			}
			if fi.Mode().Type() != c.mode || fi.Mode().Perm() != c.perm {
				t.Errorf("%s: mode %v, want type %v perm %v", p, fi.Mode(), c.mode, c.perm)
			}
		}
	}
	if devErr == nil {
		if st := lstat(t, filepath.Join(mnt, "null")); st.Rdev != uint64(dev) {
			t.Errorf("device number on the mount %#x, want %#x", st.Rdev, dev)
		}
	}
	// The FIFO on the mount is a pipe of this machine's kernel: what is
	// written comes out of the other end, and the server is not involved.
	done := make(chan string, 1)
	go func() {
		b, err := os.ReadFile(fifo)
		if err != nil {
			done <- err.Error()
			return
		}
		done <- string(b)
	}()
	if err := os.WriteFile(fifo, []byte("through"), 0); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got != "through" {
		t.Errorf("read from the FIFO %q, want through", got)
	}
}

// TestXattrs checks user extended attributes on the mount: set, listed,
// read back on the server, kept when the file is saved whole through the
// mount, removed; set on a file not yet stored; other namespaces refused.
func TestXattrs(t *testing.T) {
	dir, mnt, _, _ := mountLocal(t, Options{})
	writeFile(t, filepath.Join(dir, "f"), "f")
	if err := unix.Setxattr(filepath.Join(dir, "f"), "user.probe", []byte("1"), 0); err != nil {
		testenv.Require(t, "the test directory's file system takes no user extended attributes: "+err.Error())
	}
	f := filepath.Join(mnt, "f")
	get := func(p, name string) (string, error) {
		buf := make([]byte, 256)
		n, err := unix.Getxattr(p, name, buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	if got, err := get(f, "user.probe"); err != nil || got != "1" {
		t.Errorf("user.probe set on the server, on the mount: %q, %v", got, err)
	}
	if err := unix.Setxattr(f, "user.comment", []byte("hi"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.comment", []byte("again"), unix.XATTR_CREATE); err != unix.EEXIST {
		t.Errorf("XATTR_CREATE of an existing name: %v, want EEXIST", err)
	}
	if err := unix.Setxattr(f, "user.none", []byte("x"), unix.XATTR_REPLACE); err != unix.ENODATA {
		t.Errorf("XATTR_REPLACE of a missing name: %v, want ENODATA", err)
	}
	buf := make([]byte, 256)
	n, err := unix.Listxattr(f, buf)
	if err != nil || string(buf[:n]) != "user.comment\x00user.probe\x00" {
		t.Errorf("listxattr = %q, %v", buf[:n], err)
	}
	// Saving the file whole through the mount keeps them.
	if err := os.WriteFile(f, []byte("new content"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f, filepath.Join(dir, "f")} {
		if got, err := get(p, "user.comment"); err != nil || got != "hi" {
			t.Errorf("%s after a save: user.comment = %q, %v; want hi", p, got, err)
		}
	}
	if err := unix.Removexattr(f, "user.comment"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f, filepath.Join(dir, "f")} {
		if _, err := get(p, "user.comment"); err != unix.ENODATA {
			t.Errorf("%s after removexattr: %v, want ENODATA", p, err)
		}
	}
	if err := unix.Removexattr(f, "user.comment"); err != unix.ENODATA {
		t.Errorf("removing a missing name: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(f, "trusted.x", []byte("1"), 0); err != unix.ENOTSUP {
		t.Errorf("setxattr trusted.x: %v, want ENOTSUP", err)
	}
	// ENOTSUP, not ENODATA, tells ls -l to stop asking for every file.
	if _, err := get(f, "security.selinux"); err != unix.ENOTSUP {
		t.Errorf("getxattr security.selinux: %v, want ENOTSUP", err)
	}
	// A file created and not yet stored takes them with its first store.
	g, err := os.Create(filepath.Join(mnt, "g"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsetxattr(int(g.Fd()), "user.new", []byte("n"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsetxattr(int(g.Fd()), "user.gone", []byte("g"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fremovexattr(int(g.Fd()), "user.gone"); err != nil {
		t.Fatal(err)
	}
	g.WriteString("g")
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	n, err = unix.Listxattr(filepath.Join(dir, "g"), buf)
	if err != nil || string(buf[:n]) != "user.new\x00" {
		t.Errorf("created file on the server: listxattr = %q, %v; want user.new", buf[:n], err)
	}
}

// TestLinkedTree lists and stats a tree whose files all have a second name
// (as a backup made with cp -al or rsnapshot has) from the metadata the
// walk brought: no call per file. Listing such a directory once failed
// with EIO.
func TestLinkedTree(t *testing.T) {
	dir, mnt, c, _ := mountLocal(t, Options{})
	const n = 20
	for i := range n {
		p := filepath.Join(dir, "tree", fmt.Sprintf("f%02d", i))
		writeFile(t, p, "x")
		if err := os.MkdirAll(filepath.Join(dir, "copy"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(p, filepath.Join(dir, "copy", fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	c.reset()
	ents, err := os.ReadDir(filepath.Join(mnt, "tree"))
	if err != nil || len(ents) != n {
		t.Fatalf("ReadDir = %d entries, %v; want %d", len(ents), err, n)
	}
	for _, e := range ents {
		st := lstat(t, filepath.Join(mnt, "tree", e.Name()))
		if st.Nlink != 2 {
			t.Errorf("%s: nlink %d, want 2", e.Name(), st.Nlink)
		}
	}
	if got := c.stats.Load(); got >= n {
		t.Errorf("listing and stating %d linked files made %d Stats, want fewer than one each", n, got)
	}
}

// TestRenameNoReplace: renameat2 with RENAME_NOREPLACE fails with EEXIST
// onto a name that exists and renames onto one that does not, on a mount
// that asks the server and on one under a write lease, which answers from
// its cache without a call (config.status moves each file it makes with
// it, 120 ms a time 120 ms from the server before).
func TestRenameNoReplace(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback=%v", wb), func(t *testing.T) {
			srv := servertest.Start(t, "")
			mnt, s := mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: wb})
			if !waitFor(5*time.Second, s.cache.Leased) {
				t.Fatal("the mount got no watch")
			}
			for _, name := range []string{"a", "b"} {
				if err := os.WriteFile(filepath.Join(mnt, name), []byte(name), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before := srv.Srv.Calls()
			err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "a"), unix.AT_FDCWD, filepath.Join(mnt, "b"), unix.RENAME_NOREPLACE)
			if err != unix.EEXIST {
				t.Errorf("renameat2 onto b with RENAME_NOREPLACE: %v, want EEXIST", err)
			}
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "a"), unix.AT_FDCWD, filepath.Join(mnt, "c"), unix.RENAME_NOREPLACE); err != nil {
				t.Errorf("renameat2 onto c with RENAME_NOREPLACE: %v", err)
			}
			if err := syncDir(mnt); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{"a": "", "b": "b", "c": "a"} {
				got, err := os.ReadFile(filepath.Join(srv.Dir, name))
				if want == "" && !os.IsNotExist(err) || want != "" && string(got) != want {
					t.Errorf("%s on the server: %q, %v; want %q", name, got, err, want)
				}
			}
			if n := servertest.CallsSince(srv.Srv, before, "stat", 0); wb && n > 0 {
				t.Errorf("under a write lease the checks made %d Stat calls, want none", n)
			}
		})
	}
}

// TestWriteAfterUnlinkOfOneName: a file with two names, open for writing
// under one, keeps what is written after that name is removed, as on a
// local disk: it is stored under the other name. Where the mount knows
// no other name (its directory was never listed), what was written
// before the removal is stored then, and the close of what came after
// fails rather than losing it silently.
func TestWriteAfterUnlinkOfOneName(t *testing.T) {
	for _, c := range []struct {
		name        string
		other       string // The second name, on the server.
		budget      int    // cache.Options.PrefetchBudget.
		want        string // The file at other afterwards.
		wantCloseOK bool
	}{
		{"other name known", "x/B", 0, "old\npre\npost\n", true},
		{"other name unknown", "y/z/w/B", 2, "old\npre\n", false},
	} {
		for _, wb := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/writeback=%v", c.name, wb), func(t *testing.T) {
				srv := servertest.Start(t, "")
				for _, d := range []string{"x", "y/z/w"} { // Walked after x/A.
					if err := os.MkdirAll(filepath.Join(srv.Dir, d), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(filepath.Join(srv.Dir, "x", "A"), []byte("old\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Link(filepath.Join(srv.Dir, "x", "A"), filepath.Join(srv.Dir, c.other)); err != nil {
					t.Fatal(err)
				}
				opt := Options{TTL: time.Hour, WriteBack: wb}
				opt.Cache.PrefetchBudget = c.budget
				mnt, s := mountFS(t, srv.Client(t, "a"), opt)
				if !waitFor(5*time.Second, s.cache.Leased) {
					t.Fatal("the mount got no watch")
				}
				f, err := os.OpenFile(filepath.Join(mnt, "x", "A"), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString("pre\n"); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(filepath.Join(mnt, "x", "A")); err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString("post\n"); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); (err == nil) != c.wantCloseOK {
					t.Errorf("close after the removal: %v, want success %v", err, c.wantCloseOK)
				}
				if err := syncDir(mnt); err != nil {
					t.Fatal(err)
				}
				if got, err := os.ReadFile(filepath.Join(srv.Dir, c.other)); err != nil || string(got) != c.want {
					t.Errorf("%s on the server: %q, %v; want %q", c.other, got, err, c.want)
				}
				if _, err := os.Stat(filepath.Join(srv.Dir, "x", "A")); !os.IsNotExist(err) {
					t.Errorf("x/A on the server after its removal: %v", err)
				}
			})
		}
	}
}
