// Package netemcmd is the `ferry netem` command: a link emulator bed run in
// the foreground, for trying Ferry and other tools over a slow link by hand.
package netemcmd

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry/internal/netem"
)

// rateFlag is a link rate flag in bits per second, written like "100mbit".
type rateFlag struct {
	v   int64
	set bool
}

func (f *rateFlag) String() string { return netem.FormatRate(f.v) }
func (f *rateFlag) Type() string   { return "rate" }
func (f *rateFlag) Set(s string) error {
	v, err := netem.ParseRate(s)
	if err != nil {
		return err
	}
	f.v, f.set = v, true
	return nil
}

// lossFlag is a loss probability flag, written like "1%" or "0.01".
type lossFlag float64

func (f *lossFlag) String() string { return fmt.Sprintf("%g%%", float64(*f)*100) }
func (f *lossFlag) Type() string   { return "loss" }
func (f *lossFlag) Set(s string) error {
	v, err := netem.ParseLoss(s)
	if err != nil {
		return err
	}
	*f = lossFlag(v)
	return nil
}

const long = `Netem runs an emulated slow link between two new network namespaces until
it is interrupted, for trying Ferry or any other program over such a link.

It creates a client namespace and a server namespace joined by a TUN device
pair and forwards every packet between them in this process, with the given
round trip (split evenly between the directions), rate, random loss and
jitter. It prints the namespaces' names and addresses; run programs on either
side with nsenter, which keeps the mount namespace so that FUSE mounts made on
the client side are visible everywhere:

    nsenter --net=/var/run/netns/NS COMMAND [ARG...]

On SIGINT or SIGTERM it prints the packet counters of each direction, kills
every process still running in the namespaces and removes them.

It needs root, /dev/net/tun, iproute2 (ip netns) and nsenter.

Limitations: one client and one server side; the delay, rate, loss and
jitter are fixed for the run; the emulator tops out near a gigabit per second
of one core, so use explicit rates of at most a few hundred Mbit/s.`

// Command returns the `netem` command.
func Command() *cobra.Command {
	var (
		rtt, jitter      time.Duration
		rate             = rateFlag{v: 100_000_000}
		upRate, downRate rateFlag
		loss             lossFlag
		queue            int
		every            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "netem",
		Short: "Run an emulated slow, lossy link between two network namespaces",
		Long:  long,
		Example: `  ferry netem --rtt 100ms --rate 20mbit --loss 1%
  ferry netem --rtt 50ms --up-rate 5mbit --down-rate 50mbit --jitter 2ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if rtt < 0 || jitter < 0 || queue < 0 {
				return fmt.Errorf("netem: --rtt, --jitter and --queue must not be negative")
			}
			cfg := netem.Symmetric(rtt, rate.v, float64(loss))
			cfg.Up.Jitter, cfg.Down.Jitter = jitter, jitter
			cfg.Up.Queue, cfg.Down.Queue = queue, queue
			if upRate.set {
				cfg.Up.Rate = upRate.v
			}
			if downRate.set {
				cfg.Down.Rate = downRate.v
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return Run(ctx, cmd.OutOrStdout(), cfg, every)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&rtt, "rtt", 100*time.Millisecond, "round-trip time, half of it in each direction")
	f.Var(&rate, "rate", "rate of each direction, e.g. 100mbit, 5mbit, 800kbit; 0 for unlimited")
	f.Var(&upRate, "up-rate", "rate from client to server, if different from --rate")
	f.Var(&downRate, "down-rate", "rate from server to client, if different from --rate")
	f.Var(&loss, "loss", "random loss of each direction, e.g. 1% or 0.01")
	f.DurationVar(&jitter, "jitter", 0, "one-way jitter: each packet's delay varies uniformly by up to this much, without reordering")
	f.IntVar(&queue, "queue", 0, "drop-tail queue of each direction in bytes; 0 for 1.5 times the bandwidth-delay product")
	f.DurationVar(&every, "stats", 0, "also print the counters at this interval (0: only at exit)")
	return cmd
}

// Run runs a bed with cfg until ctx ends, printing how to use it to w and,
// every interval if it is positive and at the end, its counters. It removes
// the bed before returning.
func Run(ctx context.Context, w io.Writer, cfg netem.Config, interval time.Duration) error {
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := netem.New(setup, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer b.Close()

	rtt := cfg.Up.Delay + cfg.Down.Delay
	fmt.Fprintf(w, "ferry netem: link up: round trip %v, rate up %s down %s, loss up %g%% down %g%%, jitter %v, TCP congestion control %s\n",
		rtt, netem.FormatRate(cfg.Up.Rate), netem.FormatRate(cfg.Down.Rate),
		cfg.Up.Loss*100, cfg.Down.Loss*100, cfg.Up.Jitter, b.CongestionControl)
	fmt.Fprintf(w, "  client namespace %-24s address %v\n", b.ClientNS, b.ClientAddr)
	fmt.Fprintf(w, "  server namespace %-24s address %v\n", b.ServerNS, b.ServerAddr)
	fmt.Fprintf(w, "Run commands on either side with nsenter, for example:\n")
	fmt.Fprintf(w, "  nsenter --net=%s ferry serve DIR --listen %v:7070\n", netem.NSPath(b.ServerNS), b.ServerAddr)
	fmt.Fprintf(w, "  nsenter --net=%s ferry find %v:7070:/\n", netem.NSPath(b.ClientNS), b.ServerAddr)
	fmt.Fprintf(w, "  nsenter --net=%s ping %v\n", netem.NSPath(b.ClientNS), b.ServerAddr)
	fmt.Fprintf(w, "Stop with Ctrl-C: both namespaces and every process in them are removed.\n")

	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			printStats(w, b)
		case <-ctx.Done():
			printStats(w, b)
			if err := b.Close(); err != nil {
				return err
			}
			fmt.Fprintf(w, "ferry netem: removed %s and %s\n", b.ClientNS, b.ServerNS)
			return nil
		}
	}
}

func printStats(w io.Writer, b *netem.Bed) {
	up, down := b.Stats()
	fmt.Fprintf(w, "up   (client to server): %v\n", up)
	fmt.Fprintf(w, "down (server to client): %v\n", down)
}
