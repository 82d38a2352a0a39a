package replica

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/servertest"
)

func TestParseMembers(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		fail string
	}{
		{"# set\na 127.0.0.1:1 fpa\n\nb 127.0.0.1:2 fpb\n", 2, ""},
		{"a 127.0.0.1:1\n", 0, "NAME ADDR FINGERPRINT"},
		{"a 127.0.0.1:1 fpa\na 127.0.0.1:2 fpb\n", 0, "name a named twice"},
		{"a 127.0.0.1:1 fpa\nb 127.0.0.1:1 fpb\n", 0, "addr"},
		{"a 127.0.0.1:1 fpa\nb 127.0.0.1:2 fpa\n", 0, "key"},
		{"", 0, "1 to 9"},
	}
	for _, tt := range tests {
		ms, err := ParseMembers(strings.NewReader(tt.in))
		if tt.fail != "" {
			if err == nil || !strings.Contains(err.Error(), tt.fail) {
				t.Errorf("%q: error %v, want one saying %q", tt.in, err, tt.fail)
			}
			continue
		}
		if err != nil || len(ms) != tt.n || ms[0].ID == ms[1].ID {
			t.Errorf("%q: %+v %v", tt.in, ms, err)
		}
	}
}

func newKey(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type testSet struct {
	members []Member
	keys    map[string]ed25519.PrivateKey
	listen  map[string]string // where a member listens, if not its address
	every   time.Duration     // Config.LeaderEvery
	sets    map[string]*Set
	dir     string
}

func newTestSet(t *testing.T, names ...string) *testSet {
	return newDelayedSet(t, 0, names...)
}

// newDelayedSet is newTestSet with every member reached through a proxy
// that delays each byte oneWay each way: members 2*oneWay apart in round
// trip.
func newDelayedSet(t *testing.T, oneWay time.Duration, names ...string) *testSet {
	ts := &testSet{keys: map[string]ed25519.PrivateKey{}, listen: map[string]string{}, sets: map[string]*Set{}, dir: t.TempDir()}
	for _, n := range names {
		k := newKey(t)
		ts.keys[n] = k
		addr := servertest.FreeAddr(t)
		if oneWay > 0 {
			ts.listen[n] = addr
			addr = servertest.DelayProxy(t, addr, oneWay)
		}
		ts.members = append(ts.members, Member{Name: n, Addr: addr, ID: memberID(n),
			Fingerprint: auth.Fingerprint(k.Public().(ed25519.PublicKey))})
	}
	for _, n := range names {
		ts.start(t, n)
	}
	t.Cleanup(func() {
		for _, s := range ts.sets {
			s.Close()
		}
	})
	return ts
}

func (ts *testSet) start(t *testing.T, name string) {
	s, err := Open(Config{Members: ts.members, Key: ts.keys[name], LogDir: filepath.Join(ts.dir, name),
		Tick: 20 * time.Millisecond, Listen: ts.listen[name], LeaderEvery: ts.every})
	if err != nil {
		t.Fatal(err)
	}
	ts.sets[name] = s
}

// leader waits for a member to see a leader and returns its name.
func (ts *testSet) leader(t *testing.T, from string) string {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		lead := ts.sets[from].node.Status().Leader
		for _, m := range ts.members {
			if m.ID == lead {
				return m.Name
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s sees no leader", from)
	return ""
}

// TestSet runs three members on loopback: grants from each agree, a
// member learns another's control, the set goes on without its leader,
// and the control file shows it all.
func TestSet(t *testing.T) {
	ts := newTestSet(t, "a", "b", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := ts.sets["a"].Grant(ctx, true, "/src")
	if err != nil || !r.OK || !r.Controls[0].Deep {
		t.Fatalf("a's deep grant of /src: %+v %v", r, err)
	}
	r, err = ts.sets["b"].Grant(ctx, false, "/src/main.c")
	if err != nil || r.OK || r.Controls[0].Holder != "a" {
		t.Fatalf("b's grant under a's deep control: %+v %v", r, err)
	}
	if c, ok := ts.sets["b"].Controller("/src/main.c"); !ok || c.Holder != "a" {
		t.Fatalf("b sees %+v %v for /src/main.c", c, ok)
	}
	if err := ts.sets["c"].Command(ctx, []string{"grant", "/doc"}); err != nil {
		t.Fatal(err)
	}
	if err := ts.sets["b"].Command(ctx, []string{"grant", "/doc"}); ferry.KindOf(err) != ferry.KindUnavailable {
		t.Fatalf("b's grant of c's /doc: %v", err)
	}
	st := ts.sets["c"].Status(ctx)
	for _, want := range []string{"self: c", "member: a", "held: /doc shallow", "controls: 2 (1 here)", " leader\n"} {
		if !strings.Contains(st, want) {
			t.Errorf("c's status lacks %q:\n%s", want, st)
		}
	}

	// Without its leader the set elects another and goes on.
	lead := ts.leader(t, "a")
	ts.sets[lead].Close()
	delete(ts.sets, lead)
	var other string
	for n := range ts.sets {
		other = n
	}
	if r, err := ts.sets[other].Grant(ctx, false, "/after"); err != nil || !r.OK {
		t.Fatalf("grant after the leader %s left: %+v %v", lead, r, err)
	}
	// The old leader comes back from its log and learns what it missed.
	ts.start(t, lead)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, ok := ts.sets[lead].Controller("/after"); ok && c.Holder == other {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s restarted and never learned of /after", lead)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMembersAuthenticated shows that only members may speak raft to a
// member, and only as themselves.
func TestMembersAuthenticated(t *testing.T) {
	ts := newTestSet(t, "a", "b", "c")
	a := ts.members[0]
	send := func(key ed25519.PrivateKey, from uint64, typ raftpb.MessageType) error {
		cfg, err := auth.PeerTLS(key, false, func(string) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(a.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := proto.NewReplicaClient(conn).Raft(ctx)
		if err != nil {
			return err
		}
		m := raftpb.Message{Type: typ, From: from, To: a.ID, Term: 1000}
		b, _ := m.Marshal()
		if err := st.Send(&proto.RaftBatch{Msgs: [][]byte{b}}); err != nil {
			_, err = st.CloseAndRecv()
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}
	if err := send(newKey(t), ts.members[1].ID, raftpb.MsgHeartbeat); err == nil {
		t.Error("a stranger's raft messages were taken")
	}
	if err := send(ts.keys["b"], ts.members[2].ID, raftpb.MsgHeartbeat); err == nil || !strings.Contains(err.Error(), "as another") {
		t.Errorf("b sending as c: %v", err)
	}
	if term := ts.sets["a"].node.Status().Term; term >= 1000 {
		t.Errorf("a forged heartbeat moved a to term %d", term)
	}
	// A member's own message is taken (a stale vote response, which raft
	// then ignores).
	if err := send(ts.keys["b"], ts.members[1].ID, raftpb.MsgVoteResp); err != nil {
		t.Errorf("b sending as itself: %v", err)
	}
}

// TestLeaderFollowsGrants: the leader hands raft's leadership to the
// member asking for most grants, where a grant then costs one round trip.
func TestLeaderFollowsGrants(t *testing.T) {
	ts := newTestSet(t, "a", "b", "c")
	for _, s := range ts.sets {
		s.Close()
	}
	ts.every = 200 * time.Millisecond
	for _, n := range []string{"a", "b", "c"} {
		ts.start(t, n)
	}
	lead := ts.leader(t, "a")
	busy := "a"
	if lead == "a" {
		busy = "b"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 40 {
		if r, err := ts.sets[busy].Grant(ctx, false, fmt.Sprintf("/p%d", i)); err != nil || !r.OK {
			t.Fatalf("grant %d: %+v %v", i, r, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ts.leader(t, busy) != busy {
		if time.Now().After(deadline) {
			t.Fatalf("leader stays %s after %s asked for 40 grants", ts.leader(t, busy), busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// At least one transfer: under load (the race detector, a busy CI
	// machine) an election may give the old leader back its leadership,
	// which it then hands over again.
	if st := ts.sets[lead].Status(ctx); !regexp.MustCompile(`leader_transfers=[1-9]`).MatchString(st) {
		t.Errorf("the old leader's status:\n%s", st)
	}
}

// FuzzParseMembers: any members file either parses into a valid set (1 to
// MaxMembers members, names, addresses, keys and ids each unique) or fails.
func FuzzParseMembers(f *testing.F) {
	f.Add("a 127.0.0.1:1 SHA256:x\nb 127.0.0.1:2 SHA256:y\n")
	f.Add("# c\n\n a b c d\n")
	f.Fuzz(func(t *testing.T, in string) {
		ms, err := ParseMembers(strings.NewReader(in))
		if err != nil {
			return
		}
		if len(ms) == 0 || len(ms) > MaxMembers {
			t.Fatalf("%d members", len(ms))
		}
		seen := map[string]bool{}
		for _, m := range ms {
			for _, k := range []string{"n" + m.Name, "a" + m.Addr, "k" + m.Fingerprint, fmt.Sprint("i", m.ID)} {
				if seen[k] {
					t.Fatalf("%q twice in %+v", k, ms)
				}
				seen[k] = true
			}
			if m.ID == 0 || m.Name == "" || strings.ContainsAny(m.Name+m.Addr+m.Fingerprint, " \t\n") {
				t.Fatalf("member %+v", m)
			}
		}
	})
}
