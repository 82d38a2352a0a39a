package remote

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/ferryfs/ferry"
)

// awaitReady waits, before a call starts, while the connection cc cannot
// carry it: a server restarting or a link that broke is waited for, up to
// ResumeFor and the call's own deadline, instead of failing the call at
// once (gRPC fails a call at once while it is between two attempts to
// reconnect). A handshake that failed fails the call at once with its
// reason, and so does a server never reached: a command pointed at the
// wrong address should say so, not wait. After the wait the call runs and
// fails, if it does, as it would have.
func (c *Client) awaitReady(ctx context.Context, cc *grpc.ClientConn) error {
	s := cc.GetState()
	if s == connectivity.Ready {
		c.connected.Store(true)
		return nil
	}
	if !c.connected.Load() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, c.resumeFor)
	defer cancel()
	for {
		switch s {
		case connectivity.Ready, connectivity.Shutdown:
			return nil
		case connectivity.Idle:
			cc.Connect()
		case connectivity.TransientFailure:
			if herr := c.handshakeErr.Load(); herr != nil {
				return *herr
			}
		}
		if !cc.WaitForStateChange(wctx, s) {
			return nil
		}
		s = cc.GetState()
	}
}

// readyUnary and readyStream make every call wait for its connection
// (awaitReady), note the first that gets through, and bound how long a
// call waits on a connection that has gone silent (guard).
func (c *Client) readyUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := c.awaitReady(ctx, cc); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := c.guard(cc, cancel)
	err := g.wait(func() error { return invoker(ctx, method, req, reply, cc, opts...) })
	if err == nil {
		c.connected.Store(true)
	}
	return err
}

func (c *Client) readyStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := c.awaitReady(ctx, cc); err != nil {
		return nil, err
	}
	if !guarded(method) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err == nil {
			c.connected.Store(true)
		}
		return st, err
	}
	ctx, cancel := context.WithCancel(ctx)
	g := c.guard(cc, cancel)
	var st grpc.ClientStream
	err := g.wait(func() (err error) {
		st, err = streamer(ctx, desc, cc, method, opts...)
		return err
	})
	if err != nil {
		cancel()
		return nil, err
	}
	c.connected.Store(true)
	return &guardedStream{ClientStream: st, g: g, cancel: cancel, single: !desc.ServerStreams}, nil
}

// guarded says whether the streams of method are guarded: not the long-lived
// ones, which wait for events by design (Lease, Watch), nor the batched
// puts' stream, idle between puts, nor Get, whose reader guards its
// receives itself and resumes.
func guarded(method string) bool {
	switch path.Base(method) {
	case "Lease", "Watch", "PutChunkedBatch", "Get":
		return false
	}
	return true
}

// callGuard cancels a call that waits for its connection while the
// connection receives nothing for ResumeFor: over a link gone silent the
// connection's keepalive notices only after half a minute, and a command
// must not wait longer than --timeout. A slow link that still delivers
// bytes, however few, is not silent.
type callGuard struct {
	c       *Client
	act     *activity
	cancel  context.CancelFunc
	stalled atomic.Bool
}

func (c *Client) guard(cc *grpc.ClientConn, cancel context.CancelFunc) *callGuard {
	act := c.acts[0]
	for i, b := range c.bulks {
		if b == cc {
			act = c.acts[1+i]
		}
	}
	return &callGuard{c: c, act: act, cancel: cancel}
}

// wait runs fn, which waits for the server, under the guard, and turns the
// cancellation of a stalled call into the error that says why.
func (g *callGuard) wait(fn func() error) error {
	stop := g.act.watch(g.c.resumeFor, func() {
		g.stalled.Store(true)
		g.cancel()
	})
	err := fn()
	stop()
	if err != nil && g.stalled.Load() {
		err = ferry.E("", "", ferry.KindUnavailable, fmt.Errorf("%w for %v", errStalled, g.c.resumeFor))
	}
	return err
}

// errStalled is the reason of a call that a guard cancelled. Such a call
// has waited its bound already, so it is not made again (rideOut).
var errStalled = errors.New("nothing from the server")

// guardedStream guards each send and receive of a stream: a send waits
// when the server has not returned flow-control window.
type guardedStream struct {
	grpc.ClientStream
	g      *callGuard
	cancel context.CancelFunc
	single bool // One reply: the stream ends with it.
}

func (s *guardedStream) SendMsg(m any) error {
	return s.g.wait(func() error { return s.ClientStream.SendMsg(m) })
}

func (s *guardedStream) RecvMsg(m any) error {
	err := s.g.wait(func() error { return s.ClientStream.RecvMsg(m) })
	if err != nil || s.single {
		s.cancel()
	}
	return err
}
