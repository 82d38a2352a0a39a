package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
)

// session names one Client to the server in every call, so that its own
// changes do not break its own lease (proto.SessionHeader).
type session string

func newSession() session { return session(randomID()) }

// randomID returns 128 random bits in hex: a name no other client draws
// (a session, a resumable upload, a group of changes).
func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s session) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{proto.SessionHeader: string(s)}, nil
}

func (s session) RequireTransportSecurity() bool { return true }

// Watch implements ferry.Watcher with the server's Lease call: the stream
// is the lease, and events for changes other clients made through the
// server carry an Ack their writers wait for. The stream ends with an
// error when the lease runs out (the server stopped granting renewals, or
// the link is silent), a little before the server stops waiting for it.
// A server that predates leases gets a plain Watch.
func (c *Client) Watch(ctx context.Context, p string) *ferry.Stream[ferry.Event] {
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Event) error) error {
		err := c.lease(ctx, p, send)
		if status.Code(err) == codes.Unimplemented {
			return c.watch(ctx, p, send)
		}
		return err
	})
}

// leaseMargin is how much earlier than its lease the client stops trusting
// it, for the time the end takes to reach the cache.
func leaseMargin(lease time.Duration) time.Duration { return lease / 10 }

func (c *Client) lease(ctx context.Context, p string, send func(ferry.Event) error) error {
	const op = "remote.Watch"
	// The stream outlives ctx by a little: a watch that ends gives its
	// lease up (CloseSend) rather than leaving the server to wait it out.
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	// Until the lease is given, a cancelled ctx cuts the stream.
	setup := context.AfterFunc(ctx, func() { cancel(ctx.Err()) })
	st, err := c.c.Lease(sctx)
	if err != nil {
		setup()
		return c.fail(op, p, err)
	}
	began := time.Now()
	if err := st.Send(&proto.LeaseMsg{Path: p}); err != nil {
		setup()
		return c.fail(op, p, err)
	}
	first, err := st.Recv()
	if !setup() {
		return ferry.E(op, p, ferry.KindCanceled, ctx.Err())
	}
	if status.Code(err) == codes.Unimplemented {
		return err
	}
	if err != nil {
		return c.fail(op, p, err)
	}
	lease := time.Duration(first.LeaseMs) * time.Millisecond
	if lease <= 0 {
		return ferry.E(op, p, ferry.KindInvalid, "the server gave no lease time")
	}
	c.owners.Store(first.Owners)

	var mu sync.Mutex
	expiry := began.Add(lease)
	sent := map[uint64]time.Time{} // Renewals not yet granted, by number.
	out := make(chan *proto.LeaseMsg, 64)
	ls := &leaseStream{root: p, out: out, ctx: sctx, replies: map[uint64]*writeReq{}}
	c.leaseMu.Lock()
	if c.leases == nil {
		c.leases = map[*leaseStream]struct{}{}
	}
	c.leases[ls] = struct{}{}
	c.leaseMu.Unlock()
	defer func() {
		c.leaseMu.Lock()
		delete(c.leases, ls)
		c.leaseMu.Unlock()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	wg.Add(1)
	go func() {
		// One goroutine sends: renewals, and the acks the cache gives.
		defer wg.Done()
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		var seq uint64
		for {
			var m *proto.LeaseMsg
			select {
			case m = <-out:
			case <-tick.C:
				seq++
				mu.Lock()
				sent[seq] = time.Now()
				mu.Unlock()
				m = &proto.LeaseMsg{Renew: seq}
			case <-ctx.Done():
				// The server ends the stream once it has the end of
				// this side; a server that does not answer is cut.
				st.CloseSend()
				select {
				case <-sctx.Done():
				case <-time.After(time.Second):
					cancel(ctx.Err())
				}
				return
			case <-sctx.Done():
				return
			}
			if st.Send(m) != nil {
				return
			}
		}
	}()
	wg.Add(1)
	go func() {
		// The lease ends at expiry, less a margin, unless renewed.
		defer wg.Done()
		for {
			mu.Lock()
			left := time.Until(expiry) - leaseMargin(lease)
			mu.Unlock()
			if left <= 0 {
				cancel(ferry.E(op, p, ferry.KindUnavailable, "the lease ran out: the server did not renew it in time"))
				return
			}
			select {
			case <-time.After(left):
			case <-sctx.Done():
				return
			}
		}
	}()
	for {
		m, err := st.Recv()
		if err != nil && ctx.Err() != nil {
			return ferry.E(op, p, ferry.KindCanceled, ctx.Err())
		}
		if cause := context.Cause(sctx); err != nil && cause != nil && ferry.KindOf(cause) == ferry.KindUnavailable {
			return cause
		}
		if err == io.EOF {
			return ferry.E(op, p, ferry.KindUnavailable, "the server ended the watch")
		}
		if err != nil {
			return c.fail(op, p, err)
		}
		if m.Renewed != 0 {
			mu.Lock()
			if t, ok := sent[m.Renewed]; ok {
				expiry = t.Add(lease)
				for n := range sent {
					if n <= m.Renewed {
						delete(sent, n)
					}
				}
			}
			mu.Unlock()
			continue
		}
		if m.WriteReply != 0 {
			ls.reply(m.WriteReply, m.WriteGranted, m.WriteShallow)
			continue
		}
		if m.Recall {
			// A recall that overtook the answer to a request for the
			// same lease ends it before it is given.
			ls.revoke(m.Path)
		}
		ev := ferry.Event{Path: m.Path, Lost: m.Lost, Recall: m.Recall}
		if m.Brk != 0 {
			brk := m.Brk
			var once sync.Once
			ev.Ack = func() {
				once.Do(func() {
					select {
					case out <- &proto.LeaseMsg{Ack: brk}:
					case <-sctx.Done():
					}
				})
			}
		}
		if err := send(ev); err != nil {
			if ctx.Err() != nil {
				// The consumer is gone: the sender gives the lease up,
				// and what comes until the server ends the stream is
				// dropped. Cutting the stream here instead would leave
				// the server to wait the lease out, and others' calls
				// to wait for its breaks.
				continue
			}
			return err
		}
	}
}

// leaseStream is a Lease stream in progress, as WriteLease finds it.
type leaseStream struct {
	root string
	out  chan<- *proto.LeaseMsg
	ctx  context.Context // Ends with the stream.

	mu      sync.Mutex
	seq     uint64
	replies map[uint64]*writeReq // Write lease requests not yet answered.
}

// writeReq is a write lease request waiting for its answer.
type writeReq struct {
	path    string
	ch      chan ferry.WriteGrant
	revoked bool // Recalled before it was answered.
}

// reply delivers the server's answer to write lease request n.
func (ls *leaseStream) reply(n uint64, granted, shallow bool) {
	ls.mu.Lock()
	r := ls.replies[n]
	delete(ls.replies, n)
	ls.mu.Unlock()
	if r == nil {
		return
	}
	switch {
	case !granted || r.revoked:
		r.ch <- ferry.WriteRefused
	case shallow:
		r.ch <- ferry.WriteShallow
	default:
		r.ch <- ferry.WriteDeep
	}
}

// revoke marks the requests for a write lease over p as recalled.
func (ls *leaseStream) revoke(p string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, r := range ls.replies {
		if r.path == p {
			r.revoked = true
		}
	}
}

// stream returns the Lease stream in progress whose root is p or above it.
func (c *Client) stream(p string) *leaseStream {
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	for ls := range c.leases {
		if ferry.HasPrefix(p, ls.root) && ls.ctx.Err() == nil {
			return ls
		}
	}
	return nil
}

// WriteLease implements ferry.WriteLeaser on the Lease stream of a Watch
// of a path at or above p: without one, or from a server without write
// leases (which never answers the request; it is given up after the
// client's call bound), no lease is given.
func (c *Client) WriteLease(ctx context.Context, p string) (ferry.WriteGrant, error) {
	const op = "remote.WriteLease"
	p, err := ferry.CleanPath(p)
	if err != nil {
		return ferry.WriteRefused, err
	}
	ls := c.stream(p)
	if ls == nil {
		return ferry.WriteRefused, nil
	}
	ch := make(chan ferry.WriteGrant, 1)
	ls.mu.Lock()
	ls.seq++
	n := ls.seq
	ls.replies[n] = &writeReq{path: p, ch: ch}
	ls.mu.Unlock()
	defer func() {
		ls.mu.Lock()
		delete(ls.replies, n)
		ls.mu.Unlock()
	}()
	select {
	case ls.out <- &proto.LeaseMsg{WriteReq: n, WritePath: p}:
	case <-ls.ctx.Done():
		return ferry.WriteRefused, nil
	case <-ctx.Done():
		return ferry.WriteRefused, ferry.E(op, p, ferry.KindCanceled, ctx.Err())
	}
	bound := time.NewTimer(c.resumeFor)
	defer bound.Stop()
	select {
	case grant := <-ch:
		return grant, nil
	case <-ls.ctx.Done():
		return ferry.WriteRefused, nil
	case <-bound.C:
		return ferry.WriteRefused, ferry.E(op, p, ferry.KindUnavailable, "no answer from the server")
	case <-ctx.Done():
		return ferry.WriteRefused, ferry.E(op, p, ferry.KindCanceled, ctx.Err())
	}
}

// SetsOwners reports whether the server said, on the client's last Lease
// stream, that it gives files to other owners when asked.
func (c *Client) SetsOwners() bool { return c.owners.Load() }

// ReleaseWrite implements ferry.WriteLeaser.
func (c *Client) ReleaseWrite(ctx context.Context, p string) error {
	p, err := ferry.CleanPath(p)
	if err != nil {
		return err
	}
	ls := c.stream(p)
	if ls == nil {
		return nil // The lease ended with its stream.
	}
	select {
	case ls.out <- &proto.LeaseMsg{ReleaseWrite: p}:
	case <-ls.ctx.Done():
	case <-ctx.Done():
		return ferry.E("remote.ReleaseWrite", p, ferry.KindCanceled, ctx.Err())
	}
	return nil
}

// watch is Watch for a server without leases.
func (c *Client) watch(ctx context.Context, p string, send func(ferry.Event) error) error {
	const op = "remote.Watch"
	st, err := c.c.Watch(ctx, &proto.PathReq{Path: p})
	if err != nil {
		return c.fail(op, p, err)
	}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return ferry.E(op, p, ferry.KindUnavailable, "the server ended the watch")
		}
		if err != nil {
			return c.fail(op, p, err)
		}
		if err := send(ferry.Event{Path: m.Path, Lost: m.Lost}); err != nil {
			return err
		}
	}
}
