package main

// The latency benchmark (`go run ./bench/load latency`) is the second
// measurement of issue 6: how long a Stat or a small Get takes while a bulk
// transfer runs on the same remote.Client, against the same call on an idle
// link. It shares the load benchmark's machinery (harness.go): the work
// directory and the ferry binary, `ferry serve` in the server namespace,
// and this binary run again in the client namespace, here as
// `latency-worker` (latency_worker.go) with one client. Each link is a
// fresh bed.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
)

// condition is one link the latency benchmark measures: a round trip and a
// loss probability each way, at the invocation's rate.
type condition struct {
	rtt  time.Duration
	loss float64 // probability, 0 to 1
}

func (c condition) String() string {
	if c.loss == 0 {
		return c.rtt.String()
	}
	return fmt.Sprintf("%s, %g%% loss", c.rtt, c.loss*100)
}

// parseConditions reads a comma-separated list of links, each a round trip
// with an optional loss after a slash: "50ms,100ms,100ms/1%".
func parseConditions(s string) ([]condition, error) {
	var out []condition
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		rtt, loss, hasLoss := strings.Cut(f, "/")
		var c condition
		var err error
		if c.rtt, err = time.ParseDuration(strings.TrimSpace(rtt)); err != nil || c.rtt <= 0 {
			return nil, fmt.Errorf("bad link %q: want a round trip such as 100ms, then optionally /1%% for loss", f)
		}
		if hasLoss {
			if c.loss, err = netem.ParseLoss(loss); err != nil {
				return nil, fmt.Errorf("bad link %q: %w", f, err)
			}
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no links in -links")
	}
	return out, nil
}

// latOptions are the latency benchmark's command line.
type latOptions struct {
	links      []condition
	rate       int64 // bits per second, each way
	calls      int   // of each kind, per phase
	bulkSize   int64 // of the downloaded file and of each upload
	smallSize  int64
	warmup     time.Duration
	gap        time.Duration
	out        string
	keep       bool
	commandLog string
}

func parseLatencyFlags(args []string) (*latOptions, error) {
	fs := flag.NewFlagSet("latency", flag.ContinueOnError)
	o := &latOptions{}
	var links, rate, bulk, small string
	fs.StringVar(&links, "links", "50ms,100ms,100ms/1%", "comma-separated `links`, each a round trip and optionally /LOSS; each gets a fresh bed")
	fs.StringVar(&rate, "rate", "100mbit", "the links' `rate` each way")
	fs.IntVar(&o.calls, "n", 30, "Stats and small Gets timed in each phase (of each)")
	fs.StringVar(&bulk, "size", "256MiB", "`size` of the file downloaded (in a loop) and of each upload")
	fs.StringVar(&small, "small", "4KiB", "`size` of the small file read whole")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "time from a bulk transfer's first bytes to the first timed call")
	fs.DurationVar(&o.gap, "gap", 10*time.Millisecond, "pause before each timed call")
	fs.StringVar(&o.out, "out", "bench/REPORT-latency.md", "report `file`")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, data) instead of removing it")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./bench/load latency [flags]\n\n"+
			"Times Stats and small Gets on an idle link and during a bulk download and upload\non the same client, over emulated links, and writes a report; needs root.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.links, err = parseConditions(links); err != nil {
		return nil, err
	}
	if o.rate, err = netem.ParseRate(rate); err != nil || o.rate <= 0 {
		return nil, fmt.Errorf("bad -rate %q: want a limited rate such as 100mbit", rate)
	}
	if o.bulkSize, err = parseSize(bulk); err != nil || o.bulkSize <= 0 {
		return nil, fmt.Errorf("bad -size %q", bulk)
	}
	if o.smallSize, err = parseSize(small); err != nil || o.smallSize <= 0 {
		return nil, fmt.Errorf("bad -small %q", small)
	}
	if o.calls <= 0 || o.warmup < 0 || o.gap < 0 {
		return nil, errors.New("-n must be positive, -warmup and -gap not negative")
	}
	o.commandLog = strings.TrimSpace("go run ./bench/load latency " + strings.Join(args, " "))
	return o, nil
}

// The served files of the latency benchmark, and the path its uploads
// replace.
const (
	latSmall  = "small.bin"
	latBig    = "big.bin"
	latUpload = "/up.bin"
)

// bulk kinds, as the worker's commands name them; "" is idle.
const (
	bulkNone     = ""
	bulkDownload = "download"
	bulkUpload   = "upload"
)

// phase is what one round of timed calls measured: on the idle link or
// during a bulk transfer.
type phase struct {
	bulk      string // bulkNone, bulkDownload or bulkUpload
	stat, get []time.Duration
	// statFailed and getFailed count the calls that failed, and firstErr
	// says what the first failure was.
	statFailed, getFailed int
	firstErr              string
	// span is how long the calls took together, by the worker's clock.
	span time.Duration
	// bulkBytes is what the bulk transfer moved during the calls (file
	// bytes, as the client read or handed them over).
	bulkBytes int64
	// link is what the link carried in the bulk's direction over window,
	// which begins just before the calls and ends just after them.
	link   netem.Stats
	window time.Duration
	// bulkFailed counts the bulk transfers that failed in the phase
	// (bulkErr says what the first was).
	bulkFailed int64
	bulkErr    string
}

// linkResult is one link's phases: idle, during a download, during an
// upload.
type linkResult struct {
	cond   condition
	cc     string // the bed's congestion control
	phases []phase
}

// runLatency is the latency benchmark's main.
func runLatency(args []string) error {
	o, err := parseLatencyFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, stop, root, err := begin()
	if err != nil {
		return err
	}
	defer stop()
	h, err := newHarness(ctx, root, o.keep, []servedFile{{latSmall, o.smallSize}, {latBig, o.bulkSize}})
	if err != nil {
		return err
	}
	defer h.close()
	rep := &latReport{opts: o, started: time.Now(), loadStart: loadavg(), machine: machine(), commit: ferryCommit(root)}
	for i, c := range o.links {
		log.Printf("link %d/%d: %s at %s", i+1, len(o.links), c, netem.FormatRate(o.rate))
		res, err := h.measureLink(ctx, o, c)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("link %s: %w", c, err)
		}
		rep.links = append(rep.links, res)
	}
	rep.finished, rep.loadEnd = time.Now(), loadavg()
	return writeOut(root, o.out, rep.write)
}

// settle is how long the benchmark waits after stopping a bulk transfer,
// on top of two round trips, for the data in flight and in the link's
// queue to drain before the next phase.
const settle = time.Second

// measureLink makes a bed with link c, starts a server and the worker, and
// times the calls idle, during a download and during an upload.
func (h *harness) measureLink(ctx context.Context, o *latOptions, c condition) (res linkResult, err error) {
	res.cond = c
	if err := h.openBed(ctx, netem.Symmetric(c.rtt, o.rate, c.loss)); err != nil {
		return res, err
	}
	defer h.closeBed()
	res.cc = h.bed.CongestionControl
	fmt.Fprintf(h.logf, "### link: %s at %s\n", c, netem.FormatRate(o.rate))
	// No trash: each upload replaces the last, and the server would
	// otherwise keep and index the replaced file, costing CPU the
	// machine needs for the link.
	srv, err := h.startServer(ctx, mode{}, "--trash-max", "-1")
	if err != nil {
		return res, err
	}
	defer srv.stop()
	w, err := h.startWorker(ctx, "latency-worker",
		"-addr", h.serverAddr(),
		"-home", h.home,
		"-small", h.files[0],
		"-big", h.files[1],
		"-up", latUpload,
		"-up-size", strconv.FormatInt(o.bulkSize, 10),
		"-n", strconv.Itoa(o.calls),
		"-gap", o.gap.String(),
	)
	if err != nil {
		return res, err
	}
	defer func() {
		if _, serr := w.stop(); err == nil && serr != nil {
			err = serr
		}
	}()
	if _, err := w.await(ctx, "ready", time.Minute); err != nil {
		return res, err
	}
	// A call may take up to latCallTimeout; the worker gives up on it
	// then.
	callsLimit := time.Duration(2*o.calls)*(latCallTimeout+o.gap) + 30*time.Second
	var failedBefore int64
	for _, kind := range []string{bulkNone, bulkDownload, bulkUpload} {
		if kind != bulkNone {
			log.Printf("  %s: starting it, %s of warm-up", kind, o.warmup)
			if err := w.send(kind); err != nil {
				return res, err
			}
			if _, err := w.await(ctx, "bulk", time.Minute); err != nil {
				return res, err
			}
			if err := sleep(ctx, o.warmup); err != nil {
				return res, err
			}
		}
		up0, down0 := h.bed.Stats()
		t0 := time.Now()
		if err := w.send("calls"); err != nil {
			return res, err
		}
		e, err := w.await(ctx, "calls", callsLimit)
		if err != nil {
			return res, err
		}
		up1, down1 := h.bed.Stats()
		p := phaseOf(kind, e)
		p.window = time.Since(t0)
		p.link = down1.Sub(down0)
		if kind == bulkUpload {
			p.link = up1.Sub(up0)
		}
		if kind != bulkNone {
			if err := w.send("idle"); err != nil {
				return res, err
			}
			idle, err := w.await(ctx, "idle", time.Minute)
			if err != nil {
				return res, err
			}
			p.bulkFailed, p.bulkErr = idle.Errors-failedBefore, idle.Msg
			failedBefore = idle.Errors
			if err := sleep(ctx, settle+2*c.rtt); err != nil {
				return res, err
			}
		}
		log.Printf("  %s", p.summary(c.rtt))
		res.phases = append(res.phases, p)
	}
	return res, nil
}

// phaseOf reads a "calls" event of the worker.
func phaseOf(kind string, e event) phase {
	p := phase{bulk: kind, statFailed: e.StatFailed, getFailed: e.GetFailed, firstErr: e.Msg,
		span: time.Duration(e.T - e.T0), bulkBytes: e.Bulk1 - e.Bulk0}
	for _, ns := range e.StatNs {
		p.stat = append(p.stat, time.Duration(ns))
	}
	for _, ns := range e.GetNs {
		p.get = append(p.get, time.Duration(ns))
	}
	return p
}

// summary is a one-line account of the phase for the log.
func (p phase) summary(rtt time.Duration) string {
	s, g := latStatsOf(p.stat), latStatsOf(p.get)
	out := fmt.Sprintf("%s: stat median %.0f ms (%.1f RTT) p90 %.0f ms; get median %.0f ms (%.1f RTT) p90 %.0f ms",
		p.while(), s.med, inRTT(s.med, rtt), s.p90, g.med, inRTT(g.med, rtt), g.p90)
	if p.bulk != bulkNone {
		out += fmt.Sprintf("; bulk %.1f Mbit/s, link %.1f Mbit/s", mbit(p.bulkBytes, p.span), mbit(p.link.Bytes, p.window))
	}
	if n := p.statFailed + p.getFailed; n > 0 {
		out += fmt.Sprintf("; %d calls failed: %s", n, p.firstErr)
	}
	if p.bulkFailed > 0 {
		out += fmt.Sprintf("; %d bulk transfers failed: %s", p.bulkFailed, p.bulkErr)
	}
	return out
}

// while names the phase's condition for the report.
func (p phase) while() string {
	switch p.bulk {
	case bulkDownload:
		return "during a download"
	case bulkUpload:
		return "during an upload"
	}
	return "idle"
}
