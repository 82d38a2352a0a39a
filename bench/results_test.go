package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
)

// testOptions returns the options of a run under conds that keeps its
// results in dir/results.json and writes its report to dir/REPORT-test.md.
func testOptions(dir string, conds ...condition) *options {
	return &options{
		conds: conds, runs: 1, rate: 100e6, bigSize: 8 << 20, tree: "/usr/local/go/src/container",
		modules: 10, docSize: 1 << 20, repo: "/usr/local/go/src/math", upgradeDir: "prometheus/promhttp",
		timeout: 3 * time.Minute, out: filepath.Join(dir, "REPORT-test.md"),
		results: filepath.Join(dir, "results.json"), commandLog: "go run ./bench -profile smoke",
	}
}

func ms(n int) condition { return condition{RTT: time.Duration(n) * time.Millisecond, Rate: 100e6} }

// tables returns a written report's tables: what follows its header,
// which names the invocations and differs between them.
func tables(t *testing.T, r *report) string {
	t.Helper()
	if err := r.write(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.opts.out)
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(b), "\n## ")
	return after
}

// TestResultsRoundTrip checks that every kind of cell and ceiling reads
// back from the results file as it was written: times, traffic, commit,
// and errors with their message and class, so that the report words them
// the same.
func TestResultsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir, ms(10))
	c := o.conds[0]
	stats := netem.Stats{Packets: 10, Bytes: 15000, LossPackets: 1, LossBytes: 1500, QueuePackets: 2, QueueBytes: 3000}
	cases := []struct {
		system string
		x      cell
	}{
		{"rsync", cell{times: []time.Duration{time.Second, 1500 * time.Millisecond, 2*time.Second + 1}, median: 1500 * time.Millisecond, up: stats, down: netem.Stats{Bytes: 7}}},
		{"scp", cell{err: notApplicable("scp only copies")}},
		{"nfs", cell{err: fmt.Errorf("%w: no NFS client in this kernel", errNotMeasured)}},
		{"ferry", cell{err: fmt.Errorf("%w: needs `ferry find`", errUnavailable)}},
		{"sshfs", cell{err: fmt.Errorf("%w after %v", errTimeout, 3*time.Minute)}},
		{"ferry-mount", cell{err: skipped(ms(5))}},
		{"ssh", cell{err: errors.New("verify: the copy has 3 files of 10 bytes, want 4 of 12")}},
	}
	w := testReport(o, "abc1234")
	for _, tc := range cases {
		if err := w.add(c, tc.system, "find", tc.x); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.addCeiling(c, 90e6, 95e6, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.addCeiling(ms(50), 0, 0, errors.New("iperf3: exit status 1")); err != nil {
		t.Fatal(err)
	}
	r := testReport(testOptions(dir, c), "other")
	if err := loadInto(r, o.results); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		got, ok := r.cells[cellKey{"find", tc.system, c}]
		if !ok {
			t.Errorf("%s: no cell read back", tc.system)
			continue
		}
		want := tc.x
		want.commit = "abc1234"
		if !slices.Equal(got.times, want.times) || got.median != want.median || got.up != want.up || got.down != want.down || got.commit != want.commit {
			t.Errorf("%s: got %+v, want %+v", tc.system, got, want)
		}
		if (got.err == nil) != (want.err == nil) || got.err != nil && got.err.Error() != want.err.Error() {
			t.Errorf("%s: error %v, want %v", tc.system, got.err, want.err)
		}
		for _, class := range errorClasses() {
			if g, w := errors.Is(got.err, class.sentinel), errors.Is(want.err, class.sentinel); g != w {
				t.Errorf("%s: errors.Is(%v, %s) = %v, want %v", tc.system, got.err, class.name, g, w)
			}
		}
	}
	if got := r.ceilings[c]; got.up != 90e6 || got.down != 95e6 || got.err != nil {
		t.Errorf("ceiling at %s: got %+v, want 90e6 up, 95e6 down", c.column(), got)
	}
	if got := r.ceilings[ms(50)]; got.err == nil || got.err.Error() != "iperf3: exit status 1" {
		t.Errorf("ceiling at 50 ms: error %v, want iperf3: exit status 1", got.err)
	}
	if got, want := tables(t, r), tables(t, w); got != want {
		t.Errorf("report from the file:\n%s\nwant, as from the run:\n%s", got, want)
	}
}

// testReport returns an empty report of a run with options o, measuring
// Ferry commit commit.
func testReport(o *options, commit string) *report {
	r := newReport(o, commit)
	r.data = &dataset{}
	return r
}

// TestResultsRefuseOtherInputs checks that a results file is not mixed
// with results of other inputs, and that the Ferry commit is not one.
func TestResultsRefuseOtherInputs(t *testing.T) {
	cases := []struct {
		name    string
		change  func(o *options)
		wantErr string // "" for none
	}{
		{"same inputs", func(o *options) {}, ""},
		{"other conditions", func(o *options) { o.conds = []condition{ms(200)} }, ""},
		{"other systems", func(o *options) { o.systems = map[string]bool{"rsync": true} }, ""},
		{"big", func(o *options) { o.bigSize = 128 << 20 }, "big 8388608 in the file, 134217728 in this run"},
		{"tree", func(o *options) { o.tree = "/usr/local/go/src/net" }, "tree /usr/local/go/src/container in the file, /usr/local/go/src/net in this run"},
		{"modules", func(o *options) { o.modules = 300 }, "modules 10 in the file, 300 in this run"},
		{"doc size", func(o *options) { o.docSize = 4 << 20 }, "doc_size"},
		{"repo", func(o *options) { o.repo = "/usr/local/go/src/cmd" }, "repo"},
		{"upgrade dir", func(o *options) { o.upgradeDir = "" }, "upgrade_dir"},
		{"incompressible", func(o *options) { o.incompressible = true }, "incompressible false in the file, true in this run"},
		{"rate", func(o *options) { o.rate = 20e6 }, "rate 100000000 in the file, 20000000 in this run"},
		{"runs", func(o *options) { o.runs = 3 }, "runs 1 in the file, 3 in this run"},
		{"timeout", func(o *options) { o.timeout = 20 * time.Minute }, "timeout 3m0s in the file, 20m0s in this run"},
	}
	dir := t.TempDir()
	o := testOptions(dir, ms(10))
	if err := testReport(o, "abc").add(ms(10), "rsync", "find", cell{median: time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o2 := *o
			tc.change(&o2)
			r := testReport(&o2, "another-commit")
			err := loadInto(r, o.results)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got %v, want an error naming %q", err, tc.wantErr)
			case tc.wantErr == "" && !r.has(ms(10), "rsync", "find"):
				t.Errorf("the file's cell was not loaded")
			}
		})
	}
}

// TestSkipRule checks which cells the skip rule records as over the limit
// without running them: the same system and workload at a longer round
// trip with the same loss and rate as a timeout.
func TestSkipRule(t *testing.T) {
	lossy := func(c condition) condition { c.Loss = 0.01; return c }
	slow := func(c condition) condition { c.Rate = 20e6; return c }
	r := testReport(testOptions(t.TempDir()), "abc")
	r.results = "" // This test keeps nothing.
	r.add(ms(10), "sshfs", "make-j2", cell{median: time.Minute})
	r.add(ms(50), "sshfs", "make-j2", cell{err: fmt.Errorf("%w after 3m0s", errTimeout)})
	r.add(ms(100), "sshfs", "make-j2", cell{err: skipped(ms(50))})
	r.add(ms(50), "scp", "get-tree", cell{err: errors.New("exit status 1")})
	r.add(lossy(ms(100)), "ferry-mount", "make-j2", cell{err: skipped(lossy(ms(50)))})
	cases := []struct {
		name             string
		c                condition
		system, workload string
		wantAt           *condition // nil: not skipped
	}{
		{"longer round trip", ms(200), "sshfs", "make-j2", &[]condition{ms(50)}[0]},
		{"just longer", ms(51), "sshfs", "make-j2", &[]condition{ms(50)}[0]},
		{"the same round trip", ms(50), "sshfs", "make-j2", nil},
		{"shorter round trip", ms(10), "sshfs", "make-j2", nil},
		{"other loss", lossy(ms(200)), "sshfs", "make-j2", nil},
		{"other rate", slow(ms(200)), "sshfs", "make-j2", nil},
		{"other system", ms(200), "rsync", "make-j2", nil},
		{"other workload", ms(200), "sshfs", "recompile", nil},
		{"a failure is not a timeout", ms(200), "scp", "get-tree", nil},
		{"a skipped cell counts", lossy(ms(200)), "ferry-mount", "make-j2", &[]condition{lossy(ms(100))}[0]},
	}
	for _, tc := range cases {
		at, ok := r.timedOutShorter(tc.c, tc.system, tc.workload)
		switch {
		case tc.wantAt == nil && ok:
			t.Errorf("%s: %s %s at %s skipped for %s, want it run", tc.name, tc.system, tc.workload, tc.c, at)
		case tc.wantAt != nil && (!ok || at != *tc.wantAt):
			t.Errorf("%s: %s %s at %s: got (%v, %v), want skipped for %s", tc.name, tc.system, tc.workload, tc.c, at, ok, *tc.wantAt)
		}
	}
}

// TestPlan checks what a condition has left to run: neither what the
// results hold (unless -rerun) nor what the skip rule records, which it
// records as over the limit.
func TestPlan(t *testing.T) {
	cases := []struct {
		name  string
		rerun bool
		want  []string // system: workloads
	}{
		{"resume", false, []string{"rsync: make-j2", "sshfs: find"}},
		{"rerun", true, []string{"rsync: find make-j2", "sshfs: find"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := testEnv(t)
			o := testOptions(t.TempDir(), ms(100))
			o.systems = map[string]bool{"rsync": true, "sshfs": true}
			o.workloads = map[string]bool{"find": true, "make-j2": true, "ceiling": true}
			o.rerun = tc.rerun
			h.o = o
			r := testReport(o, "abc")
			r.add(ms(10), "sshfs", "make-j2", cell{err: fmt.Errorf("%w after 3m0s", errTimeout)})
			r.add(ms(100), "rsync", "find", cell{median: time.Second})
			r.addCeiling(ms(100), 1, 1, nil)
			ceil, runs, err := h.plan(ms(100), r)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, run := range runs {
				var names []string
				for _, w := range run.wls {
					names = append(names, w.name)
				}
				got = append(got, run.s.name()+": "+strings.Join(names, " "))
			}
			if !slices.Equal(got, tc.want) || ceil != tc.rerun {
				t.Errorf("plan: ceiling %v, %q; want ceiling %v, %q", ceil, got, tc.rerun, tc.want)
			}
			if x := r.cells[cellKey{"make-j2", "sshfs", ms(100)}]; !errors.Is(x.err, errSkipped) || !strings.Contains(x.err.Error(), "10 ms, 0%") {
				t.Errorf("sshfs make-j2 at 100 ms: %v, want skipped for the timeout at 10 ms, 0%%", x.err)
			}
		})
	}
}

// TestReportFromTwoInvocations checks that a report made from a results
// file filled by two invocations, each with its own round trip and Ferry
// commit, has a column for each, names both invocations and commits, and
// that a third invocation like the first has nothing left to run.
func TestReportFromTwoInvocations(t *testing.T) {
	dir := t.TempDir()
	invoke := func(rtt int, commit string, cells map[string]cell, ceilUp float64) *report {
		t.Helper()
		o := testOptions(dir, ms(rtt))
		o.commandLog = fmt.Sprintf("go run ./bench -profile smoke -rtt %dms", rtt)
		o.systems = map[string]bool{"rsync": true, "sshfs": true, "ferry": true}
		o.workloads = map[string]bool{"find": true, "ceiling": true}
		r := testReport(o, commit)
		if err := loadInto(r, o.results); err != nil {
			t.Fatal(err)
		}
		for system, x := range cells {
			if err := r.add(ms(rtt), system, "find", x); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.addCeiling(ms(rtt), ceilUp, ceilUp, nil); err != nil {
			t.Fatal(err)
		}
		if err := r.finish(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	invoke(0, "aaa", map[string]cell{
		"rsync": {median: time.Second},
		"ferry": {median: time.Second / 2},
		"sshfs": {err: fmt.Errorf("%w after 3m0s", errTimeout)},
	}, 90e6)
	r := invoke(10, "bbb", map[string]cell{
		"rsync": {median: 2 * time.Second},
		"ferry": {median: time.Second},
		"sshfs": {err: skipped(ms(0))},
	}, 80e6)
	if err := r.write(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.opts.out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"Produced by 2 invocations into the results file `" + r.results + "`",
		"- `go run ./bench -profile smoke -rtt 0ms` on ",
		"- `go run ./bench -profile smoke -rtt 10ms` on ",
		"- **Ferry commit:** differs between conditions: 0 ms, 0%: aaa; 10 ms, 0%: bbb.\n",
		"| direction | 0 ms, 0% | 10 ms, 0% |\n",
		"| client → server | 90.0 Mbit/s | 80.0 Mbit/s |\n",
		"| system | 0 ms, 0% | 10 ms, 0% |\n",
		"| rsync | 1.00 s (1.00×) | 2.00 s (1.00×) |\n",
		"| ferry | 0.50 s (0.50×) | 1.00 s (0.50×) |\n",
		"| sshfs | timeout after 3m0s | > 3 min [1] |\n",
		"[1] sshfs: over the limit at a shorter round trip (timed out at 0 ms, 0%), not run",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}

	h, _ := testEnv(t)
	h.o = testOptions(dir, ms(0))
	h.o.systems, h.o.workloads = r.opts.systems, r.opts.workloads
	again := testReport(h.o, "ccc")
	if err := loadInto(again, h.o.results); err != nil {
		t.Fatal(err)
	}
	if ceil, runs, err := h.plan(ms(0), again); ceil || len(runs) > 0 || err != nil {
		t.Errorf("the first invocation again plans ceiling %v, %d systems, error %v; want nothing", ceil, len(runs), err)
	}
}
