package netem_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/netem/netemtest"
)

// These tests check the emulator against its configuration with tolerances.
// They need root, /dev/net/tun and ip netns (see netemtest.ForTest) and
// send traffic only between the two namespaces of their own bed.
//
// A loaded machine (the tests of other packages run in parallel, some under
// the race detector) delays the emulator and the test's own goroutines, so
// it can only make packets later and transfers slower. A result that is
// early or too fast is therefore a bug and fails at once; one that is late
// or slow is measured again, up to four times in all, and fails only if it
// never comes within tolerance.

// tries is the most times a measurement is made.
const tries = 4

// retry runs measure until it reports no lateness or tries runs are spent,
// then reports the last run's problems as errors. measure reports hard
// failures itself with t.Errorf or t.Fatalf.
func retry(t *testing.T, measure func() (late []string)) {
	t.Helper()
	var late []string
	for i := range tries {
		if late = measure(); len(late) == 0 || t.Failed() {
			return
		}
		t.Logf("attempt %d of %d out of tolerance (a loaded machine?): %s", i+1, tries, strings.Join(late, "; "))
	}
	for _, l := range late {
		t.Error(l)
	}
}

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

// echo sends back what every connection l accepts sends, until l is
// closed.
func echo(l net.Listener) {
	serveEach(l, func(c net.Conn) { io.Copy(c, c) })
}

// serveEach runs serve on every connection l accepts, each on its own
// goroutine and closed after, until l is closed.
func serveEach(l net.Listener, serve func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			serve(c)
		}()
	}
}

func TestRoundTrip(t *testing.T) {
	for _, oneWay := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(oneWay.String(), func(t *testing.T) {
			b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: oneWay}, Down: netem.Link{Delay: oneWay}})
			l, addr := listen(t, b)
			go echo(l)
			want := 2 * oneWay
			const slack = 200 * time.Microsecond // the writer may send this early
			retry(t, func() (late []string) {
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
				med := rtts[n/2]
				t.Logf("want %v: connect %v, ping-pong min %v median %v max %v", want, connect, rtts[0], med, rtts[n-1])
				if rtts[0] < want-slack {
					t.Errorf("fastest round trip %v is shorter than the configured %v", rtts[0], want)
				}
				if connect < want-slack {
					t.Errorf("connect took %v, less than the round trip %v", connect, want)
				}
				// The fastest round trip shows the emulator's own lateness;
				// the median and the connect also hold scheduling delays.
				if rtts[0] > want+3*time.Millisecond {
					late = append(late, fmt.Sprintf("fastest round trip %v, want %v within 3ms", rtts[0], want))
				}
				if med > want+10*time.Millisecond {
					late = append(late, fmt.Sprintf("median round trip %v, want %v within 10ms", med, want))
				}
				if connect > want+50*time.Millisecond {
					late = append(late, fmt.Sprintf("connect took %v, want %v within 50ms", connect, want))
				}
				return late
			})
		})
	}
}

// udpFlow sends n numbered datagrams of size bytes from the client to the
// server side of b, gap apart (or, with gap 0, in bursts of 50 a
// millisecond apart), and returns the sequence numbers received in arrival
// order and the one-way delay of each. It waits for stragglers until all n
// have arrived or two seconds after the last was sent.
func udpFlow(t *testing.T, b *netem.Bed, n, size int, gap time.Duration) (seqs []uint32, delays []time.Duration) {
	t.Helper()
	srv, err := b.ListenPacket(b.ServerNS, "udp", netip.AddrPortFrom(b.ServerAddr, 0).String())
	if err != nil {
		t.Fatalf("ListenPacket: %v", err)
	}
	defer srv.Close()
	srv.(*net.UDPConn).SetReadBuffer(8 << 20) // as far as net.core.rmem_max allows
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
	var sentAll atomic.Int64 // time since origin when the last was sent; 0 before
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for len(seqs) < n {
			if s := sentAll.Load(); s != 0 && time.Since(origin) > time.Duration(s)+2*time.Second {
				return
			}
			srv.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			m, _, err := srv.ReadFrom(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			if err != nil {
				t.Errorf("receive: %v", err)
				return
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
	sentAll.Store(int64(time.Since(origin)))
	wg.Wait()
	return seqs, delays
}

func TestLoss(t *testing.T) {
	const (
		n    = 5000
		loss = 0.2
	)
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Loss: loss}})
	retry(t, func() (late []string) {
		up0, down0 := b.Stats()
		seqs, _ := udpFlow(t, b, n, 100, 0)
		up1, down1 := b.Stats()
		up, down := up1.Sub(up0), down1.Sub(down0)
		t.Logf("received %d of %d; up: %v; down: %v", len(seqs), n, up, down)
		// With IPv6 off nothing else crosses the link: every datagram
		// is either delivered or lost by the emulator.
		if up.Packets+up.LossPackets != n {
			t.Errorf("emulator delivered %d and lost %d, want a total of the %d sent", up.Packets, up.LossPackets, n)
		}
		// The number lost is binomial: mean n*loss, deviation
		// sqrt(n loss (1-loss)) = 28. Five deviations either way.
		mean, sd := n*loss, math.Sqrt(n*loss*(1-loss))
		if math.Abs(float64(up.LossPackets)-mean) > 5*sd {
			t.Errorf("lost %d of %d (%.2f%%), want %.0f ± %.0f", up.LossPackets, n, 100*float64(up.LossPackets)/n, mean, 5*sd)
		}
		if down.LossPackets != 0 {
			t.Errorf("down direction lost %d packets, configured lossless", down.LossPackets)
		}
		if int64(len(seqs)) > up.Packets {
			t.Errorf("received %d datagrams, more than the %d delivered", len(seqs), up.Packets)
		}
		// A starved receiver overflows its socket buffer: that is the
		// machine's loss, not the emulator's.
		if float64(len(seqs)) < 0.99*float64(up.Packets) {
			late = append(late, fmt.Sprintf("received %d of the %d datagrams delivered", len(seqs), up.Packets))
		}
		return late
	})
}

func TestJitterKeepsOrder(t *testing.T) {
	const (
		delay  = 10 * time.Millisecond
		jitter = 5 * time.Millisecond
	)
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: delay, Jitter: jitter}})
	retry(t, func() (late []string) {
		// Datagrams more than twice the jitter apart do not hold each
		// other up, so their delays spread over the whole range.
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
		if lo < delay-jitter-200*time.Microsecond {
			t.Errorf("fastest datagram took %v, less than %v-%v", lo, delay, jitter)
		}
		// Uniform jitter puts p10 and p90 at 10ms∓4ms: the delays spread
		// both ways by about half the jitter or more.
		if p90 < delay+jitter/2 {
			t.Errorf("p90 delay %v, want above %v: jitter not applied", p90, delay+jitter/2)
		}
		if p10 > delay-jitter/2+time.Millisecond {
			late = append(late, fmt.Sprintf("p10 delay %v, want below %v", p10, delay-jitter/2+time.Millisecond))
		}
		return late
	})
}

func TestSet(t *testing.T) {
	b := netemtest.ForTest(t, netem.Config{Up: netem.Link{Delay: 5 * time.Millisecond}})
	// The fastest datagram shows the delay without the scheduling noise
	// of a loaded machine.
	check := func(want time.Duration) {
		retry(t, func() (late []string) {
			_, d := udpFlow(t, b, 50, 100, 2*time.Millisecond)
			if len(d) != 50 {
				t.Fatalf("received %d of 50 datagrams on a lossless link", len(d))
			}
			lo := slices.Min(d)
			t.Logf("configured %v: fastest one-way delay %v", want, lo)
			if lo < want-200*time.Microsecond {
				t.Errorf("one-way delay %v, less than the configured %v", lo, want)
			}
			if lo > want+3*time.Millisecond {
				late = append(late, fmt.Sprintf("one-way delay %v, want %v within 3ms", lo, want))
			}
			return late
		})
	}
	check(5 * time.Millisecond)
	b.Set(netem.Config{Up: netem.Link{Delay: 30 * time.Millisecond}})
	if got := b.Config().Up.Delay; got != 30*time.Millisecond {
		t.Errorf("Config().Up.Delay = %v after Set, want 30ms", got)
	}
	check(30 * time.Millisecond)
}

func TestRate(t *testing.T) {
	const rate = 20_000_000
	b := netemtest.ForTest(t, netem.Symmetric(20*time.Millisecond, rate, 0))
	t.Logf("congestion control: %s", b.CongestionControl)
	l, addr := listen(t, b)
	var received atomic.Int64
	go serveEach(l, func(c net.Conn) {
		buf := make([]byte, 1<<16)
		for {
			n, err := c.Read(buf)
			received.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	type sample struct {
		at    time.Time
		bytes int64
		wire  netem.Stats
	}
	snap := func() sample {
		up, _ := b.Stats()
		return sample{time.Now(), received.Load(), up}
	}
	retry(t, func() (late []string) {
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
		if wire > 1.02*rate {
			t.Errorf("wire rate %.2f Mbit/s, above the configured %.2f Mbit/s", wire/1e6, float64(rate)/1e6)
		}
		if wire < 0.9*rate {
			late = append(late, fmt.Sprintf("wire rate %.2f Mbit/s, want %.2f Mbit/s within -10%%", wire/1e6, float64(rate)/1e6))
		}
		if good < 0.85*rate {
			late = append(late, fmt.Sprintf("goodput %.2f Mbit/s, want at least 85%% of %.2f Mbit/s", good/1e6, float64(rate)/1e6))
		}
		return late
	})
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
