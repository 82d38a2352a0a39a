package replica

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
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
	oneWay := oneWayFromEnv(t)
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

// oneWayFromEnv returns the one-way delay between sites a measurement
// asks for in FERRY_ONEWAY, 60 ms by default.
func oneWayFromEnv(t *testing.T) time.Duration {
	v := os.Getenv("FERRY_ONEWAY")
	if v == "" {
		return 60 * time.Millisecond
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// tarFile is a file or directory of a tarball.
type tarFile struct {
	path string
	dir  bool
	mode os.FileMode
	mt   time.Time
	data []byte
}

// readTarball reads a .tar.gz's directories and regular files, in order.
func readTarball(t *testing.T, file string) []tarFile {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []tarFile
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		p := path.Clean("/" + h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			out = append(out, tarFile{path: p, dir: true, mode: h.FileInfo().Mode().Perm(), mt: h.ModTime})
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tarFile{path: p, mode: h.FileInfo().Mode().Perm(), mt: h.ModTime, data: b})
		}
	}
}

// TestMeasureJoin measures a member joining a set of two members
// 2*FERRY_ONEWAY apart (default 60 ms: 120 ms round trip) that holds
// OpenSSH's source tree (FERRY_SSH_TARBALL): from the add to the new
// member serving, and the bytes it fetched, with an empty directory, one
// holding the tree with every tenth file changed, and one holding the
// tree. FERRY_MEASURE=1 runs it.
func TestMeasureJoin(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" || os.Getenv("FERRY_SSH_TARBALL") == "" {
		t.Skip("a measurement: FERRY_MEASURE=1 FERRY_SSH_TARBALL=openssh_VERSION.orig.tar.gz runs it")
	}
	oneWay := oneWayFromEnv(t)
	files := readTarball(t, os.Getenv("FERRY_SSH_TARBALL"))
	var size int64
	for _, f := range files {
		size += int64(len(f.data))
	}
	// write makes the tree in dir, with every every-th file changed.
	write := func(dir string, every int) {
		for i, f := range files {
			p := filepath.Join(dir, f.path)
			if f.dir {
				must(t, os.MkdirAll(p, 0o755))
				continue
			}
			data := f.data
			if every > 0 && i%every == 0 {
				data = append(slices.Clone(data), "/* changed */\n"...)
			}
			must(t, os.WriteFile(p, data, f.mode))
			must(t, os.Chtimes(p, f.mt, f.mt))
		}
	}
	cells := []struct {
		name string
		seed func(dir string)
	}{
		{"empty directory", func(string) {}},
		{"every tenth file changed", func(dir string) { write(dir, 10) }},
		{"the same tree", func(dir string) { write(dir, 0) }},
	}
	for _, c := range cells {
		t.Run(c.name, func(t *testing.T) {
			s := newSitesWith(t, &sites{testSet: newDelayedSet(t, oneWay, "a", "b"), chunked: true}, time.Second)
			ctx := context.Background()
			for _, f := range files {
				d := ferry.Dir{}
				d.SetMode(f.mode)
				d.SetMtime(f.mt)
				var r io.Reader = bytes.NewReader(f.data)
				if f.dir {
					d[ferry.AttrType], r = ferry.TypeDir, nil
				}
				if _, err := s.fs["a"].Put(ctx, f.path, d, ferry.Whole, r).Wait(); err != nil {
					t.Fatal(err)
				}
			}
			s.quiet(t)
			m, set := s.joiner(t, "c", oneWay, c.seed)
			start := time.Now()
			if err := s.sets["a"].Command(ctx, []string{"add", m.Name, m.Addr, m.Fingerprint}); err != nil {
				t.Fatal(err)
			}
			if err := set.waitReady(ctx); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			s.same(t)
			t.Logf("%-26s joined in %6.2fs  fetched %8d bytes of content, %8d on the wire; tree %d files, %d bytes; %v round trip",
				c.name, took.Seconds(), set.stats.fetchedBytes.Load(), set.stats.wireBytes.Load(), len(files), size, 2*oneWay)
		})
	}
}

// TestMeasureWriters times changes at a member to what another member
// controls, with members 2*FERRY_ONEWAY apart and the default idle time:
// two sites writing one file in turn (each write's time, median), and a
// burst of 40 new files at b in a directory a has just written in (from
// the first create to the last). FERRY_MEASURE=1 runs it.
func TestMeasureWriters(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" {
		t.Skip("a measurement: FERRY_MEASURE=1 runs it")
	}
	oneWay := oneWayFromEnv(t)
	timed := func(fn func()) time.Duration {
		start := time.Now()
		fn()
		return time.Since(start)
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	for round := range 3 {
		s := newDelayedSites(t, DefaultIdle, oneWay)
		a, b := s.fs["a"], s.fs["b"]
		var atA, atB []time.Duration
		for i := range 10 {
			atA = append(atA, timed(func() { put(t, a, "/shared", fmt.Sprint("a ", i)) }))
			atB = append(atB, timed(func() { put(t, b, "/shared", fmt.Sprint("b ", i)) }))
		}
		t.Logf("round %d: one file written in turn at a and b: median write %v at a, %v at b", round, median(atA), median(atB))

		ctx := context.Background()
		_, err := a.Put(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait()
		must(t, err)
		put(t, a, "/d/from-a", "a")
		burst := timed(func() {
			for i := range 40 {
				put(t, b, fmt.Sprintf("/d/f%d", i), "b")
			}
		})
		t.Logf("round %d: 40 files made at b in a directory a just wrote in: %v", round, burst)
		s.quiet(t)
		for _, n := range []string{"a", "b", "c"} {
			s.stop(n)
		}
	}
}
