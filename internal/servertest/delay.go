package servertest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// DelayProxy listens on loopback and forwards each connection to target,
// delivering every byte oneWay later in each direction: a link with a round
// trip of 2*oneWay and no bandwidth limit, for counting round trips without
// network namespaces. It stops when the test ends.
func DelayProxy(t testing.TB, target string, oneWay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); delayCopy(s, c, oneWay) }()
			go func() { defer wg.Done(); delayCopy(c, s, oneWay) }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
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
