package fusefs

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/store"
)

// Tests that run programs on a mount serve it from another process: Go
// starts a program with a vfork-like clone that leaves one thread of the
// parent unstoppable until the child has exec'd, so if the child's chdir or
// exec needs the mount, and serving it needs the garbage collector to stop
// the world, the process that serves the mount deadlocks.

// helperEnv names the directories of a helper process and its mode:
// "SERVED MOUNTPOINT [writeback] [cache=DIR]".
const helperEnv = "FERRY_FUSEFS_HELPER"

// TestServeHelper is not a test: started by serveElsewhere, it serves a
// directory with a real server, moving files by chunks and keeping a
// trash as ferry serve does, mounts it over the wire with a chunk cache
// and serves the mount until its standard input closes.
func TestServeHelper(t *testing.T) {
	arg := os.Getenv(helperEnv)
	if arg == "" {
		t.Skip("a helper process for the tests that run programs; not a test")
	}
	f := strings.Fields(arg)
	srv := servertest.StartChunked(t, f[0])
	writeBack, cacheDir := false, t.TempDir()
	for _, o := range f[2:] {
		if o == "writeback" {
			writeBack = true
		} else if d, ok := strings.CutPrefix(o, "cache="); ok {
			cacheDir = d
		}
	}
	// A chunk cache, as ferry mount has: files of 64 KiB or more are then
	// read by chunks, and the cache layer holds what it fetches ahead
	// there (disk mode, the mount's default).
	chunks, err := store.OpenCache(cacheDir, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	c := srv.ClientVia(t, "root", srv.Addr, func(cfg *remote.Config) { cfg.Cache, cfg.CloseCache = chunks, true })
	s, err := Mount(f[1], c, Options{AllowOther: true, Log: testLog(t), TempDir: t.TempDir(),
		// A write-back mount lets the kernel open files, as ferry mount's
		// does by default.
		WriteBack: writeBack, KernelOpens: writeBack, Cache: cache.Options{Disk: chunks},
		// The control file, stacked as ferry mount stacks it.
		Control: func(mount, cache ferry.Controller) ferry.FS {
			return ctl.New("mount", ctl.New("cache", ctl.New("client", c, c), cache), mount)
		}})
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("ready\n")
	io.Copy(io.Discard, os.Stdin)
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
}

// serveElsewhere serves dir through a real server and a mount on a new
// temporary directory, both in a helper process, until the test ends; the
// mount writes back (Options.WriteBack) if writeBack is set.
func serveElsewhere(t *testing.T, dir string, writeBack bool) (mnt string) {
	t.Helper()
	return serveHelper(t, helper{dir: dir, writeBack: writeBack})
}

// helper says how serveHelper serves a directory.
type helper struct {
	dir       string
	writeBack bool
	// cacheDir holds the mount's chunk cache, if not "" (else a
	// directory of the helper's own).
	cacheDir string
	// bin is the test binary the helper runs, if not this one's.
	bin string
}

// serveHelper serves h.dir as serveElsewhere says.
func serveHelper(t *testing.T, h helper) (mnt string) {
	t.Helper()
	needFUSE(t)
	mnt = t.TempDir()
	bin := h.bin
	if bin == "" {
		bin = os.Args[0]
	}
	cmd := exec.Command(bin, "-test.run=^TestServeHelper$", "-test.v")
	dir, writeBack, cacheDir := h.dir, h.writeBack, h.cacheDir
	arg := dir + " " + mnt
	if writeBack {
		arg += " writeback"
	}
	if cacheDir != "" {
		arg += " cache=" + cacheDir
	}
	cmd.Env = append(os.Environ(), helperEnv+"="+arg, "GORACE=atexit_sleep_ms=0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ready := make(chan bool, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
			}
			out.WriteString(sc.Text() + "\n")
		}
		done <- cmd.Wait()
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the helper exited: %v\n%s%s", err, out.String(), stderr.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the helper did not mount in time")
	}
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the helper: %v\n%s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			cmd.Process.Kill()
			t.Errorf("the helper did not unmount and exit")
		}
	})
	return mnt
}

// withoutRace returns this package's test binary built without the race
// detector, for a helper that serves a long run of programs: pjdfstest on
// a mount served by a race-detecting helper takes six times as long.
// Under a build without the race detector, it is this binary.
func withoutRace(t *testing.T) string {
	t.Helper()
	if !raceBuild {
		return os.Args[0]
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("building the helper without the race detector: no go command: %v", err)
		}
	}
	bin := filepath.Join(t.TempDir(), "fusefs.test")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, "test", "-c", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the helper without the race detector: %v\n%s", err, out)
	}
	return bin
}
