package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/testenv"
)

// TestMain lets the test binary be the benchmark's workers too, as the
// benchmark runs itself (os.Executable) as the load generator.
func TestMain(m *testing.M) {
	workerMain(os.Args[1:])
	os.Exit(m.Run())
}

// TestLoadSmall runs the whole benchmark at a small scale over a real bed:
// a few clients, both modes, the kill. It needs root, /dev/net/tun and ip
// netns; without them it is skipped, except under CI=true.
func TestLoadSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: builds ferry and runs a test bed for about half a minute")
	}
	testenv.RequireErr(t, netem.Available())
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"-clients", "6", "-slow", "0.5", "-rate", "50mbit", "-rtt", "20ms",
		"-size", "2MiB", "-files", "2", "-warmup", "1s", "-duration", "2s", "-fixed", "1MiB", "-runs", "1",
		"-kill", "0.34", "-kill-wait", "3s", "-out", filepath.Join(t.TempDir(), "r.md")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h, err := newHarness(ctx, root, o.keep, o.servedFiles())
	if err != nil {
		t.Fatal(err)
	}
	work := h.work
	closed := false
	defer func() {
		if !closed {
			h.close()
		}
	}()
	if err := h.openBed(ctx, netem.Symmetric(o.rtt, o.rate, 0)); err != nil {
		t.Fatal(err)
	}
	rep := &report{opts: o, started: time.Now(), machine: machine(), commit: "test", cc: h.bed.CongestionControl}
	for _, m := range o.modes() {
		res, err := h.runOnce(ctx, o, m)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		res.run = 1
		t.Logf("%s: %s", m, res.summary())
		if res.slowBytes <= 0 || res.fastBytes <= 0 || res.errors != 0 {
			t.Errorf("%s: slow clients got %d bytes, fast %d, %d failed downloads (%s)", m, res.slowBytes, res.fastBytes, res.errors, res.firstErr)
		}
		// Three slow clients at 1 Mbit/s get at most 3 Mbit/s.
		if r := mbit(res.slowBytes, res.window); r > 3.5 {
			t.Errorf("%s: the slow clients got %.1f Mbit/s, more than their throttle allows", m, r)
		}
		if res.kill.killed != 2 || res.kill.tFree < 0 || res.kill.tGone < 0 {
			t.Errorf("%s: kill %+v: want 2 killed, their memory returned and connections gone", m, res.kill)
		}
		if m.fixed > 0 && res.targetSlow < float64(3*m.fixed)*0.9 {
			t.Errorf("%s: slow clients' target %v, want about 3 x %d", m, res.targetSlow, m.fixed)
		}
		rep.runs = append(rep.runs, res)
	}
	rep.finished = time.Now()
	if err := rep.write(o.out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(o.out)
	if !strings.Contains(string(md), "| fixed 1MiB |") {
		t.Errorf("the report lacks the fixed mode:\n%s", md)
	}
	ns := h.bed.ClientNS
	h.close()
	closed = true
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the work directory %s is still there: %v", work, err)
	}
	if _, err := os.Stat(netem.NSPath(ns)); !os.IsNotExist(err) {
		t.Errorf("the namespace %s is still there: %v", ns, err)
	}
}
