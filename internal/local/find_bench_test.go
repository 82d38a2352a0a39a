package local

import (
	"context"
	"os"
	"runtime"
	"testing"
)

// BenchmarkFind walks GOROOT/src (about 15,000 entries) with every
// attribute, as a server answers a mount's or a sync's Find.
func BenchmarkFind(b *testing.B) {
	src := runtime.GOROOT() + "/src"
	if _, err := os.Stat(src); err != nil {
		b.Skip("no GOROOT/src to walk")
	}
	t, err := New(src)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { t.Close() })
	ctx := context.Background()
	for b.Loop() {
		n := 0
		for range t.Find(ctx, "/", "true").All() {
			n++
		}
		b.ReportMetric(float64(n), "entries/op")
	}
}
