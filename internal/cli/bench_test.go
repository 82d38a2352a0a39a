package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// benchRTTs are the round trips of the benchmarks' emulated links. The
// difference between a benchmark's rtt=50ms and rtt=0s times, divided by
// 50 ms, is how many round trips the link cost it; requests/op counts the
// calls the server answered.
var benchRTTs = []time.Duration{0, 50 * time.Millisecond}

// makeTree writes dirs directories of files small files each under root.
func makeTree(b *testing.B, root string, dirs, files int) {
	for d := range dirs {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", d), "sub")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range files {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.c", f)), []byte("int x;\n"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// overLinks runs op b.N times over a link of each of benchRTTs with a fresh
// client, reporting the server calls per op.
func overLinks(b *testing.B, s *servertest.Server, op func(c *remote.Client, i int)) {
	for _, rtt := range benchRTTs {
		b.Run(fmt.Sprintf("rtt=%v", rtt), func(b *testing.B) {
			c := s.ClientVia(b, "bench", servertest.DelayProxy(b, s.Addr, rtt/2))
			op(c, -1) // Connect and warm up.
			before := s.Srv.Calls()
			b.ResetTimer()
			for i := range b.N {
				op(c, i)
			}
			b.StopTimer()
			var calls int64
			for k, v := range s.Srv.Calls() {
				calls += v - before[k]
			}
			b.ReportMetric(float64(calls)/float64(b.N), "requests/op")
		})
	}
}

// BenchmarkFindTree: a find over a tree of thousands of entries is one
// request and about one round trip.
func BenchmarkFindTree(b *testing.B) {
	s := servertest.Start(b, "")
	makeTree(b, s.Dir, 100, 50) // 5,201 entries.
	ctx := context.Background()
	overLinks(b, s, func(c *remote.Client, _ int) {
		if err := find(ctx, c, "/", "", false, io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkGetTree: downloading a tree of thousands of files is one request.
func BenchmarkGetTree(b *testing.B) {
	s := servertest.Start(b, "")
	makeTree(b, s.Dir, 20, 50) // 1,000 files.
	ctx := context.Background()
	dst := b.TempDir()
	n := 0
	overLinks(b, s, func(c *remote.Client, _ int) {
		n++
		if err := get(ctx, c, "/", filepath.Join(dst, fmt.Sprint(n)), newProgress(io.Discard, "", -1, progressOpts{}), io.Discard); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkPutTree: uploading N files costs far fewer than N round trips:
// one per level of directories, then the files without waiting for each.
func BenchmarkPutTree(b *testing.B) {
	s := servertest.StartChunked(b, "")
	src := b.TempDir()
	makeTree(b, src, 10, 50) // 500 files in 20 directories, 2 levels deep.
	ctx := context.Background()
	n := 0
	overLinks(b, s, func(c *remote.Client, _ int) {
		n++
		if err := put(ctx, c, src, fmt.Sprintf("/up%d", n), filter{}, progressOpts{}, io.Discard); err != nil {
			b.Fatal(err)
		}
	})
}
