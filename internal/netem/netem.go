// Package netem emulates a slow, lossy, long link between two network
// namespaces on one machine, for Ferry's tests and benchmarks.
//
// The kernel this project is developed on has no netem qdisc, so the link is
// emulated in user space. New creates two namespaces, a client and a server
// side, each with a persistent TUN device named wan0 and a point-to-point
// address pair (client 10.77.N.1, server 10.77.N.2), so no bridge, NAT or
// route is needed. The calling process opens both TUN devices and copies
// every IP packet from one to the other through a model of the link, per
// direction:
//
//  1. random loss with probability Link.Loss;
//  2. a serialiser of Link.Rate bits per second fed by a drop-tail queue of
//     Link.Queue bytes (packets that would overflow it are dropped);
//  3. a delay line of Link.Delay, plus uniform jitter in ±Link.Jitter that
//     never reorders packets.
//
// Real TCP runs end to end through the bed, so congestion control sees the
// real round trip. Inside both namespaces TCP buffer maxima are raised to
// 64 MB and BBR is selected where the kernel has it (see
// Bed.CongestionControl); IPv6 is disabled so the devices carry only the
// test's traffic.
//
// Programs run in a namespace with Bed.Command (nsenter, which keeps the
// caller's mount namespace, so FUSE mounts made in the client namespace are
// visible to everyone); Go code opens sockets in a namespace with
// Bed.Listen, Bed.ListenPacket and Bed.Dial, which need no child process.
//
// The emulator needs root, /dev/net/tun and `ip netns`; Available says what
// is missing. It forwards about a gigabit per second on one core, so
// benchmarks should use explicit rates of at most a few hundred Mbit/s. The
// Go runtime's timers wake up to about a millisecond late; the model keeps
// the average rate and the delays exact and only the spacing of packets
// within a millisecond is bursty.
package netem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Link describes one direction of the emulated link.
type Link struct {
	// Delay is the fixed one-way delay.
	Delay time.Duration
	// Jitter adds a uniformly distributed delay in [-Jitter, +Jitter] to
	// each packet, without reordering: a packet never leaves before the
	// one in front of it.
	Jitter time.Duration
	// Rate is the link's rate in bits per second, counting whole IP
	// packets. Zero means unlimited.
	Rate int64
	// Loss is the probability, from 0 to 1, that a packet is dropped.
	Loss float64
	// Queue is the size in bytes of the drop-tail queue in front of a
	// rate-limited link. Zero means 1.5 times the bandwidth-delay product
	// of the round trip (both directions' delays), but at least
	// DefaultMinQueue.
	Queue int
}

// Config describes both directions of the link.
type Config struct {
	Up   Link // client to server
	Down Link // server to client
}

// Symmetric returns a Config with the same rate and loss in both
// directions and half the round trip rtt as each direction's delay.
func Symmetric(rtt time.Duration, rate int64, loss float64) Config {
	l := Link{Delay: rtt / 2, Rate: rate, Loss: loss}
	return Config{Up: l, Down: l}
}

// Stats counts the packets of one direction of the link. Bytes are whole IP
// packets as they cross the wire, headers included.
type Stats struct {
	Packets, Bytes           int64 // delivered to the far side
	LossPackets, LossBytes   int64 // dropped by random loss
	QueuePackets, QueueBytes int64 // dropped by the full queue (or delay line)
}

// Sub returns s minus t, for counting the traffic of one interval.
func (s Stats) Sub(t Stats) Stats {
	return Stats{
		s.Packets - t.Packets, s.Bytes - t.Bytes,
		s.LossPackets - t.LossPackets, s.LossBytes - t.LossBytes,
		s.QueuePackets - t.QueuePackets, s.QueueBytes - t.QueueBytes,
	}
}

func (s Stats) String() string {
	return fmt.Sprintf("%d packets %d bytes delivered, %d packets %d bytes lost, %d packets %d bytes dropped by the queue",
		s.Packets, s.Bytes, s.LossPackets, s.LossBytes, s.QueuePackets, s.QueueBytes)
}

// A Bed is a running emulated link between two namespaces. Its methods may
// be called from several goroutines.
type Bed struct {
	ClientNS, ServerNS     string     // namespace names, for NSPath, Command, nsenter
	ClientAddr, ServerAddr netip.Addr // the two ends of the link
	// CongestionControl is the TCP congestion control in use in both
	// namespaces: "bbr" where the kernel offers it, else its default.
	CongestionControl string

	up, down *direction
	runner

	closeOnce sync.Once
	closeErr  error
}

// runner is the clock and the lifetime of the goroutines that move a
// bed's or a mesh's packets.
type runner struct {
	start time.Time
	wg    sync.WaitGroup
	done  chan struct{}
}

func newRunner() runner { return runner{start: time.Now(), done: make(chan struct{})} }

// now returns the runner's clock: monotonic time since it started.
func (r *runner) now() time.Duration { return time.Since(r.start) }

var counter atomic.Int64

// Available returns nil if this process can create a bed: it runs as root,
// /dev/net/tun opens, and `ip netns` and nsenter work. Otherwise the error
// says what is missing.
func Available() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("not running as root"))
	}
	if fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		errs = append(errs, fmt.Errorf("cannot open /dev/net/tun: %w", err))
	} else {
		unix.Close(fd)
	}
	if err := exec.Command("ip", "netns", "list").Run(); err != nil {
		errs = append(errs, fmt.Errorf("`ip netns list` fails (iproute2 missing?): %w", err))
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		errs = append(errs, fmt.Errorf("nsenter not found (util-linux missing?): %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("netem: link emulator unavailable: %w", errors.Join(errs...))
	}
	return nil
}

// New creates the two namespaces, their TUN devices and addresses, and starts
// forwarding through a link described by cfg. ctx bounds the setup only; the
// bed runs until Close, which the caller must call. On error nothing is left
// behind.
//
// New first removes, best effort, namespaces left by dead processes (see
// Sweep).
func New(ctx context.Context, cfg Config) (*Bed, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	sweepOnce.Do(func() { Sweep(ctx) })

	n := counter.Add(1) - 1
	pid := os.Getpid()
	subnet := byte((int64(pid)*7 + n) % 256) // any value works: each bed is isolated
	b := &Bed{
		ClientNS:   fmt.Sprintf("ferry-%d-%d-cli", pid, n),
		ServerNS:   fmt.Sprintf("ferry-%d-%d-srv", pid, n),
		ClientAddr: netip.AddrFrom4([4]byte{10, 77, subnet, 1}),
		ServerAddr: netip.AddrFrom4([4]byte{10, 77, subnet, 2}),
		runner:     newRunner(),
	}
	if err := b.setup(ctx); err != nil {
		cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return nil, errors.Join(err, removeNS(cleanup, b.ClientNS), removeNS(cleanup, b.ServerNS))
	}
	b.Set(cfg)
	b.wg.Add(4)
	go b.up.read(&b.runner)
	go b.up.write(&b.runner)
	go b.down.read(&b.runner)
	go b.down.write(&b.runner)
	return b, nil
}

func (b *Bed) setup(ctx context.Context) error {
	type end struct {
		ns         string
		self, peer netip.Addr
	}
	var files [2]*os.File
	for i, e := range []end{{b.ClientNS, b.ClientAddr, b.ServerAddr}, {b.ServerNS, b.ServerAddr, b.ClientAddr}} {
		f, cc, err := makeNS(ctx, e.ns, e.self.String(), "peer", e.peer.String())
		if err != nil {
			return err
		}
		b.CongestionControl = cc
		files[i] = f
	}
	b.up = newDirection(files[0], files[1])
	b.down = newDirection(files[1], files[0])
	return nil
}

// makeNS makes namespace ns with its TUN device, addressed by addr (the
// arguments of `ip addr add` before "dev"), and opens the device. It
// returns the congestion control in use there.
func makeNS(ctx context.Context, ns string, addr ...string) (*os.File, string, error) {
	if err := run(ctx, "ip", "netns", "add", ns); err != nil {
		return nil, "", err
	}
	cc, err := tuneSysctls(ns)
	if err != nil {
		return nil, "", err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"tuntap", "add", "dev", tunName, "mode", "tun"},
		{"link", "set", tunName, "txqueuelen", "1000"},
		append(append([]string{"addr", "add"}, addr...), "dev", tunName),
		{"link", "set", tunName, "up"},
	} {
		if err := run(ctx, "ip", append([]string{"-n", ns}, args...)...); err != nil {
			return nil, "", err
		}
	}
	f, err := openTUN(ns)
	return f, cc, err
}

// Set changes the link. It takes effect from the next packet; packets
// already queued or in flight keep the times they were given.
func (b *Bed) Set(cfg Config) {
	up, down := resolve(cfg)
	b.up.params.Store(&up)
	b.down.params.Store(&down)
}

// Config returns the link as last set.
func (b *Bed) Config() Config {
	return Config{Up: b.up.params.Load().Link, Down: b.down.params.Load().Link}
}

// Stats returns the counters of each direction since the bed started.
func (b *Bed) Stats() (up, down Stats) {
	return b.up.stats(), b.down.stats()
}

// Command returns a command that runs name with args in network namespace
// ns (b.ClientNS or b.ServerNS) through nsenter. Unlike `ip netns exec` it
// keeps the caller's mount namespace, so a FUSE file system mounted by the
// command is visible outside it. The command is killed if ctx ends; Close
// kills whatever still runs in the bed.
func (b *Bed) Command(ctx context.Context, ns string, name string, args ...string) *exec.Cmd {
	return commandIn(ctx, ns, name, args...)
}

func commandIn(ctx context.Context, ns string, name string, args ...string) *exec.Cmd {
	argv := append(append(Enter(ns), name), args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// Enter returns the words that, put before a command line, run it in
// namespace ns (nsenter, keeping the caller's mount namespace).
func Enter(ns string) []string {
	return []string{"nsenter", "--net=" + NSPath(ns), "--"}
}

// Listen announces on a local address in namespace ns; see net.Listen.
func (b *Bed) Listen(ns, network, address string) (net.Listener, error) {
	return listenIn(ns, network, address)
}

func listenIn(ns, network, address string) (net.Listener, error) {
	var l net.Listener
	err := inNamespace(ns, func() (err error) {
		l, err = net.Listen(network, address)
		return err
	})
	return l, err
}

// ListenPacket announces on a local address in namespace ns; see
// net.ListenPacket.
func (b *Bed) ListenPacket(ns, network, address string) (net.PacketConn, error) {
	var c net.PacketConn
	err := inNamespace(ns, func() (err error) {
		c, err = net.ListenPacket(network, address)
		return err
	})
	return c, err
}

// Dial connects from namespace ns to address, which must be a literal IP
// address and port (no name resolution happens in ns); see net.Dialer.
func (b *Bed) Dial(ctx context.Context, ns, network, address string) (net.Conn, error) {
	return dialIn(ctx, ns, network, address)
}

func dialIn(ctx context.Context, ns, network, address string) (net.Conn, error) {
	var c net.Conn
	err := inNamespace(ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Close stops forwarding, kills every process still running in either
// namespace and removes both namespaces with their devices. It is
// idempotent; later calls return the first call's result.
func (b *Bed) Close() error {
	b.closeOnce.Do(func() {
		close(b.done)
		err1 := b.up.in.Close()
		err2 := b.down.in.Close()
		b.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b.closeErr = errors.Join(err1, err2,
			removeNS(ctx, b.ClientNS), removeNS(ctx, b.ServerNS))
	})
	return b.closeErr
}
