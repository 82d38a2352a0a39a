package callback

import (
	"context"
	"testing"
	"time"
)

// breakDone runs Break in the background and returns a channel that
// receives its error.
func breakDone(t *Table, session string, cs ...Change) <-chan error {
	done := make(chan error, 1)
	go func() { done <- t.Break(context.Background(), session, cs...) }()
	return done
}

func next(t *testing.T, h *Holder) []Break {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bs, err := h.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return bs
}

func pending(done <-chan error) bool {
	select {
	case <-done:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

func TestBreakWaitsForAck(t *testing.T) {
	tb := New(time.Minute)
	b := tb.Hold("b", "/")
	done := breakDone(tb, "a", Change{Path: "/d/f"})
	bs := next(t, b)
	if len(bs) != 1 || bs[0].Path != "/d/f" || bs[0].Tree {
		t.Fatalf("breaks %+v", bs)
	}
	if !pending(done) {
		t.Fatal("Break returned before its acknowledgement")
	}
	if b.Renew() {
		t.Error("a renewal was granted while a break waited")
	}
	b.Ack(bs[0].Seq)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !b.Renew() {
		t.Error("no renewal after the acknowledgement")
	}
}

func TestBreakSkips(t *testing.T) {
	tests := []struct {
		name    string
		session string
		root    string
		change  Change
	}{
		{"own session", "a", "/", Change{Path: "/f"}},
		{"outside the root", "b", "/x", Change{Path: "/y/f"}},
		{"a sibling with a common prefix", "b", "/x", Change{Path: "/xy"}},
		{"above the root, not a tree", "b", "/x/y", Change{Path: "/x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := New(time.Minute)
			tb.Hold(tt.session, tt.root)
			if err := <-breakDone(tb, "a", tt.change); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTreeChangeAboveRoot(t *testing.T) {
	tb := New(time.Minute)
	b := tb.Hold("b", "/x/y")
	done := breakDone(tb, "a", Change{Path: "/x", Tree: true})
	bs := next(t, b)
	if !pending(done) {
		t.Fatal("a rename above the root broke nothing")
	}
	b.Ack(bs[0].Seq)
	<-done
}

// TestLeaseRunsOut: a holder that never acknowledges holds a writer at
// most until its lease ends, and is then dropped.
func TestLeaseRunsOut(t *testing.T) {
	tb := New(300 * time.Millisecond)
	b := tb.Hold("b", "/")
	done := breakDone(tb, "a", Change{Path: "/f"})
	next(t, b)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer still waits long after the lease")
	}
	select {
	case <-b.Gone():
	default:
		t.Fatal("the holder was not dropped")
	}
	if tb.Holders() != 0 {
		t.Errorf("%d holders left", tb.Holders())
	}
	// Later changes do not wait for it.
	if err := <-breakDone(tb, "a", Change{Path: "/f"}); err != nil {
		t.Fatal(err)
	}
}

// TestLostStreamHoldsUntilExpiry: a broken stream does not end the lease
// at once (the client may not know yet), so a break waits for the lease;
// a released lease ends at once.
func TestLostStreamHoldsUntilExpiry(t *testing.T) {
	tb := New(400 * time.Millisecond)
	b := tb.Hold("b", "/")
	b.Lost()
	done := breakDone(tb, "a", Change{Path: "/f"})
	if !pending(done) {
		t.Fatal("a lost holder was not waited for")
	}
	<-done
	<-b.Gone()

	c := tb.Hold("c", "/")
	c.Release()
	if err := <-breakDone(tb, "a", Change{Path: "/f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Next(context.Background()); err == nil {
		t.Error("Next on a released holder did not fail")
	}
}

func TestBreakCancelled(t *testing.T) {
	tb := New(time.Minute)
	tb.Hold("b", "/")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tb.Break(ctx, "a", Change{Path: "/f"}) }()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled Break did not fail")
	}
}

// TestExpiredDropped: a holder that stopped renewing is dropped by the
// next break instead of being waited for.
func TestExpiredDropped(t *testing.T) {
	tb := New(time.Minute)
	now := time.Now()
	tb.now = func() time.Time { return now }
	b := tb.Hold("b", "/")
	now = now.Add(2 * time.Minute)
	if err := <-breakDone(tb, "a", Change{Path: "/f"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Gone():
	default:
		t.Fatal("an expired holder is still held")
	}
}
