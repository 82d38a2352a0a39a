package remote_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestWaitsForServerBack: once connected, a call made while the server is
// away waits for it to come back within ResumeFor instead of failing at
// once; one made past that fails with KindUnavailable.
func TestWaitsForServerBack(t *testing.T) {
	s := servertest.Start(t, "")
	sw := servertest.SwitchProxy(t, s.Addr)
	c := s.ClientVia(t, "tester", sw.Addr, func(cfg *remote.Config) { cfg.ResumeFor = 30 * time.Second })
	ctx := context.Background()
	if _, err := c.Stat(ctx, "/").Wait(); err != nil {
		t.Fatal(err)
	}
	sw.Down()
	// Let the client see the connection fail and go between attempts.
	time.Sleep(300 * time.Millisecond)
	up := time.AfterFunc(time.Second, sw.Up)
	defer up.Stop()
	if _, err := c.Put(ctx, "/f", ferry.Dir{}, ferry.Whole, nil).Wait(); err != nil {
		t.Fatalf("a call made while the server was away for a second: %v, want it to wait and succeed", err)
	}

	short := s.ClientVia(t, "tester", sw.Addr, func(cfg *remote.Config) { cfg.ResumeFor = 500 * time.Millisecond })
	if _, err := short.Stat(ctx, "/").Wait(); err != nil {
		t.Fatal(err)
	}
	sw.Down()
	time.Sleep(300 * time.Millisecond)
	if _, err := short.Stat(ctx, "/f").Wait(); ferry.KindOf(err) != ferry.KindUnavailable {
		t.Errorf("a call with the server away past ResumeFor: %v, want %v", err, ferry.KindUnavailable)
	}
	sw.Up()
}

// TestNeverReachedFailsAtOnce: a server never reached (nothing listens
// there) fails the first call without waiting out ResumeFor: the address
// is more likely wrong than the server restarting.
func TestNeverReachedFailsAtOnce(t *testing.T) {
	s := servertest.Start(t, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := s.ClientVia(t, "tester", addr, func(cfg *remote.Config) { cfg.ResumeFor = time.Minute })
	done := make(chan error, 1)
	go func() { _, err := c.Stat(context.Background(), "/").Wait(); done <- err }()
	select {
	case err := <-done:
		if ferry.KindOf(err) != ferry.KindUnavailable {
			t.Errorf("a call to an address nothing listens on: %v, want %v", err, ferry.KindUnavailable)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a call to an address nothing listens on still waits after 30 s")
	}
}

// TestGetOverSilentLink: a Get whose link goes silent (nothing reset)
// fails as unavailable within about ResumeFor, though keepalives would
// notice only after half a minute.
func TestGetOverSilentLink(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 96<<20) // More than a stream window in flight.
	if err := os.WriteFile(filepath.Join(dir, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, dir)
	sw := servertest.SwitchProxy(t, srv.Addr)
	const bound = 2 * time.Second
	c := srv.ClientVia(t, "u", sw.Addr, func(c *remote.Config) { c.ResumeFor = bound })
	r := c.Get(context.Background(), "/big", 0, -1)
	defer r.Close()
	if _, err := io.ReadFull(r, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	sw.Freeze()
	defer sw.Thaw()
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, r); done <- err }()
	select {
	case err := <-done:
		if ferry.KindOf(err) != ferry.KindUnavailable || !strings.Contains(err.Error(), "nothing from the server") {
			t.Errorf("reading over a silent link: %v, want unavailable, nothing from the server", err)
		}
	case <-time.After(10 * bound):
		t.Fatalf("a Get still waits %v after its link went silent", 10*bound)
	}
}

// TestCallsOverSilentLink: every kind of call made while the link is
// silent (nothing reset) fails as unavailable within about ResumeFor, not
// after the half minute keepalives take.
func TestCallsOverSilentLink(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, dir)
	sw := servertest.SwitchProxy(t, srv.Addr)
	const bound = time.Second
	c := srv.ClientVia(t, "u", sw.Addr, func(c *remote.Config) { c.ResumeFor = bound })
	ctx := context.Background()
	if _, err := c.Stat(ctx, "/").Wait(); err != nil {
		t.Fatal(err)
	}
	sw.Freeze()
	defer sw.Thaw()
	calls := []struct {
		name string
		call func() error
	}{
		{"stat", func() error { _, err := c.Stat(ctx, "/f").Wait(); return err }},
		{"find", func() error {
			s := c.Find(ctx, "/", "")
			for range s.All() {
			}
			return s.Err()
		}},
		{"put", func() error {
			_, err := c.Put(ctx, "/g", nil, ferry.Whole, bytes.NewReader(make([]byte, 8<<20))).Wait()
			return err
		}},
		{"batched put", func() error {
			b := c.PutBatch(ctx)
			defer b.Close()
			_, err := b.Put(ctx, "/b", nil, io.NewSectionReader(bytes.NewReader(make([]byte, 100<<10)), 0, 100<<10)).Wait()
			return err
		}},
		{"remove", func() error { _, err := c.Remove(ctx, "/f").Wait(); return err }},
		{"move", func() error { _, err := c.Move(ctx, "/f", "/h").Wait(); return err }},
	}
	for _, tc := range calls {
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- tc.call() }()
		select {
		case err := <-done:
			if ferry.KindOf(err) != ferry.KindUnavailable {
				t.Errorf("%s over a silent link: %v, want unavailable", tc.name, err)
			}
			t.Logf("%s failed after %v: %v", tc.name, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(10 * bound):
			t.Errorf("%s still waits %v after its link went silent", tc.name, 10*bound)
		}
	}
}

// TestFailureLogged: calls that fail because the server is gone leave a
// line in the client's log, one for a burst, with the count of the rest.
func TestFailureLogged(t *testing.T) {
	srv := servertest.Start(t, "")
	sw := servertest.SwitchProxy(t, srv.Addr)
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(b)
	}), nil))
	c := srv.ClientVia(t, "u", sw.Addr, func(c *remote.Config) {
		c.ResumeFor = 200 * time.Millisecond
		c.Log = log
	})
	if _, err := c.Stat(context.Background(), "/").Wait(); err != nil {
		t.Fatal(err)
	}
	sw.Down()
	for range 3 {
		if _, err := c.Stat(context.Background(), "/").Wait(); ferry.KindOf(err) != ferry.KindUnavailable {
			t.Fatalf("a Stat with the server gone: %v, want unavailable", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(buf.String(), "could not be reached"); n != 1 {
		t.Errorf("%d lines for a burst of 3 failures, want 1:\n%s", n, buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
