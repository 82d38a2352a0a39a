// Package server serves a ferry.FS over the wire protocol of internal/proto.
//
// Every connection is TLS 1.3. A connection is identified once, on its first
// call, from the client's key or bearer token (auth.Authorizer); calls of a
// stranger fail with KindAuth and the server goes on serving others. The
// server serves a control file (ferry.CtlPath) reporting its version,
// uptime, counters and connections (each client keeps two: one for bulk
// data, one for the rest) with their users and the kernel's measurements,
// and, when the tree keeps a chunk index (Indexer), the index's size and hit
// counts, and taking the commands "debug on|off" and "reindex".
// If the tree it serves is a ferry.Watcher, clients can watch it.
package server

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/transport"
	"github.com/ferryfs/ferry/internal/zwire"
)

// Config says what a Server serves and to whom.
type Config struct {
	FS      ferry.FS
	Key     ed25519.PrivateKey
	Auth    *auth.Authorizer
	Version string
	// Log receives the server's logs; Level, if not nil, is what the
	// control file's "debug on|off" changes.
	Log   *slog.Logger
	Level *slog.LevelVar
	// Memory is what the server's calls may hold in memory on their
	// clients' behalf (0: DefaultMemory): the read-ahead of downloads
	// (ReadAheadBudget) and, the rest, what uploads may send ahead of
	// their handlers (see memory.go).
	Memory int64
	// ReadAheadBudget is the memory all Gets may hold read ahead of their
	// connections; 0 means a quarter of Memory.
	ReadAheadBudget int64
	// ReadAheadFixed, if positive, makes every Get read this many bytes
	// ahead (within ReadAheadBudget, and at least one message), whatever
	// its connection carries, instead of sizing its read-ahead by the
	// connection's delivery rate and round trip. It exists to measure
	// what the adaptive sizing is worth (bench/load): a fixed size pins
	// as much memory for a 1 Mbit/s client as for a fast one.
	ReadAheadFixed int64
	// MetricsPerConn labels the connection metrics with each
	// connection's address instead of its host: a benchmark (bench/load)
	// tells its slow and fast clients apart so, but the series then grow
	// with every connection the server has seen.
	MetricsPerConn bool
	// MaxStreams bounds the calls one connection has in progress at once
	// (default DefaultMaxStreams); further calls wait for a slot, so that
	// a client cannot pin the server's memory with streams it never
	// ends.
	MaxStreams uint32
	// MaxUserCalls bounds the calls one user has in progress at once
	// over all its connections (default DefaultMaxUserCalls); further
	// calls fail as unavailable, which clients wait out and try again.
	MaxUserCalls int
	// MaxHostConns bounds the connections open at once from one address
	// (default DefaultMaxHostConns), authenticated or not; more are
	// closed as they come.
	MaxHostConns int
	// StagingDir holds resumable uploads until they are committed; it must
	// be outside the served tree. If empty, the server makes a temporary
	// one and removes it when Serve returns.
	StagingDir string
	// NoZstd turns compression on the wire off: the server then neither
	// compresses nor accepts compressed data, as a server that predates it.
	NoZstd bool
	// Owners says the server may give files to other owners (it runs
	// with the right to chown, as root): its clients are told, and keep
	// owner changes back under their write leases (ferry serve sets it).
	Owners bool
	// Lease is how long a client's lease on its cache holds without a
	// renewal (callback.DefaultLease if 0): the longest a change waits
	// for a client that stopped answering.
	Lease time.Duration
}

// Server serves one ferry.FS.
type Server struct {
	cfg Config
	// authLimit refuses addresses that fail to authenticate too often.
	authLimit *authLimit
	fs        ferry.FS // cfg.FS under the control file layer.
	start     time.Time
	grpc      *grpc.Server

	mu    sync.Mutex
	conns map[*conn]struct{}
	// ended holds the counters of connections that ended, by host and
	// user, for the metrics (see Collect).
	ended map[hostUser]connTotals
	raw   map[string]net.Conn // Accepted TCP connections by remote address.
	// hostConns counts the open connections of each remote host, and
	// userCalls the calls in progress of each user.
	hostConns map[string]int
	userCalls map[string]int

	calls  [opCount]atomic.Int64
	errs   atomic.Int64
	budget *budget
	// windows is the memory upload streams reserve, pool the buffers
	// gRPC receives into (see memory.go).
	windows *windows
	pool    countingPool
	// uploads are the resumable uploads in progress.
	uploads    *uploads
	ownStaging bool
	// groups are the staged puts and recent outcomes of Commit.
	groups *groups
	// leases are the clients' leases, broken by every change made
	// through the server.
	leases *callback.Table
	// stopping is done once Serve stops: the calls that would last as
	// long as their clients (watches, leases) end then, rather than hold
	// the stop for its whole grace.
	stopping context.Context
	stop     context.CancelFunc
	// latency is the time each call took, by method.
	latency *prometheus.HistogramVec
	// cancelledReads counts read-aheads stopped by a cancelled stream or
	// a broken connection.
	cancelledReads atomic.Int64
	inFlight       atomic.Int64 // Calls begun and not ended.
	bytesIn        atomic.Int64
	bytesOut       atomic.Int64
	// zip compresses and decompresses payloads for the clients that can.
	zip *zwire.Codec
	// zstd says whether the server compresses and accepts compressed data.
	zstd bool

	rebuildMu sync.Mutex
	rebuild   string // The state of the last index rebuild, for the control file.
}

// conn is one client connection.
type conn struct {
	addr  string
	raw   net.Conn // The TCP connection, for the kernel's measurements; may be nil.
	since time.Time
	calls atomic.Int64
	// readAhead is the bytes read ahead for this connection's streams,
	// and readAheadTarget the sum of their target depths.
	readAhead       atomic.Int64
	readAheadTarget atomic.Int64

	mu   sync.Mutex
	user string     // Set by the first call that authenticated.
	seen connTotals // Its counters at the last scrape of the metrics.
}

type connKey struct{}

const (
	opStat = iota
	opGet
	opPut
	opMove
	opRemove
	opRemoveAll
	opWstat
	opFind
	opFindGet
	opWatch
	opPutStatus
	opChunkList
	opReadChunks
	opPutChunked
	opPutBatch
	opLink
	opLease
	opSpace
	opCommit
	opCount
)

var opNames = [opCount]string{"stat", "get", "put", "move", "remove", "removeall", "wstat", "find", "findget", "watch", "putstatus", "chunklist", "readchunks", "putchunked", "putbatch", "link", "lease", "space", "commit"}

// New returns a server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxUserCalls <= 0 {
		cfg.MaxUserCalls = DefaultMaxUserCalls
	}
	if cfg.MaxHostConns <= 0 {
		cfg.MaxHostConns = DefaultMaxHostConns
	}
	if cfg.Memory <= 0 {
		cfg.Memory = DefaultMemory
	}
	if cfg.ReadAheadBudget <= 0 {
		cfg.ReadAheadBudget = cfg.Memory / 4
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	s := &Server{cfg: cfg, start: time.Now(), authLimit: newAuthLimit(time.Now), conns: map[*conn]struct{}{}, ended: map[hostUser]connTotals{}, raw: map[string]net.Conn{}, hostConns: map[string]int{}, userCalls: map[string]int{}, budget: newBudget(cfg.ReadAheadBudget, cfg.ReadAheadFixed),
		zip: zwire.New(proto.MaxData), zstd: !cfg.NoZstd}
	// Uploads reserve what read-ahead leaves, and at least one window so
	// that a small budget still takes one upload at a time.
	s.windows = newWindows(max(cfg.Memory-cfg.ReadAheadBudget, transport.StreamWindow))
	s.pool.BufferPool = transport.BufferPool
	if cfg.StagingDir == "" {
		dir, err := os.MkdirTemp("", "ferry-uploads-")
		if err != nil {
			return nil, ferry.E("server.New", "", ferry.KindIO, err)
		}
		s.cfg.StagingDir, s.ownStaging = dir, true
	} else if err := os.MkdirAll(cfg.StagingDir, 0o700); err != nil {
		return nil, ferry.E("server.New", cfg.StagingDir, ferry.KindIO, err)
	}
	s.uploads = newUploads(s.cfg.StagingDir)
	s.leases = callback.New(cfg.Lease)
	s.groups = newGroups()
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ferry_call_seconds", Help: "How long calls took, by method (streams: until they ended).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
	}, []string{"method"})
	s.fs = ctl.New("server", cfg.FS, s)
	tlsCfg, err := auth.ServerTLS(cfg.Key)
	if err != nil {
		return nil, err
	}
	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.StatsHandler(s),
		grpc.UnaryInterceptor(s.unaryAuth),
		grpc.StreamInterceptor(s.streamAuth),
		grpc.MaxRecvMsgSize(proto.MaxData+(64<<10)),
		grpc.MaxConcurrentStreams(cfg.MaxStreams),
		// Static flow-control windows far above gRPC's 64 KiB start: see
		// transport.StreamWindow.
		grpc.InitialWindowSize(transport.StreamWindow),
		grpc.InitialConnWindowSize(transport.ConnWindow),
		grpc.WriteBufferSize(transport.WriteBuffer),
		grpc.ReadBufferSize(transport.WriteBuffer),
		experimental.BufferPool(&s.pool),
		grpc.InTapHandle(s.admit),
		grpc.ForceServerCodecV2(transport.Codec),
		// Clients ping every 20 s to notice dead links and keep their
		// watches (their leases) alive; gRPC's default policy would
		// answer such pings with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// The server pings too, so the watches of a client that vanished
		// end within about 40 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	proto.RegisterFerryServer(s.grpc, &handler{s: s})
	return s, nil
}

// DefaultMaxUserCalls and DefaultMaxHostConns are the defaults of
// Config.MaxUserCalls and Config.MaxHostConns: room for a few busy mounts
// per user, and for a few hundred clients behind one address (bench/load
// runs 200 from one, two connections each), while each connection costs
// the server about half a MiB of buffers.
const (
	DefaultMaxUserCalls = 4 * DefaultMaxStreams
	DefaultMaxHostConns = 512
)

// DefaultMaxStreams is the default of Config.MaxStreams: twice what a
// mount has in flight at most (the kernel's 128 background requests, its
// watch, prefetches and read-ahead), while 20,000 streams had pinned 5 GB.
const DefaultMaxStreams = 256

// Serve accepts connections on l until ctx is done, then stops gracefully:
// calls in flight get grace to finish before they are cut. Listeners from
// transport.Listen give tuned sockets.
func (s *Server) Serve(ctx context.Context, l net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(&trackListener{l, s}) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.stop()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.grpc.Stop()
		<-done
	}
	if s.ownStaging {
		os.RemoveAll(s.cfg.StagingDir)
	}
	return nil
}

// TagConn, HandleConn, TagRPC and HandleRPC implement stats.Handler, which
// tells the server of each connection as it comes and goes.

// TagConn implements stats.Handler.
func (s *Server) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	c := &conn{addr: info.RemoteAddr.String(), since: time.Now()}
	s.mu.Lock()
	c.raw = s.raw[c.addr]
	delete(s.raw, c.addr)
	s.mu.Unlock()
	return context.WithValue(ctx, connKey{}, c)
}

// trackListener remembers each accepted connection by its remote address
// until TagConn takes it, since gRPC tells the stats handler only addresses.
type trackListener struct {
	net.Listener
	s *Server
}

func (l *trackListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		h := host(c.RemoteAddr().String())
		l.s.mu.Lock()
		if l.s.hostConns[h] >= l.s.cfg.MaxHostConns {
			l.s.mu.Unlock()
			l.s.cfg.Log.Debug("connection refused: too many from its address", "addr", c.RemoteAddr(), "max", l.s.cfg.MaxHostConns)
			c.Close()
			continue
		}
		l.s.hostConns[h]++
		l.s.raw[c.RemoteAddr().String()] = c
		l.s.mu.Unlock()
		return &trackedConn{Conn: c, s: l.s, host: h}, nil
	}
}

// trackedConn forgets its entry when it closes, so connections that never
// got as far as TagConn (a failed handshake) leave nothing behind.
type trackedConn struct {
	net.Conn
	s      *Server
	host   string
	closed sync.Once
}

func (c *trackedConn) Close() error {
	c.closed.Do(func() {
		c.s.mu.Lock()
		if c.s.raw[c.RemoteAddr().String()] == c.Conn {
			delete(c.s.raw, c.RemoteAddr().String())
		}
		if c.s.hostConns[c.host]--; c.s.hostConns[c.host] <= 0 {
			delete(c.s.hostConns, c.host)
		}
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// HandleConn implements stats.Handler.
func (s *Server) HandleConn(ctx context.Context, st stats.ConnStats) {
	c, _ := ctx.Value(connKey{}).(*conn)
	if c == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st.(type) {
	case *stats.ConnBegin:
		s.conns[c] = struct{}{}
	case *stats.ConnEnd:
		delete(s.conns, c)
		// Its counters go on counting in its host's series (a series
		// per connection goes with it).
		c.mu.Lock()
		k, t := hostUser{host: hostOf(c.addr), user: c.user}, c.seen
		c.mu.Unlock()
		if t != (connTotals{}) && !s.cfg.MetricsPerConn {
			e := s.ended[k]
			s.ended[k] = connTotals{e.tx + t.tx, e.rx + t.rx, e.re + t.re}
		}
	}
}

// TagRPC implements stats.Handler.
func (s *Server) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler and counts the calls in flight and
// the bytes of each call.
func (s *Server) HandleRPC(_ context.Context, st stats.RPCStats) {
	switch st := st.(type) {
	case *stats.Begin:
		s.inFlight.Add(1)
	case *stats.End:
		s.inFlight.Add(-1)
	case *stats.InPayload:
		s.bytesIn.Add(int64(st.WireLength))
	case *stats.OutPayload:
		s.bytesOut.Add(int64(st.WireLength))
	}
}

// identify authenticates the connection of ctx once and returns its user.
func (s *Server) identify(ctx context.Context) (string, error) {
	c, _ := ctx.Value(connKey{}).(*conn)
	if c != nil {
		c.calls.Add(1)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.user != "" {
			return c.user, nil
		}
	}
	var raw [][]byte
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			for _, cert := range ti.State.PeerCertificates {
				raw = append(raw, cert.Raw)
			}
		}
	}
	token := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			token = strings.TrimPrefix(v[0], "Bearer ")
		}
	}
	addr := ""
	if c != nil {
		addr = c.addr
	}
	if !s.authLimit.allowed(host(addr)) {
		return "", ferry.E("server", "", ferry.KindAuth, "too many failed attempts to authenticate from this address; try again in a minute")
	}
	user, err := s.cfg.Auth.Identify(raw, token)
	if err != nil {
		s.authLimit.failed(host(addr))
		s.cfg.Log.Warn("refused client", "addr", addr, "err", err)
		return "", err
	}
	if c != nil {
		c.user = user
		s.cfg.Log.Info("client", "addr", c.addr, "user", user)
	}
	return user, nil
}

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	user, err := s.identify(ctx)
	if err == nil {
		err = s.beginCall(user)
	}
	if err != nil {
		return nil, proto.Status(err)
	}
	defer s.endCall(user)
	defer s.timed(ctx, info.FullMethod, user)(&err)
	var reply any
	reply, err = h(ctx, req)
	return reply, err
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	user, err := s.identify(ss.Context())
	if err == nil {
		err = s.beginCall(user)
	}
	if err != nil {
		return proto.Status(err)
	}
	defer s.endCall(user)
	defer s.timed(ss.Context(), info.FullMethod, user)(&err)
	return h(srv, ss)
}

// timed starts timing a call of method; the func it returns, given the
// call's error, records its duration in the latency histogram and, with
// debug on, logs it.
func (s *Server) timed(ctx context.Context, method, user string) func(*error) {
	began := time.Now()
	return func(err *error) {
		d := time.Since(began)
		name := method[strings.LastIndexByte(method, '/')+1:]
		s.latency.WithLabelValues(name).Observe(d.Seconds())
		if s.cfg.Log.Enabled(ctx, slog.LevelDebug) {
			s.cfg.Log.Debug("call", "method", name, "user", user, "took", d.Round(time.Microsecond), "err", *err)
		}
	}
}

// beginCall counts a call of user in, unless the user has
// Config.MaxUserCalls in progress: a client that opens connection after
// connection must not pin the server's memory with their streams.
func (s *Server) beginCall(user string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.userCalls[user] >= s.cfg.MaxUserCalls {
		return ferry.E("server", "", ferry.KindUnavailable, fmt.Sprintf("%d calls of this user are in progress already; try again", s.cfg.MaxUserCalls))
	}
	s.userCalls[user]++
	return nil
}

func (s *Server) endCall(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.userCalls[user]--; s.userCalls[user] <= 0 {
		delete(s.userCalls, user)
	}
}

// connections returns the open connections, oldest first.
func (s *Server) connections() []*conn {
	s.mu.Lock()
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].since.Before(cs[j].since) })
	return cs
}

// Status implements ctl.Controller.
func (s *Server) Status(context.Context) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %s\n", s.cfg.Version)
	fmt.Fprintf(&b, "uptime: %s\n", time.Since(s.start).Round(time.Second))
	debug := s.cfg.Level != nil && s.cfg.Level.Level() <= slog.LevelDebug
	fmt.Fprintf(&b, "debug: %v\n", debug)
	waits, waitTime := s.leases.Waits()
	fmt.Fprintf(&b, "leases: held=%d lease=%s breaks=%d waits=%d wait_time=%s\n",
		s.leases.Holders(), s.leases.Lease(), s.leases.Breaks(), waits, waitTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "leases.write: held=%d recalls=%d\n", s.leases.WriteLeases(), s.leases.Recalls())
	cs := s.connections()
	fmt.Fprintf(&b, "connections: %d\n", len(cs))
	for _, c := range cs {
		c.mu.Lock()
		user := c.user
		c.mu.Unlock()
		if user == "" {
			user = "-"
		}
		fmt.Fprintf(&b, "conn: addr=%s user=%s since=%s calls=%d",
			c.addr, user, c.since.UTC().Format(time.RFC3339), c.calls.Load())
		fmt.Fprintf(&b, " readahead=%d readahead_target=%d", c.readAhead.Load(), c.readAheadTarget.Load())
		if c.raw != nil {
			if info, err := transport.ConnInfo(c.raw); err == nil {
				fmt.Fprintf(&b, " %s", info)
			}
		}
		b.WriteByte('\n')
	}
	for i, n := range opNames {
		fmt.Fprintf(&b, "calls.%s: %d\n", n, s.calls[i].Load())
	}
	fmt.Fprintf(&b, "errors: %d\n", s.errs.Load())
	ra := s.budget.stats()
	if ra.fixed > 0 {
		fmt.Fprintf(&b, "readahead.mode: fixed %d\n", ra.fixed)
	} else {
		fmt.Fprintf(&b, "readahead.mode: adaptive\n")
	}
	fmt.Fprintf(&b, "readahead.bytes: %d of %d\n", ra.used, ra.total)
	fmt.Fprintf(&b, "readahead.streams: %d\n", ra.streams)
	fmt.Fprintf(&b, "readahead.orphaned: %d\n", ra.orphaned)
	fmt.Fprintf(&b, "readahead.cancelled: %d\n", s.cancelledReads.Load())
	reserved, total, streams := s.windows.stats()
	fmt.Fprintf(&b, "uploads.memory: %d of %d\nuploads.streams: %d\nuploads.refused: %d\n", reserved, total, streams, s.windows.refused.Load())
	fmt.Fprintf(&b, "received.held: %d\n", s.pool.held.Load())
	s.uploads.mu.Lock()
	fmt.Fprintf(&b, "uploads.active: %d\nuploads.resumed: %d\n", len(s.uploads.active), s.uploads.resumed)
	s.uploads.mu.Unlock()
	fmt.Fprintf(&b, "bytes.in: %d\nbytes.out: %d\n", s.bytesIn.Load(), s.bytesOut.Load())
	z := s.zip.Stats()
	fmt.Fprintf(&b, "zstd.in: %d\nzstd.out: %d\nzstd.skipped: %d\nzstd.inflated: %d\n", z.In, z.Out, z.Skipped, z.Inflated)
	// The chunk store below keeps no control file of its own: its index
	// and trash get their sections here ("reindex" and "trash empty"
	// are their commands).
	if x, ok := ferry.As[Indexer](s.fs); ok {
		st := x.Index().Stats()
		b.WriteString("[index]\n")
		fmt.Fprintf(&b, "index.chunks: %d of %d\nindex.files: %d\nindex.indexed: %d\n", st.Chunks, st.MaxChunks, st.Files, st.Indexed)
		fmt.Fprintf(&b, "index.hits: %d\nindex.misses: %d\nindex.stale: %d\n", st.Hits, st.Misses, st.Stale)
		s.rebuildMu.Lock()
		if s.rebuild != "" {
			fmt.Fprintf(&b, "index.rebuild: %s\n", s.rebuild)
		}
		s.rebuildMu.Unlock()
	}
	if t, ok := ferry.As[Trasher](s.fs); ok {
		ts := t.Trash()
		b.WriteString("[trash]\n")
		fmt.Fprintf(&b, "trash.files: %d\ntrash.bytes: %d\n", ts.Files, ts.Bytes)
	}
	return b.String()
}

// Leases returns the leases the server has given its clients.
func (s *Server) Leases() *callback.Table { return s.leases }

// InFlight returns how many calls the server has begun and not ended.
func (s *Server) InFlight() int64 { return s.inFlight.Load() }

// Calls returns how many calls of each kind the server has answered, by the
// names the control file uses ("find", "put", ...).
func (s *Server) Calls() map[string]int64 {
	m := make(map[string]int64, opCount)
	for i, n := range opNames {
		m[n] = s.calls[i].Load()
	}
	return m
}

// ReadAhead returns the bytes held read ahead now and how many read-aheads
// were stopped by cancelled streams or broken connections.
func (s *Server) ReadAhead() (held, cancelled int64) {
	s.budget.mu.Lock()
	defer s.budget.mu.Unlock()
	return s.budget.used, s.cancelledReads.Load()
}

// Command implements ctl.Controller.
func (s *Server) Command(_ context.Context, args []string) error {
	const op = "server.Command"
	switch {
	case len(args) == 2 && args[0] == "debug" && (args[1] == "on" || args[1] == "off"):
		if s.cfg.Level == nil {
			return ferry.E(op, "", ferry.KindInvalid, "this server's log level is fixed")
		}
		if args[1] == "on" {
			s.cfg.Level.Set(slog.LevelDebug)
		} else {
			s.cfg.Level.Set(slog.LevelInfo)
		}
		s.cfg.Log.Info("debug " + args[1])
		return nil
	case len(args) == 1 && args[0] == "reindex":
		return s.Reindex()
	case len(args) == 2 && args[0] == "trash" && args[1] == "empty":
		t, ok := ferry.As[Trasher](s.fs)
		if !ok {
			return ferry.E(op, "", ferry.KindInvalid, "this server keeps no trash")
		}
		files, bytes := t.EmptyTrash()
		s.cfg.Log.Info("trash emptied", "files", files, "bytes", bytes)
		return nil
	case len(args) == 1 && args[0] == "sync":
		// Nothing waits here: every put is synced before it commits.
		return nil
	}
	return ferry.E(op, "", ferry.KindInvalid, fmt.Sprintf("unknown command %q (known: debug on|off, reindex, trash empty, sync, pass CMD)", strings.Join(args, " ")))
}

// Reindex starts rebuilding the served tree's chunk index in the
// background; the control file's index.rebuild says how it went. It fails
// with KindInvalid if the tree keeps no index and with KindExist if a
// rebuild is running. A rebuild is never needed for correctness (every
// chunk is checked against its hash before it is used), only to recover
// the bandwidth savings after the index was lost or damaged.
func (s *Server) Reindex() error {
	const op = "server.Reindex"
	x, ok := ferry.As[Indexer](s.fs)
	if !ok {
		return ferry.E(op, "", ferry.KindInvalid, "this server keeps no chunk index")
	}
	s.rebuildMu.Lock()
	defer s.rebuildMu.Unlock()
	if s.rebuild == "running" {
		return ferry.E(op, "", ferry.KindExist, "a rebuild is running")
	}
	s.rebuild = "running"
	s.cfg.Log.Info("rebuilding the chunk index")
	go func() {
		t0 := time.Now()
		files, failed, err := x.Rebuild(context.Background())
		st := fmt.Sprintf("done files=%d failed=%d took=%s", files, failed, time.Since(t0).Round(time.Millisecond))
		if err != nil {
			st = fmt.Sprintf("failed files=%d failed=%d: %v", files, failed, err)
		}
		s.cfg.Log.Info("chunk index rebuilt", "files", files, "failed", failed, "err", err)
		s.rebuildMu.Lock()
		s.rebuild = st
		s.rebuildMu.Unlock()
	}()
	return nil
}

// handler implements the gRPC service over s.fs.
type handler struct {
	proto.UnimplementedFerryServer
	s *Server
}

// done counts a call and converts its error for the wire.
func (h *handler) done(op int, err error) error {
	h.s.calls[op].Add(1)
	if err != nil {
		h.s.errs.Add(1)
		h.s.cfg.Log.Debug("call failed", "op", opNames[op], "err", err)
	}
	return proto.Status(err)
}

func (h *handler) Stat(ctx context.Context, r *proto.PathReq) (*proto.DirReply, error) {
	h.promise(ctx, r.Path)
	d, err := h.s.fs.Stat(ctx, r.Path).Wait()
	return proto.Reply(d, h.s.zstd), h.done(opStat, err)
}

func (h *handler) Get(r *proto.GetReq, st grpc.ServerStreamingServer[proto.Data]) error {
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	h.promise(ctx, r.Path)
	rd := h.s.fs.Get(ctx, r.Path, r.Offset, r.Count)
	defer rd.Close()
	var zbuf []byte
	c, _ := ctx.Value(connKey{}).(*conn)
	ra := startReadAhead(ctx, rd, c, h.s.budget, &h.s.cancelledReads)
	defer func() {
		cancel() // Stops the reader if the send failed.
		ra.Stop()
	}()
	for {
		p, ok := ra.Next()
		if !ok {
			return h.done(opGet, ferry.E("server.Get", r.Path, ferry.KindCanceled, ctx.Err()))
		}
		if len(p.data) > 0 {
			m := &proto.Data{Data: p.data}
			if r.Zstd && h.s.zstd {
				// zbuf is reused: Send has copied the last message out.
				if m.Data, m.Zstd = h.s.zip.Compress(zbuf, p.data); m.Zstd {
					zbuf = m.Data
				}
			}
			if err := st.Send(m); err != nil {
				return h.done(opGet, err)
			}
		}
		if p.err == io.EOF {
			return h.done(opGet, nil)
		}
		if p.err != nil {
			return h.done(opGet, p.err)
		}
	}
}

// putData returns the data of a PutMsg, decompressed into *buf if it came
// compressed.
func (h *handler) putData(m *proto.PutMsg, buf *[]byte) ([]byte, error) {
	if !m.Zstd {
		return m.Data, nil
	}
	if !h.s.zstd {
		return nil, ferry.E("server.Put", m.Path, ferry.KindInvalid, "compressed data refused")
	}
	data, err := h.s.zip.Decompress(*buf, m.Data)
	if err != nil {
		return nil, ferry.E("server.Put", m.Path, ferry.KindInvalid, err)
	}
	*buf = data
	return data, nil
}

// errPutDone tells a Put's pipe writer that the tree stopped reading.
var errPutDone = errors.New("put finished before its data")

func (h *handler) Put(st grpc.ClientStreamingServer[proto.PutMsg, proto.DirReply]) error {
	const op = "server.Put"
	ctx := st.Context()
	first, err := st.Recv()
	if err == io.EOF {
		return h.done(opPut, ferry.E(op, "", ferry.KindInvalid, "empty put"))
	}
	if err != nil {
		return h.done(opPut, err)
	}
	if first.Upload != "" && first.Offset == ferry.Whole {
		return h.putUpload(first, st)
	}
	// The cancel makes the tree abandon the put if the stream breaks: a
	// whole-file put then leaves the old content.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h.promise(ctx, first.Path)
	pr, pw := io.Pipe()
	fut := h.s.fs.Put(ctx, first.Path, proto.ToDir(first.Dir), first.Offset, pr)
	go func() {
		<-fut.Done()
		pr.CloseWithError(errPutDone)
	}()
	var zbuf []byte
	m := first
	for {
		// The pipe's Write returns once the tree has taken the bytes, so
		// zbuf can be reused.
		data, err := h.putData(m, &zbuf)
		if err != nil {
			cancel()
			pw.CloseWithError(err)
			fut.Wait()
			return h.done(opPut, err)
		}
		if len(data) > 0 {
			if _, err := pw.Write(data); err != nil {
				break // The tree stopped reading: its result says why.
			}
		}
		m, err = st.Recv()
		if err == io.EOF {
			pw.Close()
			break
		}
		if err != nil {
			cancel()
			pw.CloseWithError(ferry.E(op, first.Path, ferry.KindUnavailable, err))
			fut.Wait()
			return h.done(opPut, err)
		}
	}
	d, err := fut.Wait()
	if err = h.changed(ctx, err, callback.Change{Path: first.Path}); err != nil {
		return h.done(opPut, err)
	}
	return h.done(opPut, st.SendAndClose(proto.Reply(d, h.s.zstd)))
}

func (h *handler) Move(ctx context.Context, r *proto.MoveReq) (*proto.DirReply, error) {
	d, err := h.move(ctx, r.From, r.To)
	return proto.Reply(d, false), h.done(opMove, err)
}

// move renames from to to once the leases over them are recalled, and
// answers once the promises it broke are dropped: a Move, or a change of
// a group (Commit).
func (h *handler) move(ctx context.Context, from, to string) (ferry.Dir, error) {
	h.recall(ctx, true, from, to)
	h.promise(ctx, from, to)
	h.s.leases.ChangingTrees(cleanPaths([]string{from, to})...)
	d, err := h.s.fs.Move(ctx, from, to).Wait()
	// Only a directory moves what is below it; a file's rename (an
	// editor's save, git's lock files) breaks just its two names.
	tree := err == nil && d.IsDir()
	return d, h.changed(ctx, err, callback.Change{Path: from, Tree: tree}, callback.Change{Path: to, Tree: tree})
}

func (h *handler) Link(ctx context.Context, r *proto.MoveReq) (*proto.DirReply, error) {
	h.promise(ctx, r.From, r.To)
	d, err := h.s.fs.Link(ctx, r.From, r.To).Wait()
	err = h.changed(ctx, err, callback.Change{Path: r.From}, callback.Change{Path: r.To})
	return proto.Reply(d, false), h.done(opLink, err)
}

func (h *handler) Remove(ctx context.Context, r *proto.PathReq) (*proto.Empty, error) {
	return &proto.Empty{}, h.done(opRemove, h.remove(ctx, r.Path))
}

// remove is Remove's change, also made by Commit.
func (h *handler) remove(ctx context.Context, p string) error {
	h.recall(ctx, true, p)
	h.promise(ctx, p)
	_, err := h.s.fs.Remove(ctx, p).Wait()
	return h.changed(ctx, err, callback.Change{Path: p})
}

func (h *handler) RemoveAll(ctx context.Context, r *proto.PathReq) (*proto.Empty, error) {
	h.recall(ctx, true, r.Path)
	h.promise(ctx, r.Path)
	h.s.leases.ChangingTrees(cleanPaths([]string{r.Path})...)
	_, err := h.s.fs.RemoveAll(ctx, r.Path).Wait()
	err = h.changed(ctx, err, callback.Change{Path: r.Path, Tree: true})
	return &proto.Empty{}, h.done(opRemoveAll, err)
}

func (h *handler) Wstat(ctx context.Context, r *proto.WstatReq) (*proto.DirReply, error) {
	d, err := h.wstat(ctx, r.Path, proto.ToDir(r.Dir))
	return proto.Reply(d, false), h.done(opWstat, err)
}

// wstat is Wstat's change, also made by Commit.
func (h *handler) wstat(ctx context.Context, p string, d ferry.Dir) (ferry.Dir, error) {
	h.promise(ctx, p)
	got, err := h.s.fs.Wstat(ctx, p, d).Wait()
	return got, h.changed(ctx, err, callback.Change{Path: p})
}

func (h *handler) Space(ctx context.Context, r *proto.PathReq) (*proto.SpaceReply, error) {
	sp, ok := ferry.As[ferry.Spacer](h.s.fs)
	if !ok {
		return nil, h.done(opSpace, ferry.E("server.Space", r.Path, ferry.KindInvalid, "this server cannot say how much room it has"))
	}
	v, err := sp.Space(ctx, r.Path).Wait()
	return &proto.SpaceReply{Total: v.Total, Free: v.Free, Avail: v.Avail, Files: v.Files, FilesFree: v.FilesFree}, h.done(opSpace, err)
}

func (h *handler) Find(r *proto.FindReq, st grpc.ServerStreamingServer[proto.FindReply]) error {
	ctx := st.Context()
	return h.find(opFind, r, h.promiseFind(ctx, r.Path, func() *ferry.Stream[ferry.Entry] { return h.s.fs.Find(ctx, r.Path, r.Pred) }), st)
}

func (h *handler) FindGet(r *proto.FindReq, st grpc.ServerStreamingServer[proto.FindReply]) error {
	ctx := st.Context()
	return h.find(opFindGet, r, h.promiseFind(ctx, r.Path, func() *ferry.Stream[ferry.Entry] { return h.s.fs.FindGet(ctx, r.Path, r.Pred) }), st)
}

// find sends compressed batches to a client that takes them.
func (h *handler) find(op int, r *proto.FindReq, s *ferry.Stream[ferry.Entry], st grpc.ServerStreamingServer[proto.FindReply]) error {
	var zip *zwire.Codec
	if r.Zstd && h.s.zstd {
		zip = h.s.zip
	}
	return h.done(op, proto.SendFind(s, st.Send, zip, r.Omit...))
}

func (h *handler) Watch(r *proto.PathReq, st grpc.ServerStreamingServer[proto.WatchEvent]) error {
	w, ok := ferry.As[ferry.Watcher](h.s.fs)
	if !ok {
		return h.done(opWatch, ferry.E("server.Watch", r.Path, ferry.KindInvalid, "this server cannot watch"))
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	defer context.AfterFunc(h.s.stopping, cancel)()
	s := w.Watch(ctx, r.Path)
	for e := range s.All() {
		if err := st.Send(&proto.WatchEvent{Path: e.Path, Lost: e.Lost}); err != nil {
			s.Close()
			return h.done(opWatch, err)
		}
	}
	return h.done(opWatch, h.s.stoppingErr("server.Watch", r.Path, s.Err()))
}

// stoppingErr is err, unless the server is stopping: a call it ended for
// that says so.
func (s *Server) stoppingErr(op, p string, err error) error {
	if s.stopping.Err() != nil {
		return ferry.E(op, p, ferry.KindUnavailable, "the server is stopping")
	}
	return err
}
