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

func newSession() session {
	var b [16]byte
	rand.Read(b[:])
	return session(hex.EncodeToString(b[:]))
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

	var mu sync.Mutex
	expiry := began.Add(lease)
	sent := map[uint64]time.Time{} // Renewals not yet granted, by number.
	out := make(chan *proto.LeaseMsg, 64)
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
		ev := ferry.Event{Path: m.Path, Lost: m.Lost}
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
			return err
		}
	}
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
