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
}

type cellKey struct {
	workload, system string
	cond             condition
}

type ceiling struct {
	up, down float64 // bits per second
	err      error
}

// report collects the results and writes them as Markdown.
type report struct {
	opts              *options
	data              *dataset
	cc                string
	started, finished time.Time
	loadStart         string
	cells             map[cellKey]cell
	ceilings          map[condition]ceiling
}

func (r *report) add(c condition, system, workload string, x cell) {
	if r.cells == nil {
		r.cells = map[cellKey]cell{}
	}
	r.cells[cellKey{workload, system, c}] = x
}

func (r *report) addCeiling(c condition, up, down float64, err error) {
	if r.ceilings == nil {
		r.ceilings = map[condition]ceiling{}
	}
	r.ceilings[c] = ceiling{up, down, err}
	if err != nil {
		log.Printf("  iperf3: %v", err)
	} else {
		log.Printf("  iperf3: up %.1f Mbit/s, down %.1f Mbit/s", up/1e6, down/1e6)
	}
}

// write writes the report file and, if asked and possible, the plots.
func (r *report) write(ctx context.Context, plots bool) error {
	o := r.opts
	dir := filepath.Dir(o.out)
	plotDir := filepath.Join(dir, plotDirName(o.out))
	var plotted map[string]string
	if plots && len(roundTrips(o.conds)) < 2 {
		log.Printf("no plots: time against round trip needs two round trips or more")
	} else if plots {
		var err error
		if plotted, err = r.plot(ctx, plotDir); err != nil {
			log.Printf("no plots: %v", err)
		}
	}

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Benchmark report\n\n")
	p("Ferry beside the tools people use today for the same jobs, over the same emulated link in the same run ")
	p("(see [README.md](README.md) for how to run it and what each workload does). ")
	p("Produced by `%s` on %s in %s.\n\n", strings.TrimSpace(o.commandLog), r.started.UTC().Format("2006-01-02 15:04 MST"), r.finished.Sub(r.started).Round(time.Second))
	p("- **Machine:** %s; load average %s at the start, %s at the end (other work on the machine skews the times).\n", machine(), r.loadStart, loadavg())
	p("- **Link:** emulated by `internal/netem` (user-space, between two network namespaces): %g Mbit/s each way; round trip and loss per column, the same in both directions; drop-tail queue of 1.5 × the bandwidth-delay product (at least %d kB); TCP congestion control `%s` in both namespaces.\n",
		float64(o.rate)/1e6, netem.DefaultMinQueue/1000, r.cc)
	p("- **Data:** a %d MiB file made of the files of %s concatenated (real data: sources and binaries); a copy of `%s` as the tree (%d files in %d directories, %s MB).\n",
		r.data.bigSize>>20, r.data.bigFrom, r.data.treeFrom, r.data.treeFiles, r.data.treeDirs, fmtMB(r.data.treeBytes))
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
	p("- **Other data:** missing-name looks up `%s`; make-j2 builds a generated C project of %d modules; edit-save edits line %d of a %.1f MB document made of %s; %s; %s.\n",
		x.missing, x.cprojModules, x.docLine, float64(x.docBytes)/1e6, x.docFrom, upgrade, repo)
	p("- **Method:** wall time of the client command, the median of %d run(s), each into an empty destination and, for the mounts, from a fresh mount (cold cache; grep-warm times a second run on the mount). In parentheses: the ratio to the best peer in the column (the fastest system other than Ferry's and the local-disk reference). Bytes on the wire are whole IP packets counted by the emulator, for the median run.\n", o.runs)
	if o.note != "" {
		p("- **Note:** %s\n", o.note)
	}
	p("\n")

	conds := o.conds
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
	var systems []string
	for _, s := range systemNames() {
		if o.systems == nil || o.systems[s] {
			systems = append(systems, s)
		}
	}
	for _, w := range workloads {
		if !slices.ContainsFunc(systems, func(s string) bool { return r.hasCells(w.name, s) }) {
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
			if long, short, ok := r.rowReason(w.name, s); ok {
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
// condition.
func (r *report) hasCells(workload, system string) bool {
	for _, c := range r.opts.conds {
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
func (r *report) rowReason(workload, system string) (long, short string, ok bool) {
	var msg string
	for i, c := range r.opts.conds {
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
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		parts = append(parts, "Ferry at commit "+strings.TrimSpace(string(out)))
	}
	return strings.Join(parts, "; ")
}

// plot draws one PNG per workload, time against round trip with a line per
// system and loss rate, with python3 and matplotlib. It returns the files
// by workload.
func (r *report) plot(ctx context.Context, dir string) (map[string]string, error) {
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
	for _, c := range r.opts.conds {
		if !slices.Contains(losses, c.Loss) {
			losses = append(losses, c.Loss)
		}
	}
	for _, w := range workloads {
		ch := chart{Name: w.name, Title: w.name + ": " + w.title, File: filepath.Join(dir, w.name+".png")}
		for _, s := range systemNames() {
			for i, loss := range losses {
				se := series{Label: fmt.Sprintf("%s, %s loss", s, fmtLoss(loss)), Dashed: i > 0}
				for _, c := range r.opts.conds {
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
