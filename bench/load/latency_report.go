package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/transport"
)

// targetRTT is issue 6's target for a small call during a bulk transfer:
// within 2 round trips of the link.
const targetRTT = 2

// latStat summarises a set of latencies, in milliseconds.
type latStat struct {
	n             int
	med, p90, max float64
}

// latStatsOf returns the median (of an even count, the mean of the middle
// two), the 90th percentile by nearest rank and the largest of ds.
func latStatsOf(ds []time.Duration) latStat {
	if len(ds) == 0 {
		return latStat{}
	}
	v := make([]float64, len(ds))
	for i, d := range ds {
		v[i] = float64(d) / float64(time.Millisecond)
	}
	slices.Sort(v)
	return latStat{n: len(v), med: statOf(v).med, p90: nearestRank(v, 90), max: v[len(v)-1]}
}

// nearestRank returns the p-th percentile of sorted (ascending) by nearest
// rank: the least value with at least p% of the values at or below it (the
// 27th of 30 for p90). It returns 0 for no values.
func nearestRank(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(k, 1), n)-1]
}

// inRTT converts milliseconds to round trips of rtt; NaN if rtt is not
// positive.
func inRTT(ms float64, rtt time.Duration) float64 {
	if rtt <= 0 {
		return math.NaN()
	}
	return ms / (float64(rtt) / float64(time.Millisecond))
}

// fmtRTT formats a number of round trips; NaN is "-".
func fmtRTT(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// verdict says whether latencies s meet targetRTT round trips of rtt: "yes"
// if their p90 does, "median only" if only their median does, "no"
// otherwise, and "no calls" if none succeeded.
func verdict(s latStat, rtt time.Duration) string {
	switch {
	case s.n == 0 || rtt <= 0:
		return "no calls"
	case inRTT(s.p90, rtt) <= targetRTT:
		return "yes"
	case inRTT(s.med, rtt) <= targetRTT:
		return "median only"
	}
	return "no"
}

// ordinal spells n as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 27th.
func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// latReport is the latency benchmark's results.
type latReport struct {
	opts               *latOptions
	started, finished  time.Time
	loadStart, loadEnd string
	machine            string
	commit             string
	links              []linkResult
}

// write writes the report to path.

// msAt returns how long n bytes take at rate bits per second, in ms.
func msAt(n int64, rate int64) float64 {
	if rate <= 0 {
		return 0
	}
	return float64(n) * 8 / float64(rate) * 1000
}

// write writes the report to path.
func (r *latReport) write(path string) error { return writeReport(path, r.markdown()) }

// markdown renders the report.
func (r *latReport) markdown() string {
	o := r.opts
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	var links []string
	cc := map[string]bool{}
	for _, l := range r.links {
		links = append(links, l.cond.String())
		cc[l.cc] = true
	}
	var ccs []string
	for c := range cc {
		ccs = append(ccs, c)
	}
	slices.Sort(ccs)
	rate := netem.FormatRate(o.rate)
	p("# Ferry latency of small calls during a bulk transfer\n\n")
	p("Written by `bench/load latency` (see [README.md](README.md), \"The latency benchmark\"). Issue 6: \"the latency of a stat or a small read issued while a bulk transfer runs on the same client, against the same call on an idle link; target within %d round trips.\"\n\n", targetRTT)
	p("- Command: `%s`\n", o.commandLog)
	p("- Date: %s to %s (%s)\n", r.started.Format("2006-01-02 15:04:05 MST"), r.finished.Format("15:04:05"), r.finished.Sub(r.started).Round(time.Second))
	p("- Machine: %s\n", r.machine)
	p("- Load average (1, 5, 15 min): %s at the start, %s at the end\n", r.loadStart, r.loadEnd)
	p("- Ferry: %s\n", r.commit)
	p("- Links: `netem` beds, a fresh one for each link: %s; %s each way, the drop-tail queue netem sizes by default (1.5 times the bandwidth-delay product), TCP %s\n",
		strings.Join(links, "; "), rate, strings.Join(ccs, ", "))
	p("- Server: `ferry serve` in the server namespace (adaptive read-ahead; `--trash-max -1`, so that a replaced upload is not kept and indexed)\n")
	p("- Client: one `remote.Client` in the client namespace, with its two TCP connections: one for calls such as Stat, one for bulk data (Get, Put); plain streamed Gets and Puts, no chunk cache, no compression\n")
	p("- Calls: in each phase, %d Stats of a %s file and %d Gets of it read whole (a Get of the file's size), alternating, one at a time, each after a pause of %s\n",
		o.calls, fmtSize(o.smallSize), o.calls, o.gap)
	p("- Phases on each link: idle; during a download of a %s file of random bytes, fetched over and over; during an upload of %s of random bytes to one path, put over and over; the calls start %s after the transfer's first bytes\n\n",
		fmtSize(o.bulkSize), fmtSize(o.bulkSize), o.warmup)

	p("## Which connection a call takes\n\n")
	p("`remote.Client` sends Stat, and a Get of at most `remote.SmallGet` (%s) bytes, on its call connection, and larger Gets, Gets to the end of a file and Puts on its bulk connection. So the small Get here, like the Stat, waits only where the two connections meet, in the link's queue: behind the download's data on the way back, or behind the upload's on the way there; with a lost packet it also waits for TCP to repair its own connection. On the bulk connection (before commit 79a446c every Get took it) it also waited behind the data the server's socket holds unsent (up to `TCP_NOTSENT_LOWAT`, %s, %.0f ms at %s) and gRPC's write buffer (%s, %.0f ms).\n\n",
		fmtSize(remote.SmallGet), fmtSize(transport.NotSentLowat), msAt(transport.NotSentLowat, o.rate), rate, fmtSize(transport.WriteBuffer), msAt(transport.WriteBuffer, o.rate))

	p("## Latency\n\n")
	p("Milliseconds from issuing a call to its result (a Stat's reply; a Get's last byte and the end of its stream), and the same in round trips of the link's configured round trip (no call takes less than one). Median (of an even count, the mean of the middle two), p90 by nearest rank (the %s of %d), largest. *Added* is the rise of the median over the same call's idle median, in round trips. *Within %d RTT* is the target: *yes* if the p90 is, *median only* if only the median is, *no* otherwise. Failed calls (none unless the column says so) are left out of the figures.\n\n",
		ordinal(int(math.Ceil(0.9*float64(o.calls)))), o.calls, targetRTT)
	p("| link | call | while | median ms | p90 ms | max ms | median RTT | p90 RTT | max RTT | added RTT | within %d RTT | failed |\n", targetRTT)
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range r.links {
		rtt := l.cond.rtt
		for _, call := range []string{"Stat", "Get"} {
			var idle latStat
			for i, ph := range l.phases {
				ds, failed := ph.stat, ph.statFailed
				if call == "Get" {
					ds, failed = ph.get, ph.getFailed
				}
				s := latStatsOf(ds)
				if i == 0 {
					idle = s
				}
				added := "-"
				if ph.bulk != bulkNone && idle.n > 0 && s.n > 0 {
					added = fmtRTT(inRTT(s.med-idle.med, rtt))
				}
				p("| %s | %s %s | %s | %.1f | %.1f | %.1f | %s | %s | %s | %s | %s | %d |\n",
					l.cond, call, fmtSize(o.smallSize), ph.while(), s.med, s.p90, s.max,
					fmtRTT(inRTT(s.med, rtt)), fmtRTT(inRTT(s.p90, rtt)), fmtRTT(inRTT(s.max, rtt)),
					added, verdict(s, rtt), failed)
			}
		}
	}

	p("\n## The bulk transfer during the calls\n\n")
	p("*Bulk* is the rate at which the client read the download's file bytes, or handed the upload's to its `remote.Client`, while the calls ran; *link* is what the emulated link delivered in the transfer's direction over the same time (whole IP packets, the calls' own few bytes included), and its share of the link's %s; *lost* and *dropped* are that direction's packets dropped by the random loss and by the full queue.\n\n", rate)
	p("| link | while | calls took | bulk Mbit/s | link Mbit/s | of the rate | lost / dropped packets | failed transfers |\n")
	p("|---|---|---|---|---|---|---|---|\n")
	for _, l := range r.links {
		for _, ph := range l.phases {
			if ph.bulk == bulkNone {
				continue
			}
			link := mbit(ph.link.Bytes, ph.window)
			p("| %s | %s | %.1f s | %.1f | %.1f | %.0f%% | %d / %d | %d |\n",
				l.cond, ph.while(), ph.span.Seconds(), mbit(ph.bulkBytes, ph.span), link,
				link*1e6/float64(o.rate)*100, ph.link.LossPackets, ph.link.QueuePackets, ph.bulkFailed)
		}
	}
	var fails []string
	for _, l := range r.links {
		for _, ph := range l.phases {
			if ph.firstErr != "" {
				fails = append(fails, fmt.Sprintf("- %s, %s: %d Stats and %d Gets failed; the first: %s", l.cond, ph.while(), ph.statFailed, ph.getFailed, ph.firstErr))
			}
			if ph.bulkFailed > 0 {
				fails = append(fails, fmt.Sprintf("- %s, %s: %d bulk transfers failed; the first of the run: %s", l.cond, ph.while(), ph.bulkFailed, ph.bulkErr))
			}
		}
	}
	if len(fails) > 0 {
		p("\n## Failures\n\n%s\n", strings.Join(fails, "\n"))
	}

	p("\n## Every call\n\n")
	p("Milliseconds, in the order made.\n\n")
	for _, l := range r.links {
		for _, ph := range l.phases {
			for _, c := range []struct {
				name string
				ds   []time.Duration
			}{{"Stat", ph.stat}, {"Get", ph.get}} {
				var v []string
				for _, d := range c.ds {
					v = append(v, fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)))
				}
				p("- %s, %s, %s: %s\n", l.cond, ph.while(), c.name, strings.Join(v, " "))
			}
		}
	}
	return b.String()
}
