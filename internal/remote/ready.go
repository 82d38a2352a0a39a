package remote

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
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
// (awaitReady), and note the first that gets through.
func (c *Client) readyUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := c.awaitReady(ctx, cc); err != nil {
		return err
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil {
		c.connected.Store(true)
	}
	return err
}

func (c *Client) readyStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := c.awaitReady(ctx, cc); err != nil {
		return nil, err
	}
	st, err := streamer(ctx, desc, cc, method, opts...)
	if err == nil {
		c.connected.Store(true)
	}
	return st, err
}
