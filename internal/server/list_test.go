package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
)

// TestListMemory: a put's chunk list takes its memory from the uploads'
// budget. A list that cannot fit even alone is refused as invalid (the
// client then puts the file whole); one that does not fit beside another
// waits for it to end, or gives up as busy, which the client sees as
// proto.ErrBusy across the wire.
func TestListMemory(t *testing.T) {
	ctx := context.Background()
	const entries = 1000
	w := newWindows(entries * refMemory)

	huge := &list{w: w, wait: time.Second}
	if err := huge.grow(ctx, "/huge", entries+1); ferry.KindOf(err) != ferry.KindInvalid {
		t.Fatalf("a list larger than the whole budget: %v, want KindInvalid", err)
	}
	huge.end()

	a := &list{w: w, wait: time.Second}
	if err := a.grow(ctx, "/a", entries/2); err != nil {
		t.Fatal(err)
	}
	if err := a.grow(ctx, "/a", entries/2); err != nil {
		t.Fatal(err)
	}
	b := &list{w: w, wait: 20 * time.Millisecond}
	err := b.grow(ctx, "/b", 10)
	wire := proto.ToError(proto.FromError(err))
	if !errors.Is(wire, proto.ErrBusy) || ferry.KindOf(wire) != ferry.KindUnavailable {
		t.Fatalf("a list beside a full one: %v (after the wire: %v), want busy", err, wire)
	}
	if w.refused.Load() != 1 {
		t.Errorf("refused %d, want 1", w.refused.Load())
	}

	c := &list{w: w, wait: 10 * time.Second}
	got := make(chan error, 1)
	go func() { got <- c.grow(ctx, "/c", 10) }()
	select {
	case err := <-got:
		t.Fatalf("a list got memory that another held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	a.end()
	if err := <-got; err != nil {
		t.Fatalf("a list once the other ended: %v", err)
	}
	c.end()
	b.end()
	if reserved, _, _ := w.stats(); reserved != 0 {
		t.Errorf("%d bytes reserved once every list ended", reserved)
	}
}
