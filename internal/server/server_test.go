package server_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/transport"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantKind(t *testing.T, what string, err error, k ferry.Kind) {
	t.Helper()
	if got := ferry.KindOf(err); err == nil || got != k {
		t.Errorf("%s: got %v (kind %q), want kind %q", what, err, got, k)
	}
}

// stillServes checks that the server answers an admitted client.
func stillServes(t *testing.T, s *servertest.Server) {
	t.Helper()
	if _, err := s.Client(t, "ok").Stat(ctx(t), "/").Wait(); err != nil {
		t.Errorf("the server stopped serving others: %v", err)
	}
}

func dialWith(t *testing.T, s *servertest.Server, key ed25519.PrivateKey, token, hostsFile string) *remote.Client {
	t.Helper()
	if hostsFile == "" {
		hostsFile = filepath.Join(t.TempDir(), auth.KnownHostsFile)
	}
	c, err := remote.Dial(remote.Config{Addr: s.Addr, Key: key, Token: token, Hosts: &auth.KnownHosts{File: hostsFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newKey(t *testing.T) ed25519.PrivateKey {
	k, _, err := auth.LoadOrCreateKey(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestUnknownKeyRefused(t *testing.T) {
	s := servertest.Start(t, "")
	key := newKey(t)
	_, err := dialWith(t, s, key, "", "").Stat(ctx(t), "/").Wait()
	wantKind(t, "stranger's Stat", err, ferry.KindAuth)
	if fp := auth.Fingerprint(key.Public().(ed25519.PublicKey)); err == nil || !strings.Contains(err.Error(), fp) {
		t.Errorf("refusal %v does not name the key %s", err, fp)
	}
	stillServes(t, s)
}

func TestChangedServerKeyRefused(t *testing.T) {
	s := servertest.Start(t, "")
	hosts := filepath.Join(t.TempDir(), auth.KnownHostsFile)
	other := newKey(t)
	if err := os.WriteFile(hosts, []byte(s.Addr+" "+auth.Fingerprint(other.Public().(ed25519.PublicKey))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	s.Auth.Authorize(auth.Fingerprint(key.Public().(ed25519.PublicKey)), "u")
	_, err := dialWith(t, s, key, "", hosts).Stat(ctx(t), "/").Wait()
	wantKind(t, "Stat of a server whose key changed", err, ferry.KindAuth)
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("error %v does not say the key changed", err)
	}
}

func TestPinOnFirstUse(t *testing.T) {
	s := servertest.Start(t, "")
	hosts := filepath.Join(t.TempDir(), auth.KnownHostsFile)
	key := newKey(t)
	s.Auth.Authorize(auth.Fingerprint(key.Public().(ed25519.PublicKey)), "u")
	if _, err := dialWith(t, s, key, "", hosts).Stat(ctx(t), "/").Wait(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(hosts)
	want := s.Addr + " " + auth.Fingerprint(s.Key.Public().(ed25519.PublicKey)) + "\n"
	if string(b) != want {
		t.Errorf("known_hosts = %q, want %q", b, want)
	}
	// A second connection with the pin is admitted.
	if _, err := dialWith(t, s, key, "", hosts).Stat(ctx(t), "/").Wait(); err != nil {
		t.Errorf("second connection: %v", err)
	}
}

func TestTokens(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(s.Auth.TokensFile, []byte("# comment\nsecret-token alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dialWith(t, s, nil, "secret-token", "").Stat(ctx(t), "/").Wait(); err != nil {
		t.Errorf("with a listed token: %v", err)
	}
	_, err := dialWith(t, s, nil, "wrong", "").Stat(ctx(t), "/").Wait()
	wantKind(t, "with an unknown token", err, ferry.KindAuth)
	_, err = dialWith(t, s, nil, "", "").Stat(ctx(t), "/").Wait()
	wantKind(t, "with neither key nor token", err, ferry.KindAuth)
}

func TestGarbagePeers(t *testing.T) {
	s := servertest.Start(t, "")
	garbage := [][]byte{
		[]byte("GET / HTTP/1.0\r\n\r\n"),
		bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, 1000), // A TLS record header lying about its size.
		{0},
	}
	for _, g := range garbage {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(g)
		c.Close()
	}
	// TLS that then speaks nonsense instead of HTTP/2.
	c, err := tls.Dial("tcp", s.Addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + strings.Repeat("\xff", 4096)))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
	c.Close()
	stillServes(t, s)
}

// cuttingDialer gives connections that break after limit bytes written.
func cuttingDialer(limit int64) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &cuttingConn{Conn: c, left: limit}, nil
	}
}

type cuttingConn struct {
	net.Conn
	left int64
	cut  atomic.Bool
}

func (c *cuttingConn) Write(b []byte) (int, error) {
	if c.left -= int64(len(b)); c.left < 0 {
		c.cut.Store(true)
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

func TestConnectionCutMidPut(t *testing.T) {
	s := servertest.Start(t, "")
	old := "the old content"
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dialAdmitted(t, s, cuttingDialer(2<<20), 0)
	// A reader that cannot seek cannot resume.
	data := struct{ io.Reader }{bytes.NewReader(bytes.Repeat([]byte("new"), 3<<20))}
	_, err := c.Put(ctx(t), "/f", nil, ferry.Whole, data).Wait()
	if err == nil {
		t.Fatal("a put over a connection cut midway succeeded")
	}
	if k := ferry.KindOf(err); k != ferry.KindUnavailable && k != ferry.KindCanceled {
		t.Errorf("cut put failed with %v of kind %q, want unavailable or canceled", err, k)
	}
	// The server notices the cut when the connection closes; then the old
	// content is there and no temporary file is left.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents := fstest.Leftovers(s.Dir)
		b, _ := os.ReadFile(filepath.Join(s.Dir, "f"))
		if len(ents) == 1 && string(b) == old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a cut put: %d entries, f holds %d bytes; want 1 entry holding the old content", len(ents), len(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stillServes(t, s)
}

// TestPutResumesAfterCuts: a large upload over connections that each break
// after 2 MiB still completes: each resume sends only what had not arrived.
func TestPutResumesAfterCuts(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dialAdmitted(t, s, cuttingDialer(2<<20), 0)
	want := make([]byte, 9<<20)
	for i := range want {
		want[i] = byte(i*13 + i>>12)
	}
	// The data is what follows the reader's position.
	src := bytes.NewReader(append([]byte("skipped"), want...))
	src.Seek(int64(len("skipped")), io.SeekStart)
	d, err := c.Put(ctx(t), "/f", nil, ferry.Whole, src).Wait()
	if err != nil {
		t.Fatalf("resumable put: %v", err)
	}
	if d.Size() != int64(len(want)) {
		t.Errorf("put returned %v, want size %d", d, len(want))
	}
	got, _ := os.ReadFile(filepath.Join(s.Dir, "f"))
	if !bytes.Equal(got, want) {
		t.Errorf("the file holds %d bytes, equal=%v; want the %d bytes put", len(got), bytes.Equal(got, want), len(want))
	}
	status := readCtl(t, s.Client(t, "admin"))
	if strings.Contains(status, "uploads.resumed: 0\n") || !strings.Contains(status, "uploads.active: 0\n") {
		t.Errorf("after a put over breaking connections, want resumes and no active uploads:\n%s", status)
	}
	if ents := fstest.Leftovers(s.Dir); len(ents) != 1 {
		t.Errorf("the served directory holds %v, want f alone", ents)
	}
}

func readCtl(t *testing.T, c *remote.Client) string {
	t.Helper()
	r := c.Get(ctx(t), ferry.CtlPath, 0, -1)
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dialAdmitted returns a client with a new admitted key whose connections
// dial makes, closed when the test ends.
func dialAdmitted(t *testing.T, s *servertest.Server, dial func(context.Context, string) (net.Conn, error), resumeFor time.Duration) *remote.Client {
	t.Helper()
	key := newKey(t)
	s.Auth.Authorize(auth.Fingerprint(key.Public().(ed25519.PublicKey)), "u")
	c, err := remote.Dial(remote.Config{
		Addr: s.Addr, Key: key, ResumeFor: resumeFor, Dial: dial,
		Hosts: &auth.KnownHosts{File: filepath.Join(t.TempDir(), "kh")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cutClient dials the server with connections that the test can cut all
// at once.
func cutClient(t *testing.T, s *servertest.Server, resumeFor time.Duration) (*remote.Client, func()) {
	var mu sync.Mutex
	var conns []net.Conn
	c := dialAdmitted(t, s, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
		return nc, err
	}, resumeFor)
	return c, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range conns {
			nc.Close()
		}
		conns = nil
	}
}

// TestGetResumesAfterCut: a download survives a broken connection; it
// resumes where it stopped, and what arrived is delivered once.
func TestGetResumesAfterCut(t *testing.T) {
	s := servertest.Start(t, "")
	// Larger than what a stream sends ahead of its reader (its 32 MiB
	// window): an 8 MiB file could arrive whole before the cut, and
	// then nothing resumed.
	want := make([]byte, 64<<20)
	for i := range want {
		want[i] = byte(i * 7 / 5)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	c, cut := cutClient(t, s, time.Minute)
	before := s.Srv.Calls()["get"]
	r := c.Get(ctx(t), "/f", 100, -1)
	defer r.Close()
	got := make([]byte, 1<<20)
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	cut()
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read after the cut: %v", err)
	}
	got = append(got, rest...)
	if !bytes.Equal(got, want[100:]) {
		t.Errorf("resumed download: %d bytes, want %d, equal=%v", len(got), len(want)-100, bytes.Equal(got, want[100:]))
	}
	// The first Get is counted when its handler notices the cut, which
	// may be after the resumed one has delivered the rest.
	deadline := time.Now().Add(5 * time.Second)
	for s.Srv.Calls()["get"]-before < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.Srv.Calls()["get"] - before; n != 2 {
		t.Errorf("the server answered %d gets, want 2 (the first and the resumed one)", n)
	}
}

// TestGetGivesUpWhenServerGone: with the server gone for good, an
// interrupted download fails once ResumeFor has passed; it does not hang.
func TestGetGivesUpWhenServerGone(t *testing.T) {
	dir := t.TempDir()
	// Random bytes, more than a stream's flow-control window: zstd would
	// fit a run of one byte in the socket buffers, and a smaller file in
	// the client's window, and the download would end before the cut.
	data := make([]byte, transport.StreamWindow+8<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s := servertest.Start(t, dir)
	c, cut := cutClient(t, s, 500*time.Millisecond)
	r := c.Get(ctx(t), "/f", 0, -1)
	defer r.Close()
	if _, err := io.ReadFull(r, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	cut()
	_, err := io.ReadAll(r)
	if k := ferry.KindOf(err); k != ferry.KindUnavailable && k != ferry.KindCanceled {
		t.Errorf("read with the server gone: %v (kind %q), want unavailable or canceled", err, k)
	}
}

func TestControlFile(t *testing.T) {
	s := servertest.Start(t, "")
	c := s.Client(t, "tester")
	cx := ctx(t)
	read := func() string {
		r := c.Get(cx, ferry.CtlPath, 0, -1)
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// A client keeps two connections: one for bulk data, one for the
	// rest. Both are dialed at once, but the server may count the second
	// a moment after the first call arrives on the other.
	got := read()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(got, "connections: 2") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got = read()
	}
	for _, want := range []string{"[server]", "version: test", "uptime:", "connections: 2", "user=tester", "calls.get:", "uploads.memory: 0 of", "uploads.refused: 0", "received.held:"} {
		if !strings.Contains(got, want) {
			t.Errorf("control file lacks %q:\n%s", want, got)
		}
	}
	d, err := c.Stat(cx, ferry.CtlPath).Wait()
	if err != nil || d.Type() != ferry.TypeFile {
		t.Errorf("Stat(/Ctl) = %v, %v", d, err)
	}
	cmd := func(s string) error {
		_, err := c.Put(cx, ferry.CtlPath, nil, 0, strings.NewReader(s)).Wait()
		return err
	}
	wantKind(t, "debug on without a level to change", cmd("debug on"), ferry.KindInvalid)
	wantKind(t, "unknown command", cmd("frobnicate"), ferry.KindInvalid)
	wantKind(t, "pass with no layer below", cmd("pass debug on"), ferry.KindInvalid)
	if err := cmd("\n\n"); err != nil {
		t.Errorf("blank command lines: %v", err)
	}
	_, err = c.Remove(cx, ferry.CtlPath).Wait()
	wantKind(t, "Remove(/Ctl)", err, ferry.KindPermission)
	s2 := c.Find(cx, "/", "")
	for e := range s2.All() {
		if e.Dir.Path() == ferry.CtlPath {
			t.Errorf("Find lists the control file")
		}
	}
}

// TestCancelledGetFreesReadAhead: closing a download early stops the
// server's read-ahead for it at once and gives its memory back.
func TestCancelledGetFreesReadAhead(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), bytes.Repeat([]byte("r"), 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, "u")
	r := c.Get(ctx(t), "/f", 0, -1)
	if _, err := io.ReadFull(r, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, cancelled := s.Srv.ReadAhead()
		if held == 0 && cancelled >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing the reader the server holds %d bytes read ahead, %d cancelled", held, cancelled)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMetrics: calls are counted by operation, and connections are
// series by client host and user: more connections from one host add no
// series, and the bytes they sent keep counting after they end.
func TestMetrics(t *testing.T) {
	s := servertest.Start(t, "")
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Srv.Collector())
	gather := func() map[string]string {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, f := range fams {
			for _, m := range f.Metric {
				key := f.GetName()
				for _, l := range m.Label {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				got[key] = m.String()
			}
		}
		return got
	}
	var clients []*remote.Client
	for range 3 {
		c := s.Client(t, "metrics-user")
		clients = append(clients, c)
		if _, err := c.Stat(ctx(t), "/").Wait(); err != nil {
			t.Fatal(err)
		}
	}
	got := gather()
	if v := got["ferry_calls_total,op=stat"]; !strings.Contains(v, "value:3") {
		t.Errorf("ferry_calls_total{op=stat} = %q, want 3", v)
	}
	// The upload memory is what the default budget leaves after read-ahead.
	if v := got["ferry_upload_memory_max_bytes"]; !strings.Contains(v, fmt.Sprintf("value:%g", float64(server.DefaultMemory*3/4))) {
		t.Errorf("ferry_upload_memory_max_bytes = %q, want three quarters of %d", v, server.DefaultMemory)
	}
	var infos, sent []string
	for k := range got {
		if strings.HasPrefix(k, "ferry_conn_info,") && strings.Contains(k, "user=metrics-user") && strings.Contains(k, "congestion=") {
			infos = append(infos, k)
		}
		if strings.HasPrefix(k, "ferry_conn_sent_bytes_total,") && strings.Contains(k, "user=metrics-user") {
			sent = append(sent, k)
		}
	}
	if len(infos) != 1 || len(sent) != 1 || !strings.Contains(sent[0], "host=127.0.0.1,") {
		t.Fatalf("series of three clients from one host: %v and %v, want one each, by host", infos, sent)
	}
	before := counterValue(got[sent[0]])
	for _, c := range clients {
		c.Close()
	}
	// The connections have ended when their congestion series has gone.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, live := gather()[infos[0]]; !live {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, live := gather()[infos[0]]; live {
		t.Fatal("the closed clients' connections never ended")
	}
	if after := counterValue(gather()[sent[0]]); after < before || before == 0 {
		t.Errorf("bytes sent to the host: %v before its connections ended, %v after; want no decrease", before, after)
	}
}

// counterValue reads the value of a gathered counter's text.
func counterValue(m string) float64 {
	_, v, _ := strings.Cut(m, "counter:")
	_, v, _ = strings.Cut(v, "value:")
	v, _, _ = strings.Cut(strings.TrimSpace(v), " ")
	f, _ := strconv.ParseFloat(strings.TrimRight(v, "}"), 64)
	return f
}

// TestTokenGuessingLimited: an address that keeps presenting wrong tokens
// is refused before its tokens are looked at, so that guessing one is
// slow, and told why.
func TestTokenGuessingLimited(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(s.Auth.TokensFile, []byte("secret-token alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 30; i++ {
		_, err = dialWith(t, s, nil, fmt.Sprintf("guess-%d", i), "").Stat(ctx(t), "/").Wait()
		wantKind(t, "a guessed token", err, ferry.KindAuth)
	}
	if err == nil || !strings.Contains(err.Error(), "too many failed attempts") {
		t.Errorf("the 30th guess in a row: %v, want a refusal for too many attempts", err)
	}
	_, err = dialWith(t, s, nil, "secret-token", "").Stat(ctx(t), "/").Wait()
	if err == nil || !strings.Contains(err.Error(), "too many failed attempts") {
		t.Errorf("the right token right after 30 wrong ones: %v, want refused until the address is forgiven", err)
	}
}

// TestStreamsPerConnectionBounded: a connection holding as many streams
// as the server allows it (watches it never ends) gets no more until one
// ends, so that a client cannot pin the server's memory with streams.
func TestStreamsPerConnectionBounded(t *testing.T) {
	const limit = 8
	s := servertest.StartWith(t, "", func(cfg *server.Config) { cfg.MaxStreams = limit })
	c := s.Client(t, "tester")
	if _, err := c.Stat(ctx(t), "/").Wait(); err != nil {
		t.Fatal(err)
	}
	var watches []*ferry.Stream[ferry.Event]
	for range limit {
		w := c.Watch(context.Background(), "/")
		watches = append(watches, w)
	}
	defer func() {
		for _, w := range watches {
			w.Close()
		}
	}()
	// Every slot is taken once the server has begun them all: a Stat on
	// the same connection waits for one.
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	waitInFlight(t, s, limit)
	if _, err := c.Stat(short, "/").Wait(); ferry.KindOf(err) != ferry.KindCanceled {
		t.Fatalf("a Stat with %d watches open on its connection: %v, want it to wait past its deadline", limit, err)
	}
	watches[0].Close()
	watches = watches[1:]
	if _, err := c.Stat(ctx(t), "/").Wait(); err != nil {
		t.Errorf("a Stat once a watch ended: %v", err)
	}
}

// waitInFlight waits until the server has n calls in flight.
func waitInFlight(t *testing.T, s *servertest.Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Srv.InFlight() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the server has %d calls in flight, want %d", s.Srv.InFlight(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCallsPerUserBounded: one user's calls in progress over all its
// connections are bounded: beyond the bound a call fails as unavailable at
// once, while another user's calls go on; once one ends, the user's next
// call gets through.
func TestCallsPerUserBounded(t *testing.T) {
	const limit = 4
	s := servertest.StartWith(t, "", func(cfg *server.Config) { cfg.MaxUserCalls = limit })
	var watches []*ferry.Stream[ferry.Event]
	defer func() {
		for _, w := range watches {
			w.Close()
		}
	}()
	for range limit / 2 {
		c := s.Client(t, "u")
		for range 2 {
			w := c.Watch(context.Background(), "/")
			for range w.All() {
				break // The watch is in place.
			}
			watches = append(watches, w)
		}
	}
	waitInFlight(t, s, limit)
	c := s.Client(t, "u")
	if _, err := c.Stat(ctx(t), "/").Wait(); ferry.KindOf(err) != ferry.KindUnavailable || !strings.Contains(err.Error(), "in progress") {
		t.Fatalf("a Stat beyond the user's %d calls: %v, want unavailable", limit, err)
	}
	if _, err := s.Client(t, "v").Stat(ctx(t), "/").Wait(); err != nil {
		t.Errorf("another user's Stat: %v", err)
	}
	watches[0].Close()
	watches = watches[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.Stat(ctx(t), "/").Wait()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a Stat once a call ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConnsPerHostBounded: connections from one address beyond the bound
// are closed as they come, before any handshake; once one closes, a new
// one is taken.
func TestConnsPerHostBounded(t *testing.T) {
	const limit = 2
	s := servertest.StartWith(t, "", func(cfg *server.Config) { cfg.MaxHostConns = limit })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// open reports whether the server keeps c open for a while.
	open := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	first := dial()
	second := dial()
	if !open(first) || !open(second) {
		t.Fatal("connections within the bound were closed")
	}
	if open(dial()) {
		t.Fatalf("a connection beyond the bound of %d was kept", limit)
	}
	first.Close()
	// The server notices the close when it next reads from it: the
	// handshake's read fails at once.
	deadline := time.Now().Add(5 * time.Second)
	for !open(dial()) {
		if time.Now().After(deadline) {
			t.Fatal("no connection is taken after one closed")
		}
	}
}

// layer is a layer that adds nothing: what the tree below can do must be
// found through it.
type layer struct{ ferry.FS }

func (l layer) Unwrap() ferry.FS { return l.FS }

// TestCapabilitiesThroughLayers: with a layer between the server and the
// chunked tree, puts still go by chunks, the index shows in the control
// file, and clients can still hold leases: the server finds them by
// unwrapping the stack, not by the type of the tree it is given.
func TestCapabilitiesThroughLayers(t *testing.T) {
	s := servertest.StartChunkedWith(t, "", func(cfg *server.Config) { cfg.FS = layer{cfg.FS} })
	c := s.Client(t, "u")
	before := s.Srv.Calls()
	data := bytes.Repeat([]byte("chunks through a layer\n"), 64<<10)
	if _, err := c.Put(ctx(t), "/f", ferry.Dir{}, ferry.Whole, bytes.NewReader(data)).Wait(); err != nil {
		t.Fatal(err)
	}
	// A server without chunks would refuse the chunked put, and the
	// client would put the file plainly.
	if got := servertest.CallsSince(s.Srv, before, "put", 1); got != 0 {
		t.Errorf("%d plain puts through the layer, want none", got)
	}
	r := c.Get(ctx(t), ferry.CtlPath, 0, -1)
	text, err := io.ReadAll(r)
	r.Close()
	if err != nil || !strings.Contains(string(text), "index.") {
		t.Errorf("the control file shows no index (%v):\n%s", err, text)
	}
	w := c.Watch(ctx(t), "/")
	defer w.Close()
	began := false
	for ev := range w.All() {
		began = ev.Lost && ev.Path == "/"
		break
	}
	if !began {
		t.Errorf("no watch through the layer")
	}
}

// TestDebugLogsEveryCall: with debug on, every call is logged with its
// method and how long it took, not only the failed ones.
func TestDebugLogsEveryCall(t *testing.T) {
	var buf servertest.Buffer
	s := servertest.StartWith(t, "", func(cfg *server.Config) {
		cfg.Log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	c := s.Client(t, "u")
	if _, err := c.Stat(ctx(t), "/").Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "method=Stat") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line for the Stat:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(buf.String(), "took=") {
		t.Errorf("the call's line says nothing of its duration:\n%s", buf.String())
	}
}
