package fusefs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestCtlFile: the mount's control file shows the mount's state and every
// layer's below it, runs commands written to it (its own, and those passed
// down to the server), fails a close whose command fails, and cannot be
// removed, renamed or made anew; a file of that name on the server is
// shadowed.
func TestCtlFile(t *testing.T) {
	needFUSE(t)
	srv := servertest.StartWith(t, "", func(c *server.Config) { c.Level = new(slog.LevelVar) })
	c := srv.Client(t, "a")
	mnt, _ := mountFS(t, c, Options{Control: stackCtl(ctl.New("client", c, c))})
	p := filepath.Join(mnt, "Ctl")
	text := readFile(t, p)
	for _, want := range []string{"[mount]\n", "[cache]\n", "contents.bytes: ", "lease: ", "[client]\n", "[server]\n", "debug: false"} {
		if !strings.Contains(text, want) {
			t.Errorf("the control file lacks %q:\n%s", want, text)
		}
	}
	for _, cmd := range []string{"drop\n", "sync\n", "pass drop\n", "pass pass pass debug on\n"} {
		if err := os.WriteFile(p, []byte(cmd), 0o644); err != nil {
			t.Errorf("writing %q: %v", cmd, err)
		}
	}
	if text := readFile(t, p); !strings.Contains(text, "debug: true") {
		t.Errorf("the server's debug was not turned on through the mount:\n%s", text)
	}
	for _, cmd := range []string{"bogus\n", "pass bogus\n", "pass pass pass bogus\n"} {
		if err := os.WriteFile(p, []byte(cmd), 0o644); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("writing %q: %v, want EINVAL", cmd, err)
		}
	}
	if err := os.Remove(p); !errors.Is(err, syscall.EPERM) {
		t.Errorf("removing the control file: %v, want EPERM", err)
	}
	if err := os.Rename(p, filepath.Join(mnt, "x")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("renaming the control file: %v, want EPERM", err)
	}
	writeFile(t, filepath.Join(mnt, "y"), "y")
	if err := os.Rename(filepath.Join(mnt, "y"), p); !errors.Is(err, syscall.EPERM) {
		t.Errorf("renaming over the control file: %v, want EPERM", err)
	}
	if _, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("creating the control file anew: %v, want EEXIST", err)
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "Ctl")); !os.IsNotExist(err) {
		t.Errorf("the server has a file named Ctl: %v", err)
	}
}

// TestStatfsFromServer: df on the mount shows the server's file system,
// not a made-up terabyte.
func TestStatfsFromServer(t *testing.T) {
	needFUSE(t)
	srv := servertest.Start(t, "")
	mnt, _ := mountFS(t, srv.Client(t, "a"), Options{})
	var m, d syscall.Statfs_t
	if err := syscall.Statfs(mnt, &m); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Statfs(srv.Dir, &d); err != nil {
		t.Fatal(err)
	}
	mount, disk := int64(m.Blocks)*m.Bsize, int64(d.Blocks)*d.Bsize
	if diff := mount - disk; diff < -m.Bsize || diff > m.Bsize {
		t.Errorf("the mount says %d bytes in all, the server's file system %d", mount, disk)
	}
	if m.Files != d.Files {
		t.Errorf("the mount says %d files in all, the server's file system %d", m.Files, d.Files)
	}
}

// TestReadOnly: a read-only mount reads, and refuses every change with
// EROFS.
func TestReadOnly(t *testing.T) {
	needFUSE(t)
	srv := servertest.Start(t, "")
	writeFile(t, filepath.Join(srv.Dir, "f"), "server")
	mnt, _ := mountFS(t, srv.Client(t, "a"), Options{ReadOnly: true})
	if got := readFile(t, filepath.Join(mnt, "f")); got != "server" {
		t.Errorf("read %q", got)
	}
	changes := map[string]func() error{
		"write":  func() error { return os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644) },
		"create": func() error { return os.WriteFile(filepath.Join(mnt, "g"), []byte("x"), 0o644) },
		"mkdir":  func() error { return os.Mkdir(filepath.Join(mnt, "d"), 0o755) },
		"remove": func() error { return os.Remove(filepath.Join(mnt, "f")) },
		"rename": func() error { return os.Rename(filepath.Join(mnt, "f"), filepath.Join(mnt, "h")) },
		"chmod":  func() error { return os.Chmod(filepath.Join(mnt, "f"), 0o600) },
	}
	for name, change := range changes {
		if err := change(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only mount: %v, want EROFS", name, err)
		}
	}
	if got := readFile(t, filepath.Join(srv.Dir, "f")); got != "server" {
		t.Errorf("the server's f is %q after the refused changes", got)
	}
}

// nopControl is a control layer that knows every command and does
// nothing, at once.
type nopControl struct{}

func (nopControl) Status(context.Context) string           { return "" }
func (nopControl) Command(context.Context, []string) error { return nil }

// TestCtlSyncReachesCache: "sync" written to the mount's control file
// stores what the cache keeps back under its write lease before the write
// returns: the file is on the server's disk the moment it does, though
// the link takes 400 ms a round trip. (The layer below the cache in the
// control file answers at once, so only the cache's sync waits.)
func TestCtlSyncReachesCache(t *testing.T) {
	needFUSE(t)
	srv := servertest.Start(t, "")
	c := srv.ClientVia(t, "a", servertest.DelayProxy(t, srv.Addr, 200*time.Millisecond))
	_, tree := localTree(t)
	mnt, s := mountFS(t, c, Options{WriteBack: true, Control: stackCtl(ctl.New("below", tree, nopControl{}))})
	if !waitFor(10*time.Second, s.cache.Leased) {
		t.Fatal("the mount got no watch")
	}
	for i := range 3 {
		name := fmt.Sprintf("f%d", i)
		writeFile(t, filepath.Join(mnt, name), "kept back "+name)
		if _, err := os.Stat(filepath.Join(srv.Dir, name)); err == nil {
			t.Logf("%s was on the server when close returned: not kept back", name)
		}
		if err := os.WriteFile(filepath.Join(mnt, "Ctl"), []byte("sync\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(srv.Dir, name))
		if err != nil || string(got) != "kept back "+name {
			t.Errorf("after sync through the control file, the server's %s is %q (%v)", name, got, err)
		}
	}
}

// stackCtl stacks the mount's and cache's control layers over below, as
// ferry mount does.
func stackCtl(below ferry.FS) func(mount, cache ferry.Controller) ferry.FS {
	return func(mount, cache ferry.Controller) ferry.FS {
		return ctl.New("mount", ctl.New("cache", below, cache), mount)
	}
}
