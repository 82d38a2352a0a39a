package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStat(t *testing.T) {
	for _, tc := range []struct {
		v      []float64
		format string
		want   string
	}{
		{nil, "%.1f", "-"},
		{[]float64{3}, "%.1f", "3.0"},
		{[]float64{3, 1, 2}, "%.1f", "2.0 [1.0-3.0]"},
		{[]float64{4, 1, 2, 3}, "%.1f", "2.5 [1.0-4.0]"},
		{[]float64{5, 5}, "%.0f", "5"},
	} {
		if got := statOf(tc.v).format(tc.format); got != tc.want {
			t.Errorf("statOf(%v).format(%q) = %q, want %q", tc.v, tc.format, got, tc.want)
		}
	}
}

func TestFmtKill(t *testing.T) {
	for _, tc := range []struct {
		lo, hi []float64
		want   string
	}{
		{nil, nil, "-"},
		{[]float64{20}, []float64{35}, "20-35 ms"},
		{[]float64{20, 30, 10}, []float64{35, 45, 25}, "20-35 ms [upper 25-45]"},
		{[]float64{-1, -1, 10}, []float64{-1, -1, 25}, "not seen"},
		{[]float64{10, 20, -1}, []float64{25, 30, -1}, "10-25 ms (not seen in some runs)"},
	} {
		if got := fmtKillStat(statOf(tc.lo), statOf(tc.hi)); got != tc.want {
			t.Errorf("fmtKillStat(%v, %v) = %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
	if got := fmtKillRange(10*time.Millisecond, 24600*time.Microsecond); got != "10-25 ms" {
		t.Errorf("fmtKillRange = %q", got)
	}
	if got := fmtKillRange(0, -1); got != "not seen" {
		t.Errorf("fmtKillRange of an unseen time = %q", got)
	}
}

// fakeReport is a report of two modes of two runs each.
func fakeReport() *report {
	o, _ := parseFlags([]string{"-clients", "20", "-slow", "0.5", "-fixed", "4MiB", "-runs", "2"})
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	rep := &report{opts: o, started: start, finished: start.Add(5 * time.Minute), loadStart: "1.00 0.50 0.20", loadEnd: "2.00 1.00 0.40",
		machine: "nproc 2 (test CPU)", commit: "abc1234", cc: "bbr"}
	for run := 1; run <= 2; run++ {
		for _, m := range o.modes() {
			f := float64(run)
			r := runResult{mode: m, run: run, window: 20 * time.Second, ready: 20,
				slowBytes: 25_000_000, fastBytes: int64(500_000_000 * f),
				slowRates: []float64{1e6}, fastRates: []float64{2e7 * f},
				serverCPU: 4 * time.Second, rssIdle: 30 << 20, rssAvg: 200 << 20, rssMax: 210 << 20, rssHWM: 220 << 20,
				workerCPU: 6 * time.Second, benchCPU: 10 * time.Second,
				raAvg: 20 << 20, raMax: 22 << 20, raSlow: 10 * 256 << 10, raFast: 10 * 1 << 20,
				targetSlow: 10 * 256 << 10, targetFast: 10 * 1 << 20, streams: 20, samples: 40,
				kill: killResult{killed: 4, killedSlow: 2, killedFast: 2, active: 4, heldBefore: 2560 << 10, cancelled: 4,
					tCancel: 40 * time.Millisecond, tFree: 40 * time.Millisecond, tGone: 50 * time.Millisecond,
					tCancelLo: 25 * time.Millisecond, tFreeLo: 25 * time.Millisecond, tGoneLo: 35 * time.Millisecond,
					resolution: 10 * time.Millisecond},
			}
			if m.fixed > 0 {
				r.raSlow, r.targetSlow = 10*4<<20, 10*4<<20
			}
			rep.runs = append(rep.runs, r)
		}
	}
	return rep
}

func TestMarkdown(t *testing.T) {
	rep := fakeReport()
	rep.runs[3].ready = 17
	md := rep.markdown()
	wantLines(t, md,
		"- Command: `go run ./bench/load -clients 20 -slow 0.5 -fixed 4MiB -runs 2`",
		"- Modes: adaptive, fixed 4MiB; 2 runs of each",
		"10 throttled to 1mbit",
		// aggregate: 210 and 410 Mbit/s, median 310; fast per client 20 and 40.
		"| adaptive | 310.0 [210.0-410.0] | 10.0, 1.00 | 300.0 [200.0-400.0], 30.00 [20.00-40.00] | 0.20 | 30 MiB | 200 MiB | 210 MiB | 220 MiB |",
		"| adaptive | 20.0 MiB (22 MiB) | 2.5 MiB, 256 KiB | 256 KiB | 10.0 MiB, 1024 KiB | 1024 KiB | 20 |",
		"| fixed 4MiB | 20.0 MiB (22 MiB) | 40.0 MiB, 4096 KiB | 4096 KiB |",
		"| adaptive | 4 (2 + 2) | 2560 KiB | 4 of 4, 25-40 ms | 25-40 ms | 35-50 ms | 0 KiB | 10 ms |",
		"Run 2 (fixed 4MiB): only 17 of the 20 clients had received data",
		"| 2 | fixed 4MiB | 410.0 | 10.0 | 400.0 | 0.20 | 0.30 | 0.50 | 200.0 MiB | 40.0 MiB / 10.0 MiB | 40 | 4 of 4 in 25-40 ms | 25-40 ms | 0 |",
	)
}

// wantLines checks that the report md holds each of want.
func wantLines(t *testing.T, md string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("the report lacks %q:\n%s", w, md)
		}
	}
}

// markdownReport is a report of either benchmark.
type markdownReport interface {
	markdown() string
	write(path string) error
}

// checkWrite writes rep to path, in a directory that holds nothing else,
// and checks that the file is the report's markdown and nothing is left
// beside it.
func checkWrite(t *testing.T, rep markdownReport, path string) {
	t.Helper()
	if err := rep.write(path); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != rep.markdown() {
		t.Error("the written report differs from markdown()")
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("the directory holds %d files, want only the report", len(ents))
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "REPORT-load.md")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := fakeReport()
	checkWrite(t, rep, path)
	if err := rep.write(filepath.Join(dir, "missing", "r.md")); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}
