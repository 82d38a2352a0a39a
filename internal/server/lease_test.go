package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
)

// watcher records the events of one client's watch; ack says whether it
// acknowledges breaks.
type watcher struct {
	mu     sync.Mutex
	broken map[string]int // Breaks acknowledged, by path.
	held   []ferry.Event  // Breaks not acknowledged.
	ended  error          // Set when the watch ended.
	done   chan struct{}
}

func watch(t testing.TB, w ferry.Watcher, ack bool) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &watcher{broken: map[string]int{}, done: make(chan struct{})}
	st := w.Watch(ctx, "/")
	in := make(chan struct{})
	go func() {
		defer close(r.done)
		first := true
		for ev := range st.All() {
			if first {
				close(in)
				first = false
			}
			if ev.Ack == nil {
				continue
			}
			r.mu.Lock()
			if ack {
				r.broken[ev.Path]++
				ev.Ack()
			} else {
				r.held = append(r.held, ev)
			}
			r.mu.Unlock()
		}
		r.mu.Lock()
		r.ended = st.Err()
		if r.ended == nil {
			r.ended = context.Canceled
		}
		r.mu.Unlock()
	}()
	select {
	case <-in:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not begin")
	}
	return r
}

func (r *watcher) saw(p string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.broken[p]
}

// TestLeaseBreak: a change another client makes is answered only once a
// watching client acknowledged it, even over a slower link; a client's own
// change breaks nothing of its own; a watch that ends gives its lease up.
func TestLeaseBreak(t *testing.T) {
	srv := servertest.Start(t, "")
	a := srv.Client(t, "a")
	b := srv.ClientVia(t, "b", servertest.DelayProxy(t, srv.Addr, 20*time.Millisecond))
	wb := watch(t, b, true)
	c := ctx(t)
	steps := []struct {
		name  string
		do    func() error
		paths []string
	}{
		{"put", func() error { return put(c, a, "/f", "one") }, []string{"/f"}},
		{"wstat", func() error { _, err := a.Wstat(c, "/f", ferry.Dir{"mode": "0600"}).Wait(); return err }, []string{"/f"}},
		{"mkdir", func() error { _, err := a.Put(c, "/d", ferry.Dir{"type": "d"}, ferry.Whole, nil).Wait(); return err }, []string{"/d"}},
		{"move", func() error { _, err := a.Move(c, "/f", "/d/g").Wait(); return err }, []string{"/f", "/d/g"}},
		{"link", func() error { _, err := a.Link(c, "/d/g", "/h").Wait(); return err }, []string{"/d/g", "/h"}},
		{"remove", func() error { _, err := a.Remove(c, "/h").Wait(); return err }, []string{"/h"}},
		{"removeall", func() error { _, err := a.RemoveAll(c, "/d").Wait(); return err }, []string{"/d"}},
	}
	for _, s := range steps {
		// b caches the whole tree: every change breaks it.
		list(t, b, "/")
		before := map[string]int{}
		for _, p := range s.paths {
			before[p] = wb.saw(p)
		}
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		for _, p := range s.paths {
			if wb.saw(p) == before[p] {
				t.Errorf("%s returned before the other client acknowledged %s", s.name, p)
			}
		}
	}
	// A change in a directory b was never sent breaks nothing.
	n := srv.Srv.Leases().Breaks()
	if _, err := a.Put(c, "/new", ferry.Dir{"type": "d"}, ferry.Whole, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	if wb.saw("/new") == 0 {
		t.Error("a new directory in one b listed was not broken")
	}
	n = srv.Srv.Leases().Breaks()
	if err := put(c, a, "/new/f", "x"); err != nil {
		t.Fatal(err)
	}
	if got := srv.Srv.Leases().Breaks(); got != n {
		t.Errorf("a change in a directory b never read sent %d breaks", got-n)
	}
	// b's own change: no break for anyone.
	list(t, b, "/")
	n = srv.Srv.Leases().Breaks()
	if err := put(c, b, "/own", "b"); err != nil {
		t.Fatal(err)
	}
	if got := srv.Srv.Leases().Breaks(); got != n {
		t.Errorf("a client's own change sent %d breaks", got-n)
	}
	// A refused change breaks nothing either.
	if _, err := a.Remove(c, "/missing").Wait(); err == nil {
		t.Fatal("removing a missing file succeeded")
	}
	if got := srv.Srv.Leases().Breaks(); got != n {
		t.Errorf("a failed change sent %d breaks", got-n)
	}
	if srv.Srv.Leases().Holders() != 1 {
		t.Fatalf("%d leases held, want 1", srv.Srv.Leases().Holders())
	}
}

// list reads the whole tree through c, as a cache filling itself would.
func list(t testing.TB, c ferry.Finder, root string) {
	t.Helper()
	st := c.Find(context.Background(), root, "")
	for range st.All() {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
}

func put(ctx context.Context, c ferry.Tree, p, data string) error {
	_, err := c.Put(ctx, p, ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait()
	return err
}

// TestLeaseRunsOut: a client that does not acknowledge a break holds the
// writer up for at most its lease, and its own watch has ended (its cache
// untrusted) by the time the writer is answered.
func TestLeaseRunsOut(t *testing.T) {
	srv := servertest.StartWith(t, "", func(c *server.Config) { c.Lease = 2 * time.Second })
	a, b := srv.Client(t, "a"), srv.Client(t, "b")
	wb := watch(t, b, false)
	list(t, b, "/")
	if err := put(ctx(t), a, "/f", "x"); err != nil {
		t.Fatal(err)
	}
	wb.mu.Lock()
	ended, held := wb.ended, len(wb.held)
	wb.mu.Unlock()
	if held != 1 {
		t.Errorf("b holds %d breaks, want 1", held)
	}
	if ended == nil || !strings.Contains(ended.Error(), "lease ran out") {
		t.Fatalf("b's watch had not ended when the writer was answered: %v", ended)
	}
	waitHolders(t, srv, 0)
}

// TestLeaseReleased: a watch that is closed gives its lease up, so the
// next change does not wait for it.
func TestLeaseReleased(t *testing.T) {
	srv := servertest.StartWith(t, "", func(c *server.Config) { c.Lease = time.Hour })
	a, b := srv.Client(t, "a"), srv.Client(t, "b")
	ctx, cancel := context.WithCancel(ctx(t))
	st := b.Watch(ctx, "/")
	for range st.All() {
		break
	}
	waitHolders(t, srv, 1)
	cancel()
	waitHolders(t, srv, 0)
	if err := put(context.Background(), a, "/f", "x"); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseReleasedWhileChanged: a watch closed while changes made on the
// server's disk still stream to it (as when a mount is unmounted while its
// server's tree is reset) gives its lease up too, rather than leave the
// server to wait it out while others' calls wait for its breaks.
func TestLeaseReleasedWhileChanged(t *testing.T) {
	srv := servertest.StartWith(t, "", func(c *server.Config) { c.Lease = time.Hour })
	a := srv.Client(t, "a")
	// Whether the lease was given up or cut depended on a race: tried
	// several times, it would be lost at least once.
	for round := range 8 {
		b := srv.Client(t, fmt.Sprintf("b%d", round))
		ctx, cancel := context.WithCancel(ctx(t))
		st := b.Watch(ctx, "/")
		for range st.All() {
			break
		}
		waitHolders(t, srv, 1)
		// Changes on the disk, whose events wait for a consumer that
		// reads no more.
		for i := range 5 {
			if err := os.WriteFile(filepath.Join(srv.Dir, fmt.Sprintf("disk%d-%d", round, i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		cancel()
		waitHolders(t, srv, 0)
	}
	if err := put(context.Background(), a, "/f", "x"); err != nil {
		t.Fatal(err)
	}
}

func waitHolders(t *testing.T, srv *servertest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for srv.Srv.Leases().Holders() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d leases held, want %d", srv.Srv.Leases().Holders(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkCloseBreak measures what callback breaks cost a close: a small
// whole-file put from a client 100 ms from the server (DelayProxy, no
// bandwidth limit), with 0, 1 and 10 other clients watching, each also
// 100 ms away, having read the directory written to or (elsewhere) only
// another one. Run it with a fixed count, such as
//
//	go test -run '^$' -bench CloseBreak -benchtime 20x ./internal/server
func BenchmarkCloseBreak(b *testing.B) {
	const oneWay = 50 * time.Millisecond
	for _, tt := range []struct {
		n         int
		elsewhere bool // The watchers read only another directory.
	}{{0, false}, {1, false}, {10, false}, {10, true}} {
		name := fmt.Sprintf("watchers=%d", tt.n)
		if tt.elsewhere {
			name += ",elsewhere"
		}
		n := tt.n
		b.Run(name, func(b *testing.B) {
			srv := servertest.Start(b, "")
			if err := os.Mkdir(filepath.Join(srv.Dir, "elsewhere"), 0o755); err != nil {
				b.Fatal(err)
			}
			a := srv.ClientVia(b, "a", servertest.DelayProxy(b, srv.Addr, oneWay))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range n {
				c := srv.ClientVia(b, fmt.Sprintf("w%d", i), servertest.DelayProxy(b, srv.Addr, oneWay))
				watch(b, c, true)
				if tt.elsewhere {
					list(b, c, "/elsewhere")
				} else {
					list(b, c, "/")
				}
			}
			// The first put sets up the connection.
			if err := put(ctx, a, "/warm", "x"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := put(ctx, a, fmt.Sprintf("/f%d", i), "data"); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/close")
		})
	}
}

// TestStopEndsLeases: a server that stops ends its clients' leases at
// once, rather than waiting out its grace (a minute here) for streams that
// last as long as their clients; the clients see their watch end.
func TestStopEndsLeases(t *testing.T) {
	srv := servertest.StartGrace(t, "", time.Minute)
	c := srv.Client(t, "a")
	st := c.Watch(context.Background(), "/")
	for range st.All() {
		break // The lease is held.
	}
	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the server still waits to stop 30 s later, with a lease held")
	}
	for range st.All() {
	}
	if err := st.Err(); ferry.KindOf(err) != ferry.KindUnavailable {
		t.Errorf("the watch ended with %v, want unavailable", err)
	}
}
