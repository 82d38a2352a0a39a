package server

import (
	"context"
	"testing"
	"time"
)

func TestBudget(t *testing.T) {
	b := newBudget(100)
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
	b2 := newBudget(10)
	if !b2.acquire(ctx, 50) {
		t.Error("a piece larger than an idle budget was refused")
	}
	b2.join(1)
	b2.join(1)
	if s := b2.share(); s != 5 {
		t.Errorf("share of two streams = %d, want 5", s)
	}
}
