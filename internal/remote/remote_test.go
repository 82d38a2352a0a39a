package remote_test

import (
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestSuite runs the shared suite through a real server on loopback, so
// every call, its errors and its cancellation cross the wire.
func TestSuite(t *testing.T) {
	fstest.Run(t, func(t *testing.T) (ferry.FS, string) {
		s := servertest.Start(t, "")
		return s.Client(t, "tester"), s.Dir
	})
}

func TestWatch(t *testing.T) {
	fstest.RunWatch(t, func(t *testing.T) (ferry.Watcher, ferry.FS, string) {
		s := servertest.Start(t, "")
		c := s.Client(t, "tester")
		return c, c, s.Dir
	})
}
