package main

import (
	"reflect"
	"testing"
	"time"
)

func TestPickKilled(t *testing.T) {
	for _, tc := range []struct {
		clients, slow int
		frac          float64
		want          []int
	}{
		{clients: 20, slow: 10, frac: 0.15, want: []int{0, 5, 10, 15}},
		{clients: 200, slow: 190, frac: 0.15, want: append(seq(0, 29, 190), 190, 195)},
		{clients: 10, slow: 0, frac: 0.15, want: []int{0, 5}},
		{clients: 3, slow: 3, frac: 0.01, want: []int{0}},
		{clients: 4, slow: 2, frac: 1, want: []int{0, 1, 2, 3}},
		{clients: 4, slow: 2, frac: 0, want: nil},
	} {
		got := pickKilled(tc.clients, tc.slow, tc.frac)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("pickKilled(%d, %d, %g) = %v, want %v", tc.clients, tc.slow, tc.frac, got, tc.want)
		}
	}
}

// seq returns k indexes spread evenly over 0..n-1 from first, as
// pickKilled spreads them.
func seq(first, k, n int) []int {
	var out []int
	for j := range k {
		out = append(out, first+j*n/k)
	}
	return out
}

func TestClassRA(t *testing.T) {
	owners := map[string]connOwner{"s1": {0, true}, "s2": {0, true}, "f1": {1, false}}
	snap := snapshot{conns: map[string]connRA{
		"s1": {100, 200}, "s2": {0, 0}, "f1": {1000, 3000}, "stranger": {5, 5},
	}}
	slow, fast := classRA(snap, owners)
	if slow != (connRA{100, 200}) || fast != (connRA{1000, 3000}) {
		t.Errorf("classRA = %+v, %+v; want {100 200}, {1000 3000}", slow, fast)
	}
}

func TestMeasureWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m0 := event{Ev: "mark", T: t0.UnixNano(), Bytes: []int64{0, 0, 0}}
	m1 := event{Ev: "mark", T: t0.Add(10 * time.Second).UnixNano(), Bytes: []int64{1_250_000, 1_250_000, 12_500_000}}
	owners := map[string]connOwner{"a": {0, true}, "b": {1, true}, "c": {2, false}}
	samples := []sample{
		{snap: snapshot{held: 300, streams: 3, conns: map[string]connRA{"a": {100, 100}, "b": {0, 100}, "c": {200, 400}}}, proc: procStat{rss: 10 << 20}, hasProc: true},
		{snap: snapshot{held: 500, streams: 3, conns: map[string]connRA{"a": {100, 100}, "b": {100, 100}, "c": {300, 600}}}, proc: procStat{rss: 30 << 20}, hasProc: true},
	}
	var r runResult
	r.measureWindow(m0, m1, samples, owners, 2)
	if r.window != 10*time.Second || r.slowBytes != 2_500_000 || r.fastBytes != 12_500_000 {
		t.Errorf("window %v, bytes %d slow %d fast; want 10s, 2500000, 12500000", r.window, r.slowBytes, r.fastBytes)
	}
	if !reflect.DeepEqual(r.slowRates, []float64{1e6, 1e6}) || !reflect.DeepEqual(r.fastRates, []float64{1e7}) {
		t.Errorf("rates %v slow, %v fast; want [1e6 1e6], [1e7]", r.slowRates, r.fastRates)
	}
	if r.raAvg != 400 || r.raMax != 500 || r.raSlow != 150 || r.raFast != 250 || r.targetSlow != 200 || r.targetFast != 500 || r.streams != 3 {
		t.Errorf("read-ahead avg %v max %v slow %v fast %v targets %v %v streams %v; want 400 500 150 250 200 500 3",
			r.raAvg, r.raMax, r.raSlow, r.raFast, r.targetSlow, r.targetFast, r.streams)
	}
	if r.rssAvg != 20<<20 || r.rssMax != 30<<20 || r.samples != 2 {
		t.Errorf("RSS avg %d max %d, %d samples; want %d %d 2", r.rssAvg, r.rssMax, r.samples, 20<<20, 30<<20)
	}
}

// TestKillWatch feeds a kill's samples and checks the times and bounds.
func TestKillWatch(t *testing.T) {
	kill := time.Unix(2000, 0)
	ms := func(n int) time.Time { return kill.Add(time.Duration(n) * time.Millisecond) }
	owners := map[string]connOwner{"k1": {3, true}, "k2": {3, true}, "k3": {7, false}, "live": {1, true}}
	base := snapshot{cancelled: 10, conns: map[string]connRA{"k1": {256, 256}, "k3": {1024, 1024}, "live": {256, 256}}}
	k := newKillWatch(event{Ev: "killed", T: kill.UnixNano(), Clients: []int{3, 7}, Active: 2}, owners, base)
	if k.res.killed != 2 || k.res.killedSlow != 1 || k.res.killedFast != 1 || k.res.heldBefore != 1280 {
		t.Fatalf("before: %+v; want 2 killed (1 slow, 1 fast) holding 1280", k.res)
	}
	steps := []struct {
		start, end int
		snap       snapshot
		done       bool
	}{
		// Began before the kill: ignored.
		{-5, 5, snapshot{cancelled: 12, conns: map[string]connRA{}}, false},
		{5, 15, snapshot{cancelled: 10, orphaned: 0, conns: map[string]connRA{"k1": {256, 256}, "k3": {1024, 1024}, "live": {256, 256}}}, false},
		{15, 25, snapshot{cancelled: 11, orphaned: 1024, conns: map[string]connRA{"k3": {1024, 1024}, "live": {256, 256}}}, false},
		{25, 35, snapshot{cancelled: 12, orphaned: 0, conns: map[string]connRA{"live": {256, 256}}}, true},
	}
	var samples []sample
	for i, s := range steps {
		samples = append(samples, sample{start: ms(s.start), end: ms(s.end), snap: s.snap})
		if got := k.settled(samples); got != s.done {
			t.Fatalf("step %d: settled = %v, want %v", i, got, s.done)
		}
	}
	res := k.result(samples)
	want := killResult{
		killed: 2, killedSlow: 1, killedFast: 1, active: 2, heldBefore: 1280, cancelled: 2,
		tCancel: 35 * time.Millisecond, tFree: 35 * time.Millisecond, tGone: 35 * time.Millisecond,
		tCancelLo: 15 * time.Millisecond, tFreeLo: 15 * time.Millisecond, tGoneLo: 15 * time.Millisecond,
		peakOrphaned: 1024, resolution: 10 * time.Millisecond,
	}
	if res != want {
		t.Errorf("result:\ngot  %+v\nwant %+v", res, want)
	}
}

// TestKillWatchShort checks that a watch with fewer cancellations than
// downloads ends killSettle after the memory returned.
func TestKillWatchShort(t *testing.T) {
	kill := time.Unix(2000, 0)
	k := newKillWatch(event{Ev: "killed", T: kill.UnixNano(), Clients: []int{0}, Active: 2}, map[string]connOwner{"a": {0, true}}, snapshot{conns: map[string]connRA{}})
	var samples []sample
	for i := 0; ; i++ {
		at := kill.Add(time.Duration(i*10+1) * time.Millisecond)
		samples = append(samples, sample{start: at, end: at.Add(5 * time.Millisecond), snap: snapshot{cancelled: 1, conns: map[string]connRA{}}})
		if k.settled(samples) {
			break
		}
		if i > 100 {
			t.Fatal("the watch never ended")
		}
	}
	if el := samples[len(samples)-1].end.Sub(samples[0].end); el < killSettle || el > killSettle+10*time.Millisecond {
		t.Errorf("the watch ended %v after the memory returned, want %v", el, killSettle)
	}
	if k.res.cancelled != 1 || k.res.tCancel != 6*time.Millisecond || k.res.tCancelLo != 0 {
		t.Errorf("cancelled %d at %v (after %v), want 1 at 6ms (after 0s)", k.res.cancelled, k.res.tCancel, k.res.tCancelLo)
	}
}

func TestParseWorkerFlags(t *testing.T) {
	o, err := parseWorkerFlags([]string{"-addr", "10.0.0.2:7077", "-home", "/h", "-clients", "4", "-slow", "2", "-files", "/a,/b"})
	if err != nil {
		t.Fatal(err)
	}
	if o.addr != "10.0.0.2:7077" || o.clients != 4 || o.slow != 2 || !reflect.DeepEqual(o.files, []string{"/a", "/b"}) || o.slowRate != 1_000_000 || o.killFrac != 0.15 {
		t.Errorf("parseWorkerFlags = %+v", o)
	}
	for _, args := range [][]string{
		{"-addr", "x:1", "-home", "/h", "-clients", "4", "-slow", "5", "-files", "/a"},
		{"-addr", "x:1", "-home", "/h", "-clients", "0", "-files", "/a"},
		{"-home", "/h", "-clients", "4", "-files", "/a"},
	} {
		if _, err := parseWorkerFlags(args); err == nil {
			t.Errorf("parseWorkerFlags(%q) succeeded", args)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-clients", "100", "-slow", "0.5", "-fixed", "1MiB, 2MiB", "-size", "8MiB"})
	if err != nil {
		t.Fatal(err)
	}
	if o.slow() != 50 || !reflect.DeepEqual(o.fixed, []int64{1 << 20, 2 << 20}) || o.fileSize != 8<<20 {
		t.Errorf("parseFlags: slow %d, fixed %v, size %d", o.slow(), o.fixed, o.fileSize)
	}
	if got := o.modes(); !reflect.DeepEqual(got, []mode{{}, {1 << 20}, {2 << 20}}) {
		t.Errorf("modes = %v", got)
	}
	o, err = parseFlags([]string{"-fixed", ""})
	if err != nil || len(o.modes()) != 1 || o.modes()[0].String() != "adaptive" {
		t.Errorf("-fixed \"\": modes %v, %v; want adaptive only", o.modes(), err)
	}
	for _, args := range [][]string{{"-slow", "2"}, {"-fixed", "x"}, {"-rate", "fast"}, {"-clients", "0"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
}
