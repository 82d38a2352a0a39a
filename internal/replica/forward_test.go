package replica

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
)

// TestForwardToHolder: changes at b under a's control are made at a, one
// call each, whatever their kind; b reads each at once from its own copy
// (a large file's content crossing once), the control stays a's, and a
// refused change comes back as the error it is.
func TestForwardToHolder(t *testing.T) {
	s := newSites(t, time.Hour) // a keeps its control throughout
	a, b := s.fs["a"], s.fs["b"]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := a.Put(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait()
	must(t, err)
	put(t, a, "/d/x", "from a") // a's control is now deep over /d
	grants := s.sets["b"].stats.grants.Load()
	fetched := s.sets["b"].stats.fetchedBytes.Load()

	big := make([]byte, 3<<20) // content past byChunks goes from a spool file
	for i := range big {
		big[i] = byte(rand.N(4))
	}
	if _, err := b.Put(ctx, "/d/big", nil, ferry.Whole, bytes.NewReader(big)).Wait(); err != nil {
		t.Fatal(err)
	}
	put(t, b, "/d/y", "from b")
	if got := get(t, b, "/d/y"); got != "from b" {
		t.Fatalf("b reads %q right after its forwarded put", got)
	}
	if got := get(t, b, "/d/big"); got != string(big) {
		t.Fatalf("b reads %d bytes of its forwarded 3 MiB put", len(got))
	}
	if n := s.sets["b"].stats.fetchedBytes.Load() - fetched; n != 0 {
		t.Fatalf("b fetched %d bytes of its own forwarded put back from a", n)
	}
	if _, err := b.Move(ctx, "/d/y", "/d/z").Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Link(ctx, "/d/z", "/d/l").Wait(); err != nil {
		t.Fatal(err)
	}
	d, err := b.Wstat(ctx, "/d/z", ferry.Dir{ferry.AttrMode: "0600"}).Wait()
	must(t, err)
	if d[ferry.AttrMode] != "0600" {
		t.Fatalf("b's forwarded wstat returned mode %q", d[ferry.AttrMode])
	}
	must(t, wait0(b.Remove(ctx, "/d/l")))
	if _, err := b.Stat(ctx, "/d/l").Wait(); ferry.KindOf(err) != ferry.KindNotExist {
		t.Fatalf("b stats /d/l after removing it: %v", err)
	}
	if err := wait0(b.Remove(ctx, "/d/none")); ferry.KindOf(err) != ferry.KindNotExist {
		t.Fatalf("removing a missing file through a: %v, want it not to exist", err)
	}
	if got := get(t, a, "/d/z"); got != "from b" {
		t.Fatalf("a reads %q from what b moved", got)
	}

	if n := s.sets["b"].stats.forwarded.Load(); n != 6 {
		t.Fatalf("b forwarded %d changes, want 6", n)
	}
	if n := s.sets["a"].stats.forwardsServed.Load(); n != 6 {
		t.Fatalf("a made %d changes for b, want 6", n)
	}
	if n := s.sets["b"].stats.grants.Load(); n != grants {
		t.Fatalf("b was granted %d controls, want none", n-grants)
	}
	if c, ok := b.set.Controller("/d/z"); !ok || c.Holder != "a" {
		t.Fatalf("/d/z is controlled by %+v, want a", c)
	}
	s.same(t)
}

// TestForwardThenTakeOver: a forwarded change does not keep the holder's
// control from going idle, so the member that goes on changing there is
// granted it and works on its own copy.
func TestForwardThenTakeOver(t *testing.T) {
	s := newSites(t, 300*time.Millisecond)
	a, b := s.fs["a"], s.fs["b"]
	put(t, a, "/f", "from a")
	put(t, b, "/f", "from b, through a")
	if n := s.sets["b"].stats.forwarded.Load(); n != 1 {
		t.Fatalf("b forwarded %d changes, want 1", n)
	}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		put(t, b, "/f", "from b")
		if c, ok := b.set.Controller("/f"); ok && c.Holder == "b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still forwards after %d changes", i+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := get(t, a, "/f"); got != "from b" {
		t.Fatalf("a reads %q", got)
	}
	s.same(t)
}

// TestForwardToIdleHolder: a holder that made no change of its own in a
// place for half its idle time gives its control up after the first
// change forwarded to it there, long before its idle time is out.
func TestForwardToIdleHolder(t *testing.T) {
	const idle = 6 * time.Second
	s := newSites(t, idle)
	a, b := s.fs["a"], s.fs["b"]
	put(t, a, "/f", "from a")
	last := time.Now()
	time.Sleep(idle/2 + 100*time.Millisecond)
	put(t, b, "/f", "from b, through a")
	if n := s.sets["b"].stats.forwarded.Load(); n != 1 {
		t.Fatalf("b forwarded %d changes, want 1", n)
	}
	for {
		if c, ok := b.set.Controller("/f"); !ok || c.Holder != "a" {
			break
		}
		if time.Since(last) > idle {
			t.Fatalf("a kept /f for its whole idle time after b's forwarded change")
		}
		time.Sleep(20 * time.Millisecond)
	}
	put(t, b, "/f", "from b")
	if c, ok := b.set.Controller("/f"); !ok || c.Holder != "b" {
		t.Fatalf("/f is controlled by %+v after a gave it up, want b", c)
	}
	s.same(t)
}

// TestForwardRefusesBadInput: a forwarded change of no known kind, or
// with a path no file system takes, is refused with an error that says
// so, and changes nothing.
func TestForwardRefusesBadInput(t *testing.T) {
	s := newSites(t, time.Hour)
	put(t, s.fs["a"], "/f", "from a")
	l := s.sets["b"].link(memberID("a"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, q := range []*proto.ForwardReq{
		{Op: "chmod", Path: "/f"},
		{Op: "remove", Path: "/f\x00x"},
		{Op: "move", Path: "/f", To: "/" + strings.Repeat("x", 300)},
	} {
		st, err := proto.NewReplicaClient(l.bulk).Forward(ctx)
		must(t, err)
		must(t, st.Send(q))
		_, err = st.CloseAndRecv()
		if k := ferry.KindOf(proto.FromStatus("test", q.Path, err)); k != ferry.KindInvalid {
			t.Errorf("forwarding %s %q: %v (%v), want it refused as invalid", q.Op, q.Path, err, k)
		}
	}
	if got := get(t, s.fs["a"], "/f"); got != "from a" {
		t.Fatalf("a reads %q after the refused changes", got)
	}
	s.same(t)
}
