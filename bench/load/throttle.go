package main

import (
	"net"
	"sync"
	"time"
)

// pacer spaces reads so that they average at most rate bytes per second,
// with bursts of up to burst bytes. It keeps a theoretical arrival time, as
// the generic cell rate algorithm does: the time at which the bytes read so
// far would have arrived at exactly the rate. A read may start once that
// time is less than one burst ahead of the clock; reading n bytes moves it
// n/rate further. After an idle spell it restarts from the clock, so idle
// time is never saved up beyond one burst.
type pacer struct {
	rate  float64 // bytes per second
	burst int
	tat   time.Time
}

// newPacer returns a pacer of bitsPerSecond with bursts of burst bytes.
func newPacer(bitsPerSecond int64, burst int) *pacer {
	return &pacer{rate: float64(bitsPerSecond) / 8, burst: burst}
}

// wait returns how long a read must wait at now before it may start.
func (p *pacer) wait(now time.Time) time.Duration {
	if !p.tat.After(now) {
		// Also the zero tat: its distance to now saturates, and
		// subtracting slack from that would wrap around.
		return 0
	}
	slack := time.Duration(float64(p.burst) / p.rate * float64(time.Second))
	return max(p.tat.Sub(now)-slack, 0)
}

// took accounts n bytes read at now.
func (p *pacer) took(now time.Time, n int) {
	if p.tat.Before(now) {
		p.tat = now
	}
	p.tat = p.tat.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
}

// throttledConn is a net.Conn whose reads are paced, so that the kernel's
// receive buffer fills and the sender's TCP sees a slow receiver: a client
// on a slow last mile, without slowing the emulated link for everyone.
// Writes are not paced.
type throttledConn struct {
	net.Conn
	mu     sync.Mutex
	p      *pacer
	closed chan struct{}
	once   sync.Once
}

func newThrottledConn(c net.Conn, bitsPerSecond int64, burst int) *throttledConn {
	return &throttledConn{Conn: c, p: newPacer(bitsPerSecond, burst), closed: make(chan struct{})}
}

// Read waits for the pacer, then reads at most one burst. Close
// interrupts the wait.
func (c *throttledConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	d := c.p.wait(time.Now())
	c.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.closed:
			t.Stop()
			return 0, net.ErrClosed
		}
	}
	if len(b) > c.p.burst {
		b = b[:c.p.burst]
	}
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.p.took(time.Now(), n)
	c.mu.Unlock()
	return n, err
}

func (c *throttledConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
