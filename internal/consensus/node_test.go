package consensus

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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

// TestNodes runs three members over an in-process transport: grants from
// all of them commit, the group goes on without its leader, and the
// stopped member restarts from its disk and catches up.
func TestNodes(t *testing.T) {
	l := &loop{nodes: map[uint64]*Node{}}
	ms := map[uint64]*member{}
	for id := uint64(1); id <= 3; id++ {
		ms[id] = startMember(t, l, id, t.TempDir())
	}
	defer func() {
		for id, m := range ms {
			m.stop(l, id)
		}
	}()
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
