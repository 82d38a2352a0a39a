// Package transport tunes Ferry's TCP sockets for long, lossy links and reads
// back what the kernel measures of them.
//
// Every socket asks for BBR, a rate-based congestion controller that keeps a
// lossy long link full where loss-based cubic collapses (measured here: at
// 100 ms and 1% loss, 87 Mbit/s against under 2). Every socket also sets
// TCP_NOTSENT_LOWAT, so the kernel holds only a little data that is not yet
// sent: the rest waits in the application, where a small call can overtake a
// bulk transfer instead of queueing behind seconds of it, and the writer is
// woken only when the socket can take a useful amount.
package transport

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/mem"
)

// Congestion is the congestion controller every socket asks for. Where the
// kernel lacks it the socket keeps the system's default; Info says which one
// a connection got.
const Congestion = "bbr"

// NotSentLowat bounds the data a socket holds unsent. It must cover what the
// link drains while the writer wakes up and refills it: 256 KiB is 2 ms at
// 1 Gbit/s, ample for a goroutine's wake-up, and small enough that a call
// queued behind it waits 20 ms at 100 Mbit/s.
const NotSentLowat = 256 << 10

// tune sets the socket options on a raw socket. Failures are not errors: a
// socket without BBR or NOTSENT_LOWAT still works, only less well, and Info
// tells which it got.
func tune(c syscall.RawConn) error {
	return c.Control(func(fd uintptr) {
		unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, Congestion)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, NotSentLowat)
	})
}

// Listen listens on a TCP address; accepted connections are tuned.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return tunedListener{l}, nil
}

// tunedListener tunes each accepted socket itself: an accepted socket
// inherits the listener's congestion controller but not NOTSENT_LOWAT.
type tunedListener struct{ net.Listener }

func (l tunedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			tune(raw)
		}
	}
	return c, nil
}

// Dial connects to a TCP address with a tuned socket.
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{
		Control:   func(_, _ string, c syscall.RawConn) error { return tune(c) },
		KeepAlive: 15 * time.Second,
	}
	return d.DialContext(ctx, "tcp", addr)
}

// Info is what the kernel measures of a connection.
type Info struct {
	Congestion   string        // Congestion is the controller in use.
	RTT          time.Duration // RTT is the smoothed round trip.
	MinRTT       time.Duration // MinRTT is the least round trip seen.
	DeliveryRate int64         // DeliveryRate is the recent delivery rate in bytes per second.
	NotSent      int64         // NotSent is the bytes written but not yet sent.
	BytesSent    int64         // BytesSent counts bytes sent, retransmissions included.
	BytesRecv    int64         // BytesRecv counts bytes received.
	Retrans      int64         // Retrans counts retransmitted segments.
	Cwnd         int64         // Cwnd is the congestion window in segments.
	SendWindow   int64         // SendWindow is the window the peer last advertised, in bytes.
	// Busy is how long the connection has had data in flight; RwndLimited
	// and SndbufLimited are the parts of it when sending was held back by
	// the peer's receive window and by this socket's send buffer. (The
	// rest is the congestion window's, or the application's.)
	Busy, RwndLimited, SndbufLimited time.Duration
}

// BDP returns the bandwidth-delay product the kernel has measured: what the
// link holds in flight. It is 0 until there is a measurement.
func (i Info) BDP() int64 {
	return int64(float64(i.DeliveryRate) * i.MinRTT.Seconds())
}

func (i Info) String() string {
	return fmt.Sprintf("cc=%s rtt=%v minrtt=%v rate=%.1fMbit/s notsent=%d sent=%d recv=%d retrans=%d cwnd=%d sndwnd=%d busy=%v rwnd_limited=%v sndbuf_limited=%v",
		i.Congestion, i.RTT.Round(time.Microsecond), i.MinRTT.Round(time.Microsecond),
		float64(i.DeliveryRate)*8/1e6, i.NotSent, i.BytesSent, i.BytesRecv, i.Retrans,
		i.Cwnd, i.SendWindow, i.Busy.Round(time.Millisecond), i.RwndLimited.Round(time.Millisecond), i.SndbufLimited.Round(time.Millisecond))
}

// ConnInfo reads the kernel's measurements of a TCP connection.
func ConnInfo(c net.Conn) (Info, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return Info{}, fmt.Errorf("transport: %T is not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Info{}, err
	}
	var info Info
	var serr error
	err = raw.Control(func(fd uintptr) {
		ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			serr = err
			return
		}
		info = Info{
			RTT:          time.Duration(ti.Rtt) * time.Microsecond,
			MinRTT:       time.Duration(ti.Min_rtt) * time.Microsecond,
			DeliveryRate: int64(ti.Delivery_rate),
			NotSent:      int64(ti.Notsent_bytes),
			BytesSent:    int64(ti.Bytes_sent),
			BytesRecv:    int64(ti.Bytes_received),
			Retrans:      int64(ti.Total_retrans),
			Cwnd:         int64(ti.Snd_cwnd),
			SendWindow:   int64(ti.Snd_wnd),
			// The kernel counts these in microseconds.
			Busy:          time.Duration(ti.Busy_time) * time.Microsecond,
			RwndLimited:   time.Duration(ti.Rwnd_limited) * time.Microsecond,
			SndbufLimited: time.Duration(ti.Sndbuf_limited) * time.Microsecond,
		}
		info.Congestion, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	})
	if err == nil {
		err = serr
	}
	return info, err
}

// Flow-control windows for gRPC. gRPC-go starts its windows at 64 KiB and
// doubles them about once per round trip, which costs 3-15% of a 64 MiB
// transfer at 100 ms and keeps BBR in its start-up mode; a static window
// turns that estimator off. NOTSENT_LOWAT keeps the large window from
// piling data unsent in the kernel, where other calls would wait behind it.
//
// The window must cover what BBR puts in flight, not just the
// bandwidth-delay product: in start-up BBR sends at 2.89 times the rate it
// has measured until the link's queue overflows, so the data in flight
// reaches the BDP plus a full queue (at the netem bed's queue of 1.5 BDP,
// 2.5 BDP, and a round trip of 200 ms becomes 500 ms), and the receiver
// returns window only after a quarter of it is read. A window short of
// that stalls the sender each round trip; the socket then runs dry, BBR
// marks its samples application-limited, never sees the bandwidth stop
// growing, and stays in start-up for the whole transfer, overfilling the
// queue. Measured (single runs) with an 8 MiB stream window, `ferry get` of 128 MiB at
// 100 Mbit/s and 200 ms stayed in start-up and retransmitted 10% of the
// bytes (14.6 s, and 30 s at 1% loss); with 32 MiB it leaves start-up after
// about 2 s, retransmits 2% (13.8 s; 15.1 s at 1% loss). StreamWindow is
// about four times the BDP of 100 Mbit/s at 600 ms, ConnWindow two full
// streams. They bound what a peer may send ahead of a reader that is not
// reading, per stream and per connection.
const (
	StreamWindow = 32 << 20
	ConnWindow   = 64 << 20
	// WriteBuffer is gRPC's read and write buffer: large writes mean few
	// system calls on fast links.
	WriteBuffer = 256 << 10
)

// BufferPool is the pool gRPC encodes (Codec) and receives messages in, on
// both ends: gRPC's default tiers are 256 B, 4, 16 and 32 KiB and 1 MiB,
// so a file message of up to proto.SendData (just under 256 KiB) took a
// 1 MiB buffer, held while the message waits for a slow receiver's socket.
// This one adds a 256 KiB tier. A server and 200 clients in one process
// (190 reading at 1 Mbit/s over loopback, downloads of 32 MiB) held 1,221
// MB of heap after GC, 399 MB of it in 1 MiB encoding buffers; with this
// pool and Codec, 810 MB.
var BufferPool = mustPool(mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 18, 20))

func mustPool(p mem.BufferPool, err error) mem.BufferPool {
	if err != nil {
		panic(err) // Only invalid exponents fail.
	}
	return p
}
