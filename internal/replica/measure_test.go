package replica

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/servertest"
)

// unpack makes dirs directories of files files of 4 KiB each under /src
// through f, pausing between directories as an unpacker or configure
// pauses between bursts, and returns how long the changes took (pauses
// left out).
func unpack(t *testing.T, f ferry.FS, dirs, files int, pause time.Duration) time.Duration {
	ctx := context.Background()
	body := strings.Repeat("x", 4096)
	var took time.Duration
	start := time.Now()
	if _, err := f.Put(ctx, "/src", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	took += time.Since(start)
	for d := range dirs {
		time.Sleep(pause)
		start := time.Now()
		dir := fmt.Sprintf("/src/d%d", d)
		if _, err := f.Put(ctx, dir, ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait(); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			if _, err := f.Put(ctx, fmt.Sprintf("%s/f%d.c", dir, i), nil, ferry.Whole, strings.NewReader(body)).Wait(); err != nil {
				t.Fatal(err)
			}
		}
		took += time.Since(start)
	}
	return took
}

// TestMeasureUnpackAcrossSites measures an unpack (10 directories of 20
// files, 150 ms between directories) made through the replica layer at
// one of three sites 2*FERRY_ONEWAY apart (default 60 ms: 120 ms round
// trip), against a local disk and against a single server that far away
// (each create a call), with deep and shallow-only control and several
// idle timers. It is a measurement, not a test: FERRY_MEASURE=1 runs it;
// FERRY_CELLS=REGEXP picks cells by name.
func TestMeasureUnpackAcrossSites(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" {
		t.Skip("a measurement: FERRY_MEASURE=1 runs it")
	}
	oneWay := 60 * time.Millisecond
	if v := os.Getenv("FERRY_ONEWAY"); v != "" {
		var err error
		if oneWay, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	const dirs, files, pause = 10, 20, 150 * time.Millisecond
	type cell struct {
		name string
		run  func(t *testing.T) (time.Duration, string)
	}
	sitesRun := func(shallow bool, idle time.Duration) func(t *testing.T) (time.Duration, string) {
		return func(t *testing.T) (time.Duration, string) {
			s := newSitesWith(t, &sites{testSet: newDelayedSet(t, oneWay, "a", "b", "c"), shallow: shallow}, idle)
			took := unpack(t, s.fs["b"], dirs, files, pause)
			s.quiet(t)
			b := s.sets["b"]
			return took, fmt.Sprintf("grants=%d refused=%d", b.stats.grants.Load(), b.stats.refused.Load())
		}
	}
	cells := []cell{
		{"local disk", func(t *testing.T) (time.Duration, string) {
			lt, err := local.NewServed(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer lt.Close()
			return unpack(t, lt, dirs, files, pause), ""
		}},
		{fmt.Sprintf("one server %v away", 2*oneWay), func(t *testing.T) (time.Duration, string) {
			srv := servertest.Start(t, "")
			c := srv.ClientVia(t, "u", servertest.DelayProxy(t, srv.Addr, oneWay))
			return unpack(t, c, dirs, files, pause), ""
		}},
		{"3 sites, deep, idle 1s", sitesRun(false, time.Second)},
		{"3 sites, deep, idle 0.5s", sitesRun(false, 500*time.Millisecond)},
		{"3 sites, deep, idle 0.1s", sitesRun(false, 100*time.Millisecond)},
		{"3 sites, shallow only, idle 1s", sitesRun(true, time.Second)},
	}
	only := regexp.MustCompile(os.Getenv("FERRY_CELLS")) // all by default
	for _, c := range cells {
		if !only.MatchString(c.name) {
			continue
		}
		var took []time.Duration
		var note string
		for range 3 {
			t.Run(c.name, func(t *testing.T) {
				d, n := c.run(t)
				took, note = append(took, d), n
			})
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		t.Logf("%-34s median %7.3fs  runs %v  %s", c.name, took[len(took)/2].Seconds(), took, note)
	}
}
