// Command load is the server load benchmark of issue 6: hundreds of
// concurrent clients download from one `ferry serve` over an emulated long
// link, some of them throttled to 1 Mbit/s and the rest not. It reports the
// aggregate throughput, the server's memory and CPU, and how the read-ahead
// memory divides between slow and fast clients, with the server's adaptive
// read-ahead and with fixed-size read-ahead (`ferry serve
// --readahead-fixed`), in the same invocation. At the end of every run it
// kills 15% of the clients mid-download (resets their connections) and
// reports how quickly the server's cancelled-reads counter accounts for
// them and their read-ahead memory returns.
//
// With the argument latency it runs the benchmark's second part instead:
// one client times Stats and small Gets on an idle link and while a bulk
// download, then a bulk upload, runs on the same client, over a fresh bed
// for each link (see latency.go).
//
// Usage, from the repository root, as root:
//
//	go run ./bench/load [flags]
//	go run ./bench/load latency [flags]
//
// See bench/README.md ("The server load benchmark" and "The latency
// benchmark") for what they measure and their limitations.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
)

// options are the command line.
type options struct {
	clients    int
	slowFrac   float64
	slowRate   int64 // bits per second
	rtt        time.Duration
	rate       int64 // the link's rate each way, bits per second
	fileSize   int64
	files      int
	warmup     time.Duration
	duration   time.Duration
	fixed      []int64 // the fixed read-ahead sizes compared with adaptive
	runs       int
	killFrac   float64
	killWait   time.Duration
	sample     time.Duration
	killSample time.Duration
	out        string
	keep       bool
	commandLog string
}

// slow is how many clients are throttled.
func (o *options) slow() int { return int(float64(o.clients)*o.slowFrac + 0.5) }

// servedFiles are the files the clients download.
func (o *options) servedFiles() []servedFile {
	var files []servedFile
	for i := range o.files {
		files = append(files, servedFile{fmt.Sprintf("f%d.bin", i), o.fileSize})
	}
	return files
}

// mode is one server configuration: adaptive read-ahead (fixed 0) or a
// fixed size.
type mode struct {
	fixed int64
}

func (m mode) String() string {
	if m.fixed == 0 {
		return "adaptive"
	}
	return "fixed " + fmtSize(m.fixed)
}

// modes are the configurations compared, adaptive first.
func (o *options) modes() []mode {
	ms := []mode{{}}
	for _, f := range o.fixed {
		ms = append(ms, mode{f})
	}
	return ms
}

func main() {
	workerMain(os.Args[1:])
	log.SetFlags(log.Ltime)
	log.SetPrefix("load: ")
	var err error
	if len(os.Args) > 1 && os.Args[1] == "latency" {
		log.SetPrefix("latency: ")
		err = runLatency(os.Args[2:])
	} else {
		err = run()
	}
	if err != nil {
		log.Fatal(err)
	}
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	o := &options{}
	var slowRate, rate, size, fixed string
	fs.IntVar(&o.clients, "clients", 200, "concurrent clients")
	fs.Float64Var(&o.slowFrac, "slow", 0.95, "`fraction` of the clients throttled to -slow-rate")
	fs.StringVar(&slowRate, "slow-rate", "1mbit", "the throttled clients' `rate`")
	fs.DurationVar(&o.rtt, "rtt", 50*time.Millisecond, "the link's round trip")
	fs.StringVar(&rate, "rate", "300mbit", "the link's `rate` each way (the emulator tops out near 1 Gbit/s of one core)")
	fs.StringVar(&size, "size", "32MiB", "`size` of each file the clients download")
	fs.IntVar(&o.files, "files", 4, "files of -size served; client i starts with file i mod -files")
	fs.DurationVar(&o.warmup, "warmup", 8*time.Second, "time from the last client's first bytes to the measured window")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "the measured window")
	fs.StringVar(&fixed, "fixed", "1MiB,4MiB", "comma-separated fixed read-ahead `sizes` run beside adaptive (empty: adaptive only)")
	fs.IntVar(&o.runs, "runs", 3, "runs of each mode; the report shows medians")
	fs.Float64Var(&o.killFrac, "kill", 0.15, "`fraction` of each class of clients killed at the end of each run")
	fs.DurationVar(&o.killWait, "kill-wait", 5*time.Second, "how long to watch the server after the kill")
	fs.DurationVar(&o.sample, "sample", 500*time.Millisecond, "interval of the server's samples in the window")
	fs.DurationVar(&o.killSample, "kill-sample", 10*time.Millisecond, "interval of the server's samples after the kill")
	fs.StringVar(&o.out, "out", "bench/REPORT-load.md", "report `file`")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, data) instead of removing it")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./bench/load [flags]\n\nRuns the server load benchmark over an emulated link and writes a report; needs root.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.slowRate, err = netem.ParseRate(slowRate); err != nil || o.slowRate <= 0 {
		return nil, fmt.Errorf("bad -slow-rate %q", slowRate)
	}
	if o.rate, err = netem.ParseRate(rate); err != nil {
		return nil, fmt.Errorf("bad -rate %q: %w", rate, err)
	}
	if o.fileSize, err = parseSize(size); err != nil || o.fileSize <= 0 {
		return nil, fmt.Errorf("bad -size %q", size)
	}
	for _, f := range strings.Split(fixed, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := parseSize(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad -fixed size %q", f)
		}
		o.fixed = append(o.fixed, n)
	}
	switch {
	case o.clients <= 0:
		return nil, errors.New("-clients must be positive")
	case o.slowFrac < 0 || o.slowFrac > 1 || o.killFrac < 0 || o.killFrac > 1:
		return nil, errors.New("-slow and -kill are fractions from 0 to 1")
	case o.files <= 0 || o.runs <= 0:
		return nil, errors.New("-files and -runs must be positive")
	case o.duration <= 0 || o.sample <= 0 || o.killSample <= 0 || o.rtt < 0:
		return nil, errors.New("-duration, -sample and -kill-sample must be positive, -rtt not negative")
	}
	o.commandLog = strings.TrimSpace("go run ./bench/load " + strings.Join(args, " "))
	return o, nil
}

func run() error {
	o, err := parseFlags(os.Args[1:])
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
	h, err := newHarness(ctx, root, o.keep, o.servedFiles())
	if err != nil {
		return err
	}
	defer h.close()
	if err := h.openBed(ctx, netem.Symmetric(o.rtt, o.rate, 0)); err != nil {
		return err
	}
	rep := &report{opts: o, started: time.Now(), loadStart: loadavg(), machine: machine(), commit: ferryCommit(root), cc: h.bed.CongestionControl}
	// Modes alternate within each round, so that a change in the
	// machine's load falls on all of them alike.
	for r := range o.runs {
		for _, m := range o.modes() {
			log.Printf("run %d/%d: %s", r+1, o.runs, m)
			res, err := h.runOnce(ctx, o, m)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("run %d, %s: %w", r+1, m, err)
			}
			res.run = r + 1
			log.Printf("  %s", res.summary())
			rep.runs = append(rep.runs, res)
		}
	}
	rep.finished, rep.loadEnd = time.Now(), loadavg()
	return writeOut(root, o.out, rep.write)
}

// begin checks that a bed can be made and returns the invocation's
// context and the repository's root. The first Ctrl-C cancels the context
// and everything unwinds: processes killed, namespaces and files removed.
// After it, signals get their default action again, so a second Ctrl-C
// exits at once (the next run then sweeps what is left). The caller must
// call stop.
func begin() (ctx context.Context, stop context.CancelFunc, root string, err error) {
	if err := netem.Available(); err != nil {
		return nil, nil, "", err
	}
	if root, err = repoRoot(); err != nil {
		return nil, nil, "", err
	}
	ctx, stop = signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	return ctx, stop, root, nil
}

// workerMain runs the worker args name, if they name one, and exits.
// Both main and the tests' TestMain call it: the benchmark runs its own
// binary (os.Executable) again as the worker.
func workerMain(args []string) {
	if len(args) == 0 {
		return
	}
	var run func([]string) error
	switch args[0] {
	case "worker":
		run = runWorker
	case "latency-worker":
		run = runLatencyWorker
	default:
		return
	}
	if err := run(args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "load %s: %v\n", args[0], err)
		os.Exit(1)
	}
	os.Exit(0)
}

// repoRoot returns the directory of go.mod above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run from the repository")
		}
		dir = parent
	}
}
