package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryfs/ferry/internal/control"
)

// stats counts what this member does for the set.
type stats struct {
	grants, refused, released  atomic.Int64
	revokesSent, revokesServed atomic.Int64
	forwarded, forwardsServed  atomic.Int64
	applied, fenced, transfers atomic.Int64
	fetchedBytes               atomic.Int64 // chunk bytes fetched from other members
	// contentBytes and wireBytes count the content of other members'
	// updates received here (pieces and chunks fetched), as applied and
	// as it crossed the link, compressed or not.
	contentBytes, wireBytes atomic.Int64
}

// received counts content of n bytes that crossed the link as wire bytes.
func (s *stats) received(n, wire int) {
	s.contentBytes.Add(int64(n))
	s.wireBytes.Add(int64(wire))
}

// counting is the control table as raft's machine, counting the grants
// applied per member since the leader last looked. Readers take tabMu
// for reading, so they never wait for raft's log to be synced.
type counting struct {
	*control.Table
	tabMu   sync.RWMutex
	applied chan struct{} // closed and replaced after each entry
	mu      sync.Mutex
	grants  map[string]int
	// joined and left are told of each member added to the set and
	// removed from it, as the table learns of it (applied, or restored
	// from a snapshot).
	joined, left func(Member)
}

// Added implements consensus.Membership.
func (c *counting) Added(index, id uint64, info []byte) {
	c.member(func(t *control.Table) (Member, bool) { return t.Join(index, id, info) }, c.joined)
}

// Removed implements consensus.Membership.
func (c *counting) Removed(index, id uint64, info []byte) {
	c.member(func(t *control.Table) (Member, bool) { return t.Remove(index, id, info) }, c.left)
}

// member applies a change of members to the table and tells tell of the
// member it changed.
func (c *counting) member(change func(*control.Table) (Member, bool), tell func(Member)) {
	c.tabMu.Lock()
	m, ok := change(c.Table)
	close(c.applied)
	c.applied = make(chan struct{})
	c.tabMu.Unlock()
	if ok && tell != nil {
		tell(m)
	}
}

func (c *counting) Apply(index uint64, cmd []byte) []byte {
	if m, ok := control.Granted(cmd); ok {
		c.mu.Lock()
		c.grants[m]++
		c.mu.Unlock()
	}
	c.tabMu.Lock()
	defer c.tabMu.Unlock()
	res := c.Table.Apply(index, cmd)
	close(c.applied)
	c.applied = make(chan struct{})
	return res
}

func (c *counting) Restore(data []byte) error {
	c.tabMu.Lock()
	err := c.Table.Restore(data)
	close(c.applied)
	c.applied = make(chan struct{})
	ms, gone := c.Table.Members(), c.Table.Gone()
	c.tabMu.Unlock()
	if c.joined != nil {
		for _, m := range ms {
			c.joined(m)
		}
	}
	if c.left != nil {
		for _, m := range gone {
			c.left(m)
		}
	}
	return err
}

// read runs fn with the table steady.
func (c *counting) read(fn func(t *control.Table)) {
	c.tabMu.RLock()
	defer c.tabMu.RUnlock()
	fn(c.Table)
}

// index returns the table's last entry and a channel closed after the next.
func (c *counting) index() (uint64, <-chan struct{}) {
	c.tabMu.RLock()
	defer c.tabMu.RUnlock()
	return c.Table.Index(), c.applied
}

// take returns the counts and starts new ones.
func (c *counting) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.grants
	c.grants = map[string]int{}
	return g
}

// follow moves raft's leadership, every period, to the member that asked
// for most of the grants since the last look: a grant costs one round
// trip at the leader's site and two elsewhere. Hysteresis: that member
// must have asked at least minGrants and twice as many as the leader.
func (s *Set) follow(ctx context.Context, period time.Duration) {
	const minGrants = 10
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		counts := s.machine.take()
		if s.node.Status().Leader != s.self.ID {
			continue
		}
		best, n := Member{}, 0
		for _, m := range s.memberList() {
			if m.ID != s.self.ID && counts[m.Name] > n {
				best, n = m, counts[m.Name]
			}
		}
		if n >= minGrants && n > 2*counts[s.self.Name] {
			s.log.Info("replica: handing raft's leadership to the member granted most", "member", best.Name, "grants", n, "here", counts[s.self.Name])
			s.stats.transfers.Add(1)
			s.node.TransferLeader(best.ID)
		}
	}
}

var (
	descLeader   = prometheus.NewDesc("ferry_replica_leader", "1 if this member is the raft leader of its set.", nil, nil)
	descTerm     = prometheus.NewDesc("ferry_replica_term", "The raft term this member is in.", nil, nil)
	descApplied  = prometheus.NewDesc("ferry_replica_applied_index", "The last raft log index this member applied.", nil, nil)
	descHeld     = prometheus.NewDesc("ferry_replica_controls_held", "Controls this member holds.", nil, nil)
	descControls = prometheus.NewDesc("ferry_replica_controls", "Controls in the set's table.", nil, nil)
	descGrants   = prometheus.NewDesc("ferry_replica_grants_total", "Grants this member asked for, by result.", []string{"result"}, nil)
	descReleased = prometheus.NewDesc("ferry_replica_releases_total", "Controls this member gave up.", nil, nil)
	descRevokes  = prometheus.NewDesc("ferry_replica_revokes_total", "Revoke requests, sent to other members and served here.", []string{"dir"}, nil)
	descForwards = prometheus.NewDesc("ferry_replica_forwards_total", "Changes forwarded to the member controlling their paths, and made here for other members.", []string{"dir"}, nil)
	descUpdates  = prometheus.NewDesc("ferry_replica_updates_applied_total", "Other members' updates applied here, and refused as not under their control.", []string{"result"}, nil)
	descPending  = prometheus.NewDesc("ferry_replica_update_lag", "This member's updates a member has not applied yet.", []string{"member"}, nil)
	descTransfer = prometheus.NewDesc("ferry_replica_leader_transfers_total", "Leadership handed by this member to the member granted most.", nil, nil)
)

// Collector returns the set's metrics.
func (s *Set) Collector() prometheus.Collector { return setCollector{s} }

type setCollector struct{ s *Set }

func (c setCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeader, descTerm, descApplied, descHeld, descControls, descGrants, descReleased, descRevokes, descForwards, descUpdates, descPending, descTransfer} {
		ch <- d
	}
}

func (c setCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	st := s.node.Status()
	leader := 0.0
	if st.Leader == s.self.ID {
		leader = 1
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descLeader, leader)
	gauge(descTerm, float64(st.Term))
	gauge(descApplied, float64(st.Applied))
	var all int
	s.machine.read(func(t *control.Table) { all = t.Len() })
	held := len(s.held())
	gauge(descHeld, float64(held))
	gauge(descControls, float64(all))
	counter(descGrants, s.stats.grants.Load(), "granted")
	counter(descGrants, s.stats.refused.Load(), "refused")
	counter(descReleased, s.stats.released.Load())
	counter(descRevokes, s.stats.revokesSent.Load(), "sent")
	counter(descRevokes, s.stats.revokesServed.Load(), "served")
	counter(descForwards, s.stats.forwarded.Load(), "sent")
	counter(descForwards, s.stats.forwardsServed.Load(), "served")
	counter(descUpdates, s.stats.applied.Load(), "applied")
	counter(descUpdates, s.stats.fenced.Load(), "fenced")
	counter(descTransfer, s.stats.transfers.Load())
	if f := s.fs.Load(); f != nil {
		for _, m := range s.memberList() {
			if lag, ok := f.out.lag(m.ID); ok {
				gauge(descPending, float64(lag), m.Name)
			}
		}
	}
}
