package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sample is one scrape of the server's metrics, with its process's
// figures when the window is being measured.
type sample struct {
	start, end time.Time // of the scrape
	snap       snapshot
	proc       procStat
	hasProc    bool
}

// runResult is what one run measured.
type runResult struct {
	mode mode
	run  int
	// window is the measured window, by the worker's marks.
	window time.Duration
	// bytes are what each class of clients received in the window, and
	// rates each client's rate in bits per second.
	slowBytes, fastBytes int64
	slowRates, fastRates []float64
	// Server process: CPU in the window; resident set averaged over the
	// window's samples, the largest sampled and the process's peak
	// (VmHWM, its whole life up to the end of the window).
	serverCPU              time.Duration
	rssAvg, rssMax, rssHWM int64
	rssIdle                int64 // before any client connected
	// workerCPU and benchCPU are the load generator's and this process's
	// (the link emulator's) CPU in the window, for judging the machine.
	workerCPU, benchCPU time.Duration
	// Read-ahead in the window: held in total (average and peak), by
	// class (averages of the class sums), and the class sums of target
	// depths; streams is the average number of streams reading ahead.
	raAvg, raMax           float64
	raSlow, raFast         float64
	targetSlow, targetFast float64
	streams                float64
	samples                int
	kill                   killResult
	// ready is how many clients had received data when the warm-up began.
	ready int
	// errors are downloads that failed in clients that were not killed.
	errors   int64
	firstErr string
}

// killResult is what the kill at the end of a run measured.
type killResult struct {
	killed, killedSlow, killedFast int
	// active is how many of them had a download in flight: the
	// cancellations to expect.
	active int
	// heldBefore is the read-ahead their connections held in the last
	// sample before the kill.
	heldBefore int64
	// cancelled is the rise of the cancelled-reads counter seen. It may
	// stay below active: a download whose reader had already read its
	// file to the end (and only waited for the link) has no reads left
	// to cancel.
	cancelled int64
	// tCancel is when the counter reached its final rise, tFree when the
	// killed clients' connections held nothing and no cancelled stream
	// held memory, tGone when the server no longer listed them: each the
	// end of the first sample that showed it, after the kill; -1 if
	// never seen within -kill-wait (for tCancel: if it never rose).
	tCancel, tFree, tGone time.Duration
	// The lower bounds: the start of the last sample before the one
	// that showed each, which did not (0 if it was the first).
	tCancelLo, tFreeLo, tGoneLo time.Duration
	// peakOrphaned is the most memory cancelled streams held at once.
	peakOrphaned int64
	// resolution is the median time between samples.
	resolution time.Duration
}

// startLoadWorker starts the load generator of o's clients.
func (h *harness) startLoadWorker(ctx context.Context, o *options) (*workerProc, error) {
	return h.startWorker(ctx, "worker",
		"-addr", h.serverAddr(),
		"-home", h.home,
		"-clients", strconv.Itoa(o.clients),
		"-slow", strconv.Itoa(o.slow()),
		"-slow-rate", strconv.FormatInt(o.slowRate, 10),
		"-files", strings.Join(h.files, ","),
		"-kill-frac", strconv.FormatFloat(o.killFrac, 'g', -1, 64),
	)
}

// runOnce runs the server in mode m and o's clients against it: warm-up,
// the measured window, then the kill.
func (h *harness) runOnce(ctx context.Context, o *options, m mode) (res runResult, err error) {
	res.mode = m
	fmt.Fprintf(h.logf, "### run: %s\n", m)
	srv, err := h.startServer(ctx, m)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	idle, err := readProc(srv.pid)
	if err != nil {
		return res, err
	}
	res.rssIdle = idle.rss
	w, err := h.startLoadWorker(ctx, o)
	if err != nil {
		return res, err
	}
	defer func() {
		done, serr := w.stop()
		if err == nil && serr != nil {
			err = serr
		}
		res.errors, res.firstErr = done.Errors, done.Msg
	}()
	ready, err := w.await(ctx, "ready", 2*time.Minute)
	if err != nil {
		return res, err
	}
	res.ready = ready.Ready
	if ready.Ready < o.clients {
		// Not an error: a server that starves some clients is a result.
		log.Printf("  only %d of %d clients received data within a minute", ready.Ready, o.clients)
	}
	if err := sleep(ctx, o.warmup); err != nil {
		return res, err
	}

	// The window: marks at both ends, samples between.
	p0, err := procs(srv.pid, w.pid)
	if err != nil {
		return res, err
	}
	if err := w.send("mark"); err != nil {
		return res, err
	}
	m0, err := w.await(ctx, "mark", 10*time.Second)
	if err != nil {
		return res, err
	}
	sctx, stopSampling := context.WithCancel(ctx)
	got := make(chan []sample, 1)
	go func() { got <- sampleLoop(sctx, srv, o.sample, true, nil) }()
	err = sleep(ctx, o.duration)
	p1, perr := procs(srv.pid, w.pid)
	stopSampling()
	window := <-got
	if err != nil {
		return res, err
	}
	if perr != nil {
		return res, perr
	}
	if err := w.send("mark"); err != nil {
		return res, err
	}
	m1, err := w.await(ctx, "mark", 10*time.Second)
	if err != nil {
		return res, err
	}
	owners := w.ownersNow()
	res.measureWindow(m0, m1, window, owners, o.slow())
	res.serverCPU = p1[0].cpu - p0[0].cpu
	res.workerCPU = p1[1].cpu - p0[1].cpu
	res.benchCPU = p1[2].cpu - p0[2].cpu
	res.rssHWM = p1[0].hwm

	// The kill: samples as fast as -kill-sample allows from just before
	// it until the server has accounted for it, or -kill-wait.
	base, err := srv.scrape(ctx)
	if err != nil {
		return res, err
	}
	if err := w.send("kill"); err != nil {
		return res, err
	}
	killed, err := w.await(ctx, "killed", 10*time.Second)
	if err != nil {
		return res, err
	}
	k := newKillWatch(killed, owners, base)
	kctx, cancel := context.WithTimeout(ctx, o.killWait)
	after := sampleLoop(kctx, srv, o.killSample, false, k.settled)
	cancel()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.kill = k.result(after)
	return res, nil
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// procs reads the server's, the worker's and this process's figures.
func procs(server, worker int) ([3]procStat, error) {
	var out [3]procStat
	for i, pid := range []int{server, worker, os.Getpid()} {
		p, err := readProc(pid)
		if err != nil {
			return out, err
		}
		out[i] = p
	}
	return out, nil
}

// sampleLoop scrapes the server every interval (or back to back if a
// scrape takes longer) until ctx is done or enough, if not nil, says the
// samples so far suffice. Failed scrapes are logged and skipped.
func sampleLoop(ctx context.Context, srv *ferryServer, interval time.Duration, withProc bool, enough func([]sample) bool) []sample {
	var out []sample
	next := time.Now()
	for ctx.Err() == nil {
		s := sample{start: time.Now()}
		snap, err := srv.scrape(ctx)
		s.end = time.Now()
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("  sample: %v", err)
			}
		} else {
			s.snap = snap
			if withProc {
				if p, err := readProc(srv.pid); err == nil {
					s.proc, s.hasProc = p, true
				}
			}
			out = append(out, s)
			if enough != nil && enough(out) {
				break
			}
		}
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			if sleep(ctx, d) != nil {
				break
			}
		} else {
			next = time.Now()
		}
	}
	return out
}

// measureWindow fills in the window's figures from the marks at its ends,
// the samples within it and the connections' owners.
func (r *runResult) measureWindow(m0, m1 event, samples []sample, owners map[string]connOwner, slow int) {
	r.window = time.Duration(m1.T - m0.T)
	secs := r.window.Seconds()
	for i := range min(len(m0.Bytes), len(m1.Bytes)) {
		b := m1.Bytes[i] - m0.Bytes[i]
		rate := float64(b) * 8 / secs
		if i < slow {
			r.slowBytes += b
			r.slowRates = append(r.slowRates, rate)
		} else {
			r.fastBytes += b
			r.fastRates = append(r.fastRates, rate)
		}
	}
	r.samples = len(samples)
	var nproc int
	for _, s := range samples {
		held := float64(s.snap.held)
		r.raAvg += held
		r.raMax = max(r.raMax, held)
		r.streams += float64(s.snap.streams)
		slow, fast := classRA(s.snap, owners)
		r.raSlow += float64(slow.held)
		r.raFast += float64(fast.held)
		r.targetSlow += float64(slow.target)
		r.targetFast += float64(fast.target)
		if s.hasProc {
			r.rssAvg += s.proc.rss
			r.rssMax = max(r.rssMax, s.proc.rss)
			nproc++
		}
	}
	if n := float64(len(samples)); n > 0 {
		r.raAvg /= n
		r.streams /= n
		r.raSlow /= n
		r.raFast /= n
		r.targetSlow /= n
		r.targetFast /= n
	}
	if nproc > 0 {
		r.rssAvg /= int64(nproc)
	}
}

// classRA sums the read-ahead of the listed connections of slow and of
// fast clients. Connections of no known client (none in a healthy run) are
// in neither.
func classRA(s snapshot, owners map[string]connOwner) (slow, fast connRA) {
	for addr, c := range s.conns {
		o, ok := owners[addr]
		switch {
		case !ok:
		case o.slow:
			slow.held += c.held
			slow.target += c.target
		default:
			fast.held += c.held
			fast.target += c.target
		}
	}
	return slow, fast
}

// killWatch follows the server after a kill.
type killWatch struct {
	t      time.Time
	addrs  map[string]bool // the killed clients' connections
	base   snapshot
	expect int64
	res    killResult
	// settledAt is when the memory had returned and the connections
	// were gone, the zero time before.
	settledAt time.Time
	// prev is the start of the previous sample after the kill.
	prev time.Time
}

// killSettle is how long the watch goes on after the killed clients'
// memory has returned and their connections are gone, for cancellations
// still to come, when fewer than expected have been counted.
const killSettle = 250 * time.Millisecond

func newKillWatch(e event, owners map[string]connOwner, base snapshot) *killWatch {
	k := &killWatch{t: time.Unix(0, e.T), addrs: map[string]bool{}, base: base, expect: int64(e.Active)}
	victims := map[int]bool{}
	for _, id := range e.Clients {
		victims[id] = true
	}
	for addr, o := range owners {
		if victims[o.client] {
			k.addrs[addr] = true
		}
	}
	k.res.killed, k.res.active = len(e.Clients), e.Active
	seen := map[int]bool{}
	for _, o := range owners {
		if victims[o.client] && !seen[o.client] {
			seen[o.client] = true
			if o.slow {
				k.res.killedSlow++
			} else {
				k.res.killedFast++
			}
		}
	}
	for addr := range k.addrs {
		k.res.heldBefore += base.conns[addr].held
	}
	k.res.tCancel, k.res.tFree, k.res.tGone = -1, -1, -1
	return k
}

// observe updates the result with sample s.
func (k *killWatch) observe(s sample) {
	if s.start.Before(k.t) {
		return // Began before the kill: says nothing of after.
	}
	since := s.end.Sub(k.t)
	var lo time.Duration
	if !k.prev.IsZero() {
		lo = k.prev.Sub(k.t)
	}
	k.prev = s.start
	if rise := s.snap.cancelled - k.base.cancelled; rise > k.res.cancelled {
		k.res.cancelled, k.res.tCancel, k.res.tCancelLo = rise, since, lo
	}
	k.res.peakOrphaned = max(k.res.peakOrphaned, s.snap.orphaned)
	var held int64
	listed := false
	for addr := range k.addrs {
		if c, ok := s.snap.conns[addr]; ok {
			listed = true
			held += c.held
		}
	}
	if k.res.tFree < 0 && held == 0 && s.snap.orphaned == 0 {
		k.res.tFree, k.res.tFreeLo = since, lo
	}
	if k.res.tGone < 0 && !listed {
		k.res.tGone, k.res.tGoneLo = since, lo
	}
	if k.settledAt.IsZero() && k.res.tFree >= 0 && k.res.tGone >= 0 {
		k.settledAt = s.end
	}
}

// settled observes the newest sample and reports whether the watch may
// end: the memory has returned, the connections are gone, and either every
// expected cancellation was counted or killSettle has passed since.
func (k *killWatch) settled(samples []sample) bool {
	s := samples[len(samples)-1]
	k.observe(s)
	if k.settledAt.IsZero() {
		return false
	}
	return k.res.cancelled >= k.expect || s.end.Sub(k.settledAt) >= killSettle
}

// result returns the kill's figures after samples.
func (k *killWatch) result(samples []sample) killResult {
	var gaps []time.Duration
	for i := 1; i < len(samples); i++ {
		gaps = append(gaps, samples[i].start.Sub(samples[i-1].start))
	}
	if len(gaps) > 0 {
		slices.Sort(gaps)
		k.res.resolution = gaps[len(gaps)/2]
	}
	return k.res
}

// summary is a one-line account of the run for the log.
func (r *runResult) summary() string {
	total := float64(r.slowBytes+r.fastBytes) * 8 / r.window.Seconds() / 1e6
	s := fmt.Sprintf("%.1f Mbit/s, server CPU %.1f s, RSS avg %s, read-ahead slow %s fast %s; kill: cancelled %d/%d in %s, freed in %s",
		total, r.serverCPU.Seconds(), mib(r.rssAvg), mib(int64(r.raSlow)), mib(int64(r.raFast)),
		r.kill.cancelled, r.kill.active, fmtT(r.kill.tCancel), fmtT(r.kill.tFree))
	if r.errors > 0 {
		s += fmt.Sprintf("; %d failed downloads: %s", r.errors, r.firstErr)
	}
	return s
}
