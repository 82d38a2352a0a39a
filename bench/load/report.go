package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/server"
)

// report is the whole invocation's results.
type report struct {
	opts               *options
	started, finished  time.Time
	loadStart, loadEnd string
	machine            string
	commit             string
	cc                 string // the bed's congestion control
	runs               []runResult
}

// write writes the report to path.
func (r *report) write(path string) error { return writeReport(path, r.markdown()) }

// writeOut writes a report with write to out, a path relative to the
// repository's root unless absolute, and says where.
func writeOut(root, out string, write func(string) error) error {
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := write(out); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

// writeReport writes text to path through a temporary file renamed over
// it, so that an interrupted write never leaves half a report.
func writeReport(path, text string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".report-*")
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	_, err = tmp.WriteString(text)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the report %s: %w", path, err)
	}
	return nil
}

// byMode returns the runs of each mode, modes in the order they first ran.
func (r *report) byMode() ([]mode, map[mode][]runResult) {
	var order []mode
	m := map[mode][]runResult{}
	for _, x := range r.runs {
		if _, ok := m[x.mode]; !ok {
			order = append(order, x.mode)
		}
		m[x.mode] = append(m[x.mode], x)
	}
	return order, m
}

// stat is the median of some figure over runs, with its range.
type stat struct {
	med, lo, hi float64
	n           int
}

// over returns the median and range of f over runs.
func over(runs []runResult, f func(runResult) float64) stat {
	var v []float64
	for _, r := range runs {
		v = append(v, f(r))
	}
	return statOf(v)
}

// statOf returns the median and range of v; the median of an even count is
// the mean of the middle two.
func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return stat{med: med, lo: v[0], hi: v[n-1], n: n}
}

// format writes the median with format, and the range in brackets when
// there was more than one run and it is not a single value.
func (s stat) format(format string) string {
	if s.n == 0 {
		return "-"
	}
	out := fmt.Sprintf(format, s.med)
	if s.n > 1 && s.lo != s.hi {
		out += fmt.Sprintf(" ["+format+"-"+format+"]", s.lo, s.hi)
	}
	return out
}

// median returns the median of v, 0 if empty.
func median(v []float64) float64 { return statOf(v).med }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// fmtT formats a time to an event after the kill; a negative one was not
// seen.
func fmtT(d time.Duration) string {
	if d < 0 {
		return "not seen"
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// mbit converts bytes in a window to Mbit/s.
func mbit(bytes int64, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(bytes) * 8 / window.Seconds() / 1e6
}

// killTime is a kill's time in milliseconds for a median, or NaN-free -1
// when one run never saw it (the median then says so if most did not).
func killTime(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return float64(d) / float64(time.Millisecond)
}

// fmtKillStat formats the medians of a time's lower and upper bounds
// over runs (killTime values), and the range of the upper bound.
func fmtKillStat(lo, hi stat) string {
	switch {
	case hi.n == 0:
		return "-"
	case hi.med < 0:
		return "not seen"
	}
	out := fmt.Sprintf("%.0f-%.0f ms", lo.med, hi.med)
	if hi.lo < 0 {
		return out + " (not seen in some runs)"
	}
	if hi.n > 1 && hi.lo != hi.hi {
		out += fmt.Sprintf(" [upper %.0f-%.0f]", hi.lo, hi.hi)
	}
	return out
}

// fmtKillRange formats one run's bounds of a time after the kill.
func fmtKillRange(lo, hi time.Duration) string {
	if hi < 0 {
		return "not seen"
	}
	return fmt.Sprintf("%.0f-%.0f ms", killTime(lo), killTime(hi))
}

// markdown renders the report.
func (r *report) markdown() string {
	o := r.opts
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	slow := o.slow()
	fast := o.clients - slow
	p("# Ferry server load benchmark\n\n")
	p("Written by `bench/load` (see [README.md](README.md), \"The server load benchmark\").\n\n")
	p("- Command: `%s`\n", o.commandLog)
	p("- Date: %s to %s (%s)\n", r.started.Format("2006-01-02 15:04:05 MST"), r.finished.Format("15:04:05"), r.finished.Sub(r.started).Round(time.Second))
	p("- Machine: %s\n", r.machine)
	p("- Load average (1, 5, 15 min): %s at the start, %s at the end\n", r.loadStart, r.loadEnd)
	p("- Ferry: %s\n", r.commit)
	p("- Link: `netem` bed, %s round trip, %s each way, no loss, TCP %s\n", o.rtt, netem.FormatRate(o.rate), r.cc)
	p("- Clients: %d in one load-generator process in the client namespace, each its own `remote.Client` (2 TCP connections: calls and bulk data); "+
		"%d throttled to %s by pacing their socket reads (the server's TCP sees a slow receiver), %d not throttled\n",
		o.clients, slow, netem.FormatRate(o.slowRate), fast)
	p("- Workload: every client downloads %d files of %s of random bytes in turn, with plain streamed Gets (no chunk cache, no compression), for the whole run\n",
		o.files, fmtSize(o.fileSize))
	p("- Each run: a fresh `ferry serve` (read-ahead budget %s, a quarter of the default --memory), all clients started, %s of warm-up after the last one's first bytes, a measured window of %s (samples of the server every %s), then %.0f%% of each class of clients killed (their TCP connections reset) and the server sampled every %s for up to %s\n",
		mib(server.DefaultMemory/4), o.warmup, o.duration, o.sample, o.killFrac*100, o.killSample, o.killWait)
	modes, runs := r.byMode()
	var names []string
	for _, m := range modes {
		names = append(names, m.String())
	}
	p("- Modes: %s; %d runs of each, alternating; tables show the median and, in brackets, the range\n\n", strings.Join(names, ", "), o.runs)

	p("## Throughput, memory and CPU\n\n")
	p("Throughput is what the clients received in the window (file bytes), in Mbit/s. CPU is in cores (CPU seconds per second of the window); RSS is the server process's resident set: before any client connected, the average and largest of the window's samples, and the process's peak (VmHWM) up to the window's end. A slow client's own rate is counted in whole 256 KiB messages (2 s each at 1 Mbit/s), so per client it is coarse; the sums are not.\n\n")
	p("| mode | aggregate | slow clients: all, per client | fast clients: all, per client | server CPU | server RSS idle | RSS avg | RSS max sampled | RSS peak (HWM) |\n")
	p("|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range modes {
		rs := runs[m]
		p("| %s | %s | %s, %s | %s, %s | %s | %s MiB | %s MiB | %s MiB | %s MiB |\n", m,
			over(rs, func(x runResult) float64 { return mbit(x.slowBytes+x.fastBytes, x.window) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return mbit(x.slowBytes, x.window) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return median(x.slowRates) / 1e6 }).format("%.2f"),
			over(rs, func(x runResult) float64 { return mbit(x.fastBytes, x.window) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return median(x.fastRates) / 1e6 }).format("%.2f"),
			over(rs, func(x runResult) float64 { return x.serverCPU.Seconds() / x.window.Seconds() }).format("%.2f"),
			over(rs, func(x runResult) float64 { return float64(x.rssIdle) / (1 << 20) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.rssAvg) / (1 << 20) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.rssMax) / (1 << 20) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.rssHWM) / (1 << 20) }).format("%.0f"))
	}
	p("\n## How the read-ahead memory divides\n\n")
	p("Bytes read ahead and not yet sent, averaged over the window's samples (`ferry_readahead_bytes`, and `ferry_conn_readahead_bytes` summed over the connections of each class of clients); the target is the sum of the streams' target depths (`ferry_conn_readahead_target_bytes`). Per client is the class's sum over its %d slow and %d fast clients.\n\n", slow, fast)
	p("| mode | held, all (peak) | slow: held all, per client | slow: target per client | fast: held all, per client | fast: target per client | streams |\n")
	p("|---|---|---|---|---|---|---|\n")
	perClient := func(v float64, n int) float64 {
		if n == 0 {
			return 0
		}
		return v / float64(n) / (1 << 10)
	}
	for _, m := range modes {
		rs := runs[m]
		p("| %s | %s MiB (%s MiB) | %s MiB, %s KiB | %s KiB | %s MiB, %s KiB | %s KiB | %s |\n", m,
			over(rs, func(x runResult) float64 { return x.raAvg / (1 << 20) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return x.raMax / (1 << 20) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return x.raSlow / (1 << 20) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return perClient(x.raSlow, slow) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return perClient(x.targetSlow, slow) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return x.raFast / (1 << 20) }).format("%.1f"),
			over(rs, func(x runResult) float64 { return perClient(x.raFast, fast) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return perClient(x.targetFast, fast) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return x.streams }).format("%.0f"))
	}
	p("\n## Killing %.0f%% of the clients mid-download\n\n", o.killFrac*100)
	p("The load generator resets the TCP connections of the killed clients (SO_LINGER 0, as the kernel does for a killed process with unread data) and then forgets them. Times run from just before the resets. Each is given as bounds: the event came after the start of the last scrape of the server's metrics that did not show it, and before the end of the first that did; the tables show the medians of both bounds over the runs and, in brackets, the range of the upper one. Half the round trip (%s) passes before the server can see a reset at all.\n\n", o.rtt/2)
	p("- *cancelled reads*: how far the server's `ferry_readahead_cancelled_total` rose, of the killed clients with a download in flight, and when it reached that: their read-ahead readers had stopped reading the disk. A download whose reader had already read its file to the end, and only waited for the link, has no reads left to cancel and is not counted.\n")
	p("- *memory returned*: the killed clients' connections hold no read-ahead and no cancelled stream still holds memory (`ferry_readahead_orphaned_bytes` is 0).\n")
	p("- *connections gone*: the server no longer lists any of their connections.\n\n")
	p("| mode | killed (slow + fast) | their read-ahead before | cancelled reads | memory returned | connections gone | most held by cancelled streams | sample interval |\n")
	p("|---|---|---|---|---|---|---|---|\n")
	for _, m := range modes {
		rs := runs[m]
		k := rs[0].kill
		p("| %s | %d (%d + %d) | %s KiB | %s of %s, %s | %s | %s | %s KiB | %s ms |\n", m,
			k.killed, k.killedSlow, k.killedFast,
			over(rs, func(x runResult) float64 { return float64(x.kill.heldBefore) / (1 << 10) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.kill.cancelled) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.kill.active) }).format("%.0f"),
			fmtKillStat(over(rs, func(x runResult) float64 { return killTime(x.kill.tCancelLo) }), over(rs, func(x runResult) float64 { return killTime(x.kill.tCancel) })),
			fmtKillStat(over(rs, func(x runResult) float64 { return killTime(x.kill.tFreeLo) }), over(rs, func(x runResult) float64 { return killTime(x.kill.tFree) })),
			fmtKillStat(over(rs, func(x runResult) float64 { return killTime(x.kill.tGoneLo) }), over(rs, func(x runResult) float64 { return killTime(x.kill.tGone) })),
			over(rs, func(x runResult) float64 { return float64(x.kill.peakOrphaned) / (1 << 10) }).format("%.0f"),
			over(rs, func(x runResult) float64 { return float64(x.kill.resolution) / float64(time.Millisecond) }).format("%.0f"))
	}
	p("\n## Every run\n\n")
	p("The load generator's and this process's CPU (the link emulator, the sampling) are in cores over the window: with them the server shares the machine's %d cores.\n\n", nproc())
	p("| run | mode | aggregate Mbit/s | slow Mbit/s | fast Mbit/s | server CPU | load generator CPU | emulator CPU | RSS avg | read-ahead slow / fast | samples | cancelled reads | memory returned | failed downloads |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.runs {
		w := x.window.Seconds()
		p("| %d | %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %s | %s / %s | %d | %d of %d in %s | %s | %d |\n",
			x.run, x.mode, mbit(x.slowBytes+x.fastBytes, x.window), mbit(x.slowBytes, x.window), mbit(x.fastBytes, x.window),
			x.serverCPU.Seconds()/w, x.workerCPU.Seconds()/w, x.benchCPU.Seconds()/w, mib(x.rssAvg),
			mib(int64(x.raSlow)), mib(int64(x.raFast)), x.samples,
			x.kill.cancelled, x.kill.active, fmtKillRange(x.kill.tCancelLo, x.kill.tCancel), fmtKillRange(x.kill.tFreeLo, x.kill.tFree), x.errors)
	}
	for _, x := range r.runs {
		if x.ready < o.clients {
			p("\nRun %d (%s): only %d of the %d clients had received data a minute after they started; the warm-up began without the others.\n", x.run, x.mode, x.ready, o.clients)
		}
	}
	return b.String()
}
