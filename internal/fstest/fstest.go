// Package fstest is the test suite every ferry.FS implementation runs, so
// that the local tree, the remote client and every layer stacked on them
// behave alike.
package fstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/testenv"
)

// Setup returns a fresh FS to test and the directory on disk that holds its
// tree, so the suite can prepare and check files behind its back.
type Setup func(t *testing.T) (fs ferry.FS, dir string)

// Run runs the suite against the FSs that setup makes, each test with a
// fresh one.
func Run(t *testing.T, setup Setup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, fs ferry.FS, dir string)
	}{
		{"StatRoot", testStatRoot},
		{"StatErrors", testStatErrors},
		{"PutGetWhole", testPutGetWhole},
		{"PutLongestName", testPutLongestName},
		{"GetRanges", testGetRanges},
		{"GetErrors", testGetErrors},
		{"PutAtOffset", testPutAtOffset},
		{"PutDirAndLink", testPutDirAndLink},
		{"PutErrors", testPutErrors},
		{"PutKeepsModeOnReplace", testPutKeepsMode},
		{"Move", testMove},
		{"Link", testLink},
		{"Special", testSpecial},
		{"Times", testTimes},
		{"Xattrs", testXattrs},
		{"Remove", testRemove},
		{"Wstat", testWstat},
		{"OwnerAndSetID", testOwnerAndSetID},
		{"SetgidDir", testSetgidDir},
		{"Find", testFind},
		{"FindGet", testFindGet},
		{"FindErrors", testFindErrors},
		{"Escapes", testEscapes},
		{"BadPaths", testBadPaths},
		{"ConcurrentPuts", testConcurrentPuts},
		{"Cancel", testCancel},
		{"FailedPutKeepsOld", testFailedPutKeepsOld},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs, dir := setup(t)
			tc.fn(t, fs, dir)
		})
	}
}

// testPutLongestName: a file whose name is as long as a name may be is
// stored, whole and replaced whole, small and large (the temporary file
// of a whole Put must fit in a name too).
func testPutLongestName(t *testing.T, fs ferry.FS, dir string) {
	p := "/" + strings.Repeat("n", ferry.MaxNameLen)
	for _, size := range []int{10, 300 << 10} {
		data := strings.Repeat("x", size)
		for range 2 {
			if _, err := fs.Put(ctx(t), p, ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait(); err != nil {
				t.Fatalf("Put of %d bytes to a name of %d bytes: %v", size, ferry.MaxNameLen, err)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(b) != data {
			t.Fatalf("the file on disk: %d bytes, %v; want %d", len(b), err, size)
		}
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func write(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, dir, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantKind(t *testing.T, what string, err error, k ferry.Kind) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got no error, want %v", what, k)
		return
	}
	if got := ferry.KindOf(err); got != k {
		t.Errorf("%s: got error %v of kind %q, want kind %q", what, err, got, k)
	}
}

func getAll(ctx context.Context, fs ferry.FS, p string, off, n int64) (string, error) {
	r := fs.Get(ctx, p, off, n)
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

func testStatRoot(t *testing.T, fs ferry.FS, dir string) {
	d, err := fs.Stat(ctx(t), "/").Wait()
	if err != nil {
		t.Fatal(err)
	}
	if d.Path() != "/" || !d.IsDir() {
		t.Errorf("Stat(/) = %v, want a directory at /", d)
	}
}

func testStatErrors(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "x")
	_, err := fs.Stat(ctx(t), "/nope").Wait()
	wantKind(t, "Stat(/nope)", err, ferry.KindNotExist)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("errors.Is(%v, os.ErrNotExist) = false, want true", err)
	}
	_, err = fs.Stat(ctx(t), "/f/below").Wait()
	wantKind(t, "Stat(/f/below)", err, ferry.KindNotDir)
}

func testPutGetWhole(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB: several messages.
	cases := []struct {
		path string
		data []byte
	}{
		{"/empty", nil},
		{"/small", []byte("hello\n")},
		{"/big", big},
	}
	for _, tc := range cases {
		var r io.Reader
		if tc.data != nil {
			r = bytes.NewReader(tc.data)
		}
		d, err := fs.Put(c, tc.path, ferry.Dir{ferry.AttrMode: "0640"}, ferry.Whole, r).Wait()
		if err != nil {
			t.Fatalf("Put(%s): %v", tc.path, err)
		}
		if d.Size() != int64(len(tc.data)) || d.Type() != ferry.TypeFile || d.Mode() != 0o640 {
			t.Errorf("Put(%s) = %v, want a file of size %d mode 0640", tc.path, d, len(tc.data))
		}
		got, err := getAll(c, fs, tc.path, 0, -1)
		if err != nil || got != string(tc.data) {
			t.Errorf("Get(%s) = %d bytes, %v; want %d bytes", tc.path, len(got), err, len(tc.data))
		}
		if disk := read(t, dir, tc.path[1:]); disk != string(tc.data) {
			t.Errorf("on disk %s has %d bytes, want %d", tc.path, len(disk), len(tc.data))
		}
	}
	// Replacing shrinks: no stale tail.
	if _, err := fs.Put(c, "/small", nil, ferry.Whole, strings.NewReader("hi")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, dir, "small"); got != "hi" {
		t.Errorf("after replace, /small = %q, want %q", got, "hi")
	}
}

func testGetRanges(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "0123456789")
	cases := []struct {
		off, n int64
		want   string
	}{
		{0, -1, "0123456789"},
		{3, 4, "3456"},
		{8, 10, "89"},
		{10, -1, ""},
		{20, 5, ""},
		{0, 0, ""},
	}
	for _, tc := range cases {
		got, err := getAll(ctx(t), fs, "/f", tc.off, tc.n)
		if err != nil || got != tc.want {
			t.Errorf("Get(/f, %d, %d) = %q, %v; want %q", tc.off, tc.n, got, err, tc.want)
		}
	}
}

func testGetErrors(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "d/f", "x")
	_, err := getAll(ctx(t), fs, "/nope", 0, -1)
	wantKind(t, "Get(/nope)", err, ferry.KindNotExist)
	_, err = getAll(ctx(t), fs, "/d", 0, -1)
	wantKind(t, "Get(/d)", err, ferry.KindIsDir)
	_, err = getAll(ctx(t), fs, "/d/f", -5, -1)
	wantKind(t, "Get(/d/f, -5)", err, ferry.KindInvalid)
}

func testPutAtOffset(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "0123456789")
	c := ctx(t)
	if _, err := fs.Put(c, "/f", nil, 2, strings.NewReader("ab")).Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Put(c, "/f", nil, 12, strings.NewReader("Z")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, dir, "f"), "01ab456789\x00\x00Z"; got != want {
		t.Errorf("after puts at offsets, f = %q, want %q", got, want)
	}
	if _, err := fs.Put(c, "/new", nil, 3, strings.NewReader("x")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, dir, "new"), "\x00\x00\x00x"; got != want {
		t.Errorf("put at offset 3 of a new file = %q, want %q", got, want)
	}
}

func testPutDirAndLink(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	d, err := fs.Put(c, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir, ferry.AttrMode: "0750"}, 0, nil).Wait()
	if err != nil || !d.IsDir() || d.Mode() != 0o750 {
		t.Fatalf("Put(/d) = %v, %v; want a directory of mode 0750", d, err)
	}
	// Putting it again updates its attributes.
	d, err = fs.Put(c, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir, ferry.AttrMode: "0700"}, 0, nil).Wait()
	if err != nil || d.Mode() != 0o700 {
		t.Errorf("Put(/d) again = %v, %v; want mode 0700", d, err)
	}
	d, err = fs.Put(c, "/d/l", ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: "../x"}, 0, nil).Wait()
	if err != nil || d.Type() != ferry.TypeSymlink || d[ferry.AttrTarget] != "../x" {
		t.Errorf("Put(/d/l) = %v, %v; want a link to ../x", d, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "d/l")); err != nil || target != "../x" {
		t.Errorf("on disk d/l links to %q, %v; want ../x", target, err)
	}
	// Replacing a link is atomic and keeps no temporary names around.
	if _, err := fs.Put(c, "/d/l", ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: "y"}, 0, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "d"))
	if len(ents) != 1 {
		t.Errorf("d holds %d entries after replacing the link, want 1", len(ents))
	}
}

func testPutErrors(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "x")
	c := ctx(t)
	cases := []struct {
		what string
		path string
		d    ferry.Dir
		want ferry.Kind
	}{
		{"no parent", "/no/such/file", nil, ferry.KindNotExist},
		{"parent is a file", "/f/x", nil, ferry.KindNotDir},
		{"link without target", "/l", ferry.Dir{ferry.AttrType: ferry.TypeSymlink}, ferry.KindInvalid},
		{"unknown type", "/o", ferry.Dir{ferry.AttrType: "q"}, ferry.KindInvalid},
		{"file over dir", "/", nil, ferry.KindIsDir},
		{"dir over file", "/f", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.KindExist},
	}
	for _, tc := range cases {
		_, err := fs.Put(c, tc.path, tc.d, ferry.Whole, strings.NewReader("data")).Wait()
		wantKind(t, "Put "+tc.what, err, tc.want)
	}
}

// testPutKeepsMode: a whole-file Put with no mode keeps the mode of the
// file it replaces, set-ID bits included, as a write to it would.
func testPutKeepsMode(t *testing.T, fs ferry.FS, dir string) {
	for i, mode := range []os.FileMode{0o755, 0o755 | os.ModeSetuid, 0o775 | os.ModeSetgid} {
		// A name each: a cache above has not seen the file before.
		name := fmt.Sprintf("x%d.sh", i)
		write(t, dir, name, "old")
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
		d, err := fs.Put(ctx(t), "/"+name, nil, ferry.Whole, strings.NewReader("new")).Wait()
		if err != nil || d.Mode() != mode {
			t.Errorf("replace of a file of mode %v = %v, %v; want its mode kept", mode, d, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode() != mode {
			t.Errorf("on disk after the replace of a file of mode %v: %v, %v", mode, fi.Mode(), err)
		}
	}
}

func testMove(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "a", "A")
	write(t, dir, "b", "B")
	write(t, dir, "d/x", "X")
	c := ctx(t)
	d, err := fs.Move(c, "/a", "/d/a2").Wait()
	if err != nil || d.Path() != "/d/a2" {
		t.Fatalf("Move(/a, /d/a2) = %v, %v", d, err)
	}
	if got := read(t, dir, "d/a2"); got != "A" {
		t.Errorf("moved file holds %q, want A", got)
	}
	if _, err := fs.Move(c, "/b", "/d/a2").Wait(); err != nil {
		t.Errorf("Move over a file: %v", err)
	}
	if got := read(t, dir, "d/a2"); got != "B" {
		t.Errorf("replaced file holds %q, want B", got)
	}
	_, err = fs.Move(c, "/nope", "/z").Wait()
	wantKind(t, "Move(/nope)", err, ferry.KindNotExist)
	_, err = fs.Move(c, "/", "/z").Wait()
	wantKind(t, "Move(/)", err, ferry.KindPermission)
	_, err = fs.Move(c, "/d", "/d/inside").Wait()
	wantKind(t, "Move(/d, /d/inside)", err, ferry.KindInvalid)
}

func testLink(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "a", "A")
	write(t, dir, "d/x", "X")
	c := ctx(t)
	d, err := fs.Link(c, "/a", "/d/b").Wait()
	if err != nil {
		t.Fatalf("Link(/a, /d/b): %v", err)
	}
	if d.Path() != "/d/b" || d.Int(ferry.AttrNlink) != 2 {
		t.Errorf("Link(/a, /d/b) = %v, want /d/b with nlink 2", d)
	}
	a, err := fs.Stat(c, "/a").Wait()
	if err != nil || a[ferry.AttrIno] == "" || a[ferry.AttrIno] != d[ferry.AttrIno] || a.Int(ferry.AttrNlink) != 2 {
		t.Errorf("Stat(/a) = %v, %v; want nlink 2 and the ino of /d/b (%s)", a, err, d[ferry.AttrIno])
	}
	// Both names are one file: a write in place through one shows in the other.
	if _, err := fs.Put(c, "/d/b", nil, 1, strings.NewReader("B")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, dir, "a"); got != "AB" {
		t.Errorf("after a write through the link, a holds %q, want AB", got)
	}
	_, err = fs.Link(c, "/a", "/d/x").Wait()
	wantKind(t, "Link over an existing file", err, ferry.KindExist)
	_, err = fs.Link(c, "/nope", "/z").Wait()
	wantKind(t, "Link(/nope)", err, ferry.KindNotExist)
	if _, err = fs.Link(c, "/d", "/d2").Wait(); err == nil {
		t.Errorf("Link of a directory succeeded")
	}
	if _, err := fs.Remove(c, "/a").Wait(); err != nil {
		t.Fatal(err)
	}
	if b, err := fs.Stat(c, "/d/b").Wait(); err != nil || b.Int(ferry.AttrNlink) != 1 {
		t.Errorf("after removing /a, Stat(/d/b) = %v, %v; want nlink 1", b, err)
	}
}

// testSpecial makes a named pipe and, as root, a device: they are listed
// and described, and reading or writing them through the tree fails at once
// instead of waiting on the pipe.
func testSpecial(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	d, err := fs.Put(c, "/fifo", ferry.Dir{ferry.AttrType: ferry.TypeFifo, ferry.AttrMode: "0640"}, ferry.Whole, nil).Wait()
	if err != nil {
		t.Fatalf("Put of a pipe: %v", err)
	}
	if d.Type() != ferry.TypeFifo || d[ferry.AttrMode] != "0640" {
		t.Errorf("Put of a pipe = %v, want type p, mode 0640", d)
	}
	fi, err := os.Lstat(filepath.Join(dir, "fifo"))
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o640 {
		t.Errorf("on disk: %v, %v; want a pipe with mode 0640", fi.Mode(), err)
	}
	if _, err := getAll(c, fs, "/fifo", 0, -1); err == nil {
		t.Errorf("Get of a pipe succeeded")
	}
	if _, err := fs.Put(c, "/fifo", nil, 0, strings.NewReader("x")).Wait(); err == nil {
		t.Errorf("Put into a pipe succeeded")
	}
	var types []string
	for e := range fs.Find(c, "/", "type=p").All() {
		types = append(types, e.Dir.Path()+" "+e.Dir.Type())
	}
	if got := strings.Join(types, ","); got != "/fifo p" {
		t.Errorf("Find type=p = %q, want /fifo p", got)
	}
	dev := ferry.Dir{ferry.AttrType: ferry.TypeChar, ferry.AttrMode: "0600"}
	dev.SetInt(ferry.AttrRdev, 1<<8|3) // 1,3: /dev/null.
	d, err = fs.Put(c, "/null", dev, ferry.Whole, nil).Wait()
	if os.Geteuid() != 0 {
		wantKind(t, "Put of a device, not as root", err, ferry.KindPermission)
		return
	}
	if err != nil || d.Type() != ferry.TypeChar || d.Int(ferry.AttrRdev) != 1<<8|3 {
		t.Errorf("Put of a device = %v, %v; want type c, rdev %d", d, err, 1<<8|3)
	}
}

func testTimes(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "x")
	c := ctx(t)
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	at := time.Date(2021, 6, 7, 8, 9, 10, 11000, time.UTC)
	want := ferry.Dir{}
	want.SetMtime(mt)
	want.SetInt(ferry.AttrAtime, at.UnixNano())
	d, err := fs.Wstat(c, "/f", want).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !d.Mtime().Equal(mt) || !d.Atime().Equal(at) {
		t.Errorf("Wstat = %v, want mtime %v, atime %v", d, mt, at)
	}
	if d.Ctime().Before(time.Now().Add(-time.Minute)) {
		t.Errorf("ctime %v, want the time of the Wstat", d.Ctime())
	}
	// An atime alone leaves the mtime.
	at2 := at.Add(time.Hour)
	d, err = fs.Wstat(c, "/f", ferry.Dir{ferry.AttrAtime: fmt.Sprint(at2.UnixNano())}).Wait()
	if err != nil || !d.Mtime().Equal(mt) || !d.Atime().Equal(at2) {
		t.Errorf("Wstat of atime = %v, %v; want mtime %v, atime %v", d, err, mt, at2)
	}
	// The times of a symbolic link are its own, and one that leads out
	// of the tree changes nothing outside.
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("o"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(outside)
	for _, l := range []struct{ name, target string }{{"l", "f"}, {"out", outside}} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
		lt := time.Date(2019, 1, 1, 0, 0, 0, 0, time.UTC)
		want := ferry.Dir{}
		want.SetMtime(lt)
		d, err := fs.Wstat(c, "/"+l.name, want).Wait()
		if err != nil || d.Type() != ferry.TypeSymlink || !d.Mtime().Equal(lt) {
			t.Errorf("Wstat(/%s, mtime %v) = %v, %v; want the link with that mtime", l.name, lt, d, err)
		}
	}
	if f, err := fs.Stat(c, "/f").Wait(); err != nil || !f.Mtime().Equal(mt) {
		t.Errorf("after Wstat of a link to it, f = %v, %v; want mtime %v", f, err, mt)
	}
	if after, _ := os.Stat(outside); !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("Wstat of a link out of the tree changed the file outside: mtime %v, was %v", after.ModTime(), before.ModTime())
	}
}

func testXattrs(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "x")
	if err := unix.Setxattr(filepath.Join(dir, "f"), "user.probe", []byte("1"), 0); err != nil {
		testenv.Require(t, "the test directory's file system takes no user extended attributes: "+err.Error())
	}
	unix.Removexattr(filepath.Join(dir, "f"), "user.probe")
	c := ctx(t)
	set := ferry.Dir{}
	set.SetXattr("user.comment", []byte("hello\x00bin"))
	d, err := fs.Wstat(c, "/f", set).Wait()
	if v, ok := d.Xattr("user.comment"); err != nil || !ok || string(v) != "hello\x00bin" {
		t.Fatalf("Wstat(user.comment) = %v, %v", d, err)
	}
	if got, err := unix.Getxattr(filepath.Join(dir, "f"), "user.comment", make([]byte, 64)); err != nil || got != 9 {
		t.Errorf("on disk: getxattr = %d, %v; want 9 bytes", got, err)
	}
	// Stat and Find carry it; a whole-file Put keeps it.
	for e := range fs.Find(c, "/", "name=f").All() {
		if v, _ := e.Dir.Xattr("user.comment"); string(v) != "hello\x00bin" {
			t.Errorf("Find: %v lacks user.comment", e.Dir)
		}
	}
	if _, err := fs.Put(c, "/f", ferry.Dir{ferry.AttrType: ferry.TypeFile}, ferry.Whole, strings.NewReader("new")).Wait(); err != nil {
		t.Fatal(err)
	}
	d, err = fs.Stat(c, "/f").Wait()
	if v, _ := d.Xattr("user.comment"); err != nil || string(v) != "hello\x00bin" || d.Size() != 3 {
		t.Errorf("after a whole-file Put, Stat = %v, %v; want the new content with user.comment kept", d, err)
	}
	if got := d.Xattrs(); len(got) != 1 || got[0] != "user.comment" {
		t.Errorf("Xattrs() = %v, want [user.comment]", got)
	}
	// Removal, and the errors.
	d, err = fs.Wstat(c, "/f", ferry.Dir{ferry.XattrPrefix + "user.comment": ferry.XattrRemove}).Wait()
	if _, ok := d.Xattr("user.comment"); err != nil || ok {
		t.Errorf("after removal, Wstat = %v, %v", d, err)
	}
	_, err = fs.Wstat(c, "/f", ferry.Dir{ferry.XattrPrefix + "user.comment": ferry.XattrRemove}).Wait()
	wantKind(t, "removing a missing extended attribute", err, ferry.KindNotExist)
	bad := ferry.Dir{}
	bad.SetXattr("trusted.x", []byte("1"))
	_, err = fs.Wstat(c, "/f", bad).Wait()
	wantKind(t, "Wstat(trusted.x)", err, ferry.KindInvalid)
	_, err = fs.Wstat(c, "/f", ferry.Dir{ferry.XattrPrefix + "user.x": "not base64!"}).Wait()
	wantKind(t, "Wstat with a value not in base64", err, ferry.KindInvalid)
}

func testRemove(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "x")
	write(t, dir, "d/e/f", "x")
	c := ctx(t)
	if _, err := fs.Remove(c, "/f").Wait(); err != nil {
		t.Error(err)
	}
	_, err := fs.Remove(c, "/f").Wait()
	wantKind(t, "Remove twice", err, ferry.KindNotExist)
	_, err = fs.Remove(c, "/d").Wait()
	wantKind(t, "Remove(/d)", err, ferry.KindNotEmpty)
	_, err = fs.Remove(c, "/").Wait()
	wantKind(t, "Remove(/)", err, ferry.KindPermission)
	_, err = fs.RemoveAll(c, "/").Wait()
	wantKind(t, "RemoveAll(/)", err, ferry.KindPermission)
	if _, err := fs.RemoveAll(c, "/d").Wait(); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Errorf("after RemoveAll, stat d = %v, want not exist", err)
	}
	if _, err := fs.RemoveAll(c, "/d").Wait(); err != nil {
		t.Errorf("RemoveAll of a missing tree: %v, want success", err)
	}
}

func testWstat(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "0123456789")
	c := ctx(t)
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	want := ferry.Dir{ferry.AttrMode: "0600"}
	want.SetMtime(mt)
	want.SetInt(ferry.AttrSize, 4)
	d, err := fs.Wstat(c, "/f", want).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if d.Size() != 4 || d.Mode() != 0o600 || !d.Mtime().Equal(mt) {
		t.Errorf("Wstat = %v, want size 4, mode 0600, mtime %v", d, mt)
	}
	if got := read(t, dir, "f"); got != "0123" {
		t.Errorf("truncated file holds %q, want 0123", got)
	}
	d, err = fs.Wstat(c, "/f", ferry.Dir{ferry.AttrSize: "6"}).Wait()
	if err != nil || d.Size() != 6 {
		t.Errorf("extend: %v, %v", d, err)
	}
	if got := read(t, dir, "f"); got != "0123\x00\x00" {
		t.Errorf("extended file holds %q", got)
	}
	_, err = fs.Wstat(c, "/", ferry.Dir{ferry.AttrSize: "0"}).Wait()
	wantKind(t, "Wstat size of a dir", err, ferry.KindIsDir)
	_, err = fs.Wstat(c, "/f", ferry.Dir{ferry.AttrSize: "-1"}).Wait()
	wantKind(t, "Wstat negative size", err, ferry.KindInvalid)
	_, err = fs.Wstat(c, "/nope", ferry.Dir{ferry.AttrMode: "0600"}).Wait()
	wantKind(t, "Wstat(/nope)", err, ferry.KindNotExist)
}

// testOwnerAndSetID: a change of owner and mode at once, by Wstat or
// with a whole-file Put, leaves the mode asked for, set-ID bits and all:
// on Linux a chown clears them, so it must come first (as tar and rsync
// order them).
func testOwnerAndSetID(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	d := ferry.Dir{}
	d.SetInt(ferry.AttrUid, int64(os.Getuid()))
	d.SetInt(ferry.AttrGid, int64(os.Getgid()))
	d.SetMode(0o755 | os.ModeSetuid)
	write(t, dir, "w", "data")
	if got, err := fs.Wstat(c, "/w", d).Wait(); err != nil || got.Mode() != 0o755|os.ModeSetuid {
		t.Errorf("Wstat of owner and mode 04755 = %v, %v", got, err)
	}
	if _, err := fs.Put(c, "/p", d, ferry.Whole, strings.NewReader("data")).Wait(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w", "p"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode() != 0o755|os.ModeSetuid {
			t.Errorf("%s on disk: %v, %v; want -rwsr-xr-x", name, fi.Mode(), err)
		}
	}
}

// testSetgidDir: what is made in a directory with the set-group-ID bit
// takes its group, and a directory made there the bit too, as on a local
// disk; also a file put whole, which the tree below makes elsewhere and
// renames into place.
func testSetgidDir(t *testing.T, fs ferry.FS, dir string) {
	if os.Getuid() != 0 {
		testenv.Require(t, "giving a directory another group needs root")
	}
	const group = 65534
	if err := os.Mkdir(filepath.Join(dir, "g"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "g"), -1, group); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "g"), 0o755|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	for _, e := range []struct {
		name string
		d    ferry.Dir
		data string
	}{
		{"f", ferry.Dir{ferry.AttrMode: "0644"}, "data"},
		{"sub", ferry.Dir{ferry.AttrType: ferry.TypeDir, ferry.AttrMode: "0755"}, ""},
		{"link", ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: "f"}, ""},
	} {
		var data io.Reader
		if e.data != "" {
			data = strings.NewReader(e.data)
		}
		if _, err := fs.Put(c, "/g/"+e.name, e.d, ferry.Whole, data).Wait(); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(filepath.Join(dir, "g", e.name))
		if err != nil {
			t.Fatal(err)
		}
		if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != group {
			t.Errorf("%s made in a set-group-ID directory of group %d has group %d", e.name, group, gid)
		}
		if e.name == "sub" && fi.Mode()&os.ModeSetgid == 0 {
			t.Errorf("directory made in a set-group-ID directory: %v, want the bit too", fi.Mode())
		}
	}
}

// tree makes a small tree for the find tests.
func tree(t *testing.T, dir string) {
	for _, f := range []string{"a.go", "b.txt", "src/c.go", "src/d/e.go", "src/d/f.txt", ".git/HEAD", ".git/objects/x"} {
		write(t, dir, f, "content of "+f)
	}
}

func findPaths(t *testing.T, s *ferry.Stream[ferry.Entry]) []string {
	t.Helper()
	var got []string
	for e := range s.All() {
		if e.Err != nil {
			t.Errorf("entry error: %v", e.Err)
			continue
		}
		if e.Dir != nil {
			got = append(got, e.Dir.Path())
		}
	}
	if err := s.Err(); err != nil {
		t.Errorf("find: %v", err)
	}
	return got
}

func testFind(t *testing.T, fs ferry.FS, dir string) {
	tree(t, dir)
	cases := []struct {
		path, pred string
		want       string
	}{
		{"/", "", "/ /.git /.git/HEAD /.git/objects /.git/objects/x /a.go /b.txt /src /src/c.go /src/d /src/d/e.go /src/d/f.txt"},
		{"/", "name~*.go", "/a.go /src/c.go /src/d/e.go"},
		{"/", "name=.git & prune | type=f", "/a.go /b.txt /src/c.go /src/d/e.go /src/d/f.txt"},
		{"/", "depth<=1 & type=d", "/ /.git /src"},
		{"/src", "type=f & !name~*.go", "/src/d/f.txt"},
		{"/src/c.go", "", "/src/c.go"},
		{"/", "name=nothing-is-called-this", ""},
	}
	for _, tc := range cases {
		got := strings.Join(findPaths(t, fs.Find(ctx(t), tc.path, tc.pred)), " ")
		if got != tc.want {
			t.Errorf("Find(%s, %q) = %q, want %q", tc.path, tc.pred, got, tc.want)
		}
	}
}

func testFindGet(t *testing.T, fs ferry.FS, dir string) {
	tree(t, dir)
	big := strings.Repeat("z", 1<<20+17)
	write(t, dir, "src/big", big)
	s := fs.FindGet(ctx(t), "/src", "type=f")
	got := map[string]string{}
	cur := ""
	for e := range s.All() {
		if e.Err != nil {
			t.Fatal(e.Err)
		}
		if e.Dir != nil {
			cur = e.Dir.Path()
			got[cur] = ""
			continue
		}
		got[cur] += string(e.Data)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/src/big":     big,
		"/src/c.go":    "content of src/c.go",
		"/src/d/e.go":  "content of src/d/e.go",
		"/src/d/f.txt": "content of src/d/f.txt",
	}
	if len(got) != len(want) {
		t.Errorf("FindGet returned %d files, want %d", len(got), len(want))
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("FindGet content of %s: %d bytes, want %d", p, len(got[p]), len(w))
		}
	}
}

func testFindErrors(t *testing.T, fs ferry.FS, dir string) {
	tree(t, dir)
	err := fs.Find(ctx(t), "/", "name=(").Err()
	wantKind(t, "Find with a malformed predicate", err, ferry.KindInvalid)
	err = fs.Find(ctx(t), "/nope", "").Err()
	wantKind(t, "Find(/nope)", err, ferry.KindNotExist)
	// A consumer that stops early cancels the walk.
	s := fs.Find(ctx(t), "/", "")
	if _, ok := s.Next(); !ok {
		t.Fatal("Find gave nothing")
	}
	err = s.Close()
	wantKind(t, "Find closed early", err, ferry.KindCanceled)
}

func testEscapes(t *testing.T, fs ferry.FS, dir string) {
	outside := t.TempDir()
	write(t, outside, "secret", "secret")
	write(t, dir, "in", "in")
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "secretlink")); err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	// ".." never climbs above the root: it is the root.
	got, err := getAll(c, fs, "/../../in", 0, -1)
	if err != nil || got != "in" {
		t.Errorf("Get(/../../in) = %q, %v; want the file inside the root", got, err)
	}
	for _, p := range []string{"/out/secret", "/secretlink"} {
		got, err := getAll(c, fs, p, 0, -1)
		if err == nil || strings.Contains(got, "secret") {
			t.Errorf("Get(%s) = %q, %v; want an error and no data from outside", p, got, err)
		}
	}
	_, err = fs.Put(c, "/out/planted", nil, ferry.Whole, strings.NewReader("x")).Wait()
	if err == nil {
		t.Errorf("Put through a link to outside succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Errorf("a Put through a link wrote outside the root")
	}
	_, err = fs.Wstat(c, "/secretlink", ferry.Dir{ferry.AttrSize: "0"}).Wait()
	if err == nil {
		t.Errorf("Wstat size through a link to outside succeeded")
	}
	if got := read(t, outside, "secret"); got != "secret" {
		t.Errorf("the file outside was changed to %q", got)
	}
	// Find lists the links but does not follow them.
	for _, p := range findPaths(t, fs.Find(c, "/", "")) {
		if strings.Contains(p, "secret") && p != "/secretlink" {
			t.Errorf("Find reached outside: %s", p)
		}
	}
	_, err = fs.Move(c, "/in", "/out/in").Wait()
	if err == nil {
		t.Errorf("Move through a link to outside succeeded")
	}
	if _, err := fs.Link(c, "/out/secret", "/stolen").Wait(); err == nil {
		t.Errorf("Link to a file outside succeeded")
	}
	if _, err := fs.Link(c, "/in", "/out/planted").Wait(); err == nil {
		t.Errorf("Link through a link to outside succeeded")
	}
	_, err = fs.RemoveAll(c, "/out/secret").Wait()
	if _, serr := os.Stat(filepath.Join(outside, "secret")); serr != nil {
		t.Errorf("RemoveAll through a link removed a file outside (err %v)", err)
	}
}

func testBadPaths(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	for _, p := range []string{"/a\x00b", "/" + strings.Repeat("n", 256), strings.Repeat("/abc", 1100)} {
		_, err := fs.Stat(c, p).Wait()
		wantKind(t, fmt.Sprintf("Stat(%.20q...)", p), err, ferry.KindInvalid)
		_, err = fs.Put(c, p, nil, ferry.Whole, strings.NewReader("x")).Wait()
		wantKind(t, fmt.Sprintf("Put(%.20q...)", p), err, ferry.KindInvalid)
	}
}

// testConcurrentPuts: many whole-file puts to one file at once leave it
// holding exactly one of them, never a mix, and no temporary files behind.
func testConcurrentPuts(t *testing.T, fs ferry.FS, dir string) {
	c := ctx(t)
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := bytes.Repeat([]byte{byte('a' + i)}, 300_000)
			if _, err := fs.Put(c, "/f", nil, ferry.Whole, bytes.NewReader(data)).Wait(); err != nil {
				t.Errorf("put %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	got := read(t, dir, "f")
	if len(got) != 300_000 || strings.Count(got, got[:1]) != len(got) {
		t.Errorf("after concurrent puts the file is a mix (%d bytes)", len(got))
	}
	if ents := Leftovers(dir); len(ents) != 1 {
		t.Errorf("after concurrent puts the directory holds %v, want f alone", ents)
	}
}

func testCancel(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", strings.Repeat("x", 4<<20))
	c, cancel := context.WithCancel(context.Background())
	r := fs.Get(c, "/f", 0, -1)
	defer r.Close()
	buf := make([]byte, 1000)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	_, err := io.ReadAll(r)
	wantKind(t, "Get after cancel", err, ferry.KindCanceled)
	_, err = fs.Stat(c, "/f").Wait()
	wantKind(t, "Stat with a cancelled context", err, ferry.KindCanceled)
}

// failingReader fails after giving n bytes, as a client whose source breaks.
type failingReader struct{ n int }

func (f *failingReader) Read(b []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("source broke")
	}
	m := min(len(b), f.n)
	for i := range b[:m] {
		b[i] = 'N'
	}
	f.n -= m
	return m, nil
}

func testFailedPutKeepsOld(t *testing.T, fs ferry.FS, dir string) {
	write(t, dir, "f", "old content")
	_, err := fs.Put(ctx(t), "/f", nil, ferry.Whole, &failingReader{n: 1 << 20}).Wait()
	if err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	if got := read(t, dir, "f"); got != "old content" {
		t.Errorf("after a failed put the file holds %d bytes, want the old content", len(got))
	}
	// Over the wire the client learns of the failure before the server has
	// removed its temporary file, so allow the server a moment.
	var ents []string
	for range 100 {
		if ents = Leftovers(dir); len(ents) == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(ents) != 1 {
		t.Errorf("after a failed put the directory holds %v, want f alone", ents)
	}
}

// Leftovers returns the names in the served directory dir, with the
// temporary directory of Puts (local.TempDir) replaced by the names of the
// files in it: what a test that no Put is in progress expects to see.
func Leftovers(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.Name() != local.TempDir {
			out = append(out, e.Name())
			continue
		}
		in, _ := os.ReadDir(filepath.Join(dir, local.TempDir))
		for _, f := range in {
			out = append(out, local.TempDir+"/"+f.Name())
		}
	}
	return out
}

// Temps returns the paths of the Puts' temporary files anywhere below the
// served directory dir: in local.TempDir, or beside their targets.
func Temps(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() && strings.HasPrefix(de.Name(), local.TempPrefix) {
			out = append(out, p)
		}
		return nil
	})
	return out
}
