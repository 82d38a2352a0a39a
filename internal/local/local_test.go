package local_test

import (
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/local"
)

// TestSuite runs the suite over a tree as the CLI opens a local directory
// and as a server serves one (temporary files apart).
func TestSuite(t *testing.T) {
	for name, open := range map[string]func(string) (*local.Tree, error){"cli": local.New, "served": local.NewServed} {
		t.Run(name, func(t *testing.T) {
			fstest.Run(t, func(t *testing.T) (ferry.FS, string) {
				dir := t.TempDir()
				tr, err := open(dir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tr.Close() })
				return tr, dir
			})
		})
	}
}

func TestWatch(t *testing.T) {
	fstest.RunWatch(t, func(t *testing.T) (ferry.Watcher, ferry.FS, string) {
		dir := t.TempDir()
		tr, err := local.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr, tr, dir
	})
}
