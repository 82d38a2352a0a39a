package fusefs

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestServerGoneAndBack: with the server gone, a read in progress and a
// close that must store fail with EIO within the call timeout rather than
// hang; once it is back the mount reconnects by itself, and what close
// acknowledged before is intact.
func TestServerGoneAndBack(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	big := make([]byte, 48<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	writeFile(t, filepath.Join(dir, "big"), string(big))
	srv := servertest.Start(t, dir)
	sw := servertest.SwitchProxy(t, srv.Addr)
	const timeout = 2 * time.Second
	c := srv.ClientVia(t, "root", sw.Addr, func(c *remote.Config) { c.ResumeFor = timeout })
	mnt, _ := mountFS(t, c, Options{CallTimeout: timeout})

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
