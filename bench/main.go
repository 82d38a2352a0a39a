// Command bench runs Ferry and the tools people use today (scp, rsync and
// sshfs over OpenSSH) over the same emulated slow links, in the same run, and
// writes a Markdown report with a table per workload and, where matplotlib
// is at hand, PNG plots of time against round trip.
//
// Usage, from the repository root, as root:
//
//	go run ./bench [-profile smoke|quick|full] [-runs N] [flags]
//
// See bench/README.md for what it measures and how.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/sshd"
)

// options are the command line, after the profile has filled in what the
// user left out.
type options struct {
	profile string
	runs    int
	rate    int64
	rtts    []time.Duration // with losses, the matrix of conditions
	losses  []float64
	conds   []condition // the conditions to run, in order
	bigSize int64
	tree    string
	// modules, docSize and upgradeDir scale the inputs of make-j2,
	// edit-save and upgrade: the C project's modules, the document's
	// bytes, and the directory of the module that upgrade moves ("" for
	// all of it).
	modules    int
	docSize    int
	upgradeDir string
	// repo is the directory a git repository is made of for git-status.
	repo string
	// incompressible makes the big file random bytes, and put-file upload
	// another random file, so that the Ferry rows of get-file, put-file
	// and read-file measure the link rather than compression and the
	// server's chunk index.
	incompressible bool
	note           string          // said in the report's header
	systems        map[string]bool // nil: all
	workloads      map[string]bool // nil: all
	out            string
	timeout        time.Duration
	iperfTime      time.Duration
	install        bool
	plots          bool
	keep           bool
	root           string // the repository
	commandLog     string // how the run was invoked, for the report
	// results is the results file that keeps every result as soon as it
	// is measured ("" for none); rerun measures again what it holds.
	results string
	rerun   bool
	// mountArgs are added to every ferry mount command line.
	mountArgs []string
}

// runsSystem reports whether the run is to run system.
func (o *options) runsSystem(system string) bool { return o.systems == nil || o.systems[system] }

// runsWorkload reports whether the run is to run workload.
func (o *options) runsWorkload(workload string) bool {
	return o.workloads == nil || o.workloads[workload]
}

// profiles give the defaults of each profile. The smoke one is one
// condition, the headline link, with every workload scaled down so
// that it takes a few minutes, for comparing before and after a change.
// The quick one took 27 minutes with every workload (slow peers at 100 ms
// dominate); the full one is the matrix of issue 3 and takes hours at 200
// ms, because sshfs pays several round trips per file.
var profiles = map[string]options{
	"smoke": {
		runs:   1,
		rtts:   []time.Duration{100 * time.Millisecond},
		losses: []float64{0},
		// A tree of 10 files in 4 directories keeps the nesting that the
		// walks measure; 10 modules keep sshfs's make -j2 under a minute.
		bigSize:    8 << 20,
		tree:       "/usr/local/go/src/container",
		modules:    10,
		docSize:    1 << 20,
		upgradeDir: "prometheus/promhttp",
		repo:       "/usr/local/go/src/math",
		timeout:    90 * time.Second,
		iperfTime:  3 * time.Second,
		note:       "smoke profile: one condition, one run of each cell and scaled-down inputs, for quick comparisons; single runs on a shared 2-core machine are noisy, so read differences under about 30% as ties.",
	},
	"quick": {
		runs:   1,
		rtts:   []time.Duration{10 * time.Millisecond, 100 * time.Millisecond},
		losses: []float64{0, 0.01},
		// Not the whole matrix: a short and a long link, and the long
		// one with loss.
		conds: []condition{
			{RTT: 10 * time.Millisecond},
			{RTT: 100 * time.Millisecond},
			{RTT: 100 * time.Millisecond, Loss: 0.01},
		},
		bigSize:   32 << 20,
		tree:      "/usr/local/go/src/regexp",
		modules:   300,
		docSize:   4 << 20,
		repo:      "/usr/local/go/src/cmd",
		timeout:   3 * time.Minute,
		iperfTime: 4 * time.Second,
	},
	"full": {
		runs:      3,
		rtts:      []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond},
		losses:    []float64{0, 0.01},
		bigSize:   128 << 20,
		tree:      "/usr/local/go/src/net",
		modules:   300,
		docSize:   4 << 20,
		repo:      "/usr/local/go/src/cmd",
		timeout:   20 * time.Minute,
		iperfTime: 10 * time.Second,
	},
}

// profileNames are the profiles from the shortest to the longest.
var profileNames = []string{"smoke", "quick", "full"}

func main() {
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench: ")
	if len(os.Args) > 1 && os.Args[1] == tcpcatCmd {
		if err := tcpcat(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func parseFlags() (*options, error) {
	var (
		profile   = flag.String("profile", "quick", "`name` of the condition matrix: smoke (a few minutes), quick (about half an hour) or full (hours)")
		runs      = flag.Int("runs", 0, "timed runs per cell, the report shows the median (default: 1 smoke and quick, 3 full)")
		rate      = flag.String("rate", "100mbit", "link `rate` of each direction")
		rtts      = flag.String("rtt", "", "comma-separated round trips, e.g. 0,10ms,100ms (default: the profile's)")
		losses    = flag.String("loss", "", "comma-separated loss rates, e.g. 0,1% (default: the profile's)")
		big       = flag.Int64("big", 0, "size of the big file in MiB (default: 8 smoke, 32 quick, 128 full)")
		tree      = flag.String("tree", "", "source `dir`ectory copied as the tree workloads' data (default: a Go source directory)")
		systems   = flag.String("systems", "", "comma-separated systems to run (default: all): "+strings.Join(systemNames(), ","))
		workloads = flag.String("workloads", "", "comma-separated workloads to run (default: all): "+strings.Join(workloadNames(), ","))
		out       = flag.String("out", "", "report `file` (default: bench/REPORT.md in the repository, bench/REPORT-smoke.md for -profile smoke)")
		timeout   = flag.Duration("timeout", 0, "limit of one timed run (default: 90s smoke, 3m quick, 20m full)")
		install   = flag.Bool("install", true, "install missing Debian packages with apt-get")
		plots     = flag.Bool("plots", true, "draw PNG plots with python3 and matplotlib (installed from Debian if missing)")
		keep      = flag.Bool("keep", false, "keep the work directory (data, logs, keys) instead of removing it")
		incompr   = flag.Bool("incompressible", false, "make the big file random bytes, and upload another random file in put-file, to measure the link itself")
		results   = flag.String("results", "", "JSON `file` that keeps every result as soon as it is measured; what it holds is not measured again, and the report is made from all of it (see README.md, running in parts)")
		mountArgs = flag.String("mount-args", "", "extra `args` of every ferry mount, e.g. \"--memory 64M\"")
		rerun     = flag.Bool("rerun", false, "with -results, measure again the cells of this run's conditions that the file already holds")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./bench [flags]\n\nRuns Ferry and its peers over emulated links and writes a report; needs root.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	p, ok := profiles[*profile]
	if !ok {
		return nil, fmt.Errorf("unknown profile %q: want one of %s", *profile, strings.Join(profileNames, ","))
	}
	o := p
	o.profile = *profile
	o.install, o.plots, o.keep, o.incompressible = *install, *plots, *keep, *incompr
	o.results, o.rerun = *results, *rerun
	o.mountArgs = strings.Fields(*mountArgs)
	o.commandLog = "go run ./bench " + strings.Join(os.Args[1:], " ")
	if *runs > 0 {
		o.runs = *runs
	}
	var err error
	if o.rate, err = netem.ParseRate(*rate); err != nil {
		return nil, err
	}
	if *rtts != "" {
		o.rtts = nil
		for _, s := range strings.Split(*rtts, ",") {
			s = strings.TrimSpace(s)
			if s == "0" {
				s = "0s"
			}
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("bad -rtt %q", s)
			}
			o.rtts = append(o.rtts, d)
		}
	}
	if *losses != "" {
		o.losses = nil
		for _, s := range strings.Split(*losses, ",") {
			v, err := netem.ParseLoss(s)
			if err != nil {
				return nil, err
			}
			o.losses = append(o.losses, v)
		}
	}
	if o.conds == nil || *rtts != "" || *losses != "" {
		o.conds = nil
		for _, loss := range o.losses {
			for _, rtt := range o.rtts {
				o.conds = append(o.conds, condition{RTT: rtt, Loss: loss})
			}
		}
	}
	for i := range o.conds {
		o.conds[i].Rate = o.rate
	}
	// From the shortest round trip up, so that the skip rule knows what
	// timed out at a shorter one.
	slices.SortStableFunc(o.conds, compareConds)
	if *big > 0 {
		o.bigSize = *big << 20
	}
	if *tree != "" {
		o.tree = *tree
	}
	if *timeout > 0 {
		o.timeout = *timeout
	}
	set := func(s string, known []string) (map[string]bool, error) {
		if s == "" {
			return nil, nil
		}
		m := map[string]bool{}
		for _, n := range strings.Split(s, ",") {
			n = strings.TrimSpace(n)
			ok := false
			for _, k := range known {
				ok = ok || k == n
			}
			if !ok {
				return nil, fmt.Errorf("unknown name %q: want one of %s", n, strings.Join(known, ","))
			}
			m[n] = true
		}
		return m, nil
	}
	if o.systems, err = set(*systems, systemNames()); err != nil {
		return nil, err
	}
	if o.workloads, err = set(*workloads, workloadNames()); err != nil {
		return nil, err
	}
	if o.root, err = repoRoot(); err != nil {
		return nil, err
	}
	o.out = *out
	if o.out == "" {
		// A smoke run must not replace the report of a longer one.
		name := "REPORT.md"
		if o.profile == "smoke" {
			name = "REPORT-smoke.md"
		}
		o.out = filepath.Join(o.root, "bench", name)
	}
	return &o, nil
}

// repoRoot finds the Ferry repository above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/ferryfs/ferry\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run bench from inside the Ferry repository (go run ./bench)")
		}
		dir = parent
	}
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	if err := netem.Available(); err != nil {
		return err
	}
	// The first SIGINT or SIGTERM cancels ctx: the running command is
	// killed and every deferred cleanup below runs. A second one kills
	// the process at once (the next run's netem.New sweeps what is left).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()

	// The results file is read first, so that one made with other inputs
	// is refused before anything is installed or prepared.
	rep := newReport(o, ferryCommit(o.root))
	if err := loadInto(rep, o.results); err != nil {
		return err
	}
	if o.install {
		// Plots need two round trips or more; matplotlib is not worth
		// installing for one.
		if err := installPackages(ctx, o.plots && len(roundTrips(rep.conditions())) > 1); err != nil {
			return err
		}
	}
	if err := checkTools(); err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "ferry-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		log.Printf("work directory %s is kept", work)
	} else {
		defer os.RemoveAll(work)
	}
	// Systems unmount what they mount; this is the safety net, and it runs
	// before the work directory, which holds the mount point, is removed.
	defer func() {
		if mnt := filepath.Join(work, "mnt"); isMounted(mnt) {
			unmount(mnt)
		}
	}()

	d, err := prepareData(ctx, o, work)
	if err != nil {
		return err
	}
	keys, err := sshd.MakeKeys(ctx, filepath.Join(work, "ssh"))
	if err != nil {
		return err
	}
	h := &harness{o: o, work: work, data: d, keys: keys}
	b := &ferryBuild{h: h}
	h.systems = allSystems(h, b)
	// Ferry is built now, with the commit taken just before, so that the
	// report names the commit measured even if commits land during a long
	// run, and edits made meanwhile cannot break the build. A failed build
	// is reported in Ferry's cells.
	if o.systems == nil || o.systems["ferry"] || o.systems["ferry-mount"] || o.systems["ferry-mount-wb"] {
		rep.commit = ferryCommit(o.root)
		if err := b.get(ctx); err != nil {
			log.Printf("ferry: %v", err)
		}
	}

	rep.data = d
	rep.started, rep.loadStart = time.Now(), loadavg()
	for i, cond := range o.conds {
		log.Printf("condition %d of %d: %s", i+1, len(o.conds), cond)
		if err := h.runCondition(ctx, cond, rep); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			return fmt.Errorf("condition %s: %w", cond, err)
		}
	}
	if err := rep.finish(); err != nil {
		return err
	}
	if err := rep.write(ctx, o.plots); err != nil {
		return err
	}
	log.Printf("report written to %s", o.out)
	return nil
}

// loadInto adds the results of the results file at path, if there is one,
// to rep.
func loadInto(rep *report, path string) error {
	if path == "" {
		return nil
	}
	f, err := loadResults(path, inputsOf(rep.opts))
	if err != nil || f == nil {
		return err
	}
	if rep.opts.rerun {
		log.Printf("results file %s holds %d cells and %d ceilings; -rerun measures this run's again", path, len(f.Cells), len(f.Ceilings))
	} else {
		log.Printf("results file %s holds %d cells and %d ceilings; they are not measured again", path, len(f.Cells), len(f.Ceilings))
	}
	return rep.load(f)
}
