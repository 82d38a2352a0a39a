package callback

import (
	"context"
	"github.com/ferryfs/ferry"
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
	clock := time.Now()
	tb.now = func() time.Time { return clock }
	b := hold(tb, "b", "/")
	done := breakDone(tb, "a", Change{Path: "/d/f"})
	bs := next(t, b)
	if len(bs) != 1 || bs[0].Path != "/d/f" || bs[0].Tree {
		t.Fatalf("breaks %+v", bs)
	}
	if !pending(done) {
		t.Fatal("Break returned before its acknowledgement")
	}
	if !b.Renew() {
		t.Error("a renewal was refused while a break sent a moment ago waited")
	}
	clock = clock.Add(tb.Lease() / 3)
	if b.Renew() {
		t.Error("a renewal was granted while a break waited a third of the lease")
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

// TestGrantWrite: a write lease is refused while another session holds one
// at the path or a deep one above it, given shallow while another holds
// one below it (the paper's downgrade), and given to the same session
// over paths it already holds near; it ends with release and with the
// lease.
func TestGrantWrite(t *testing.T) {
	tb := New(time.Minute)
	a := tb.Hold("a", "/")
	b := tb.Hold("b", "/")
	c := tb.Hold("c", "/")
	for _, tc := range []struct {
		h    *Holder
		path string
		want ferry.WriteGrant
	}{
		{a, "/src", ferry.WriteDeep},
		{b, "/src/x", ferry.WriteRefused}, // Below a's deep lease.
		{b, "/", ferry.WriteShallow},      // Above a's: its files only.
		{c, "/", ferry.WriteRefused},      // At b's.
		{c, "/doc", ferry.WriteDeep},      // Below b's shallow lease.
		{b, "/srcx", ferry.WriteDeep},     // A sibling whose name starts alike.
		{a, "/src/y", ferry.WriteDeep},    // A's own, below its own.
		{a, "/srcx/z", ferry.WriteRefused},
	} {
		if got := tc.h.GrantWrite(tc.path); got != tc.want {
			t.Errorf("%s asks for %s: granted %v, want %v", tc.h.session, tc.path, got, tc.want)
		}
	}
	if n := tb.WriteLeases(); n != 5 {
		t.Errorf("%d write leases held, want 5", n)
	}
	a.ReleaseWrite("/src")
	a.ReleaseWrite("/src/y")
	if got := b.GrantWrite("/src/x"); got != ferry.WriteDeep {
		t.Errorf("a released path: granted %v, want deep", got)
	}
	b.Release()
	c.Release()
	if n := tb.WriteLeases(); n != 0 {
		t.Errorf("%d write leases held after release and the lease's end, want 0", n)
	}
}

// TestShallowRecall: a shallow lease is recalled by calls on its directory
// and on what is directly in it (a walk above it too), not by calls in the
// directories below it, which others hold.
func TestShallowRecall(t *testing.T) {
	tb := New(time.Minute)
	a := tb.Hold("a", "/")
	b := tb.Hold("b", "/")
	if got := a.GrantWrite("/d/sub"); got != ferry.WriteDeep {
		t.Fatalf("a asks for /d/sub: %v", got)
	}
	if got := b.GrantWrite("/d"); got != ferry.WriteShallow {
		t.Fatalf("b asks for /d: %v, want shallow", got)
	}
	for _, tc := range []struct {
		tree   bool
		path   string
		recall bool
	}{
		{false, "/d/sub/f", false}, // a's own, below b's.
		{false, "/d/f", true},
		{false, "/d", true},
		{false, "/d/sub", true}, // An entry of /d.
		{true, "/", true},       // A walk above.
		{false, "/e/f", false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		before := tb.Recalls()
		tb.Recall(ctx, "a", tc.tree, tc.path)
		cancel()
		got := tb.Recalls() > before
		if got != tc.recall {
			t.Errorf("a's call on %s (tree %v): recalled b's shallow lease %v, want %v", tc.path, tc.tree, got, tc.recall)
		}
		if got {
			// Acknowledged, and taken again, for the next case.
			for _, brk := range next(t, b) {
				b.Ack(brk.Seq)
			}
			if g := b.GrantWrite("/d"); g != ferry.WriteShallow {
				t.Fatalf("b asks for /d again: %v", g)
			}
		}
	}
}

// TestRecall: a call under another session's write lease waits until the
// holder acknowledges the recall (which gives the lease back), or releases
// it, or loses its lease; the holder's own calls and calls elsewhere do
// not wait.
func TestRecall(t *testing.T) {
	recall := func(tb *Table, session string, tree bool, ps ...string) <-chan error {
		done := make(chan error, 1)
		go func() { done <- tb.Recall(context.Background(), session, tree, ps...) }()
		return done
	}
	tb := New(time.Minute)
	a := tb.Hold("a", "/")
	if a.GrantWrite("/w") != ferry.WriteDeep {
		t.Fatal("not granted")
	}
	for _, tc := range []struct {
		session string
		tree    bool
		path    string
	}{
		{"a", false, "/w/f"}, // The holder itself.
		{"b", false, "/x"},   // Elsewhere.
		{"b", false, "/"},    // Above, not a walk.
		{"b", true, "/wx/f"}, // A sibling.
	} {
		if err := <-recall(tb, tc.session, tc.tree, tc.path); err != nil {
			t.Fatal(err)
		}
	}
	if n := tb.Recalls(); n != 0 {
		t.Fatalf("%d recalls sent for calls outside the lease", n)
	}
	// Acknowledged: the lease is given back.
	done := recall(tb, "b", false, "/w/f")
	bs := next(t, a)
	if len(bs) != 1 || !bs[0].Recall || bs[0].Path != "/w" {
		t.Fatalf("the holder got %+v, want a recall of /w", bs)
	}
	if !pending(done) {
		t.Fatal("the call under the lease went on before the recall was acknowledged")
	}
	// Asked again before the recall is acknowledged: the acknowledgement
	// would end the lease given again, so it is refused.
	if a.GrantWrite("/w") != ferry.WriteRefused {
		t.Error("a write lease was given again while its recall waited")
	}
	a.Ack(bs[0].Seq)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(a.Writes()) != 0 {
		t.Errorf("the holder still has %v after acknowledging the recall", a.Writes())
	}
	// A walk above the lease recalls it; a release ends the recall.
	a.GrantWrite("/w")
	done = recall(tb, "b", true, "/")
	next(t, a)
	if !pending(done) {
		t.Fatal("a walk above the lease went on before the recall was answered")
	}
	a.ReleaseWrite("/w")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A holder that never answers holds the call for its lease only.
	short := New(200 * time.Millisecond)
	h := short.Hold("a", "/")
	h.GrantWrite("/w")
	began := time.Now()
	if err := short.Recall(context.Background(), "b", false, "/w"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < 150*time.Millisecond {
		t.Errorf("the recall of a silent holder ended after %s, before its lease", took)
	}
	if short.WriteLeases() != 0 {
		t.Error("the silent holder kept its write lease after its lease ran out")
	}
}
