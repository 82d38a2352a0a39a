// Package servertest starts in-process Ferry servers over a directory on
// loopback for tests, with keys and lists in a temporary home.
package servertest

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/transport"
)

// Server is a running test server.
type Server struct {
	Addr string
	Dir  string // The directory served.
	Home string // Where its keys and lists are.
	Key  ed25519.PrivateKey
	Auth *auth.Authorizer
	Srv  *server.Server
	// Stop stops the server before the test ends; it may be called more
	// than once.
	Stop func()
}

// Start serves dir (a new temporary directory if "") until the test ends.
func Start(t testing.TB, dir string) *Server {
	t.Helper()
	return start(t, dir, false, time.Second)
}

// StartChunked is Start with the server moving files by chunks, as ferry
// serve does, its index in memory.
func StartChunked(t testing.TB, dir string) *Server {
	t.Helper()
	return start(t, dir, true, time.Second)
}

// StartChunkedWith is StartChunked with the server's configuration changed
// by tune first.
func StartChunkedWith(t testing.TB, dir string, tune func(*server.Config)) *Server {
	t.Helper()
	return start(t, dir, true, time.Second, tune)
}

// StartWith is Start with the server's configuration changed by tune
// first.
func StartWith(t testing.TB, dir string, tune func(*server.Config)) *Server {
	t.Helper()
	return start(t, dir, false, time.Second, tune)
}

// StartGrace is Start with the server given grace to stop, instead of 1 s.
func StartGrace(t testing.TB, dir string, grace time.Duration) *Server {
	t.Helper()
	return start(t, dir, false, grace)
}

// start starts the server; grace is what Serve gives calls when it stops.
func start(t testing.TB, dir string, chunks bool, grace time.Duration, tune ...func(*server.Config)) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	home := t.TempDir()
	key, _, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ServerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	lt, err := local.NewServed(dir)
	if err != nil {
		t.Fatal(err)
	}
	var tree interface {
		ferry.FS
		Close() error
	} = lt
	if chunks {
		ct, err := chunkstore.Open(lt, chunkstore.Options{MaxChunks: 1 << 20})
		if err != nil {
			lt.Close()
			t.Fatal(err)
		}
		tree = ct
	}
	az := &auth.Authorizer{
		KeysFile:   filepath.Join(home, auth.AuthorizedKeysFile),
		TokensFile: filepath.Join(home, auth.TokensFile),
	}
	cfg := server.Config{
		FS: tree, Key: key, Auth: az, Version: "test",
		Log: slog.New(slog.DiscardHandler),
	}
	for _, f := range tune {
		f(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := transport.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		srv.Serve(ctx, l, grace)
		close(done)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			tree.Close()
		})
	}
	t.Cleanup(stop)
	return &Server{Addr: l.Addr().String(), Dir: dir, Home: home, Key: key, Auth: az, Srv: srv, Stop: stop}
}

// Client makes a client key in a temporary home, admits it as user and
// returns a connected client that is closed when the test ends.
func (s *Server) Client(t testing.TB, user string) *remote.Client {
	t.Helper()
	return s.ClientVia(t, user, s.Addr)
}

// ClientVia is Client connecting through addr, such as a DelayProxy's;
// each of tune, if any, may change the client's configuration first.
func (s *Server) ClientVia(t testing.TB, user, addr string, tune ...func(*remote.Config)) *remote.Client {
	t.Helper()
	home := t.TempDir()
	key, _, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Auth.Authorize(auth.Fingerprint(key.Public().(ed25519.PublicKey)), user); err != nil {
		t.Fatal(err)
	}
	cfg := remote.Config{
		Addr:  addr,
		Key:   key,
		Hosts: &auth.KnownHosts{File: filepath.Join(home, auth.KnownHostsFile)},
	}
	for _, f := range tune {
		f(&cfg)
	}
	c, err := remote.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// CallsSince returns how many calls of op srv counted since before (an
// earlier Calls), waiting up to 2 s for the count to reach want: a server
// counts a call when its handler returns, which may be after the client
// has its answer.
func CallsSince(srv *server.Server, before map[string]int64, op string, want int64) int64 {
	deadline := time.Now().Add(2 * time.Second)
	for {
		n := srv.Calls()[op] - before[op]
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}
