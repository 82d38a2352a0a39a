package servertest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FreeAddr returns a loopback address nothing listens on: a port the
// kernel gave and took back, for a server the test starts there later,
// or for a refused connection.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// DelayProxy listens on loopback and forwards each connection to target,
// delivering every byte oneWay later in each direction: a link with a round
// trip of 2*oneWay and no bandwidth limit, for counting round trips without
// network namespaces. It stops when the test ends.
func DelayProxy(t testing.TB, target string, oneWay time.Duration) string {
	t.Helper()
	return proxy(t, target, func(dst, src net.Conn, _ bool) { delayCopy(dst, src, oneWay) }).Addr
}

type chunk struct {
	data []byte
	at   time.Time
}

// delayCopy copies src to dst, holding each piece read until d after it was
// read, in order.
func delayCopy(dst, src net.Conn, d time.Duration) {
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	for range q {
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}

// Switch is a proxy to a server that a test can take away and bring back.
type Switch struct {
	Addr  string // Where clients connect.
	mu    sync.Mutex
	down  bool
	conns []net.Conn
	gate  *gate // Holds the bytes of a frozen link.
}

// SwitchProxy listens on loopback and forwards each connection to target
// until the test ends or Down is called.
func SwitchProxy(t testing.TB, target string) *Switch {
	t.Helper()
	g := &gate{}
	g.cond = sync.NewCond(&g.mu)
	sw := proxy(t, target, func(dst, src net.Conn, _ bool) { io.Copy(gatedWriter{dst, g}, src); dst.Close() })
	sw.gate = g
	t.Cleanup(sw.Thaw)
	return sw
}

// Freeze holds every byte in flight either way, on the connections open
// and on new ones, without closing anything: a link gone silent (a cable
// pulled, a route lost) rather than a server gone, which resets.
func (sw *Switch) Freeze() { sw.gate.set(true) }

// Thaw lets the bytes a Freeze held go on.
func (sw *Switch) Thaw() { sw.gate.set(false) }

type gate struct {
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
}

func (g *gate) set(frozen bool) {
	g.mu.Lock()
	g.frozen = frozen
	g.mu.Unlock()
	g.cond.Broadcast()
}

// gatedWriter writes to w once its gate is open.
type gatedWriter struct {
	w io.Writer
	g *gate
}

func (w gatedWriter) Write(b []byte) (int, error) {
	w.g.mu.Lock()
	for w.g.frozen {
		w.g.cond.Wait()
	}
	w.g.mu.Unlock()
	return w.w.Write(b)
}

// proxy listens on loopback and connects each client to target, copying
// each direction with pipe (up is true for client to server), until the
// test ends.
func proxy(t testing.TB, target string, pipe func(dst, src net.Conn, up bool)) *Switch {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sw := &Switch{Addr: l.Addr().String()}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			sw.mu.Lock()
			down := sw.down
			sw.mu.Unlock()
			var s net.Conn
			if !down {
				s, err = net.Dial("tcp", target)
			}
			if down || err != nil {
				c.Close()
				continue
			}
			sw.mu.Lock()
			sw.conns = append(sw.conns, c, s)
			sw.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); pipe(s, c, true) }()
			go func() { defer wg.Done(); pipe(c, s, false) }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		sw.Down()
		wg.Wait()
	})
	return sw
}

// Down breaks every connection and refuses new ones, as a server that went
// away does.
func (sw *Switch) Down() {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.down = true
	for _, c := range sw.conns {
		c.Close()
	}
	sw.conns = nil
}

// Up lets connections through again.
func (sw *Switch) Up() {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.down = false
}

// Counter counts the bytes a CountProxy carried in each direction.
type Counter struct {
	Up, Down atomic.Int64 // Up is client to server; Down server to client.
}

// CountProxy listens on loopback and forwards each connection to target,
// counting the bytes of the TCP streams each way (TLS records and all, not
// the IP and TCP headers), until the test ends.
func CountProxy(t testing.TB, target string) (string, *Counter) {
	t.Helper()
	n := &Counter{}
	sw := proxy(t, target, func(dst, src net.Conn, up bool) {
		c := &n.Down
		if up {
			c = &n.Up
		}
		io.Copy(countingWriter{dst, c}, src)
		dst.Close()
	})
	return sw.Addr, n
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}
