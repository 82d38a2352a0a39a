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

// hold is Hold with every directory promised.
func hold(t *Table, session, root string) *Holder {
	h := t.Hold(session, root)
	t.PromiseTree(session, "/")
	return h
}

// acked checks that the break whose Break is done reaches b and waits for
// its acknowledgement, then acknowledges it.
func acked(t *testing.T, b *Holder, done <-chan error) {
	t.Helper()
	bs := next(t, b)
	if !pending(done) {
		t.Fatal("Break returned before its acknowledgement")
	}
	b.Ack(bs[0].Seq)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
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
	b := hold(tb, "b", "/")
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
			hold(tb, tt.session, tt.root)
			if err := <-breakDone(tb, "a", tt.change); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTreeChangeAboveRoot(t *testing.T) {
	tb := New(time.Minute)
	b := hold(tb, "b", "/x/y")
	acked(t, b, breakDone(tb, "a", Change{Path: "/x", Tree: true}))
}

// TestLeaseRunsOut: a holder that never acknowledges holds a writer at
// most until its lease ends, and is then dropped.
func TestLeaseRunsOut(t *testing.T) {
	tb := New(300 * time.Millisecond)
	b := hold(tb, "b", "/")
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
	b := hold(tb, "b", "/")
	b.Lost()
	done := breakDone(tb, "a", Change{Path: "/f"})
	if !pending(done) {
		t.Fatal("a lost holder was not waited for")
	}
	<-done
	<-b.Gone()

	c := hold(tb, "c", "/")
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
	hold(tb, "b", "/")
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
	b := hold(tb, "b", "/")
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

// TestPromises: a change breaks only the sessions that were sent entries
// of its directory, or are being streamed a tree holding it.
func TestPromises(t *testing.T) {
	tests := []struct {
		name    string
		promise func(tb *Table)
		change  Change
		breaks  bool
	}{
		{"nothing sent", func(tb *Table) {}, Change{Path: "/d/f"}, false},
		{"its directory listed", func(tb *Table) { tb.Promise("b", Listing, "/d") }, Change{Path: "/d/f"}, true},
		{"its entry sent", func(tb *Table) { tb.Promise("b", Entry, "/d/f") }, Change{Path: "/d/f"}, true},
		{"its directory's entry sent", func(tb *Table) { tb.Promise("b", Entry, "/d") }, Change{Path: "/d/f"}, false},
		{"another directory listed", func(tb *Table) { tb.Promise("b", Listing, "/e") }, Change{Path: "/d/f"}, false},
		{"the directory's listing, for the directory", func(tb *Table) { tb.Promise("b", Listing, "/d") }, Change{Path: "/d"}, false},
		{"an entry below a moved tree", func(tb *Table) { tb.Promise("b", Entry, "/d/e/f") }, Change{Path: "/d", Tree: true}, true},
		{"an entry below, not a tree change", func(tb *Table) { tb.Promise("b", Entry|Listing, "/d/e/f") }, Change{Path: "/d"}, false},
		{"a tree streaming", func(tb *Table) { tb.PromiseTree("b", "/d") }, Change{Path: "/d/e/f"}, true},
		{"a tree streamed", func(tb *Table) { tb.PromiseTree("b", "/d")() }, Change{Path: "/d/e/f"}, false},
		{"a tree streaming below a moved one", func(tb *Table) { tb.PromiseTree("b", "/d/e") }, Change{Path: "/d", Tree: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := New(time.Minute)
			b := tb.Hold("b", "/")
			tt.promise(tb)
			done := breakDone(tb, "a", tt.change)
			if !tt.breaks {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if tb.Breaks() != 0 {
					t.Fatal("a break was sent")
				}
				return
			}
			acked(t, b, done)
		})
	}
}

// TestPromisesNeedLease: a session without a lease is promised nothing, and
// its promises go with its last lease.
func TestPromisesNeedLease(t *testing.T) {
	tb := New(time.Minute)
	tb.Promise("b", Listing, "/d")
	b := tb.Hold("b", "/")
	if err := <-breakDone(tb, "a", Change{Path: "/d/f"}); err != nil || tb.Breaks() != 0 {
		t.Fatalf("a promise made before the lease broke it: %v", err)
	}
	tb.Promise("b", Listing, "/d")
	b.Release()
	b = tb.Hold("b", "/")
	if err := <-breakDone(tb, "a", Change{Path: "/d/f"}); err != nil || tb.Breaks() != 0 {
		t.Fatalf("a promise outlived its lease: %v", err)
	}
}
