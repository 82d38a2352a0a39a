// Package netemtest starts link emulator beds for tests.
package netemtest

import (
	"context"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/testenv"
)

// ForTest returns a running bed with the link cfg and closes it when the
// test and its subtests end, also when they fail. If the machine cannot run
// a bed (see netem.Available) the test is skipped with the reason, except
// when the environment variable CI is "true": there a missing test bed is a
// failure, so that CI never passes by skipping silently.
func ForTest(t testing.TB, cfg netem.Config) *netem.Bed {
	t.Helper()
	ctx, cancel := setup(t)
	defer cancel()
	b, err := netem.New(ctx, cfg)
	if err != nil {
		t.Fatalf("netem.New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing test bed: %v", err)
		}
	})
	return b
}

// MeshForTest returns a running mesh of n sites, the link from i to j set
// by link, closed when the test ends; skipped as ForTest is.
func MeshForTest(t testing.TB, n int, link func(from, to int) netem.Link) *netem.Mesh {
	t.Helper()
	ctx, cancel := setup(t)
	defer cancel()
	m, err := netem.NewMesh(ctx, n, link)
	if err != nil {
		t.Fatalf("netem.NewMesh: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("closing test mesh: %v", err)
		}
	})
	return m
}

// setup skips (or, under CI, fails) a test that cannot run a bed, and
// returns the context bounding a bed's setup.
func setup(t testing.TB) (context.Context, context.CancelFunc) {
	t.Helper()
	if err := netem.Available(); err != nil {
		testenv.Require(t, err.Error()+" (needs root, /dev/net/tun and ip netns)")
	}
	return context.WithTimeout(context.Background(), 30*time.Second)
}
