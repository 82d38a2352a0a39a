package consensus

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ferryfs/ferry/internal/control"
)

// loop is an in-process transport between nodes; a stopped node's
// messages go nowhere.
type loop struct {
	mu    sync.Mutex
	nodes map[uint64]*Node
}

func (l *loop) Send(msgs []raftpb.Message) {
	for _, m := range msgs {
		l.mu.Lock()
		to, from := l.nodes[m.To], l.nodes[m.From]
		l.mu.Unlock()
		go func() {
			ok := to != nil && to.Step(m) == nil
			if m.Type == raftpb.MsgSnap && from != nil {
				from.ReportSnapshot(m.To, ok)
			}
		}()
	}
}

func (l *loop) set(id uint64, n *Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n == nil {
		delete(l.nodes, id)
	} else {
		l.nodes[id] = n
	}
}

type member struct {
	dir  string
	disk *Disk
	node *Node
	tab  *control.Table
}

func startMember(t *testing.T, l *loop, id uint64, dir string) *member {
	t.Helper()
	disk, err := OpenDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	tab := control.New()
	n, err := Start(Config{ID: id, Peers: []uint64{1, 2, 3}, SnapshotEvery: 32}, disk, tab, l, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	l.set(id, n)
	return &member{dir, disk, n, tab}
}

func (m *member) stop(l *loop, id uint64) {
	l.set(id, nil)
	m.node.Stop()
	m.disk.Close()
}

// startGroup starts members 1 to 3 over an in-process transport; those
// left in the map are stopped at the test's end.
func startGroup(t *testing.T) (*loop, map[uint64]*member) {
	l := &loop{nodes: map[uint64]*Node{}}
	ms := map[uint64]*member{}
	for id := uint64(1); id <= 3; id++ {
		ms[id] = startMember(t, l, id, t.TempDir())
	}
	t.Cleanup(func() {
		for id, m := range ms {
			m.stop(l, id)
		}
	})
	return l, ms
}

// TestNodes runs three members over an in-process transport: grants from
// all of them commit, the group goes on without its leader, and the
// stopped member restarts from its disk and catches up.
func TestNodes(t *testing.T) {
	l, ms := startGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grants := func(round int) {
		var wg sync.WaitGroup
		for id, m := range ms {
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p := fmt.Sprintf("/r%d/m%d/f%d", round, id, i)
					res, err := m.node.Propose(ctx, control.GrantCmd(simMembers[id], false, p))
					if err != nil {
						t.Errorf("grant %s: %v", p, err)
						return
					}
					if r, err := control.DecodeResult(res); err != nil || !r.OK || r.Controls[0].Holder != simMembers[id] {
						t.Errorf("grant %s: %+v %v", p, r, err)
					}
				}()
			}
		}
		wg.Wait()
	}
	grants(1)
	if t.Failed() {
		return
	}
	var lead uint64
	for lead == 0 {
		lead = ms[1].node.Status().Leader
		time.Sleep(time.Millisecond)
	}
	ms[lead].stop(l, lead)
	old := ms[lead]
	delete(ms, lead)
	grants(2)
	ms[lead] = startMember(t, l, lead, old.dir)
	// All three apply the same table once the restarted member caught up.
	want := 3*20 + 2*20 // round 2 ran without the stopped member
	deadline := time.Now().Add(10 * time.Second)
	for {
		var sums [][32]byte
		var lens []int
		for _, m := range ms {
			m.node.View(func() { sums, lens = append(sums, m.tab.Sum()), append(lens, m.tab.Len()) })
		}
		if lens[0] == want && sums[0] == sums[1] && sums[1] == sums[2] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tables differ after restart: rows %v", lens)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJoin adds a fourth member to a running group of three whose log was
// compacted: it starts empty, gets the table by a snapshot, applies what
// follows, and, promoted, counts in the quorum. Adding it as a learner
// again after that (a proposal repeated) does not demote it.
func TestJoin(t *testing.T) {
	l, ms := startGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grant := func(m *member, p string) {
		t.Helper()
		res, err := m.node.Propose(ctx, control.GrantCmd(simMembers[1], false, p))
		if err != nil {
			t.Fatalf("grant %s: %v", p, err)
		}
		if r, err := control.DecodeResult(res); err != nil || !r.OK {
			t.Fatalf("grant %s: %+v %v", p, r, err)
		}
	}
	for i := range 100 { // three snapshots' worth: the log before is gone
		grant(ms[1], fmt.Sprintf("/a/f%d", i))
	}
	disk, err := OpenDisk(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tab := control.New()
	n4, err := Start(Config{ID: 4, Join: true, SnapshotEvery: 32}, disk, tab, l, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	l.set(4, n4)
	ms[4] = &member{"", disk, n4, tab}
	info := control.EncodeMember(control.Member{Name: "d", Addr: "d:1", Fingerprint: "SHA256:d", ID: 4})
	learner := raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: 4, Context: info}
	if err := ms[2].node.ChangeConf(ctx, learner, func(cs raftpb.ConfState) bool { return slices.Contains(cs.Learners, 4) }); err != nil {
		t.Fatal(err)
	}
	grant(ms[2], "/b")
	same := func(ids ...uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var sums [][32]byte
			for _, id := range ids {
				ms[id].node.View(func() { sums = append(sums, ms[id].tab.Sum()) })
			}
			if !slices.ContainsFunc(sums, func(s [32]byte) bool { return s != sums[0] }) {
				return
			}
			if time.Now().After(deadline) {
				for _, id := range ids {
					t.Logf("member %d: %+v %+v", id, ms[id].node.Status(), ms[id].node.Conf())
				}
				t.Fatalf("tables of %v differ", ids)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	same(1, 2, 3, 4)
	var joined []control.Member
	n4.View(func() { joined = tab.Members() })
	if len(joined) != 1 || joined[0].Name != "d" || tab.Len() != 101 {
		t.Fatalf("the new member knows members %v and %d rows", joined, tab.Len())
	}
	// Promoted by its own proposal, it is needed: with two of the first
	// three stopped no grant could commit without it.
	voter := raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: 4}
	if err := n4.ChangeConf(ctx, voter, func(cs raftpb.ConfState) bool { return slices.Contains(cs.Voters, 4) }); err != nil {
		t.Fatal(err)
	}
	if err := n4.locked(func(rn *raft.RawNode) error { return rn.ProposeConfChange(learner) }); err != nil {
		t.Fatal(err)
	}
	grant(ms[1], "/c")
	same(1, 2, 3, 4)
	for id, m := range ms {
		if cs := m.node.Conf(); !slices.Contains(cs.Voters, 4) || len(cs.Voters) != 4 {
			t.Fatalf("member %d: configuration %+v", id, cs)
		}
	}
	ms[3].stop(l, 3)
	delete(ms, 3)
	grant(ms[4], "/d") // 1, 2 and 4: three of four
	same(1, 2, 4)
	// 3 removed, the group is three, and two of them are a quorum.
	gone := raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: 3,
		Context: control.EncodeMember(control.Member{Name: simMembers[3], ID: 3})}
	if err := ms[1].node.ChangeConf(ctx, gone, func(cs raftpb.ConfState) bool { return !slices.Contains(cs.Voters, 3) }); err != nil {
		t.Fatal(err)
	}
	ms[4].stop(l, 4)
	delete(ms, 4)
	grant(ms[2], "/e")
	same(1, 2)
	ms[1].node.View(func() {
		if g := ms[1].tab.Gone(); len(g) != 1 || g[0].ID != 3 {
			t.Errorf("the table's members removed: %+v", g)
		}
	})
}
