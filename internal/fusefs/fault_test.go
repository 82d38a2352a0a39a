package fusefs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// mountSwitched serves dir through a real server behind a proxy the test
// can take away (servertest.SwitchProxy) and mounts it, with the mount's
// call timeout and the client's wait for a connection both timeout.
func mountSwitched(t *testing.T, dir string, timeout time.Duration) (string, *servertest.Switch) {
	t.Helper()
	srv := servertest.Start(t, dir)
	sw := servertest.SwitchProxy(t, srv.Addr)
	c := srv.ClientVia(t, "root", sw.Addr, func(c *remote.Config) { c.ResumeFor = timeout })
	mnt, _ := mountFS(t, c, Options{CallTimeout: timeout})
	return mnt, sw
}

// bigFile writes 48 MiB of seeded random bytes to dir/big, more than the
// link holds in flight, and returns them.
func bigFile(t *testing.T, dir string, seed1, seed2 uint64) []byte {
	t.Helper()
	big := make([]byte, 48<<20)
	rng := rand.New(rand.NewPCG(seed1, seed2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	writeFile(t, filepath.Join(dir, "big"), string(big))
	return big
}

// TestServerGoneAndBack: with the server gone, a read in progress and a
// close that must store fail with EIO within the call timeout rather than
// hang; once it is back the mount reconnects by itself, and what close
// acknowledged before is intact.
func TestServerGoneAndBack(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	big := bigFile(t, dir, 1, 2)
	const timeout = 2 * time.Second
	mnt, sw := mountSwitched(t, dir, timeout)

	writeFile(t, filepath.Join(mnt, "a"), "acknowledged")
	if got := readFile(t, filepath.Join(dir, "a")); got != "acknowledged" {
		t.Fatalf("the server has a = %q after close", got)
	}

	// bounded runs f and fails the test if it takes far longer than the
	// call timeout: a hang is the failure this test is about.
	bounded := func(what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * timeout):
			t.Fatalf("%s still waits %v after the server went away", what, 10*timeout)
			return nil
		}
	}
	f, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	sw.Down()
	err = bounded("a read", func() error { _, err := io.Copy(io.Discard, f); return err })
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("reading on with the server gone: %v, want EIO", err)
	}
	err = bounded("a close", func() error { return os.WriteFile(filepath.Join(mnt, "b"), []byte("never stored"), 0o644) })
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("writing a file with the server gone: %v, want EIO", err)
	}

	sw.Up()
	var got []byte
	if !waitFor(20*time.Second, func() bool {
		got, err = os.ReadFile(filepath.Join(mnt, "big"))
		return err == nil
	}) {
		t.Fatalf("20 s after the server came back the mount still fails: %v", err)
	}
	if !bytes.Equal(got, big) {
		t.Errorf("big read after the server came back: %d bytes, equal=%v", len(got), bytes.Equal(got, big))
	}
	writeFile(t, filepath.Join(mnt, "c"), "after")
	for name, want := range map[string]string{"a": "acknowledged", "c": "after"} {
		if got := readFile(t, filepath.Join(dir, name)); got != want {
			t.Errorf("the server has %s = %q, want %q", name, got, want)
		}
	}
	// A close that failed stored nothing, or all of it: never a part.
	if b, err := os.ReadFile(filepath.Join(dir, "b")); err == nil && string(b) != "never stored" {
		t.Errorf("the server has a partial b: %q", b)
	}
}

// failingGets is a tree whose Gets break at byte 1,000,000 of the file
// (mid-page) while fail is set, as a connection lost mid-transfer does,
// wherever they start.
type failingGets struct {
	ferry.FS
	fail atomic.Bool
}

func (f *failingGets) Get(ctx context.Context, p string, off, n int64) io.ReadCloser {
	r := f.FS.Get(ctx, p, off, n)
	if !f.fail.Load() {
		return r
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(r, max(0, 1000000-off)), errReader{}), r}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) {
	return 0, ferry.E("test.Get", "", ferry.KindUnavailable, "connection lost")
}

// TestReadFailureIsNotEnd: a Get that breaks midway fails the read with
// EIO; it must not hand the kernel the bytes that came, which the kernel
// would take for the end of the file (and trim its size to: the file then
// reads short, without an error, until its attributes are asked for
// again). Read again once Gets work, the file is whole.
func TestReadFailureIsNotEnd(t *testing.T) {
	dir, tree := localTree(t)
	want := make([]byte, 2<<20)
	for i := range want {
		want[i] = byte(i * 13 / 7)
	}
	writeFile(t, filepath.Join(dir, "big"), string(want))
	f := &failingGets{FS: tree}
	mnt, _ := mountFS(t, f, Options{})
	f.fail.Store(true)
	if _, err := os.ReadFile(filepath.Join(mnt, "big")); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading while Gets break: %v, want EIO", err)
	}
	f.fail.Store(false)
	got, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("read after Gets work again: %d bytes, want %d (equal=%v)", len(got), len(want), bytes.Equal(got, want))
	}
}

// TestServerBackWithinBound: a close while the server is away for less
// than the call timeout waits for it and stores the file, rather than
// failing with EIO at once.
func TestServerBackWithinBound(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	mnt, sw := mountSwitched(t, dir, 30*time.Second)
	writeFile(t, filepath.Join(mnt, "a"), "before")
	sw.Down()
	up := time.AfterFunc(time.Second, sw.Up)
	defer up.Stop()
	if err := os.WriteFile(filepath.Join(mnt, "b"), []byte("while away"), 0o644); err != nil {
		t.Fatalf("a close while the server was away for a second: %v, want it to wait and store", err)
	}
	if got := readFile(t, filepath.Join(dir, "b")); got != "while away" {
		t.Errorf("the server has b = %q", got)
	}
}

// TestSilentLink: with the link gone silent (nothing reset: the proxy holds
// every byte), a read in progress fails with EIO within the call timeout,
// though the connection's keepalive would notice only after half a minute;
// once the link carries again, the file reads whole.
func TestSilentLink(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	big := bigFile(t, dir, 3, 4)
	const timeout = 2 * time.Second
	mnt, sw := mountSwitched(t, dir, timeout)
	f, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.ReadFull(f, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	sw.Freeze()
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, f); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("reading on over a silent link: %v, want EIO", err)
		}
	case <-time.After(10 * timeout):
		sw.Thaw()
		t.Fatalf("a read still waits %v after the link went silent", 10*timeout)
	}
	sw.Thaw()
	var got []byte
	if !waitFor(20*time.Second, func() bool {
		got, err = os.ReadFile(filepath.Join(mnt, "big"))
		return err == nil
	}) {
		t.Fatalf("20 s after the link came back the mount still fails: %v", err)
	}
	if !bytes.Equal(got, big) {
		t.Errorf("big read after the link came back: %d bytes, equal=%v", len(got), bytes.Equal(got, big))
	}
}
