package netem_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/netem/netemtest"
)

// These tests check the emulator against its configuration with tolerances.
// They need root, /dev/net/tun and ip netns (see netemtest.ForTest) and
// send traffic only between the two namespaces of their own bed.

// listen opens a TCP listener on the server side of b.
func listen(t *testing.T, b *netem.Bed) (net.Listener, string) {
	t.Helper()
	l, err := b.Listen(b.ServerNS, "tcp", netip.AddrPortFrom(b.ServerAddr, 0).String())
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().String()
}

func TestRoundTrip(t *testing.T) {
	for _, oneWay := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(oneWay.String(), func(t *testing.T) {
			b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: oneWay}, Down: netem.Link{Delay: oneWay}})
			l, addr := listen(t, b)
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				io.Copy(c, c) // echo
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			c, err := b.Dial(ctx, b.ClientNS, "tcp", addr)
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer c.Close()
			connect := time.Since(start)
			const n = 15
			var rtts []time.Duration
			buf := make([]byte, 16)
			for range n {
				start := time.Now()
				if _, err := c.Write(buf); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					t.Fatal(err)
				}
				rtts = append(rtts, time.Since(start))
			}
			slices.Sort(rtts)
			want := 2 * oneWay
			med := rtts[n/2]
			t.Logf("want %v: connect %v, ping-pong min %v median %v max %v", want, connect, rtts[0], med, rtts[n-1])
			// Never faster than the configured delay; at most a couple of
			// milliseconds of scheduling late.
			if rtts[0] < want-200*time.Microsecond {
				t.Errorf("fastest round trip %v is shorter than the configured %v", rtts[0], want)
			}
			if med > want+3*time.Millisecond {
				t.Errorf("median round trip %v, want %v within 3ms", med, want)
			}
			if connect < want-200*time.Microsecond || connect > want+20*time.Millisecond {
				t.Errorf("connect took %v, want about %v", connect, want)
			}
		})
	}
}

// udpFlow sends n numbered datagrams of size bytes from the client to the
// server side of b, gap apart (or, with gap 0, in bursts of 50 a
// millisecond apart), and returns the sequence numbers
// received in arrival order and the one-way delay of each.
func udpFlow(t *testing.T, b *netem.Bed, n, size int, gap time.Duration) (seqs []uint32, delays []time.Duration) {
	t.Helper()
	srv, err := b.ListenPacket(b.ServerNS, "udp", netip.AddrPortFrom(b.ServerAddr, 0).String())
	if err != nil {
		t.Fatalf("ListenPacket: %v", err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := b.Dial(ctx, b.ClientNS, "udp", srv.LocalAddr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer cli.Close()

	// Both ends live in this process, so one monotonic clock serves both:
	// the sender writes the time since origin into each datagram.
	origin := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			srv.SetReadDeadline(time.Now().Add(time.Second))
			m, _, err := srv.ReadFrom(buf)
			if err != nil {
				return // quiet for a second: the flow is over
			}
			if m < 12 {
				continue
			}
			sent := time.Duration(binary.BigEndian.Uint64(buf[4:12]))
			seqs = append(seqs, binary.BigEndian.Uint32(buf[:4]))
			delays = append(delays, time.Since(origin)-sent)
		}
	}()
	buf := make([]byte, size)
	for i := range n {
		binary.BigEndian.PutUint32(buf[:4], uint32(i))
		binary.BigEndian.PutUint64(buf[4:12], uint64(time.Since(origin)))
		if _, err := cli.Write(buf); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if gap > 0 {
			time.Sleep(gap)
		} else if i%50 == 49 {
			time.Sleep(time.Millisecond) // stay below the receiver's buffer
		}
	}
	wg.Wait()
	return seqs, delays
}

func TestLoss(t *testing.T) {
	const (
		n    = 5000
		loss = 0.2
	)
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Loss: loss}})
	seqs, _ := udpFlow(t, b, n, 100, 0)
	up, down := b.Stats()
	// The number received is binomial: mean n(1-loss), deviation
	// sqrt(n loss (1-loss)) = 28. Five deviations either way.
	mean, sd := n*(1-loss), math.Sqrt(n*loss*(1-loss))
	t.Logf("received %d of %d (%.2f%% lost); up: %v; down: %v", len(seqs), n, 100*float64(n-len(seqs))/n, up, down)
	if math.Abs(float64(len(seqs))-mean) > 5*sd {
		t.Errorf("received %d of %d, want %.0f ± %.0f", len(seqs), n, mean, 5*sd)
	}
	if up.LossPackets+int64(len(seqs)) < n {
		t.Errorf("lost %d and received %d, fewer than the %d sent: loss not where it is counted", up.LossPackets, len(seqs), n)
	}
	if down.LossPackets != 0 {
		t.Errorf("down direction lost %d packets, configured lossless", down.LossPackets)
	}
}

func TestJitterKeepsOrder(t *testing.T) {
	const (
		delay  = 10 * time.Millisecond
		jitter = 5 * time.Millisecond
	)
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: delay, Jitter: jitter}})
	// Datagrams more than twice the jitter apart do not hold each other
	// up, so their delays spread over the whole range.
	const n = 150
	seqs, delays := udpFlow(t, b, n, 100, 2*jitter+2*time.Millisecond)
	if len(seqs) != n {
		t.Fatalf("received %d of %d datagrams on a lossless link", len(seqs), n)
	}
	if !slices.IsSorted(seqs) {
		t.Errorf("datagrams reordered")
	}
	slices.Sort(delays)
	lo, p10, p90, hi := delays[0], delays[n/10], delays[n*9/10], delays[n-1]
	t.Logf("one-way delay min %v p10 %v p90 %v max %v", lo, p10, p90, hi)
	if lo < delay-jitter-200*time.Microsecond || hi > delay+jitter+5*time.Millisecond {
		t.Errorf("delays span %v..%v, want within %v±%v", lo, hi, delay, jitter)
	}
	if p90-p10 < jitter {
		t.Errorf("p10..p90 spread %v, want at least %v: jitter not applied", p90-p10, jitter)
	}
}

func TestSet(t *testing.T) {
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: 5 * time.Millisecond}})
	_, before := udpFlow(t, b, 50, 100, 0)
	b.Set(netem.Config{Up: netem.Link{Delay: 30 * time.Millisecond}})
	if got := b.Config().Up.Delay; got != 30*time.Millisecond {
		t.Errorf("Config().Up.Delay = %v after Set, want 30ms", got)
	}
	_, after := udpFlow(t, b, 50, 100, 0)
	slices.Sort(before)
	slices.Sort(after)
	t.Logf("median one-way delay %v before, %v after", before[len(before)/2], after[len(after)/2])
	if m := before[len(before)/2]; m < 5*time.Millisecond || m > 8*time.Millisecond {
		t.Errorf("median delay before Set %v, want about 5ms", m)
	}
	if m := after[len(after)/2]; m < 30*time.Millisecond || m > 33*time.Millisecond {
		t.Errorf("median delay after Set %v, want about 30ms", m)
	}
}

func TestRate(t *testing.T) {
	const rate = 20_000_000
	b := netemtest.ForTest(t, netem.Symmetric(20*time.Millisecond, rate, 0))
	t.Logf("congestion control: %s", b.CongestionControl)
	l, addr := listen(t, b)

	type sample struct {
		at    time.Time
		bytes int64
		wire  netem.Stats
	}
	var mu sync.Mutex
	var received int64
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1<<16)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			received += int64(n)
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	snap := func() sample {
		up, _ := b.Stats()
		mu.Lock()
		defer mu.Unlock()
		return sample{time.Now(), received, up}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.Dial(ctx, b.ClientNS, "tcp", addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	stop := make(chan struct{})
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<16)
		for {
			select {
			case <-stop:
				sendErr <- nil
				return
			default:
			}
			if _, err := c.Write(buf); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	// Skip a second of start-up, then measure for two.
	time.Sleep(time.Second)
	s0 := snap()
	time.Sleep(2 * time.Second)
	s1 := snap()
	close(stop)
	c.SetWriteDeadline(time.Now())
	if err := <-sendErr; err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("send: %v", err)
	}
	secs := s1.at.Sub(s0.at).Seconds()
	good := float64(s1.bytes-s0.bytes) * 8 / secs
	w := s1.wire.Sub(s0.wire)
	wire := float64(w.Bytes) * 8 / secs
	t.Logf("rate %d bit/s: goodput %.2f Mbit/s, on the wire %.2f Mbit/s, %d packets dropped by the queue", rate, good/1e6, wire/1e6, w.QueuePackets)
	if wire > 1.02*rate || wire < 0.9*rate {
		t.Errorf("wire rate %.2f Mbit/s, want %.2f Mbit/s within -10%%/+2%%", wire/1e6, float64(rate)/1e6)
	}
	if good > rate || good < 0.85*rate {
		t.Errorf("goodput %.2f Mbit/s, want 85-100%% of %.2f Mbit/s", good/1e6, float64(rate)/1e6)
	}
}

func TestCommandAndClose(t *testing.T) {
	if err := netem.Available(); err != nil {
		netemtest.ForTest(t, netem.Config{}) // skips or fails as appropriate
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := netem.New(ctx, netem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out, err := b.Command(ctx, b.ClientNS, "ip", "-o", "-4", "addr", "show", "dev", "wan0").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in %s: %v: %s", b.ClientNS, err, out)
	}
	if !strings.Contains(string(out), b.ClientAddr.String()+" peer "+b.ServerAddr.String()) {
		t.Errorf("client namespace wan0: %s; want %v peer %v", out, b.ClientAddr, b.ServerAddr)
	}
	// A process left running in the bed is killed by Close.
	sleeper := b.Command(context.Background(), b.ServerNS, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()

	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		sleeper.Process.Kill()
		t.Errorf("process in the server namespace survived Close")
	}
	for _, ns := range []string{b.ClientNS, b.ServerNS} {
		if _, err := os.Stat(netem.NSPath(ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still exists after Close (stat: %v)", ns, err)
		}
	}
}

func TestSweep(t *testing.T) {
	netemtest.ForTest(t, netem.Config{}) // skips or fails where beds cannot run
	// A pid above the kernel's maximum belongs to no process.
	stale := "ferry-4194399-0-cli"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", stale).Run() })
	netem.Sweep(ctx)
	if _, err := os.Stat(netem.NSPath(stale)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale namespace %s survived Sweep (stat: %v)", stale, err)
	}
}
