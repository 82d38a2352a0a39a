package fusefs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/servertest"
)

// The exerciser runs random sequences of file operations on a mount and on
// a local directory side by side, and compares every result: the mount
// must give exactly what a local disk gives. make exercise runs it long.
var (
	exerciseSeed = flag.Uint64("exercise.seed", 0, "seed of TestExerciser (0: one from the clock, logged)")
	exerciseOps  = flag.Int("exercise.ops", 300, "operations per mode of TestExerciser")
)

// exFile is a descriptor open on both sides.
type exFile struct {
	mnt, ref *os.File
	name     string
	flags    int
}

// exerciser holds the two sides and the descriptors open on them.
type exerciser struct {
	t        *testing.T
	mnt, ref string
	other    string     // Another client's mount of the same tree, if any.
	native   ferry.Tree // A native client of the same server, if any.
	r        *rand.Rand
	files    []*exFile
	log      []string // The operations so far, for a failure's report.
	failed   int      // Operations that failed on both sides alike.
}

// exNames are the paths the exerciser works on: few, so that operations
// meet on the same files.
var exNames = []string{"f0", "f1", "f2", "d/f3", "d/f4"}

// exOpens are the flags of the descriptors it opens. Descriptors open for
// reading only are opened, read whole and closed at once: the mount reads
// by path, so one kept open across a rename over its file would read the
// new file, where a local disk keeps the old (see fusefs.go).
var exOpens = []int{
	os.O_RDWR | os.O_CREATE,
	os.O_RDWR | os.O_CREATE | os.O_TRUNC,
	os.O_WRONLY | os.O_CREATE | os.O_APPEND,
	os.O_RDWR | os.O_APPEND | os.O_CREATE,
	os.O_WRONLY | os.O_CREATE | os.O_TRUNC,
	os.O_RDWR,
}

func TestExerciser(t *testing.T) {
	seed := *exerciseSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (go test -run TestExerciser -exercise.seed %d to repeat)", seed, seed)
	for _, mode := range []string{"default", "writeback", "two clients", "two clients, write-back", "two clients, kernel opens"} {
		t.Run(mode, func(t *testing.T) {
			var dir, mnt, other string
			var native ferry.Tree
			if strings.HasPrefix(mode, "two clients") {
				// A second mount, further from the server, must see
				// every change once the first has closed its files.
				srv := servertest.Start(t, "")
				dir = srv.Dir
				var sa, sb *Server
				// With write-back the first keeps its changes back
				// under write leases, which the second's calls recall.
				mnt, sa = mountFS(t, srv.Client(t, "a"), Options{TTL: time.Hour, WriteBack: mode != "two clients", KernelOpens: mode == "two clients, kernel opens"})
				other, sb = mountFS(t, srv.ClientVia(t, "b", servertest.DelayProxy(t, srv.Addr, 5*time.Millisecond)), Options{TTL: time.Hour})
				if !waitFor(5*time.Second, func() bool { return sa.cache.Leased() && sb.cache.Leased() }) {
					t.Fatal("the mounts got no watch")
				}
				// And a native client, as ferry get reads.
				native = srv.Client(t, "c")
			} else {
				var tree ferry.FS
				dir, tree = localTree(t)
				mnt, _ = mountFS(t, &slowPuts{FS: tree, delay: 2 * time.Millisecond}, Options{WriteBack: mode == "writeback"})
			}
			ref := t.TempDir()
			for _, side := range []string{mnt, ref} {
				if err := os.Mkdir(filepath.Join(side, "d"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			x := &exerciser{t: t, mnt: mnt, ref: ref, other: other, native: native, r: rand.New(rand.NewPCG(seed, 0))}
			// A run that fails midway leaves descriptors open, which
			// would keep the mount busy when the test unmounts it.
			defer func() {
				for _, f := range x.files {
					closeBoth(f)
				}
			}()
			for i := 0; i < *exerciseOps && !t.Failed(); i++ {
				x.step()
				x.compareNames()
				x.compareOther()
			}
			for len(x.files) > 0 && !t.Failed() {
				x.close(0)
			}
			t.Logf("%d operations, %d of them failing alike on both sides", len(x.log), x.failed)
			if t.Failed() {
				return
			}
			// Everything closed and synced: the server holds what the
			// reference does.
			if err := syncDir(mnt); err != nil {
				t.Fatal(err)
			}
			x.compareTrees(dir, ref)
		})
	}
}

// do records an operation and runs it on both sides, failing the test if
// the errors differ.
func (x *exerciser) do(what string, op func(side string, f *os.File) error, f *exFile) (mntErr, refErr error) {
	x.log = append(x.log, what)
	var mf, rf *os.File
	if f != nil {
		mf, rf = f.mnt, f.ref
	}
	mntErr, refErr = op(x.mnt, mf), op(x.ref, rf)
	if errnoOf(mntErr) != errnoOf(refErr) {
		x.fail("%s: the mount says %v, a local disk %v", what, mntErr, refErr)
	} else if refErr != nil {
		x.failed++
	}
	return mntErr, refErr
}

// errnoOf reduces an error to what a program sees of it.
func errnoOf(err error) string {
	if err == nil {
		return "ok"
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en.Error()
	}
	if errors.Is(err, io.EOF) {
		return "EOF"
	}
	return err.Error()
}

func (x *exerciser) fail(format string, args ...any) {
	x.t.Helper()
	from := max(0, len(x.log)-25)
	x.t.Errorf("after %d operations: %s\nthe last operations:\n  %s", len(x.log), fmt.Sprintf(format, args...), strings.Join(x.log[from:], "\n  "))
}

func (x *exerciser) data() []byte {
	b := make([]byte, 1+x.r.IntN(3000))
	c := byte('a' + x.r.IntN(26))
	for i := range b {
		b[i] = c
	}
	return b
}

// step runs one random operation.
func (x *exerciser) step() {
	name := exNames[x.r.IntN(len(exNames))]
	var f *exFile
	if len(x.files) > 0 {
		f = x.files[x.r.IntN(len(x.files))]
	}
	switch n := x.r.IntN(100); {
	case n < 15 && len(x.files) < 4:
		flags := exOpens[x.r.IntN(len(exOpens))]
		var ef exFile
		what := fmt.Sprintf("open %s %#o", name, flags)
		mntErr, _ := x.do(what, func(side string, _ *os.File) error {
			g, err := os.OpenFile(filepath.Join(side, name), flags, 0o644)
			if side == x.mnt {
				ef.mnt = g
			} else {
				ef.ref = g
			}
			return err
		}, nil)
		if ef.mnt != nil && ef.ref != nil && mntErr == nil {
			ef.name, ef.flags = name, flags
			x.files = append(x.files, &ef)
		} else {
			closeBoth(&ef)
		}
	case n < 35 && f != nil:
		b := x.data()
		if f.flags&os.O_APPEND != 0 || x.r.IntN(2) == 0 {
			x.do(fmt.Sprintf("write %s %d bytes", f.name, len(b)), func(_ string, g *os.File) error { _, err := g.Write(b); return err }, f)
		} else {
			off := int64(x.r.IntN(6000))
			x.do(fmt.Sprintf("pwrite %s %d bytes at %d", f.name, len(b), off), func(_ string, g *os.File) error { _, err := g.WriteAt(b, off); return err }, f)
		}
	case n < 42 && f != nil:
		size := int64(x.r.IntN(5000))
		x.do(fmt.Sprintf("ftruncate %s %d", f.name, size), func(_ string, g *os.File) error { return g.Truncate(size) }, f)
	case n < 52 && f != nil && f.flags&os.O_RDWR != 0:
		off, count := int64(x.r.IntN(6000)), 1+x.r.IntN(4000)
		var got [2][]byte
		x.do(fmt.Sprintf("pread %s %d at %d", f.name, count, off), func(side string, g *os.File) error {
			b := make([]byte, count)
			k, err := g.ReadAt(b, off)
			got[x.side(side)] = b[:k]
			if err == io.EOF {
				err = nil
			}
			return err
		}, f)
		if !bytes.Equal(got[0], got[1]) {
			x.fail("pread %s: the mount read %d bytes, a local disk %d (or other bytes)", f.name, len(got[0]), len(got[1]))
		}
	case n < 57 && f != nil:
		x.do("fsync "+f.name, func(_ string, g *os.File) error { return g.Sync() }, f)
	case n < 62 && f != nil:
		var st [2]int64
		x.do("fstat "+f.name, func(side string, g *os.File) error {
			fi, err := g.Stat()
			if err == nil {
				st[x.side(side)] = fi.Size()
			}
			return err
		}, f)
		if st[0] != st[1] {
			x.fail("fstat %s: the mount says %d bytes, a local disk %d", f.name, st[0], st[1])
		}
	case n < 75 && f != nil:
		x.close(x.r.IntN(len(x.files)))
	case n < 83:
		to := exNames[x.r.IntN(len(exNames))]
		x.do(fmt.Sprintf("rename %s %s", name, to), func(side string, _ *os.File) error {
			return os.Rename(filepath.Join(side, name), filepath.Join(side, to))
		}, nil)
	case n < 88:
		x.do("unlink "+name, func(side string, _ *os.File) error { return os.Remove(filepath.Join(side, name)) }, nil)
	default:
		var got [2][]byte
		x.do("read whole "+name, func(side string, _ *os.File) error {
			b, err := os.ReadFile(filepath.Join(side, name))
			got[x.side(side)] = b
			return err
		}, nil)
		if !bytes.Equal(got[0], got[1]) {
			x.fail("read %s: the mount gave %d bytes, a local disk %d (or other bytes)", name, len(got[0]), len(got[1]))
		}
	}
}

// side returns 0 for the mount's directory and 1 for the reference's.
func (x *exerciser) side(side string) int {
	if side == x.mnt {
		return 0
	}
	return 1
}

func closeBoth(f *exFile) {
	if f.mnt != nil {
		f.mnt.Close()
	}
	if f.ref != nil {
		f.ref.Close()
	}
}

// close closes the i'th descriptor on both sides.
func (x *exerciser) close(i int) {
	f := x.files[i]
	x.files = append(x.files[:i], x.files[i+1:]...)
	x.do("close "+f.name, func(_ string, g *os.File) error { return g.Close() }, f)
}

// compareNames compares the size of every name, or its absence.
func (x *exerciser) compareNames() {
	for _, name := range exNames {
		a, errA := os.Stat(filepath.Join(x.mnt, name))
		b, errB := os.Stat(filepath.Join(x.ref, name))
		if (errA == nil) != (errB == nil) || (errA == nil && a.Size() != b.Size()) {
			x.fail("stat %s: the mount says %v %v, a local disk %v %v", name, sizeOf(a), errA, sizeOf(b), errB)
			return
		}
	}
}

// compareOther checks, while no descriptor is open, that another client's
// mount and a native client read every name as a local disk does: each
// change was closed, so close-to-open says the other clients see it.
func (x *exerciser) compareOther() {
	if x.other == "" || len(x.files) > 0 || x.t.Failed() {
		return
	}
	for _, name := range exNames {
		b, errB := os.ReadFile(filepath.Join(x.ref, name))
		a, errA := os.ReadFile(filepath.Join(x.other, name))
		if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
			x.fail("read %s in the other client's mount: %d bytes (%v), on a local disk %d (%v)", name, len(a), errA, len(b), errB)
			return
		}
		if x.native == nil {
			continue
		}
		r := x.native.Get(context.Background(), "/"+name, 0, -1)
		n, errN := io.ReadAll(r)
		r.Close()
		if (errN == nil) != (errB == nil) || errN == nil && !bytes.Equal(n, b) {
			x.fail("read %s by a native client: %d bytes (%v), on a local disk %d (%v)", name, len(n), errN, len(b), errB)
			return
		}
	}
}

func sizeOf(fi fs.FileInfo) any {
	if fi == nil {
		return "-"
	}
	return fi.Size()
}

// compareTrees compares the files below the server's directory and the
// reference's.
func (x *exerciser) compareTrees(server, ref string) {
	for _, name := range exNames {
		a, errA := os.ReadFile(filepath.Join(server, name))
		b, errB := os.ReadFile(filepath.Join(ref, name))
		if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
			x.fail("at the end, on the server %s has %d bytes (%v), on a local disk %d (%v)", name, len(a), errA, len(b), errB)
		}
	}
}
