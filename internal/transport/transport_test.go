package transport

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSocketsAreTuned: both ends of a connection get BBR where the kernel
// has it, and the NOTSENT_LOWAT bound; TCP_INFO is read back.
func TestSocketsAreTuned(t *testing.T) {
	ctx := context.Background()
	l, err := Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			checkTuned(t, "accepted", c)
			io.Copy(io.Discard, c)
			c.Close()
		}
		accepted <- err
	}()
	c, err := Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	checkTuned(t, "dialed", c)
	if _, err := c.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	info, err := ConnInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	// Write returns once the kernel holds the bytes, so part of the
	// megabyte may still wait unsent; together they account for all of it.
	if info.BytesSent+info.NotSent < 1<<20 || info.RTT <= 0 {
		t.Errorf("after writing 1 MiB, ConnInfo = %v; want sent+notsent >= 1 MiB and a round trip", info)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
}

func checkTuned(t *testing.T, what string, c net.Conn) {
	t.Helper()
	want := Congestion
	avail, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if !strings.Contains(string(avail), Congestion) {
		def, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		want = strings.TrimSpace(string(def))
	}
	info, err := ConnInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	if info.Congestion != want {
		t.Errorf("%s connection uses %q, want %q", what, info.Congestion, want)
	}
	raw, _ := c.(*net.TCPConn).SyscallConn()
	raw.Control(func(fd uintptr) {
		v, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT)
		if err != nil || v != NotSentLowat {
			t.Errorf("%s connection: NOTSENT_LOWAT = %d, %v; want %d", what, v, err, NotSentLowat)
		}
	})
}
