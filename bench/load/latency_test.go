package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/testenv"
)

func TestParseConditions(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []condition
		wantErr bool
	}{
		{in: "50ms,100ms,100ms/1%", want: []condition{{50 * time.Millisecond, 0}, {100 * time.Millisecond, 0}, {100 * time.Millisecond, 0.01}}},
		{in: " 200ms / 0.5% , ", want: []condition{{200 * time.Millisecond, 0.005}}},
		{in: "1s/0.02", want: []condition{{time.Second, 0.02}}},
		{in: "", wantErr: true},
		{in: "fast", wantErr: true},
		{in: "0ms", wantErr: true},
		{in: "100ms/lots", wantErr: true},
		{in: "100ms/200%", wantErr: true},
	} {
		got, err := parseConditions(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseConditions(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseConditions(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestConditionString(t *testing.T) {
	for _, tc := range []struct {
		c    condition
		want string
	}{
		{condition{50 * time.Millisecond, 0}, "50ms"},
		{condition{100 * time.Millisecond, 0.01}, "100ms, 1% loss"},
		{condition{200 * time.Millisecond, 0.005}, "200ms, 0.5% loss"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.c, got, tc.want)
		}
	}
}

func TestParseLatencyFlags(t *testing.T) {
	o, err := parseLatencyFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.links) != 3 || o.rate != 100e6 || o.calls != 30 || o.bulkSize != 256<<20 || o.smallSize != 4<<10 ||
		o.out != "bench/REPORT-latency.md" || o.commandLog != "go run ./bench/load latency" {
		t.Errorf("defaults: %+v", o)
	}
	for _, args := range [][]string{
		{"-rate", "0"}, {"-rate", "fast"}, {"-n", "0"}, {"-size", "0"}, {"-small", "x"},
		{"-links", ""}, {"-warmup", "-1s"}, {"extra"},
	} {
		if _, err := parseLatencyFlags(args); err == nil {
			t.Errorf("parseLatencyFlags(%q) succeeded, want an error", args)
		}
	}
}

func ms(v ...float64) []time.Duration {
	var out []time.Duration
	for _, x := range v {
		out = append(out, time.Duration(x*float64(time.Millisecond)))
	}
	return out
}

func TestLatStats(t *testing.T) {
	var thirty []time.Duration
	for i := 30; i >= 1; i-- { // 30 down to 1 ms: the order must not matter
		thirty = append(thirty, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want latStat
	}{
		{"none", nil, latStat{}},
		{"one", ms(7), latStat{1, 7, 7, 7}},
		{"odd", ms(3, 1, 2), latStat{3, 2, 3, 3}},
		{"even", ms(4, 1, 3, 2), latStat{4, 2.5, 4, 4}},
		// p90 of 30 by nearest rank is the 27th.
		{"thirty", thirty, latStat{30, 15.5, 27, 30}},
		{"ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 100), latStat{10, 5.5, 9, 100}},
		{"eleven", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100), latStat{11, 6, 10, 100}},
	} {
		if got := latStatsOf(tc.in); got != tc.want {
			t.Errorf("%s: latStatsOf(%v) = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestNearestRank(t *testing.T) {
	v := []float64{10, 20, 30, 40, 50}
	for _, tc := range []struct {
		p    float64
		want float64
	}{{0, 10}, {20, 10}, {21, 20}, {50, 30}, {90, 50}, {100, 50}} {
		if got := nearestRank(v, tc.p); got != tc.want {
			t.Errorf("nearestRank(%v, %v) = %v, want %v", v, tc.p, got, tc.want)
		}
	}
	if got := nearestRank(nil, 90); got != 0 {
		t.Errorf("nearestRank(nil, 90) = %v, want 0", got)
	}
}

func TestInRTT(t *testing.T) {
	for _, tc := range []struct {
		ms   float64
		rtt  time.Duration
		want float64
	}{
		{100, 100 * time.Millisecond, 1},
		{125, 50 * time.Millisecond, 2.5},
		{0, 50 * time.Millisecond, 0},
		{30, 20 * time.Millisecond, 1.5},
	} {
		if got := inRTT(tc.ms, tc.rtt); got != tc.want {
			t.Errorf("inRTT(%v, %v) = %v, want %v", tc.ms, tc.rtt, got, tc.want)
		}
	}
	if got := inRTT(10, 0); !math.IsNaN(got) || fmtRTT(got) != "-" {
		t.Errorf("inRTT(10, 0) = %v (%q), want NaN (\"-\")", got, fmtRTT(got))
	}
	if got := fmtRTT(2.456); got != "2.46" {
		t.Errorf("fmtRTT(2.456) = %q", got)
	}
}

func TestVerdict(t *testing.T) {
	rtt := 100 * time.Millisecond
	for _, tc := range []struct {
		s    latStat
		rtt  time.Duration
		want string
	}{
		{latStat{30, 110, 150, 400}, rtt, "yes"},
		{latStat{30, 110, 200, 400}, rtt, "yes"}, // exactly 2 round trips meets it
		{latStat{30, 150, 201, 400}, rtt, "median only"},
		{latStat{30, 201, 300, 400}, rtt, "no"},
		{latStat{}, rtt, "no calls"},
		{latStat{30, 1, 1, 1}, 0, "no calls"},
	} {
		if got := verdict(tc.s, tc.rtt); got != tc.want {
			t.Errorf("verdict(%+v, %v) = %q, want %q", tc.s, tc.rtt, got, tc.want)
		}
	}
}

func TestOrdinal(t *testing.T) {
	for n, want := range map[int]string{1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st", 27: "27th", 102: "102nd", 111: "111th"} {
		if got := ordinal(n); got != want {
			t.Errorf("ordinal(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPhaseOf(t *testing.T) {
	t0 := time.Unix(3000, 0)
	e := event{Ev: "calls", T0: t0.UnixNano(), T: t0.Add(4 * time.Second).UnixNano(),
		StatNs: []int64{int64(50 * time.Millisecond)}, GetNs: []int64{int64(60 * time.Millisecond), int64(70 * time.Millisecond)},
		StatFailed: 1, Msg: "stat /small.bin: timeout", Bulk0: 1000, Bulk1: 50_001_000}
	got := phaseOf(bulkDownload, e)
	want := phase{bulk: bulkDownload, stat: ms(50), get: ms(60, 70), statFailed: 1, firstErr: "stat /small.bin: timeout",
		span: 4 * time.Second, bulkBytes: 50_000_000}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("phaseOf = %+v, want %+v", got, want)
	}
	if r := mbit(got.bulkBytes, got.span); r != 100 {
		t.Errorf("the bulk's rate = %v Mbit/s, want 100", r)
	}
}

// fakeLatReport is a report of two links, the second lossy.
func fakeLatReport() *latReport {
	o, _ := parseLatencyFlags([]string{"-links", "50ms,100ms/1%", "-n", "4"})
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	rep := &latReport{opts: o, started: start, finished: start.Add(3 * time.Minute),
		loadStart: "1.00 0.50 0.20", loadEnd: "2.00 1.00 0.40", machine: "nproc 2 (test CPU)", commit: "abc1234"}
	for _, c := range o.links {
		r := float64(c.rtt) / float64(time.Millisecond)
		l := linkResult{cond: c, cc: "bbr"}
		l.phases = []phase{
			{bulk: bulkNone, stat: ms(r+1, r+2, r+3, r+4), get: ms(r+2, r+2, r+2, r+2), span: time.Second},
			{bulk: bulkDownload, stat: ms(1.2*r, 1.3*r, 1.4*r, 1.5*r), get: ms(2.5*r, 2.5*r, 2.5*r, 3*r), span: 2 * time.Second,
				bulkBytes: 23_750_000, link: netem.Stats{Bytes: 24_500_000, LossPackets: 7, QueuePackets: 3}, window: 2 * time.Second},
			{bulk: bulkUpload, stat: ms(1.5*r, 1.5*r, 1.5*r, 2.1*r), get: ms(1.9*r, 1.9*r, 1.9*r, 1.9*r), getFailed: 1,
				firstErr: "get /small.bin: deadline exceeded", span: 2 * time.Second, bulkBytes: 22_500_000,
				link: netem.Stats{Bytes: 23_000_000}, window: 2 * time.Second, bulkFailed: 1, bulkErr: "put /up.bin: broken"},
		}
		rep.links = append(rep.links, l)
	}
	return rep
}

func TestLatencyMarkdown(t *testing.T) {
	md := fakeLatReport().markdown()
	wantLines(t, md,
		"- Command: `go run ./bench/load latency -links 50ms,100ms/1% -n 4`",
		"- Links: `netem` beds, a fresh one for each link: 50ms; 100ms, 1% loss; 100mbit each way",
		"TCP bbr",
		"p90 by nearest rank (the 4th of 4)",
		"(up to `TCP_NOTSENT_LOWAT`, 256KiB, 21 ms at 100mbit)",
		// Idle Stat at 50 ms: 51-54 ms, median 52.5.
		"| 50ms | Stat 4KiB | idle | 52.5 | 54.0 | 54.0 | 1.05 | 1.08 | 1.08 | - | yes | 0 |",
		// During the download: 60-75 ms, median 67.5, 0.30 over idle.
		"| 50ms | Stat 4KiB | during a download | 67.5 | 75.0 | 75.0 | 1.35 | 1.50 | 1.50 | 0.30 | yes | 0 |",
		"| 50ms | Get 4KiB | during a download | 125.0 | 150.0 | 150.0 | 2.50 | 3.00 | 3.00 | 1.46 | no | 0 |",
		"| 100ms, 1% loss | Stat 4KiB | during an upload | 150.0 | 210.0 | 210.0 | 1.50 | 2.10 | 2.10 | 0.47 | median only | 0 |",
		"| 100ms, 1% loss | Get 4KiB | during an upload | 190.0 | 190.0 | 190.0 | 1.90 | 1.90 | 1.90 | 0.88 | yes | 1 |",
		"| 50ms | during a download | 2.0 s | 95.0 | 98.0 | 98% | 7 / 3 | 0 |",
		"| 100ms, 1% loss | during an upload | 2.0 s | 90.0 | 92.0 | 92% | 0 / 0 | 1 |",
		"- 100ms, 1% loss, during an upload: 0 Stats and 1 Gets failed; the first: get /small.bin: deadline exceeded",
		"- 50ms, during an upload: 1 bulk transfers failed; the first of the run: put /up.bin: broken",
		"- 50ms, during a download, Get: 125 125 125 150",
	)
}

func TestWriteLatencyReport(t *testing.T) {
	checkWrite(t, fakeLatReport(), filepath.Join(t.TempDir(), "REPORT-latency.md"))
}

// TestLatencySmall runs the latency benchmark on one short link over a
// real bed: a few calls in each phase, small files. It needs root,
// /dev/net/tun and ip netns; without them it is skipped, except under
// CI=true.
func TestLatencySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: builds ferry and runs a test bed for about 15 s")
	}
	testenv.RequireErr(t, netem.Available())
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseLatencyFlags([]string{"-links", "20ms", "-rate", "50mbit", "-n", "3", "-size", "4MiB",
		"-warmup", "300ms", "-gap", "0s", "-out", filepath.Join(t.TempDir(), "r.md")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := newHarness(ctx, root, false, []servedFile{{latSmall, o.smallSize}, {latBig, o.bulkSize}})
	if err != nil {
		t.Fatal(err)
	}
	work := h.work
	defer h.close()
	res, err := h.measureLink(ctx, o, o.links[0])
	if err != nil {
		t.Fatal(err)
	}
	if h.bed != nil {
		t.Error("measureLink left its bed up")
	}
	h.close()
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the work directory %s is still there: %v", work, err)
	}
	ents, _ := os.ReadDir(netem.NetnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "ferry-"+strconv.Itoa(os.Getpid())+"-") {
			t.Errorf("the namespace %s is still there", e.Name())
		}
	}
	if len(res.phases) != 3 {
		t.Fatalf("%d phases, want 3: %+v", len(res.phases), res.phases)
	}
	for i, p := range res.phases {
		t.Logf("%s", p.summary(o.links[0].rtt))
		if want := []string{bulkNone, bulkDownload, bulkUpload}[i]; p.bulk != want {
			t.Errorf("phase %d is %q, want %q", i, p.bulk, want)
		}
		if len(p.stat) != 3 || len(p.get) != 3 || p.statFailed+p.getFailed != 0 {
			t.Errorf("%s: %d Stats, %d Gets, %d failed (%s); want 3, 3, 0", p.while(), len(p.stat), len(p.get), p.statFailed+p.getFailed, p.firstErr)
		}
		// No call returns faster than the link's round trip.
		for _, d := range append(p.stat, p.get...) {
			if d < 20*time.Millisecond {
				t.Errorf("%s: a call took %v, less than the round trip", p.while(), d)
			}
		}
		if p.bulk != bulkNone && (p.bulkBytes <= 0 || p.link.Bytes <= 0 || p.bulkFailed != 0) {
			t.Errorf("%s: the bulk moved %d bytes, the link %d, %d failed (%s)", p.while(), p.bulkBytes, p.link.Bytes, p.bulkFailed, p.bulkErr)
		}
	}
	rep := &latReport{opts: o, links: []linkResult{res}}
	if md := rep.markdown(); !strings.Contains(md, "| 20ms | Get 4KiB | during an upload |") {
		t.Errorf("the report lacks the upload's Get:\n%s", md)
	}
}
