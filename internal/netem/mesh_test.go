package netem_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/netem/netemtest"
)

// TestMesh: three sites, each pair with its own one-way delays; round
// trips between every pair match them, a link changed while running takes
// effect, and a cut link carries nothing while the others still do.
func TestMesh(t *testing.T) {
	oneWay := func(i, j int) time.Duration {
		// 0-1: 10 ms each way, 0-2: 30 ms, 1-2: 20 ms.
		return map[[2]int]time.Duration{{0, 1}: 10, {0, 2}: 30, {1, 2}: 20}[[2]int{min(i, j), max(i, j)}] * time.Millisecond
	}
	m := netemtest.MeshForTest(t, 3, func(i, j int) netem.Link { return netem.Link{Delay: oneWay(i, j)} })
	var addrs []string
	for i, s := range m.Sites {
		l, err := m.Listen(i, "tcp", netip.AddrPortFrom(s.Addr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		addrs = append(addrs, l.Addr().String())
		go echo(l)
	}
	// rtt measures the fastest of a few ping-pongs from site i to site j.
	rtt := func(i, j int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := m.Dial(ctx, i, "tcp", addrs[j])
		if err != nil {
			return 0, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var rtts []time.Duration
		buf := make([]byte, 16)
		for range 7 {
			start := time.Now()
			if _, err := c.Write(buf); err != nil {
				return 0, err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return 0, err
			}
			rtts = append(rtts, time.Since(start))
		}
		return slices.Min(rtts), nil
	}
	check := func(i, j int, want time.Duration) {
		t.Helper()
		retry(t, func() (late []string) {
			got, err := rtt(i, j)
			if err != nil {
				t.Fatalf("site %d to %d: %v", i, j, err)
			}
			if got < want-200*time.Microsecond {
				t.Errorf("site %d to %d: round trip %v, shorter than the configured %v", i, j, got, want)
			}
			if got > want+3*time.Millisecond {
				late = append(late, fmt.Sprintf("site %d to %d: round trip %v, want %v within 3ms", i, j, got, want))
			}
			return late
		})
	}
	for i := range 3 {
		for j := range 3 {
			if i != j {
				check(i, j, 2*oneWay(i, j))
			}
		}
	}
	// Changed while running.
	m.SetLink(0, 1, netem.Link{Delay: 40 * time.Millisecond})
	m.SetLink(1, 0, netem.Link{Delay: 40 * time.Millisecond})
	check(0, 1, 80*time.Millisecond)
	// Cut: 0 and 2 no longer reach each other; 1 still reaches both.
	m.SetLink(0, 2, netem.Link{Loss: 1})
	m.SetLink(2, 0, netem.Link{Loss: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c, err := m.Dial(ctx, 0, "tcp", addrs[2]); err == nil {
		c.Close()
		t.Error("a connection crossed a cut link")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Logf("dial across the cut: %v", err)
	}
	check(1, 2, 40*time.Millisecond)
	if s := m.Stats(0, 2); s.LossPackets == 0 {
		t.Errorf("the cut link lost no packets: %v", s)
	}
}
