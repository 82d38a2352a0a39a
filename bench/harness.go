package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/sshd"
)

// condition is one emulated link: the same in both directions.
type condition struct {
	RTT  time.Duration
	Loss float64
	Rate int64
}

func (c condition) String() string {
	return fmt.Sprintf("%s round trip, %s loss, %s", fmtRTT(c.RTT), fmtLoss(c.Loss), netem.FormatRate(c.Rate))
}

// column is the condition's table heading.
func (c condition) column() string {
	return fmtRTT(c.RTT) + ", " + fmtLoss(c.Loss)
}

func fmtRTT(d time.Duration) string {
	return fmt.Sprintf("%g ms", float64(d)/float64(time.Millisecond))
}
func fmtLoss(l float64) string { return fmt.Sprintf("%g%%", l*100) }

// harness holds what lives for the whole run: options, data and keys.
type harness struct {
	o       *options
	work    string
	data    *dataset
	keys    *sshd.Keys
	systems []system
}

// env is one condition's bed and the paths a system's scripts use. Every
// path is on this machine's one file system: the namespaces separate only
// the network, so "server" and "client" files are different directories.
type env struct {
	h         *harness
	cond      condition
	bed       *netem.Bed
	srvAddr   netip.Addr
	sshConfig string // ssh_config with Host "bench" pointing at the bed's server
	srv       string // the server's tree: big file, tree/, in/
	in        string // where uploads land: srv/in
	src       string // the client's local data: big file and tree/
	out       string // where downloads land
	mnt       string // a mount point for file system clients
	log       io.Writer
}

// runCondition runs, over one fresh bed, what plan says is left to run
// under c; with nothing left it makes no bed.
func (h *harness) runCondition(ctx context.Context, c condition, rep *report) error {
	ceil, runs, err := h.plan(c, rep)
	if err != nil {
		return err
	}
	if !ceil && len(runs) == 0 {
		log.Printf("  nothing left to measure: the results hold every cell asked for")
		return nil
	}
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bed, err := netem.New(setup, netem.Symmetric(c.RTT, c.Rate, c.Loss))
	if err != nil {
		return err
	}
	defer bed.Close()
	rep.cc = bed.CongestionControl

	logf, err := os.Create(filepath.Join(h.work, "logs", strings.NewReplacer(" ", "", ",", "_", "%", "pct").Replace(c.column())+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	e := &env{
		h: h, cond: c, bed: bed, srvAddr: bed.ServerAddr,
		srv: h.data.srv, in: filepath.Join(h.data.srv, "in"), src: h.data.src,
		out: filepath.Join(h.work, "out"), mnt: filepath.Join(h.work, "mnt"),
		log: logf,
	}
	for _, d := range []string{e.in, e.out, e.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	stopSSHD, err := startSSHD(setup, e)
	if err != nil {
		return err
	}
	defer stopSSHD()

	if ceil {
		log.Printf("  iperf3")
		up, down, err := iperf(ctx, e)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := rep.addCeiling(c, up, down, err); err != nil {
			return err
		}
	}
	for _, r := range runs {
		if err := h.runSystem(ctx, e, r.s, r.wls, rep); err != nil {
			return err
		}
	}
	return nil
}

// systemRun is a system and the workloads it is to run under one
// condition.
type systemRun struct {
	s   system
	wls []workload
}

// plan returns whether c's ceiling is to be measured and what each system
// is to run under c: what was asked for and the results lack (all of it
// with -rerun), less the cells the skip rule records, without running
// them, as over the limit because they timed out at a shorter round trip.
func (h *harness) plan(c condition, rep *report) (ceil bool, runs []systemRun, err error) {
	ceil = h.o.runsWorkload("ceiling") && (h.o.rerun || !rep.hasCeiling(c))
	for _, s := range h.systems {
		if !h.o.runsSystem(s.name()) {
			continue
		}
		var wls []workload
		for _, w := range workloads {
			if !h.o.runsWorkload(w.name) || !h.o.rerun && rep.has(c, s.name(), w.name) {
				continue
			}
			if at, ok := rep.timedOutShorter(c, s.name(), w.name); ok {
				log.Printf("  %-6s %-9s skipped: timed out at %s", s.name(), w.name, at.column())
				if err := rep.add(c, s.name(), w.name, cell{err: skipped(at)}); err != nil {
					return false, nil, err
				}
				continue
			}
			wls = append(wls, w)
		}
		if len(wls) > 0 {
			runs = append(runs, systemRun{s, wls})
		}
	}
	return ceil, runs, nil
}

// runSystem sets up one system on e's bed and runs workloads wls. Only an
// interruption, or a results file that cannot be written, is returned as
// an error; a system that fails has its rows say so.
func (h *harness) runSystem(ctx context.Context, e *env, s system, wls []workload, rep *report) error {
	fmt.Fprintf(e.log, "### %s: setup\n", s.name())
	if err := s.setup(ctx, e); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Printf("  %s: %v", s.name(), err)
		defer s.teardown(e)
		// A workload the system could never do still says why; the others
		// say why the system did not start.
		for _, w := range wls {
			x := cell{err: err}
			if _, serr := s.script(w, e); errors.Is(serr, errNotApplicable) || errors.Is(serr, errNotMeasured) {
				x.err = serr
			}
			if err := rep.add(e.cond, s.name(), w.name, x); err != nil {
				return err
			}
		}
		return nil
	}
	defer s.teardown(e)
	for _, w := range wls {
		x, err := h.runWorkload(ctx, e, s, w)
		if err != nil {
			return err
		}
		if err := rep.add(e.cond, s.name(), w.name, x); err != nil {
			return err
		}
	}
	return nil
}

// runWorkload returns the cell of s for w on e's bed: its times, or why
// there are none. Only an interruption is returned as an error.
func (h *harness) runWorkload(ctx context.Context, e *env, s system, w workload) (cell, error) {
	sc, err := s.script(w, e)
	if err == nil && sc == "" {
		err = fmt.Errorf("%w: the harness has no %s command for %s", errUnavailable, s.name(), w.name)
	}
	if err == nil {
		err = h.data.unavailable(w)
	}
	if err != nil {
		return cell{err: err}, nil
	}
	x := h.measure(ctx, e, s, w, sc)
	return x, ctx.Err()
}

// measure runs script o.runs times, each after a reset, and returns the
// times and the traffic of the median run.
func (h *harness) measure(ctx context.Context, e *env, s system, w workload, script string) cell {
	type sample struct {
		t        time.Duration
		up, down netem.Stats
	}
	var samples []sample
	fail := func(i int, err error) cell {
		log.Printf("  %-6s %-9s run %d: %v", s.name(), w.name, i+1, err)
		return cell{err: err}
	}
	for i := range h.o.runs {
		if err := resetDirs(e); err != nil {
			return fail(i, err)
		}
		if err := prepare(ctx, e, w); err != nil {
			return fail(i, fmt.Errorf("prepare: %w", err))
		}
		if err := s.reset(ctx, e); err != nil {
			return fail(i, fmt.Errorf("reset: %w", err))
		}
		if wu := warmup(s, w, e); wu != "" {
			fmt.Fprintf(e.log, "### %s %s run %d, untimed warm-up: %s\n", s.name(), w.name, i+1, wu)
			err := e.client(ctx, h.o.timeout, wu)
			if st, ok := s.(settler); ok && err == nil {
				// What the warm-up wrote must be stored before the
				// timed run, or its bytes would count there.
				err = st.settle(ctx, e)
			}
			if err != nil {
				return fail(i, fmt.Errorf("warm-up: %w", err))
			}
		}
		fmt.Fprintf(e.log, "### %s %s run %d: %s\n", s.name(), w.name, i+1, script)
		u0, d0 := e.bed.Stats()
		start := time.Now()
		err := e.client(ctx, h.o.timeout, script)
		t := time.Since(start)
		if st, ok := s.(settler); ok && err == nil {
			// Untimed, but its bytes count: what the run left to do
			// in the background.
			err = st.settle(ctx, e)
		}
		u1, d1 := e.bed.Stats()
		fmt.Fprintf(e.log, "### took %v, err %v\n", t, err)
		if err != nil {
			return fail(i, err)
		}
		if err := verify(e, s, w); err != nil {
			return fail(i, err)
		}
		if p, ok := s.(peaker); ok {
			if rss, ok := p.peakRSS(e); ok {
				log.Printf("  %-6s %-9s run %d: peak resident memory of the mount %.1f MiB", s.name(), w.name, i+1, float64(rss)/(1<<20))
			}
		}
		log.Printf("  %-6s %-9s run %d: %.2f s", s.name(), w.name, i+1, t.Seconds())
		samples = append(samples, sample{t, u1.Sub(u0), d1.Sub(d0)})
	}
	slices.SortFunc(samples, func(a, b sample) int { return int(a.t - b.t) })
	m := samples[len(samples)/2]
	c := cell{up: m.up, down: m.down, median: m.t}
	for _, s := range samples {
		c.times = append(c.times, s.t)
	}
	return c
}

// A peaker is a system that can tell the most memory its client process
// has held, as the issue of large trees asks to be shown.
type peaker interface {
	peakRSS(e *env) (int64, bool)
}

// A settler is a system that may finish a workload's writes after its
// command returned; settle waits until they are done.
type settler interface {
	settle(ctx context.Context, e *env) error
}

// resetDirs empties the download and upload directories.
func resetDirs(e *env) error {
	for _, d := range []string{e.out, e.in} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// verify checks, untimed, that a workload did its job: a command that
// exits 0 having done nothing must not get a time. The workloads that only
// read check their answer in their scripts.
func verify(e *env, s system, w workload) error {
	var dir string
	switch w.name {
	case "rm-tree", "make-j2", "recompile", "edit-save", "upgrade":
		return verifyExtra(e, s, w)
	case "get-file", "get-tree":
		dir = e.out
	case "put-file", "put-tree":
		dir = e.in
	default:
		return nil
	}
	var files int
	var size int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files++
			if i, err := d.Info(); err == nil {
				size += i.Size()
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	wantFiles, wantSize := 1, e.h.data.bigSize
	if strings.HasSuffix(w.name, "-tree") {
		wantFiles, wantSize = e.h.data.treeFiles, e.h.data.treeBytes
	}
	if files != wantFiles || size != wantSize {
		return fmt.Errorf("verify: the copy has %d files of %d bytes, want %d of %d", files, size, wantFiles, wantSize)
	}
	return nil
}

// errTimeout marks a run that exceeded -timeout.
var errTimeout = errors.New("timeout")

// client runs a shell script in the client namespace with a time limit,
// logging its output, and kills its whole process group when it ends early.
func (e *env) client(ctx context.Context, limit time.Duration, script string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := e.command(ctx, e.bed.ClientNS, "sh", "-c", script)
	var tail tailBuffer
	cmd.Stdout = e.log
	cmd.Stderr = io.MultiWriter(e.log, &tail)
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("%w after %v", errTimeout, limit)
	}
	if err != nil {
		if msg := tail.last(); msg != "" {
			return fmt.Errorf("%w: %s", err, msg)
		}
	}
	return err
}

// command returns a command that runs in namespace ns in its own process
// group, so that cancelling ctx kills it and everything it started.
func (e *env) command(ctx context.Context, ns string, name string, args ...string) *exec.Cmd {
	cmd := e.bed.Command(ctx, ns, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "FERRY_HOME="+e.ferryHome(), "LC_ALL=C")
	return cmd
}

// ferryHome is FERRY_HOME of every command the harness runs: keys, and the
// client's chunk cache below cache/.
func (e *env) ferryHome() string { return filepath.Join(e.h.work, "ferry-home") }

// coldFerryCache empties the Ferry client's chunk cache, so that a run is
// cold as the issue asks: without it every run after the first would find
// the file's chunks on the client and not cross the link. The cache is
// renamed away first, because the daemon of the mount just unmounted may
// still be closing it; what it writes after that is removed with the work
// directory.
func (e *env) coldFerryCache() error {
	dir := filepath.Join(e.ferryHome(), "cache")
	old, err := os.MkdirTemp(e.h.work, "old-cache-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(old, "cache")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	os.RemoveAll(old) // Best effort: see above.
	return nil
}

// tailBuffer keeps the last line or so of what is written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) last() string {
	s := strings.TrimSpace(string(t.b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// q quotes s for sh.
func q(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// output runs a command and returns its standard output, with standard
// error in the error.
func output(ctx context.Context, name string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
