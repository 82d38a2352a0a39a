// Package remote implements a ferry.FS over the wire protocol: the client
// end of a Ferry connection.
//
// A Client holds two TLS 1.3 connections, each carrying many calls at once:
// one for bulk data (Get, Put, FindGet and the chunk calls) and one for the
// rest, so that a Stat or a Find does not wait behind a transfer's data
// (a small Get on the bulk connection does: bench/REPORT-latency.md).
// Every method returns at once and its call proceeds in the background, so
// a caller can issue many calls before waiting for any. A Client is safe for
// concurrent use and can be stacked under caches and the FUSE adaptor.
package remote

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/store"
	"github.com/ferryfs/ferry/internal/transport"
	"github.com/ferryfs/ferry/internal/zwire"
)

// Config says how to reach and authenticate to a server.
type Config struct {
	// Addr is the server's host:port.
	Addr string
	// Key is this client's key; nil to use Token only.
	Key ed25519.PrivateKey
	// Token, if not empty, is sent with every call.
	Token string
	// Hosts pins the server's key.
	Hosts *auth.KnownHosts
	// Dial, if not nil, makes the connections (tests use it to cut links);
	// by default they are tuned by transport.Dial.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// ResumeFor is how long a Get interrupted by a broken connection keeps
	// trying to resume where it stopped, and how long a call waits for a
	// connection that broke to come back before it starts (see
	// awaitReady); 0 means DefaultResumeFor.
	ResumeFor time.Duration
	// Cache, if not nil, is the chunk cache of whole-file Gets: a Get of
	// a whole file of more than ChunkMin bytes fetches only the chunks the
	// cache lacks, and Puts add their chunks to it. The Client closes it
	// in Close only if CloseCache is set.
	Cache      store.ChunkCache
	CloseCache bool
	// AfterClose, if set, is called at the end of Close with whether a
	// connection to the server was ever ready: a command can then take
	// back what it made for a server it never reached (its cache).
	AfterClose func(reached bool)
	// ChunkMin is the least size of a file that Put and Get move by
	// chunks; 0 means DefaultChunkMin, < 0 never.
	ChunkMin int64
	// BulkConns is how many connections carry bulk data; a large
	// chunked Get spreads its chunks over them. 0 means
	// DefaultBulkConns.
	BulkConns int
	// NoFine sends every chunk a server lacks whole rather than as the
	// pieces of it the server lacks (chunk.Fine): one round trip less per
	// put that changes a file, for links where bytes cost less than that.
	NoFine bool
	// NoZstd turns off compression on the wire, for tests and for links
	// fast enough that the CPU is the bottleneck.
	NoZstd bool
	// Window is how many bytes a stream may have in flight towards the
	// client (its flow-control window; the connection's is twice that),
	// at most transport.StreamWindow, the default. What the server sends
	// ahead of a reader sits in the client's memory, so a client with a
	// small memory budget asks for less.
	Window int32
	// FindOmit names attributes that Find and FindGet results need not
	// carry: the server leaves them out, which saves bytes on walks that
	// do not look at them (BriefAttrs for a sync).
	FindOmit []string
	// Log, if not nil, receives a line when calls fail because the
	// server cannot be reached (at most one every failLogEvery, with how
	// many more failed meanwhile), so that a mount's EIO has a cause on
	// record.
	Log *slog.Logger
}

// BriefAttrs are the attributes only a file system needs: a program that
// compares trees by type, size, mtime and mode can do without them.
var BriefAttrs = []string{ferry.AttrAtime, ferry.AttrCtime, ferry.AttrIno}

// DefaultResumeFor is how long an interrupted Get tries to resume, and a
// call waits for a broken connection: long enough to ride out a brief
// outage or a server's restart, short enough not to hang a user.
const DefaultResumeFor = time.Minute

// DefaultBulkConns is how many connections carry bulk data by default.
// One: spreading a download over several TCP flows made it slower on
// every emulated link tried. `ferry get --bulk-conns N` of a 128 MiB file
// of random bytes (cold client cache, warm server index) over `ferry
// netem` at 100 Mbit/s, medians of 3 for N = 1/4/8 (2026-11-23, on a busy
// machine): 0 ms 11.4/11.4 s (single runs), 100 ms and 1% loss
// 13.5/14.7/15.1 s, 200 ms 14.0/15.6/15.4 s, 200 ms and 1% 15.4/19.6/
// 17.2 s. BBR flows sharing one drop-tail queue overfill it (each probes
// for the whole link), and the loss they cause costs more than the
// start-up they save. More connections may still help where one flow is
// held back by something else, such as a kernel without BBR, whose cubic
// falls below 2 Mbit/s at 1% loss.
const DefaultBulkConns = 1

// Client is a ferry.FS served by a remote server.
//
// It keeps separate connections to the server for bulk data (Get, Put,
// FindGet) and for everything else, so that a Stat or a Find issued during
// a large transfer does not wait behind its data in the flow-control
// windows and socket buffers it fills.
type Client struct {
	conn  *grpc.ClientConn
	c     proto.FerryClient
	bulks []*grpc.ClientConn
	// bulk is the first bulk connection's client, bulkc all of them.
	bulk  proto.FerryClient
	bulkc []proto.FerryClient
	// acts record when each connection last received bytes: the call
	// connection's first, then the bulk ones', as Dial made them.
	acts []*activity
	// log, failLogged and failMuted: see logFailure.
	log          *slog.Logger
	failMu       sync.Mutex
	failLogged   time.Time
	failMuted    int
	addr         string
	resumeFor    time.Duration
	handshakeErr atomic.Pointer[error]
	// owners is what the server said of owner changes (SetsOwners).
	owners     atomic.Bool
	afterClose func(reached bool) // Config.AfterClose.
	// connected is set once a connection was ready: from then on a call
	// waits for a broken one to come back (see awaitReady).
	connected atomic.Bool
	// verifyMu is held for reading while a handshake checks the server's
	// key, and for writing by Close to set closed.
	verifyMu sync.RWMutex
	closed   bool

	// leases holds the Lease streams in progress, which carry the
	// client's write leases.
	leaseMu sync.Mutex
	leases  map[*leaseStream]struct{}

	cache store.ChunkCache
	// maps keeps the chunk lists of files read by chunks (GetCurrent).
	maps       chunkMaps
	closeCache bool
	chunkMin   int64
	noFine     bool     // Config.NoFine.
	findOmit   []string // Config.FindOmit.
	// zip is nil if the Client does not compress.
	zip *zwire.Codec
	// zstdOK is set once the server said it accepts compressed data: a
	// server without zstd never says so and gets plain bytes.
	zstdOK atomic.Bool
	// batch is the groups' PutBatch (groupBatch), made once.
	batchOnce sync.Once
	batch     atomic.Pointer[PutBatch]
	// level is the zwire.Level its batch streams chose last (see levels).
	level atomic.Int32
	// noChunks is set once the server said it does not serve chunks, so
	// that later transfers do not ask again.
	noChunks atomic.Bool
	traffic  traffic
}

var (
	_ ferry.FS       = (*Client)(nil)
	_ ferry.Watcher  = (*Client)(nil)
	_ ctl.Server     = (*Client)(nil)
	_ ctl.Controller = (*Client)(nil)
)

// Dial returns a client for the server cfg names. It starts connecting but
// does not wait: the first call waits for the connection, and fails with
// KindAuth if the server's key does not match its pin or the server refuses
// this client.
func Dial(cfg Config) (*Client, error) {
	const op = "remote.Dial"
	tlsCfg, err := auth.ClientTLS(cfg.Key, cfg.Hosts, cfg.Addr)
	if err != nil {
		return nil, err
	}
	c := &Client{addr: cfg.Addr, findOmit: cfg.FindOmit, log: cfg.Log}
	// gRPC reports a failed handshake as a bare "unavailable" status, so
	// the client keeps the verification error to report its real kind.
	verify := tlsCfg.VerifyPeerCertificate
	tlsCfg.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		// A handshake gRPC began before Close may still be running:
		// once Close has returned it must not pin a key (the known
		// hosts file may be gone with its directory by then).
		c.verifyMu.RLock()
		defer c.verifyMu.RUnlock()
		if c.closed {
			return ferry.E(op, cfg.Addr, ferry.KindCanceled, "the client is closed")
		}
		err := verify(raw, chains)
		if err != nil {
			c.handshakeErr.Store(&err)
		} else {
			c.handshakeErr.Store(nil)
		}
		return err
	}
	window := int32(transport.StreamWindow)
	if cfg.Window > 0 {
		window = min(cfg.Window, window)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		// Keepalives notice a dead link within about 30 s instead of the
		// kernel's many minutes.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(proto.MaxData+(64<<10)), grpc.ForceCodecV2(transport.Codec)),
		grpc.WithInitialWindowSize(window),
		grpc.WithInitialConnWindowSize(min(2*window, transport.ConnWindow)),
		grpc.WithWriteBufferSize(transport.WriteBuffer),
		grpc.WithReadBufferSize(transport.WriteBuffer),
		experimental.WithBufferPool(transport.BufferPool),
		// Reconnect quickly after an outage: gRPC's default waits up to
		// two minutes between attempts.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 10 * time.Second,
		}),
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(token(cfg.Token)))
	}
	opts = append(opts, grpc.WithPerRPCCredentials(newSession()))
	dial := cfg.Dial
	if dial == nil {
		dial = transport.Dial
	}
	opts = append(opts, grpc.WithChainUnaryInterceptor(c.readyUnary), grpc.WithChainStreamInterceptor(c.readyStream))
	c.resumeFor = cfg.ResumeFor
	if c.resumeFor <= 0 {
		c.resumeFor = DefaultResumeFor
	}
	c.cache, c.closeCache, c.chunkMin, c.noFine = cfg.Cache, cfg.CloseCache, cfg.ChunkMin, cfg.NoFine
	c.afterClose = cfg.AfterClose
	if c.chunkMin == 0 {
		c.chunkMin = DefaultChunkMin
	}
	if !cfg.NoZstd {
		c.zip = zwire.New(proto.MaxData)
	}
	n := cfg.BulkConns
	if n <= 0 {
		n = DefaultBulkConns
	}
	conns := make([]*grpc.ClientConn, 1+n)
	acts := make([]*activity, 1+n)
	for i := range conns {
		acts[i] = &activity{}
		if conns[i], err = grpc.NewClient("passthrough:///"+cfg.Addr, append(opts, grpc.WithContextDialer(acts[i].dialer(dial)))...); err != nil {
			for _, cc := range conns[:i] {
				cc.Close()
			}
			return nil, ferry.E(op, cfg.Addr, ferry.KindInvalid, err)
		}
		// Start every connection now, in parallel, rather than each at
		// its first call: a command that stats and then transfers would
		// otherwise pay two connection set-ups (TCP and TLS, two round
		// trips) in a row.
		conns[i].Connect()
	}
	c.conn, c.bulks = conns[0], conns[1:]
	c.acts = acts
	c.c = proto.NewFerryClient(c.conn)
	for _, cc := range c.bulks {
		c.bulkc = append(c.bulkc, proto.NewFerryClient(cc))
	}
	c.bulk = c.bulkc[0]
	return c, nil
}

// fail converts the error of a call, preferring the reason the last
// handshake failed over gRPC's "unavailable".
func (c *Client) fail(op, p string, err error) error {
	err = proto.FromStatus(op, p, err)
	if ferry.KindOf(err) == ferry.KindUnavailable && !errors.Is(err, proto.ErrBusy) {
		if herr := c.handshakeErr.Load(); herr != nil {
			return *herr
		}
		if msg := unreachable(c.addr, err.Error()); msg != "" {
			err = ferry.E("", "", ferry.KindUnavailable, msg)
		}
		c.logFailure(op, p, err)
	}
	return err
}

// failLogEvery spaces the lines logFailure writes: an outage fails many
// calls at once.
const failLogEvery = 10 * time.Second

// logFailure logs that a call failed for want of the server, unless a line
// was written less than failLogEvery ago; it then counts the call for the
// next line.
func (c *Client) logFailure(op, p string, err error) {
	if c.log == nil {
		return
	}
	c.failMu.Lock()
	defer c.failMu.Unlock()
	if time.Since(c.failLogged) < failLogEvery {
		c.failMuted++
		return
	}
	c.log.Warn("a call failed: the server could not be reached", "op", op, "path", p, "err", err, "more_since_last_line", c.failMuted)
	c.failLogged, c.failMuted = time.Now(), 0
}

// unreachable says in a person's words why gRPC's message msg says the
// server at addr could not be reached, with what to try; "" if it does not
// say so. The call's name and path are beside the point then.
func unreachable(addr, msg string) string {
	switch {
	case strings.Contains(msg, "connection refused"):
		return fmt.Sprintf("cannot reach %s: connection refused (is ferry serve running there, on that port?)", addr)
	case strings.Contains(msg, "no such host"):
		return fmt.Sprintf("cannot reach %s: no such host", addr)
	case strings.Contains(msg, "no route to host"), strings.Contains(msg, "network is unreachable"):
		return fmt.Sprintf("cannot reach %s: no route to it", addr)
	case strings.Contains(msg, "does not look like a TLS handshake"), strings.Contains(msg, "first record"):
		return fmt.Sprintf("%s does not speak Ferry: its answer is not a TLS handshake (is that the right port?)", addr)
	}
	return ""
}

// token sends a bearer token with each call.
type token string

func (t token) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (t token) RequireTransportSecurity() bool { return true }

// Close closes the connections, and the cache if the Client owns it;
// calls in flight fail.
func (c *Client) Close() error {
	c.verifyMu.Lock()
	c.closed = true
	c.verifyMu.Unlock()
	c.maps.close()
	if b := c.batch.Load(); b != nil {
		b.Close()
	}
	err := c.conn.Close()
	for _, cc := range c.bulks {
		err = errors.Join(err, cc.Close())
	}
	if c.zip != nil {
		c.zip.Close()
	}
	if c.cache != nil && c.closeCache {
		err = errors.Join(err, c.cache.Close())
	}
	if c.afterClose != nil {
		c.afterClose(c.connected.Load())
	}
	return err
}

// Addr returns the server's address.
func (c *Client) Addr() string { return c.addr }

// ServesCtl implements ctl.Server: every server serves a control file.
func (c *Client) ServesCtl() bool { return true }

func (c *Client) dirCall(op, p string, call func() (*proto.DirReply, error)) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		r, err := call()
		if err != nil {
			return nil, c.fail(op, p, err)
		}
		return proto.FromReply(r), nil
	})
}

func (c *Client) emptyCall(op, p string, call func() (*proto.Empty, error)) *ferry.Future[struct{}] {
	return ferry.Go(func() (struct{}, error) {
		_, err := call()
		return struct{}{}, c.fail(op, p, err)
	})
}

// Stat implements ferry.Tree.
func (c *Client) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	return c.dirCall("remote.Stat", p, func() (*proto.DirReply, error) {
		r, err := c.c.Stat(ctx, &proto.PathReq{Path: p})
		if err == nil && r.Zstd {
			c.zstdOK.Store(true)
		}
		return r, err
	})
}

// Get implements ferry.Tree. The call starts at once; Read delivers its
// data as it arrives. If the connection breaks, Read resumes the transfer
// where it stopped once the client has reconnected, for up to ResumeFor,
// without fetching again what arrived. A Get of a whole file, by a Client
// with a Cache, fetches by chunks only what the cache lacks (see
// getByChunks).
func (c *Client) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	if off == 0 && count < 0 && c.byChunks(p) {
		return c.getByChunks(ctx, p)
	}
	return c.getStream(ctx, p, off, count)
}

// byChunks reports whether a whole Get of p goes by chunks: with a chunk
// cache, from a server that has chunks.
func (c *Client) byChunks(p string) bool {
	return c.cache != nil && c.chunkMin >= 0 && !c.noChunks.Load() && p != ferry.CtlPath
}

// getStream is a plain Get: one streamed call for the bytes.
func (c *Client) getStream(ctx context.Context, p string, off, count int64) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	r := &reader{c: c, ctx: ctx, cancel: cancel, path: p, off: off, left: count, stopResume: func() {}}
	r.start(ctx)
	return r
}

type reader struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	path   string
	off    int64 // Offset of the next byte to deliver.
	left   int64 // Bytes still wanted; < 0 to the end.
	st     *ferry.Future[grpc.ServerStreamingClient[proto.Data]]
	buf    []byte
	zbuf   []byte // Holds decompressed data; buf points into it.
	err    error
	resume time.Time // When resuming gives up; zero until the first break.
	// stopResume releases the deadline of the current resumed call.
	stopResume context.CancelFunc
	// stopCall cancels the current call; stalled says a watchdog did, the
	// call having delivered nothing for ResumeFor.
	stopCall context.CancelFunc
	stalled  atomic.Bool
	act      *activity // The activity of the call's connection.
}

func (r *reader) start(ctx context.Context, opts ...grpc.CallOption) {
	req := &proto.GetReq{Path: r.path, Offset: r.off, Count: r.left, Zstd: r.c.zip != nil}
	var cc proto.FerryClient
	cc, r.act = r.c.bulk, r.c.acts[1]
	if r.left >= 0 && r.left <= SmallGet {
		cc, r.act = r.c.c, r.c.acts[0]
	}
	ctx, r.stopCall = context.WithCancel(ctx)
	r.st = ferry.Go(func() (grpc.ServerStreamingClient[proto.Data], error) {
		return cc.Get(ctx, req, opts...)
	})
}

// recv is st.Recv, cancelled if the call's connection receives nothing
// for ResumeFor while it waits: over a link gone silent the connection's
// keepalive notices only after half a minute, and a read must not wait
// longer than the client waits for a server. A slow link that still
// delivers bytes, however few, is not silent.
func (r *reader) recv(st grpc.ServerStreamingClient[proto.Data]) (*proto.Data, error) {
	stop := r.act.watch(r.c.resumeFor, func() {
		r.stalled.Store(true)
		r.stopCall()
	})
	m, err := st.Recv()
	stop()
	if err != nil && r.stalled.Load() && r.ctx.Err() == nil {
		err = ferry.E("remote.Get", r.path, ferry.KindUnavailable, fmt.Sprintf("nothing from the server for %v", r.c.resumeFor))
	}
	return m, err
}

// SmallGet is the most bytes a Get may ask for and still go on the call
// connection, where it does not wait behind a transfer's data in the bulk
// connection's buffers (bench/REPORT-latency.md: a 4 KiB Get during a
// download took 2.2-2.7 round trips there, a Stat 1.1-1.9). A Get to the
// end of a file goes on the bulk connection whatever the file's size: the
// client cannot know it is small.
const SmallGet = 64 << 10

// Read fails once the Get's context is done, even if data that arrived
// before is at hand: a cancelled Get is not a short file.
func (r *reader) Read(b []byte) (int, error) {
	if r.err == nil && r.ctx.Err() != nil {
		r.buf, r.err = nil, ferry.E("remote.Get", r.path, ferry.KindCanceled, r.ctx.Err())
	}
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.left == 0 {
			r.err = io.EOF
			break
		}
		st, err := r.st.Wait()
		if err == nil {
			var m *proto.Data
			if m, err = r.recv(st); err == nil {
				r.c.traffic.getWire.Add(int64(len(m.Data)))
				r.buf = m.Data
				if m.Zstd {
					if r.c.zip == nil {
						err = ferry.E("remote.Get", r.path, ferry.KindInvalid, "the server sent compressed data unasked")
					} else if r.buf, err = r.c.zip.Decompress(r.zbuf, m.Data); err == nil {
						r.zbuf = r.buf
					}
				}
				if err == nil {
					r.c.traffic.getBytes.Add(int64(len(r.buf)))
					continue
				}
				r.buf, r.err = nil, err
				break
			}
		}
		if err == io.EOF {
			r.err = io.EOF
			break
		}
		if r.stalled.Load() && ferry.KindOf(err) == ferry.KindUnavailable {
			r.err = err // recv's own, which says why.
		} else {
			r.err = r.c.fail("remote.Get", r.path, err)
		}
		// A stalled call has waited its bound already: no resume.
		if ferry.KindOf(r.err) == ferry.KindUnavailable && !r.stalled.Load() && r.c.handshakeErr.Load() == nil && r.ctx.Err() == nil {
			if r.resume.IsZero() {
				r.resume = time.Now().Add(r.c.resumeFor)
			}
			if time.Now().Before(r.resume) {
				// Wait for the reconnection, but not past the deadline.
				rctx, cancel := context.WithDeadline(r.ctx, r.resume)
				r.stopResume()
				r.stopResume = cancel
				r.err = nil
				r.start(rctx, grpc.WaitForReady(true))
			}
		}
	}
	if r.err != nil && len(r.buf) == 0 {
		return 0, r.err
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	r.off += int64(n)
	if r.left > 0 {
		r.left -= int64(n)
	}
	return n, nil
}

func (r *reader) Close() error {
	r.cancel()
	r.stopResume()
	r.stopCall()
	if r.err == nil {
		r.err = ferry.E("remote.Get", r.path, ferry.KindInvalid, "reader closed")
	}
	return nil
}

// Put implements ferry.Tree. The data is streamed in the same call as the
// path and attributes; the call commits when data reaches its end. A
// whole-file Put of at least ResumableSize bytes from an io.ReadSeeker is
// resumable: if the connection breaks, it resumes where the server's copy
// stopped once the client has reconnected, for up to ResumeFor.
func (c *Client) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		if rs, ok := data.(io.ReadSeeker); ok && off == ferry.Whole {
			// The data is what lies from the reader's position on.
			start, err := rs.Seek(0, io.SeekCurrent)
			if err == nil {
				end, err := rs.Seek(0, io.SeekEnd)
				if err == nil {
					_, err = rs.Seek(start, io.SeekStart)
				}
				if err != nil {
					return nil, ferry.E("remote.Put", p, err)
				}
				if ra, ok := data.(io.ReaderAt); ok && c.chunkable(p, d, end-start) {
					dir, err, done := c.putByChunks(ctx, p, d, io.NewSectionReader(ra, start, end-start), end-start, nil, false)
					if done {
						return dir, err
					}
				}
				if end-start >= ResumableSize {
					return c.putResumable(ctx, p, d, rs, start, end-start)
				}
				return c.putSeekable(ctx, p, d, rs, start, end-start)
			}
		}
		return c.putStream(ctx, p, d, off, data, -1, "", 0)
	})
}

// putSeekable puts the size bytes of rs from start on, and puts them again
// when the server was busy (rideOut).
func (c *Client) putSeekable(ctx context.Context, p string, d ferry.Dir, rs io.ReadSeeker, start, size int64) (ferry.Dir, error) {
	var deadline time.Time
	for {
		dir, err := c.putStream(ctx, p, d, ferry.Whole, rs, size, "", 0)
		if !errors.Is(err, proto.ErrBusy) || !c.rideOut(ctx, err, &deadline) {
			return dir, err
		}
		if _, err := rs.Seek(start, io.SeekStart); err != nil {
			return nil, ferry.E("remote.Put", p, err)
		}
	}
}

// ResumableSize is the least size of a resumable Put. The server stages a
// resumable upload and then copies it into the tree; below this size sending
// the file again costs less than that copy.
const ResumableSize = 4 << 20

// declareSize is the outgoing context of an upload of size bytes, which
// lets the server reserve less of its memory for it than a whole window.
func declareSize(ctx context.Context, size int64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, proto.SizeKey, strconv.FormatInt(size, 10))
}

// silent reports whether a connection of the client is up but has received
// nothing for ResumeFor: the link has gone silent, and waiting for it to
// come back has taken its bound already.
func (c *Client) silent() bool {
	for i, cc := range append([]*grpc.ClientConn{c.conn}, c.bulks...) {
		idle := time.Since(time.Unix(0, c.acts[i].last.Load()))
		if cc.GetState() == connectivity.Ready && idle >= c.resumeFor {
			return true
		}
	}
	return false
}

// rideOut reports whether a call that failed with err should be made
// again once the client has reconnected: the connection broke (not went
// silent for the whole bound: errStalled, silent), and less than ResumeFor has
// passed since the first break, which *deadline (set on the first) marks.
func (c *Client) rideOut(ctx context.Context, err error, deadline *time.Time) bool {
	if errors.Is(err, proto.ErrBusy) {
		return c.waitBusy(ctx, deadline)
	}
	if ferry.KindOf(err) != ferry.KindUnavailable || errors.Is(err, errStalled) || c.silent() || c.handshakeErr.Load() != nil || ctx.Err() != nil {
		return false
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(c.resumeFor)
	}
	return time.Now().Before(*deadline)
}

// waitBusy pauses before a call the server refused as busy (proto.ErrBusy)
// is made again, and reports whether it should be: less than ResumeFor has
// passed since the first refusal, which *deadline marks. The pause grows
// with the wait, from 50 ms to 1 s, and is drawn at random around that, so
// that clients refused together do not come back together.
func (c *Client) waitBusy(ctx context.Context, deadline *time.Time) bool {
	if deadline.IsZero() {
		*deadline = time.Now().Add(c.resumeFor)
	}
	left := time.Until(*deadline)
	if left <= 0 {
		return false
	}
	pause := min(max((c.resumeFor-left)/4, 50*time.Millisecond), time.Second)
	pause = min(pause/2+mathrand.N(pause), left)
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		c.traffic.busy.Add(1)
		return true
	case <-ctx.Done():
		return false
	}
}

// putResumable puts rs from start on as the upload of a new id, and after
// each break asks the server how much it holds and sends the rest.
func (c *Client) putResumable(ctx context.Context, p string, d ferry.Dir, rs io.ReadSeeker, start, size int64) (ferry.Dir, error) {
	const op = "remote.Put"
	id := randomID()
	var at int64
	var deadline time.Time
	var opts []grpc.CallOption
	for {
		dir, err := c.putStream(ctx, p, d, ferry.Whole, rs, size-at, id, at, opts...)
		if err == nil || !c.rideOut(ctx, err, &deadline) {
			return dir, err
		}
		if errors.Is(err, proto.ErrBusy) {
			// Refused before it began: the server has what it had.
			if _, serr := rs.Seek(start+at, io.SeekStart); serr != nil {
				return nil, ferry.E(op, p, serr)
			}
			continue
		}
		sctx, cancel := context.WithDeadline(ctx, deadline)
		r, serr := c.c.PutStatus(sctx, &proto.UploadReq{Upload: id}, grpc.WaitForReady(true))
		cancel()
		if serr != nil {
			return nil, err
		}
		if r.Committed != nil {
			return proto.ToDir(r.Committed), nil // Only the reply was lost.
		}
		if _, serr = rs.Seek(start+r.Have, io.SeekStart); serr != nil {
			return nil, ferry.E(op, p, serr)
		}
		at = r.Have
		opts = []grpc.CallOption{grpc.WaitForReady(true)}
	}
}

// putStream sends one Put stream: path, attributes, upload and data, whose
// size (what is left to send) is declared to the server if known (not
// negative).
func (c *Client) putStream(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader, size int64, upload string, resumeAt int64, opts ...grpc.CallOption) (ferry.Dir, error) {
	const op = "remote.Put"
	// The cancel abandons the stream if reading data fails, so the
	// server commits nothing.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if size >= 0 {
		ctx = declareSize(ctx, size)
	}
	st, err := c.bulk.Put(ctx, opts...)
	if err != nil {
		return nil, c.fail(op, p, err)
	}
	m := &proto.PutMsg{Path: p, Offset: off, Dir: proto.FromDir(d), Upload: upload, ResumeAt: resumeAt}
	if d == nil {
		m.Dir = &proto.Dir{}
	}
	if data != nil {
		buf := make([]byte, proto.SendData)
		var zbuf []byte
		for {
			n, rerr := io.ReadFull(data, buf)
			if n > 0 {
				m.Data = buf[:n]
				if c.zip != nil && c.zstdOK.Load() {
					// zbuf is reused: Send has copied the message out.
					if m.Data, m.Zstd = c.zip.Compress(zbuf, buf[:n]); m.Zstd {
						zbuf = m.Data
					}
				}
				c.traffic.putBytes.Add(int64(n))
				c.traffic.putWire.Add(int64(len(m.Data)))
				if err := st.Send(m); err != nil {
					break // The server's reply says why.
				}
				m = &proto.PutMsg{}
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				break
			}
			if rerr != nil {
				return nil, ferry.E(op, p, rerr)
			}
		}
	}
	if m.Path != "" {
		if err := st.Send(m); err != nil && err != io.EOF {
			return nil, c.fail(op, p, err)
		}
	}
	r, err := st.CloseAndRecv()
	if err != nil {
		return nil, c.fail(op, p, err)
	}
	if r.Zstd {
		c.zstdOK.Store(true)
	}
	return proto.FromReply(r), nil
}

// Move implements ferry.Tree.
func (c *Client) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return c.dirCall("remote.Move", from, func() (*proto.DirReply, error) {
		return c.c.Move(ctx, &proto.MoveReq{From: from, To: to})
	})
}

// Link implements ferry.Tree.
func (c *Client) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return c.dirCall("remote.Link", from, func() (*proto.DirReply, error) {
		return c.c.Link(ctx, &proto.MoveReq{From: from, To: to})
	})
}

// Remove implements ferry.Tree.
func (c *Client) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	return c.emptyCall("remote.Remove", p, func() (*proto.Empty, error) {
		return c.c.Remove(ctx, &proto.PathReq{Path: p})
	})
}

// RemoveAll implements ferry.Tree.
func (c *Client) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	return c.emptyCall("remote.RemoveAll", p, func() (*proto.Empty, error) {
		return c.c.RemoveAll(ctx, &proto.PathReq{Path: p})
	})
}

// Wstat implements ferry.Tree.
func (c *Client) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	return c.dirCall("remote.Wstat", p, func() (*proto.DirReply, error) {
		return c.c.Wstat(ctx, &proto.WstatReq{Path: p, Dir: proto.FromDir(d)})
	})
}

// Find implements ferry.Finder: one call streams the whole walk.
func (c *Client) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	return c.find(ctx, "remote.Find", p, pred, c.c.Find)
}

// FindGet implements ferry.Finder: one call streams the walk and the data.
func (c *Client) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	return c.find(ctx, "remote.FindGet", p, pred, c.bulk.FindGet)
}

type findCall func(context.Context, *proto.FindReq, ...grpc.CallOption) (grpc.ServerStreamingClient[proto.FindReply], error)

func (c *Client) find(ctx context.Context, op, p, pred string, call findCall) *ferry.Stream[ferry.Entry] {
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		st, err := call(ctx, &proto.FindReq{Path: p, Pred: pred, Zstd: c.zip != nil, Omit: c.findOmit})
		if err != nil {
			return c.fail(op, p, err)
		}
		for {
			m, err := st.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return c.fail(op, p, err)
			}
			es, err := proto.UnpackFind(m, c.zip)
			if err != nil {
				return ferry.E(op, p, err)
			}
			if m.Zstd {
				// A server that compresses accepts compressed data
				// too: a sync that begins with a Find then sends its
				// many Puts compressed from the first.
				c.zstdOK.Store(true)
			}
			var data int64
			for _, e := range es {
				data += int64(len(e.Data))
				if err := send(e); err != nil {
					return err
				}
			}
			if data > 0 {
				// A FindGet's files count as got, and what carried
				// them (with their entries) as their wire bytes.
				c.traffic.getBytes.Add(data)
				c.traffic.getWire.Add(int64(len(m.Batch) + len(m.Data)))
			}
		}
	})
}
