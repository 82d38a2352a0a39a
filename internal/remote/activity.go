package remote

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// activity records when a connection last received bytes, so that a call
// can tell a silent link from a slow one.
type activity struct {
	last atomic.Int64 // Unix nanoseconds.
}

// dialer returns dial with its connections' reads recorded in a.
func (a *activity) dialer(dial func(context.Context, string) (net.Conn, error)) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		a.last.Store(time.Now().UnixNano())
		return &activeConn{Conn: c, a: a}, nil
	}
}

type activeConn struct {
	net.Conn
	a *activity
}

func (c *activeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.a.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// watch calls stalled once the connection has received nothing for bound
// since watch began, unless the returned stop is called first. It costs a
// timer, not a goroutine: it runs on every wait of every call.
func (a *activity) watch(bound time.Duration, stalled func()) (stop func()) {
	began := time.Now().UnixNano()
	var mu sync.Mutex
	done := false
	var t *time.Timer
	// t is set under mu, which the timer's function takes before it
	// reads t: under load the timer can fire before AfterFunc returns.
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(bound, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		idle := time.Duration(time.Now().UnixNano() - max(began, a.last.Load()))
		if idle < bound {
			t.Reset(bound - idle)
			return
		}
		done = true
		stalled()
	})
	return func() {
		mu.Lock()
		done = true
		mu.Unlock()
		t.Stop()
	}
}
