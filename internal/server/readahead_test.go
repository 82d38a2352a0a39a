package server

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/proto"
)

func TestBudget(t *testing.T) {
	b := newBudget(100, 0)
	ctx := context.Background()
	if !b.acquire(ctx, 60) || !b.acquire(ctx, 40) {
		t.Fatal("acquiring within the budget failed")
	}
	// A full budget makes the next acquire wait until a release.
	got := make(chan bool, 1)
	go func() { got <- b.acquire(ctx, 50) }()
	select {
	case <-got:
		t.Fatal("acquire beyond the budget did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	if !<-got {
		t.Fatal("acquire after a release failed")
	}
	// A cancelled wait gives up and takes nothing.
	cctx, cancel := context.WithCancel(ctx)
	go func() { got <- b.acquire(cctx, 80) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if <-got {
		t.Error("a cancelled acquire succeeded")
	}
	if b.used != 90 {
		t.Errorf("used = %d, want 90", b.used)
	}
	// One stream alone may use more than the budget's remainder: it is
	// never starved when nothing else holds memory.
	b2 := newBudget(10, 0)
	if !b2.acquire(ctx, 50) {
		t.Error("a piece larger than an idle budget was refused")
	}
	b2.join(&readAhead{})
	b2.join(&readAhead{})
	if s := b2.share(); s != 5 {
		t.Errorf("share of two streams = %d, want 5", s)
	}
}

// TestReadAheadFixed checks that a fixed-size budget fills every stream to
// its size without measurements, that the connection reports the stream's
// held bytes and target, and that a cancelled stream's bytes count as
// orphaned until Stop frees them.
func TestReadAheadFixed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fixed      int64
		wantPieces int64
		wantTarget int64
	}{
		{"four pieces", 4 * proto.SendData, 4, 4 * proto.SendData},
		{"rounded up to a piece", proto.SendData + 1, 2, proto.SendData + 1},
		{"at least one message", 1, 1, proto.SendData},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(64*proto.SendData, tc.fixed)
			c := &conn{}
			var cancels atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			data := bytes.Repeat([]byte{1}, 16*proto.SendData)
			ra := startReadAhead(ctx, bytes.NewReader(data), c, b, &cancels)
			want := tc.wantPieces * proto.SendData
			deadline := time.Now().Add(5 * time.Second)
			for c.readAhead.Load() < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // Nothing more should come.
			if got := c.readAhead.Load(); got != want {
				t.Errorf("held %d, want %d", got, want)
			}
			if got := c.readAheadTarget.Load(); got != tc.wantTarget {
				t.Errorf("target %d, want %d", got, tc.wantTarget)
			}
			if st := b.stats(); st.orphaned != 0 || st.streams != 1 || st.used != want {
				t.Errorf("before cancel: stats %+v, want used %d, 1 stream, nothing orphaned", st, want)
			}
			cancel()
			<-ra.done
			if st := b.stats(); st.orphaned != want {
				t.Errorf("after cancel: orphaned %d, want %d", st.orphaned, want)
			}
			ra.Stop()
			if st := b.stats(); st != (budgetStats{total: b.total, fixed: b.fixed}) {
				t.Errorf("after Stop: stats %+v, want nothing held", st)
			}
			if c.readAhead.Load() != 0 || c.readAheadTarget.Load() != 0 {
				t.Errorf("after Stop: conn holds %d, target %d, want 0 and 0", c.readAhead.Load(), c.readAheadTarget.Load())
			}
			if cancels.Load() != 1 {
				t.Errorf("cancelled reads = %d, want 1", cancels.Load())
			}
		})
	}
}
