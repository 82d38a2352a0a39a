package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry/internal/netem"
)

// cell is one system's result for one workload under one condition.
type cell struct {
	times    []time.Duration // every run, fastest first
	median   time.Duration
	up, down netem.Stats // traffic of the median run
	err      error       // why there is no time
	commit   string      // the Ferry commit it was measured with
}

type cellKey struct {
	workload, system string
	cond             condition
}

type ceiling struct {
	up, down float64 // bits per second
	err      error
}

// report collects the results, keeps them in the results file if there is
// one, and writes them as Markdown.
type report struct {
	opts              *options
	data              *dataset
	cc                string
	started, finished time.Time
	loadStart         string
	loadEnd           string
	cells             map[cellKey]cell
	ceilings          map[condition]ceiling
	// results is the results file ("" for none) that every result is
	// written to as soon as it is added. earlier are the invocations
	// that added to it before this one; added is whether this one did.
	results string
	earlier []invocation
	added   bool
	commit  string // the Ferry commit this invocation measures
}

// newReport returns an empty report of a run with options o, which keeps
// its results in o.results if that is set.
func newReport(o *options, commit string) *report {
	return &report{opts: o, results: o.results, commit: commit, started: time.Now(), loadStart: loadavg()}
}

// add records a result measured now, with this invocation's Ferry commit,
// and saves it.
func (r *report) add(c condition, system, workload string, x cell) error {
	if x.commit == "" {
		x.commit = r.commit
	}
	r.put(cellKey{workload, system, c}, x)
	return r.save()
}

// put records a result without saving it.
func (r *report) put(k cellKey, x cell) {
	if r.cells == nil {
		r.cells = map[cellKey]cell{}
	}
	r.cells[k] = x
}

// addCeiling records and saves a ceiling measured now.
func (r *report) addCeiling(c condition, up, down float64, err error) error {
	r.putCeiling(c, ceiling{up, down, err})
	if err != nil {
		log.Printf("  iperf3: %v", err)
	} else {
		log.Printf("  iperf3: up %.1f Mbit/s, down %.1f Mbit/s", up/1e6, down/1e6)
	}
	return r.save()
}

func (r *report) putCeiling(c condition, ce ceiling) {
	if r.ceilings == nil {
		r.ceilings = map[condition]ceiling{}
	}
	r.ceilings[c] = ce
}

// has reports whether r holds a result of system for workload under c.
func (r *report) has(c condition, system, workload string) bool {
	_, ok := r.cells[cellKey{workload, system, c}]
	return ok
}

func (r *report) hasCeiling(c condition) bool {
	_, ok := r.ceilings[c]
	return ok
}

// timedOutShorter is the skip rule: it returns the shortest round trip, with
// c's loss and rate, at which system timed out on workload, if it is
// shorter than c's. A longer round trip only makes the same work slower,
// so the cell under c need not be run to know it would time out too.
func (r *report) timedOutShorter(c condition, system, workload string) (condition, bool) {
	var at condition
	found := false
	for k, x := range r.cells {
		if k.workload != workload || k.system != system || k.cond.Loss != c.Loss || k.cond.Rate != c.Rate ||
			k.cond.RTT >= c.RTT || !errors.Is(x.err, errTimeout) {
			continue
		}
		if !found || k.cond.RTT < at.RTT {
			at, found = k.cond, true
		}
	}
	return at, found
}

// finish marks the end of this invocation, in the results file too.
func (r *report) finish() error {
	r.finished, r.loadEnd = time.Now(), loadavg()
	if !r.added {
		return nil
	}
	return r.save()
}

// invocations returns the invocations whose results r holds: the earlier
// ones of the results file and this one, if it added anything or there is
// no file.
func (r *report) invocations() []invocation {
	inv := slices.Clone(r.earlier)
	if r.added || r.results == "" || len(inv) == 0 {
		inv = append(inv, invocation{Command: r.opts.commandLog, Started: r.started, Finished: r.finished, LoadStart: r.loadStart, LoadEnd: r.loadEnd})
	}
	return inv
}

// conditions returns the report's columns: every condition of this
// invocation and of the results it holds, by rate, loss and round trip.
func (r *report) conditions() []condition {
	conds := slices.Clone(r.opts.conds)
	addCond := func(c condition) {
		if !slices.Contains(conds, c) {
			conds = append(conds, c)
		}
	}
	for k := range r.cells {
		addCond(k.cond)
	}
	for c := range r.ceilings {
		addCond(c)
	}
	slices.SortStableFunc(conds, compareConds)
	return conds
}

// rowSystems returns the systems that have a row in every table: those
// this invocation runs and those the results hold anything of.
func (r *report) rowSystems() []string {
	conds := r.conditions()
	var systems []string
	for _, s := range systemNames() {
		if r.opts.runsSystem(s) || slices.ContainsFunc(workloadNames(), func(w string) bool { return r.hasCells(conds, w, s) }) {
			systems = append(systems, s)
		}
	}
	return systems
}

// write writes the report file and, if asked and possible, the plots.
func (r *report) write(ctx context.Context, plots bool) error {
	o := r.opts
	dir := filepath.Dir(o.out)
	plotDir := filepath.Join(dir, plotDirName(o.out))
	conds := r.conditions()
	var plotted map[string]string
	if plots && len(roundTrips(conds)) < 2 {
		log.Printf("no plots: time against round trip needs two round trips or more")
	} else if plots {
		var err error
		if plotted, err = r.plot(ctx, plotDir, conds); err != nil {
			log.Printf("no plots: %v", err)
		}
	}

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Benchmark report\n\n")
	p("Ferry beside the tools people use today for the same jobs, over the same emulated link in the same run ")
	p("(see [README.md](README.md) for how to run it and what each workload does). ")
	invs := r.invocations()
	if len(invs) == 1 {
		i := invs[0]
		p("Produced by `%s` on %s %s.\n\n", strings.TrimSpace(i.Command), fmtStarted(i), fmtDuration(i))
		p("- **Machine:** %s%s; load average %s at the start, %s at the end (other work on the machine skews the times).\n", machine(), r.commitNote(conds), i.LoadStart, i.LoadEnd)
	} else {
		p("Produced by %d invocations into the results file `%s` (see README.md, running in parts):\n\n", len(invs), r.results)
		for _, i := range invs {
			p("- `%s` on %s %s, load average %s at the start, %s at the end\n", strings.TrimSpace(i.Command), fmtStarted(i), fmtDuration(i), i.LoadStart, orUnknown(i.LoadEnd))
		}
		p("\n- **Machine:** %s%s (other work on the machine skews the times).\n", machine(), r.commitNote(conds))
	}
	if per := r.commitsPerCondition(conds); per != "" {
		p("- **Ferry commit:** differs between conditions: %s.\n", per)
	}
	p("- **Link:** emulated by `internal/netem` (user-space, between two network namespaces): %g Mbit/s each way; round trip and loss per column, the same in both directions; drop-tail queue of 1.5 × the bandwidth-delay product (at least %d kB); TCP congestion control `%s` in both namespaces.\n",
		float64(o.rate)/1e6, netem.DefaultMinQueue/1000, r.cc)
	big := fmt.Sprintf("a %d MiB file made of the files of %s concatenated (real data: sources and binaries)", r.data.bigSize>>20, r.data.bigFrom)
	if r.data.random {
		big = fmt.Sprintf("a %d MiB file of random bytes (-incompressible: neither compression nor a chunk index shrinks it, so the link is measured); put-file uploads another random file of that size, made afresh before each run, which the server holds nowhere", r.data.bigSize>>20)
	}
	p("- **Data:** %s; a copy of `%s` as the tree (%d files in %d directories, %s MB).\n",
		big, r.data.treeFrom, r.data.treeFiles, r.data.treeDirs, fmtMB(r.data.treeBytes))
	x := &r.data.extra
	module := upgradeModule
	if x.modDir != "" {
		module = "the directory " + x.modDir + " of " + upgradeModule
	}
	upgrade := fmt.Sprintf("upgrade takes %s from %s (%d files) to %s (%d files; %d files differ or are only in one)",
		module, upgradeFrom, x.modFiles[0], upgradeTo, x.modFiles[1], x.modDiffer)
	if x.modErr != nil {
		upgrade = "upgrade has no data: " + x.modErr.Error()
	}
	repo := fmt.Sprintf("git-status runs in a repository of %s (%d files)", x.repoFrom, x.repoFiles)
	if x.repoErr != nil {
		repo = "git-status has no data: " + x.repoErr.Error()
	}
	p("- **Other data:** missing-name looks up `%s`; make-j2 builds a generated C project of %d modules; recompile changes its `%s`; edit-save edits line %d of a %.1f MB document made of %s; %s; %s.\n",
		x.missing, x.cprojModules, x.touchName, x.docLine, float64(x.docBytes)/1e6, x.docFrom, upgrade, repo)
	p("- **Method:** wall time of the client command, the median of %d run(s), each into an empty destination and, for the mounts, from a fresh mount (cold cache; grep-warm times a second run on the mount). In parentheses: the ratio to the best peer in the column (the fastest system other than Ferry's and the references, local-disk and tcp). Bytes on the wire are whole IP packets counted by the emulator, for the median run.\n", o.runs)
	if o.note != "" {
		p("- **Note:** %s\n", o.note)
	}
	p("\n")

	header := func(first string) {
		p("| %s |", first)
		for _, c := range conds {
			p(" %s |", c.column())
		}
		p("\n|---|")
		for range conds {
			p("--:|")
		}
		p("\n")
	}

	if len(r.ceilings) > 0 {
		p("## Link ceiling: iperf3\n\nTCP throughput of one iperf3 flow over the link, after its first second: what any transfer can reach.\n\n")
		header("direction")
		for _, dir := range []string{"client → server", "server → client"} {
			p("| %s |", dir)
			for _, c := range conds {
				ce, ok := r.ceilings[c]
				switch {
				case !ok:
					p(" |")
				case ce.err != nil:
					p(" failed |")
				case dir == "client → server":
					p(" %.1f Mbit/s |", ce.up/1e6)
				default:
					p(" %.1f Mbit/s |", ce.down/1e6)
				}
			}
			p("\n")
		}
		p("\n")
	}

	// Every system run has a row in every table, also where it has no
	// time: the row says why.
	systems := r.rowSystems()
	for _, w := range workloads {
		if !slices.ContainsFunc(systems, func(s string) bool { return r.hasCells(conds, w.name, s) }) {
			continue
		}
		p("## %s: %s\n\n%s\n\n", w.name, w.title, w.desc)
		best := map[condition]time.Duration{}
		for _, c := range conds {
			for _, s := range systems {
				x, ok := r.cells[cellKey{w.name, s, c}]
				if ok && x.err == nil && isPeer(s) && (best[c] == 0 || x.median < best[c]) {
					best[c] = x.median
				}
			}
		}
		var notes []string
		note := func(s string) int {
			if i := slices.Index(notes, s); i >= 0 {
				return i + 1
			}
			notes = append(notes, s)
			return len(notes)
		}
		header("system")
		for _, s := range systems {
			p("| %s |", s)
			if long, short, ok := r.rowReason(conds, w.name, s); ok {
				// The same reason in every column: said once, in full.
				for i := range conds {
					if i == 0 {
						p(" %s |", strings.ReplaceAll(long, "|", `\|`))
					} else {
						p(" %s |", short)
					}
				}
				p("\n")
				continue
			}
			for _, c := range conds {
				x, ok := r.cells[cellKey{w.name, s, c}]
				switch {
				case !ok:
					p(" – |")
				case errors.Is(x.err, errNotApplicable):
					p(" n/a [%d] |", note(s+": "+strings.TrimPrefix(x.err.Error(), errNotApplicable.Error()+": ")))
				case errors.Is(x.err, errNotMeasured):
					p(" not measured [%d] |", note(s+": "+x.err.Error()))
				case errors.Is(x.err, errUnavailable):
					p(" not yet available [%d] |", note(s+": "+x.err.Error()))
				case errors.Is(x.err, errSkipped):
					p(" > %s [%d] |", fmtLimit(o.timeout), note(s+": "+strings.TrimPrefix(x.err.Error(), errTimeout.Error()+": ")))
				case errors.Is(x.err, errTimeout):
					p(" %s |", x.err)
				case x.err != nil:
					p(" failed [%d] |", note(s+": "+x.err.Error()))
				case best[c] > 0:
					p(" %s (%.2f×) |", fmtSecs(x.median), float64(x.median)/float64(best[c]))
				default:
					p(" %s |", fmtSecs(x.median))
				}
			}
			p("\n")
		}
		for i, n := range notes {
			p("\n[%d] %s", i+1, strings.ReplaceAll(n, "|", `\|`))
		}
		if len(notes) > 0 {
			p("\n")
		}
		p("\nBytes on the wire, client → server / server → client, MB:\n\n")
		header("system")
		for _, s := range systems {
			measured := false
			for _, c := range conds {
				x, ok := r.cells[cellKey{w.name, s, c}]
				measured = measured || ok && x.err == nil
			}
			if !measured {
				continue
			}
			p("| %s |", s)
			for _, c := range conds {
				x, ok := r.cells[cellKey{w.name, s, c}]
				if !ok || x.err != nil {
					p(" – |")
					continue
				}
				p(" %s / %s |", fmtMB(x.up.Bytes), fmtMB(x.down.Bytes))
			}
			p("\n")
		}
		if f, ok := plotted[w.name]; ok {
			rel, _ := filepath.Rel(dir, f)
			p("\n![%s: time against round trip](%s)\n", w.name, rel)
		}
		p("\n")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(o.out, []byte(b.String()), 0o644)
}

// hasCells reports whether system has a result for workload under any
// of conds.
func (r *report) hasCells(conds []condition, workload, system string) bool {
	for _, c := range conds {
		if _, ok := r.cells[cellKey{workload, system, c}]; ok {
			return true
		}
	}
	return false
}

// rowReason returns what a row says when system has the same reason for
// no time under every condition, that it is not applicable or not
// measured: in full ("n/a: scp only copies") and short ("n/a"). ok is false
// for a row with a time, another error, or reasons that differ.
func (r *report) rowReason(conds []condition, workload, system string) (long, short string, ok bool) {
	var msg string
	for i, c := range conds {
		x, found := r.cells[cellKey{workload, system, c}]
		if !found || !errors.Is(x.err, errNotApplicable) && !errors.Is(x.err, errNotMeasured) {
			return "", "", false
		}
		if i > 0 && x.err.Error() != msg {
			return "", "", false
		}
		msg = x.err.Error()
	}
	if why, isNA := strings.CutPrefix(msg, errNotApplicable.Error()+": "); isNA {
		return "n/a: " + why, "n/a", true
	}
	return msg, errNotMeasured.Error(), msg != ""
}

// plotDirName is the directory, beside the report, of its plots: plots/
// for REPORT.md, plots-NAME/ for REPORT-NAME.md or NAME.md, so that one
// report's plots never replace another's.
func plotDirName(report string) string {
	base := strings.TrimSuffix(filepath.Base(report), filepath.Ext(report))
	if base == "REPORT" {
		return "plots"
	}
	return "plots-" + strings.TrimPrefix(base, "REPORT-")
}

// roundTrips returns the distinct round trips of conds.
func roundTrips(conds []condition) []time.Duration {
	var rtts []time.Duration
	for _, c := range conds {
		if !slices.Contains(rtts, c.RTT) {
			rtts = append(rtts, c.RTT)
		}
	}
	return rtts
}

// commitNote returns the machine line's "; Ferry at commit X" when every
// result under conds was measured with one commit (or none was measured
// yet: this invocation's), and "" when they differ.
func (r *report) commitNote(conds []condition) string {
	commits := r.commits(conds, nil)
	switch {
	case len(commits) > 1:
		return ""
	case len(commits) == 1:
		return "; Ferry at commit " + commits[0]
	case r.commit != "":
		return "; Ferry at commit " + r.commit
	}
	return ""
}

// commitsPerCondition returns, when the results under conds were measured
// with more than one Ferry commit, each condition's commits
// ("0 ms, 0%: abc; 10 ms, 0%: def"), else "".
func (r *report) commitsPerCondition(conds []condition) string {
	if len(r.commits(conds, nil)) < 2 {
		return ""
	}
	var parts []string
	for _, c := range conds {
		if cs := r.commits(conds, &c); len(cs) > 0 {
			parts = append(parts, c.column()+": "+strings.Join(cs, " and "))
		}
	}
	return strings.Join(parts, "; ")
}

// commits returns the distinct Ferry commits of the cells under conds, or
// only under *only if it is not nil, sorted.
func (r *report) commits(conds []condition, only *condition) []string {
	var cs []string
	for k, x := range r.cells {
		if x.commit == "" || !slices.Contains(conds, k.cond) || only != nil && k.cond != *only || slices.Contains(cs, x.commit) {
			continue
		}
		cs = append(cs, x.commit)
	}
	slices.Sort(cs)
	return cs
}

// fmtStarted is when an invocation started, for the report.
func fmtStarted(i invocation) string { return i.Started.UTC().Format("2006-01-02 15:04 MST") }

// fmtDuration says how long an invocation ran, or that it did not finish.
func fmtDuration(i invocation) string {
	if i.Finished.IsZero() {
		return "interrupted (its finished cells are kept)"
	}
	return "in " + i.Finished.Sub(i.Started).Round(time.Second).String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// fmtLimit is the per-run time limit as a skipped cell shows it: "> 3 min".
func fmtLimit(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return fmt.Sprintf("%g s", d.Seconds())
}

func fmtSecs(d time.Duration) string {
	s := d.Seconds()
	switch {
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	case s < 100:
		return fmt.Sprintf("%.1f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}

func fmtMB(n int64) string {
	v := float64(n) / 1e6
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// loadavg returns the one-minute load average.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return firstField(string(b))
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}

// machine describes this machine and the tools' versions.
func machine() string {
	var parts []string
	cpu := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	parts = append(parts, fmt.Sprintf("nproc %d (%s)", runtime.NumCPU(), cpu))
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		parts = append(parts, fmt.Sprintf("%d GiB memory", (uint64(si.Totalram)*uint64(si.Unit)+1<<29)>>30))
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		parts = append(parts, "Linux "+unix.ByteSliceToString(u.Release[:]))
	}
	parts = append(parts, runtime.Version())
	// version adds the first line of a tool's version output that
	// contains want, with runs of spaces collapsed.
	version := func(want, name string, args ...string) {
		out, _ := exec.Command(name, args...).CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, want) {
				parts = append(parts, strings.Join(strings.Fields(l), " "))
				return
			}
		}
	}
	version("OpenSSH", "ssh", "-V")
	version("SSHFS", "sshfs", "--version")
	version("rsync", "rsync", "--version")
	version("iperf", "iperf3", "--version")
	return strings.Join(parts, "; ")
}

// plot draws one PNG per workload, time against round trip with a line per
// system and loss rate, with python3 and matplotlib. It returns the files
// by workload.
func (r *report) plot(ctx context.Context, dir string, conds []condition) (map[string]string, error) {
	py := "/usr/bin/python3"
	if exec.Command(py, "-c", "import matplotlib").Run() != nil {
		return nil, errors.New("python3 matplotlib is not installed (Debian: python3-matplotlib)")
	}
	type series struct {
		Label  string       `json:"label"`
		Dashed bool         `json:"dashed"`
		Points [][2]float64 `json:"points"` // round trip in ms, seconds
	}
	type chart struct {
		Name, Title, File string
		Series            []series
	}
	var charts []chart
	files := map[string]string{}
	var losses []float64
	for _, c := range conds {
		if !slices.Contains(losses, c.Loss) {
			losses = append(losses, c.Loss)
		}
	}
	for _, w := range workloads {
		ch := chart{Name: w.name, Title: w.name + ": " + w.title, File: filepath.Join(dir, w.name+".png")}
		for _, s := range systemNames() {
			for i, loss := range losses {
				se := series{Label: fmt.Sprintf("%s, %s loss", s, fmtLoss(loss)), Dashed: i > 0}
				for _, c := range conds {
					if x, ok := r.cells[cellKey{w.name, s, c}]; ok && c.Loss == loss && x.err == nil {
						se.Points = append(se.Points, [2]float64{float64(c.RTT) / 1e6, x.median.Seconds()})
					}
				}
				if len(se.Points) > 0 {
					slices.SortFunc(se.Points, func(a, b [2]float64) int { return int(a[0] - b[0]) })
					ch.Series = append(ch.Series, se)
				}
			}
		}
		if len(ch.Series) > 0 {
			charts = append(charts, ch)
			files[w.name] = ch.File
		}
	}
	if len(charts) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	js, err := json.Marshal(charts)
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp("", "ferry-bench-plot-*.py")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	tmp.WriteString(plotScript)
	tmp.Close()
	cmd := exec.CommandContext(ctx, py, tmp.Name())
	cmd.Stdin = strings.NewReader(string(js))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("plot: %w: %s", err, lastLines(string(out), 5))
	}
	return files, nil
}

// plotScript reads the charts as JSON on standard input and draws them.
const plotScript = `
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

colors = {}
for ch in json.load(sys.stdin):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for s in ch["Series"]:
        system = s["label"].split(",")[0]
        color = colors.setdefault(system, "C%d" % len(colors))
        xs = [p[0] for p in s["points"]]
        ys = [p[1] for p in s["points"]]
        if s["dashed"]:
            ax.plot(xs, ys, marker="s", fillstyle="none", linestyle="--", color=color, label=s["label"])
        else:
            ax.plot(xs, ys, marker="o", linestyle="-", color=color, label=s["label"])
    ax.set_title(ch["Title"])
    ax.set_xlabel("round trip (ms)")
    ax.set_ylabel("wall time (s)")
    ys = [p[1] for s in ch["Series"] for p in s["points"]]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(ch["File"])
    plt.close(fig)
`
