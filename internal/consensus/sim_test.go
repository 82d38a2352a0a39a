package consensus

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"testing/cryptotest"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ferryfs/ferry/internal/control"
)

// checked is a control table that checks its invariants after every entry
// and records its state there, so that members can be compared entry by
// entry.
type checked struct {
	*control.Table
	sim  *sim
	node uint64
}

func (c checked) Apply(index uint64, cmd []byte) []byte {
	res := c.Table.Apply(index, cmd)
	if err := c.Table.Check(); err != nil {
		c.sim.fail("node %d after entry %d: %v", c.node, index, err)
	}
	sum := c.Table.Sum()
	if prev, ok := c.sim.sums[index]; ok && prev != sum {
		c.sim.fail("node %d: table after entry %d differs from another member's", c.node, index)
	}
	c.sim.sums[index] = sum
	return res
}

// Added checks that every member reaches the same configuration at the
// same entry, and that a member once a voter stays one (an add repeated
// after its promotion must not demote it).
func (c checked) Added(index, id uint64, info []byte) {
	c.Table.Added(index, id, info)
	cs := c.sim.nodes[c.node-1].p.conf
	conf := fmt.Sprintf("voters %v learners %v", cs.Voters, cs.Learners)
	if prev, ok := c.sim.confs[index]; ok && prev != conf {
		c.sim.fail("node %d: configuration after entry %d is %s, another member's %s", c.node, index, conf, prev)
	}
	c.sim.confs[index] = conf
	for v, at := range c.sim.voterSince {
		if gone, ok := c.sim.removedAt[v]; ok && gone <= index {
			continue
		}
		if at < index && !slices.Contains(cs.Voters, v) {
			c.sim.fail("node %d: %d, a voter since entry %d, is not one after entry %d", c.node, v, at, index)
		}
	}
	for _, v := range cs.Voters {
		if at, ok := c.sim.voterSince[v]; !ok || index < at {
			c.sim.voterSince[v] = index
			if c.sim.nodes[v-1].joiner {
				c.sim.joined++
			}
		}
	}
}

// Removed records the entry at which member id left, and checks that
// every member removes it at the same entry.
func (c checked) Removed(index, id uint64, info []byte) {
	_, ok := c.Table.Remove(index, id, info)
	if at, seen := c.sim.removedAt[id]; ok && seen && at != index {
		c.sim.fail("node %d: %d removed at entry %d, at another member at %d", c.node, id, index, at)
	}
	if ok {
		c.sim.removedAt[id] = index
	}
	cs := c.sim.nodes[c.node-1].p.conf
	if slices.Contains(cs.Voters, id) || slices.Contains(cs.Learners, id) {
		c.sim.fail("node %d: %d still in the configuration after its removal at %d", c.node, id, index)
	}
}

type simNode struct {
	id      uint64
	joiner  bool                // started empty, to be added by a configuration change
	mem     *raft.MemoryStorage // what the member stored; it outlives a crash
	p       *peer
	tab     *control.Table
	up      bool
	cut     bool // partitioned from every other member
	runs    uint64
	waiting map[uint64][]byte // proposals not yet answered, by key
	gaveUp  map[uint64]bool   // proposals whose caller stopped waiting
	results map[uint64][]byte // answers given, by key
}

type simMsg struct {
	at int // the time it was sent
	m  raftpb.Message
}

// sim runs raft members and their control tables on virtual time with a
// seeded scheduler that drops, duplicates, delays and reorders messages,
// partitions members, crashes and restarts them, and moves leadership.
type sim struct {
	rng   *rand.Rand
	nodes []*simNode
	net   []simMsg
	now   int
	key   uint64
	sums  map[uint64][32]byte
	confs map[uint64]string // the configuration after each entry that added a member
	// voterSince is, per member, the first entry after which it was a
	// voter.
	voterSince map[uint64]uint64
	removedAt  map[uint64]uint64 // the entry that removed a member
	peers      []uint64          // the members the group began with
	drop       int               // percent of messages dropped
	errs       []string
	trace      []byte
	answered   int // proposals whose proposer got their result
	proposed   int // proposals raft took
	snaps      int // snapshots delivered to a member behind
	restarts   int
	joined     int // members added while the group ran
}

// removed counts the members removed while the group ran.
func (s *sim) removed() int { return len(s.removedAt) }

func (s *sim) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
}

func (s *sim) note(format string, args ...any) {
	s.trace = fmt.Appendf(s.trace, "%d: "+format+"\n", append([]any{s.now}, args...)...)
}

var simMembers = []string{"", "a", "b", "c", "d", "e", "f", "g"}

// newSim makes a group of n members and joiners more that it may add.
func newSim(seed uint64, n, joiners int) *sim {
	s := &sim{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), sums: map[uint64][32]byte{},
		confs: map[uint64]string{}, voterSince: map[uint64]uint64{}, removedAt: map[uint64]uint64{}}
	s.drop = s.rng.IntN(25)
	for i := 1; i <= n+joiners; i++ {
		s.nodes = append(s.nodes, &simNode{id: uint64(i), mem: raft.NewMemoryStorage(), joiner: i > n})
		if i <= n {
			s.peers = append(s.peers, uint64(i))
		}
	}
	for _, nd := range s.nodes {
		s.start(nd)
	}
	return s
}

// inConf reports whether nd is in the configuration lead applied.
func inConf(lead, nd *simNode) bool {
	return slices.Contains(lead.p.conf.Voters, nd.id) || slices.Contains(lead.p.conf.Learners, nd.id)
}

// start (re)starts a member from what it stored, with a fresh table.
func (s *sim) start(nd *simNode) {
	nd.runs++
	nd.tab = control.New()
	nd.waiting, nd.gaveUp, nd.results = map[uint64][]byte{}, map[uint64]bool{}, map[uint64][]byte{}
	p, err := newPeer(Config{ID: nd.id, Peers: s.peers, Join: nd.joiner, ElectionTicks: 10, SnapshotEvery: 16},
		nd.mem, nil, checked{nd.tab, s, nd.id}, nd.runs)
	if err != nil {
		s.fail("start node %d: %v", nd.id, err)
		return
	}
	p.done = func(key uint64, res []byte) {
		if prev, ok := nd.results[key]; ok {
			// A proposal logged twice is answered again, alike.
			if string(prev) != string(res) {
				s.fail("node %d answered proposal %d twice, differently", nd.id, key)
			}
			return
		}
		nd.results[key] = res
		if _, ok := nd.waiting[key]; !ok && !nd.gaveUp[key] {
			s.fail("node %d answered proposal %d it is not waiting for", nd.id, key)
		}
		if _, err := control.DecodeResult(res); err != nil {
			s.fail("node %d: %v", nd.id, err)
		}
		delete(nd.waiting, key)
		s.answered++
	}
	nd.p, nd.up = p, true
}

// settle runs every up member's Ready until none has one.
func (s *sim) settle() {
	for again := true; again; {
		again = false
		for _, nd := range s.nodes {
			if !nd.up || !nd.p.rn.HasReady() {
				continue
			}
			again = true
			msgs, err := nd.p.ready()
			if err != nil {
				s.fail("node %d ready: %v", nd.id, err)
				return
			}
			for _, m := range msgs {
				s.net = append(s.net, simMsg{s.now, m})
			}
		}
	}
}

// deliver takes message i off the network and steps its receiver, unless
// the scheduler drops it.
func (s *sim) deliver(i int, drop bool) {
	mm := s.net[i].m
	s.net = append(s.net[:i], s.net[i+1:]...)
	to, from := s.nodes[mm.To-1], s.nodes[mm.From-1]
	lost := drop || !to.up || to.cut || from.cut
	if mm.Type == raftpb.MsgSnap && from.up {
		// A leader waits to hear how a snapshot it sent went.
		status := raft.SnapshotFinish
		if lost {
			status = raft.SnapshotFailure
		}
		from.p.rn.ReportSnapshot(mm.To, status)
	}
	if lost {
		return
	}
	s.note("%d->%d %v t%d i%d", mm.From, mm.To, mm.Type, mm.Term, mm.Index)
	if mm.Type == raftpb.MsgSnap {
		s.snaps++
	}
	_ = to.p.rn.Step(mm) // raft refuses some messages by design
}

func (s *sim) up() []*simNode {
	var out []*simNode
	for _, nd := range s.nodes {
		if nd.up {
			out = append(out, nd)
		}
	}
	return out
}

var simPaths = []string{"/", "/src", "/src/a.c", "/src/lib", "/src/lib/x.h", "/doc", "/doc/README", "/build", "/build/out"}

// command makes a random command for member nd: a grant of one path or a
// rename's two, shallow or deep, or a release of something it holds (or,
// now and then, of an epoch it never held).
func (s *sim) command(nd *simNode) []byte {
	m := simMembers[nd.id]
	p := simPaths[s.rng.IntN(len(simPaths))]
	switch r := s.rng.IntN(10); {
	case r < 4:
		return control.GrantCmd(m, s.rng.IntN(2) == 0, p)
	case r < 6:
		return control.GrantCmd(m, false, p, simPaths[s.rng.IntN(len(simPaths))])
	case r < 9:
		if held := nd.tab.Held(m); len(held) > 0 {
			return control.ReleaseCmd(held[s.rng.IntN(len(held))])
		}
	}
	return control.ReleaseCmd(control.Control{Path: p, Holder: m, Epoch: uint64(s.rng.IntN(50))})
}

func (s *sim) step() {
	up := s.up()
	switch r := s.rng.IntN(100); {
	case r < 25:
		s.now++
		for _, nd := range up {
			if s.rng.IntN(10) > 0 { // clocks drift: a member now and then misses a tick
				nd.p.rn.Tick()
			}
		}
	case r < 70:
		if len(s.net) > 0 {
			// Mostly the oldest few (a link delivers roughly in order), at
			// times any (reordering); some dropped, some duplicated.
			i := s.rng.IntN(min(len(s.net), 4))
			if s.rng.IntN(8) == 0 {
				i = s.rng.IntN(len(s.net))
			}
			if s.rng.IntN(20) == 0 {
				s.net = append(s.net, s.net[i])
			}
			s.deliver(i, s.rng.IntN(100) < s.drop)
		}
	case r < 88:
		if len(up) > 0 {
			nd := up[s.rng.IntN(len(up))]
			s.key++
			cmd := s.command(nd)
			if err := nd.p.propose(s.key, cmd); err == nil {
				nd.waiting[s.key] = cmd
				s.proposed++
			}
		}
	case r < 90:
		if len(up) > 0 && s.rng.IntN(4) == 0 {
			nd := up[s.rng.IntN(len(up))]
			nd.up = false
			s.note("crash %d", nd.id)
		}
	case r < 94:
		for _, nd := range s.nodes {
			if !nd.up && s.rng.IntN(3) == 0 {
				s.note("restart %d", nd.id)
				s.restarts++
				s.start(nd)
				break
			}
		}
	case r < 96:
		nd := s.nodes[s.rng.IntN(len(s.nodes))]
		nd.cut = !nd.cut
		s.note("cut %d %v", nd.id, nd.cut)
	case r < 97:
		if len(up) > 0 {
			nd := up[s.rng.IntN(len(up))]
			nd.p.rn.TransferLeader(s.nodes[s.rng.IntN(len(s.nodes))].id)
		}
	case r < 99:
		if len(up) > 0 {
			s.changeConf(up)
		}
	default:
		// A proposal lost with its leader is never answered; its caller
		// gives up (a Node's caller by its context).
		for _, nd := range up {
			if len(nd.waiting) > 8 {
				for k := range nd.waiting {
					nd.gaveUp[k] = true
				}
				clear(nd.waiting)
			}
		}
	}
	s.settle()
}

// changeConf has a member of up propose a change: a learner its own
// promotion, another the removal of a member, or the addition of a
// joiner as a learner (now and then of one added already, as a proposal
// made again would be, or of one removed, which is refused).
func (s *sim) changeConf(up []*simNode) {
	nd := up[s.rng.IntN(len(up))]
	if s.rng.IntN(5) == 0 {
		// As the replica set removes one: the leader proposes it, never
		// its own, nor one of two voters (see replica's removeCommand).
		gone := s.nodes[s.rng.IntN(len(s.nodes))]
		voter := slices.Contains(nd.p.conf.Voters, gone.id)
		if nd.p.rn.BasicStatus().RaftState != raft.StateLeader || gone == nd || voter && len(nd.p.conf.Voters) <= 2 {
			return
		}
		info := control.EncodeMember(control.Member{Name: simMembers[gone.id], ID: gone.id})
		s.note("%d asks to remove %d", nd.id, gone.id)
		nd.p.rn.ProposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: gone.id, Context: info})
		return
	}
	if s.rng.IntN(2) == 0 {
		for _, o := range up {
			if slices.Contains(o.p.conf.Learners, o.id) {
				s.note("%d asks to be a voter", o.id)
				o.p.rn.ProposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: o.id})
				return
			}
		}
	}
	var js []*simNode
	for _, o := range s.nodes {
		if o.joiner {
			js = append(js, o)
		}
	}
	if len(js) == 0 {
		return
	}
	s.changeConfAdd(nd, js[s.rng.IntN(len(js))])
}

// changeConfAdd has nd propose the addition of j as a learner.
func (s *sim) changeConfAdd(nd, j *simNode) {
	info := control.EncodeMember(control.Member{Name: simMembers[j.id], Addr: fmt.Sprint("j", j.id, ":1"), Fingerprint: fmt.Sprint("SHA256:", j.id), ID: j.id})
	s.note("%d asks to add %d", nd.id, j.id)
	nd.p.rn.ProposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: j.id, Context: info})
}

// heal ends every fault and runs until the members agree, then checks that
// a new proposal commits and that every table is the same.
func (s *sim) heal() {
	s.drop = 0
	for _, nd := range s.nodes {
		nd.cut = false
		if !nd.up {
			s.start(nd)
		}
	}
	s.settle()
	var final uint64
	repeated := map[uint64]bool{}
	for round := 0; round < 2000; round++ {
		s.now++
		for _, nd := range s.nodes {
			nd.p.rn.Tick()
		}
		for n := 0; len(s.net) > 0; n++ {
			if n > 100000 {
				for _, nd := range s.nodes {
					sn, _ := nd.mem.Snapshot()
					fi, _ := nd.mem.FirstIndex()
					li, _ := nd.mem.LastIndex()
					st := nd.p.rn.Status()
					s.fail("node %d: snap %d first %d last %d status %+v", nd.id, sn.Metadata.Index, fi, li, st)
				}
				s.fail("messages never quiesce: %s", s.trace[max(0, len(s.trace)-300):])
				return
			}
			s.deliver(0, false)
			s.settle()
		}
		s.settle()
		if lead := s.leader(); lead != nil && round%20 == 0 {
			// A learner asks to be a voter until it is one, as a
			// joining member does once it has copied the tree (one
			// removed meanwhile is stopped, as an administrator
			// stops a member before removing it).
			for _, nd := range s.nodes {
				if slices.Contains(nd.p.conf.Learners, nd.id) && slices.Contains(lead.p.conf.Learners, nd.id) {
					nd.p.rn.ProposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: nd.id})
				}
			}
			s.settle()
		}
		lead := s.leader()
		if lead == nil {
			continue
		}
		if round%20 == 10 {
			// An addition made again after its member's promotion (a
			// repeated proposal) must not demote it.
			for _, nd := range s.nodes {
				if nd.joiner && !repeated[nd.id] && slices.Contains(lead.p.conf.Voters, nd.id) {
					repeated[nd.id] = true
					s.changeConfAdd(lead, nd)
				}
			}
			s.settle()
		}
		if final == 0 {
			s.key++
			final = s.key
			cmd := control.GrantCmd(simMembers[lead.id], true, "/final")
			if err := lead.p.propose(final, cmd); err != nil {
				final = 0
				continue
			}
			lead.waiting[final] = cmd
			s.settle()
			continue
		}
		if _, waiting := lead.waiting[final]; waiting {
			continue
		}
		if s.agreed(lead) && len(lead.p.conf.Learners) == 0 {
			return
		}
	}
	s.fail("no agreement 2000 ticks after healing: leader %v, applied %v", s.leader(), s.applied())
}

func (s *sim) leader() *simNode {
	for _, nd := range s.nodes {
		if nd.p.rn.BasicStatus().RaftState == raft.StateLeader {
			return nd
		}
	}
	return nil
}

func (s *sim) applied() []uint64 {
	var out []uint64
	for _, nd := range s.nodes {
		out = append(out, nd.p.applied)
	}
	return out
}

// agreed reports whether every member in lead's configuration applied
// what lead did and holds the same table.
func (s *sim) agreed(lead *simNode) bool {
	for _, nd := range s.nodes {
		if inConf(lead, nd) && (nd.p.applied != lead.p.applied || nd.tab.Sum() != lead.tab.Sum()) {
			return false
		}
	}
	return true
}

// simSeeds is how many seeds TestSimulation runs; FERRY_SIM_SEEDS sets it
// for longer runs.
func simSeeds(t *testing.T) int {
	if v := os.Getenv("FERRY_SIM_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 2000
}

func runSim(t *testing.T, seed uint64, steps int) *sim {
	cryptotest.SetGlobalRandom(t, seed) // raft draws election timeouts from crypto/rand
	n := 3
	if seed%4 == 0 {
		n = 5
	}
	s := newSim(seed, n, int(seed%3))
	for i := 0; i < steps && len(s.errs) == 0; i++ {
		s.step()
	}
	if len(s.errs) == 0 {
		s.heal()
	}
	return s
}

// TestSimulation runs raft with the control table under faults, one seed
// after another: after every applied entry every member's table satisfies
// its invariants and equals every other member's table at that entry; once
// the faults end, a new grant commits and all tables are the same.
func TestSimulation(t *testing.T) {
	seeds := simSeeds(t)
	var answered, entries, proposed, snaps, restarts, joined, removed int
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := runSim(t, seed, 3000)
			for _, e := range s.errs {
				t.Errorf("seed %d: %s", seed, e)
			}
			answered += s.answered
			proposed += s.proposed
			snaps += s.snaps
			restarts += s.restarts
			joined += s.joined
			removed += s.removed()
			entries += len(s.sums)
		})
		if t.Failed() {
			break
		}
	}
	t.Logf("%d seeds: %d proposals taken, %d command entries applied, %d answered, %d snapshots sent, %d restarts, %d members joined and promoted, %d removed",
		seeds, proposed, entries, answered, snaps, restarts, joined, removed)
	if !t.Failed() && (entries < seeds || snaps == 0 || restarts == 0 || joined == 0 || removed == 0) {
		t.Fatal("the simulation no longer exercises commits, snapshots, restarts, joins and removals")
	}
}

// TestSimulationReproducible shows that a seed replays exactly, so that a
// failing seed can be debugged.
func TestSimulationReproducible(t *testing.T) {
	a := runSim(t, 7, 600)
	b := runSim(t, 7, 600)
	if string(a.trace) != string(b.trace) || len(a.trace) == 0 {
		t.Fatalf("seed 7 ran differently twice (%d and %d bytes of trace)", len(a.trace), len(b.trace))
	}
}
