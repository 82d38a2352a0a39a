package netem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// NetnsDir is where `ip netns` keeps the bind mounts that name namespaces.
const NetnsDir = "/var/run/netns"

// tunName is the name of the TUN device inside each namespace.
const tunName = "wan0"

// NSPath returns the file that names network namespace ns, as used by
// nsenter --net and setns.
func NSPath(ns string) string { return filepath.Join(NetnsDir, ns) }

// inNamespace runs fn on an OS thread that has joined network namespace ns,
// then returns the thread to the namespace it came from. Sockets and TUN
// devices opened by fn stay in ns for their whole life. fn must not start
// goroutines that expect to be in ns: only the calling thread switches.
//
// If the thread cannot be switched back it is left locked, so the runtime
// destroys it when the goroutine ends instead of reusing it.
func inNamespace(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netem: open own network namespace: %w", err)
	}
	defer unix.Close(orig)
	target, err := unix.Open(NSPath(ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netem: open namespace %s: %w", ns, err)
	}
	err = unix.Setns(target, unix.CLONE_NEWNET)
	unix.Close(target)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netem: enter namespace %s: %w", ns, err)
	}
	fnErr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// Keep the thread locked: it dies with this goroutine.
		return errors.Join(fnErr, fmt.Errorf("netem: leave namespace %s: %w", ns, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// openTUN attaches to the persistent TUN device wan0 of namespace ns. The
// file is non-blocking so that the runtime poller serves it and Close
// interrupts a pending Read.
func openTUN(ns string) (*os.File, error) {
	var f *os.File
	err := inNamespace(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("netem: open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(tunName)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("netem: TUNSETIFF %s in %s: %w", tunName, ns, err)
		}
		f = os.NewFile(uintptr(fd), ns+"/"+tunName)
		return nil
	})
	return f, err
}

// run runs a command and returns an error holding its output if it fails.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netem: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// tuneSysctls sets the namespace's TCP buffers and congestion control from
// a thread inside it (files under /proc/sys/net belong to the namespace of
// the thread that opens them). It returns the congestion control in use.
func tuneSysctls(ns string) (string, error) {
	var cc string
	err := inNamespace(ns, func() error {
		w := func(name, val string) error {
			return os.WriteFile("/proc/sys/"+name, []byte(val), 0)
		}
		// Without IPv6 the TUN devices carry only the traffic of the test:
		// no router solicitations or MLD reports in the counters.
		w("net/ipv6/conf/all/disable_ipv6", "1")
		w("net/ipv6/conf/default/disable_ipv6", "1")
		// Large maxima so that autotuning can fill the bandwidth-delay
		// product of a fast, long link (1 Gbit/s at 400 ms is 50 MB).
		if err := w("net/ipv4/tcp_rmem", "4096 131072 67108864"); err != nil {
			return fmt.Errorf("netem: tcp_rmem in %s: %w", ns, err)
		}
		if err := w("net/ipv4/tcp_wmem", "4096 16384 67108864"); err != nil {
			return fmt.Errorf("netem: tcp_wmem in %s: %w", ns, err)
		}
		// Every run on a fresh slate: no cached ssthresh from an earlier
		// connection between the same addresses.
		w("net/ipv4/tcp_no_metrics_save", "1")
		if w("net/ipv4/tcp_congestion_control", "bbr") != nil {
			ensureBBR()
			w("net/ipv4/tcp_congestion_control", "bbr")
		}
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		if err != nil {
			return fmt.Errorf("netem: read congestion control in %s: %w", ns, err)
		}
		cc = strings.TrimSpace(string(b))
		return nil
	})
	return cc, err
}

var bbrOnce sync.Once

// ensureBBR tries once to load the BBR module. Failure is silent: the
// namespace then keeps the kernel's default (usually cubic), which
// Bed.CongestionControl reports.
func ensureBBR() {
	bbrOnce.Do(func() {
		if p, err := exec.LookPath("modprobe"); err == nil {
			exec.Command(p, "tcp_bbr").Run()
		}
	})
}

// nsName matches the names of the namespaces this package creates:
// ferry-PID-N-cli and ferry-PID-N-srv.
var nsName = regexp.MustCompile(`^ferry-([0-9]+)-([0-9]+)-(cli|srv|site[0-9]+)$`)

var sweepOnce sync.Once

// Sweep removes the namespaces left behind by beds of processes that have
// died without closing them (killed tests, a crashed benchmark). It is best
// effort and runs once per process from New; it never touches the
// namespaces of a live process.
func Sweep(ctx context.Context) {
	ents, err := os.ReadDir(NetnsDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		m := nsName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || pidAlive(pid) {
			continue
		}
		removeNS(ctx, e.Name())
	}
}

// pidAlive reports whether a process with this pid exists.
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// removeNS kills every process left in namespace ns and deletes it.
func removeNS(ctx context.Context, ns string) error {
	if _, err := os.Stat(NSPath(ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	killAll(ns)
	return run(ctx, "ip", "netns", "delete", ns)
}

// killAll sends SIGKILL to every process whose network namespace is ns, as
// listed by `ip netns pids`. These are processes started in the bed (by
// Command or by hand through nsenter); nothing outside it is touched.
func killAll(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		unix.Kill(pid, unix.SIGKILL)
	}
}
