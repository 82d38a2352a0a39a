package consensus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Transport carries raft's messages to the other members. Send must not
// block on the network: raft copes with messages lost, and a Transport
// that drops one for an unreachable member tells the Node
// (ReportUnreachable, and ReportSnapshot for a snapshot).
type Transport interface {
	Send(msgs []raftpb.Message)
}

// Node runs one member of a raft group on a goroutine: it ticks raft every
// Tick, steps the messages its transport receives, keeps the log on Disk
// and applies committed entries to the machine.
type Node struct {
	tick time.Duration
	tr   Transport
	disk *Disk

	mu      sync.Mutex // guards p and the machine it applies to
	p       *peer
	key     uint64
	waiters map[uint64]chan []byte
	err     error // the first failure to keep the log; the node stops

	stop chan struct{}
	done chan struct{}
}

// ErrStopped is returned by a Node's calls once it stopped.
var ErrStopped = errors.New("consensus: node stopped")

// Start starts a member on the log in disk, which it then owns, feeding sm.
// tick is raft's clock: elections take cfg.ElectionTicks of them.
func Start(cfg Config, disk *Disk, sm Machine, tr Transport, tick time.Duration) (*Node, error) {
	mem, err := disk.load()
	if err != nil {
		return nil, err
	}
	run, err := disk.nextRun()
	if err != nil {
		return nil, err
	}
	p, err := newPeer(cfg, mem, disk, sm, run)
	if err != nil {
		return nil, err
	}
	n := &Node{tick: tick, tr: tr, disk: disk, p: p, waiters: map[uint64]chan []byte{},
		stop: make(chan struct{}), done: make(chan struct{})}
	p.done = n.answer
	go n.run()
	return n, nil
}

func (n *Node) run() {
	defer close(n.done)
	t := time.NewTicker(n.tick)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			n.locked(func(rn *raft.RawNode) error { rn.Tick(); return nil })
		}
	}
}

// locked runs fn on raft under the node's lock, handles what raft then has
// ready and sends its messages outside the lock.
func (n *Node) locked(fn func(rn *raft.RawNode) error) error {
	n.mu.Lock()
	if n.err != nil {
		n.mu.Unlock()
		return n.err
	}
	err := fn(n.p.rn)
	var out []raftpb.Message
	for n.p.rn.HasReady() {
		msgs, rerr := n.p.ready()
		if rerr != nil {
			// A log that cannot be kept stops the member: going on could
			// acknowledge what is not durable.
			n.err = fmt.Errorf("consensus: %w", rerr)
			err = n.err
			break
		}
		out = append(out, msgs...)
	}
	n.mu.Unlock()
	if len(out) > 0 {
		n.tr.Send(out)
	}
	return err
}

// answer hands a proposal's result to its caller; called under n.mu.
func (n *Node) answer(key uint64, res []byte) {
	if c, ok := n.waiters[key]; ok {
		c <- res
		delete(n.waiters, key)
	}
}

// Propose commits cmd and returns the machine's result once this member
// applied it. A proposal raft drops (no leader yet, a leader lost) is made
// again, under the same key so that it is applied once, every election
// timeout until ctx ends.
func (n *Node) Propose(ctx context.Context, cmd []byte) ([]byte, error) {
	c := make(chan []byte, 1)
	n.mu.Lock()
	n.key++
	key := n.key
	n.waiters[key] = c
	again := time.Duration(n.p.cfg.ElectionTicks) * n.tick
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.waiters, key)
		n.mu.Unlock()
	}()
	for {
		err := n.locked(func(*raft.RawNode) error { return n.p.propose(key, cmd) })
		if err != nil && !errors.Is(err, raft.ErrProposalDropped) {
			return nil, err
		}
		t := time.NewTimer(again)
		select {
		case res := <-c:
			t.Stop()
			return res, nil
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("consensus: proposal: %w", ctx.Err())
		case <-n.done:
			t.Stop()
			return nil, ErrStopped
		case <-t.C:
		}
	}
}

// ChangeConf proposes the configuration change cc until this member
// applied a configuration for which done is true, or ctx ends. Raft takes
// one change at a time and drops one proposed while another is pending, so
// cc is proposed again every election timeout; done makes that harmless.
func (n *Node) ChangeConf(ctx context.Context, cc raftpb.ConfChange, done func(raftpb.ConfState) bool) error {
	n.mu.Lock()
	again := time.Duration(n.p.cfg.ElectionTicks) * n.tick
	n.mu.Unlock()
	var last time.Time
	for {
		if done(n.Conf()) {
			return nil
		}
		if time.Since(last) >= again {
			last = time.Now()
			err := n.locked(func(rn *raft.RawNode) error { return rn.ProposeConfChange(cc) })
			if err != nil && !errors.Is(err, raft.ErrProposalDropped) {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consensus: configuration change: %w", ctx.Err())
		case <-n.done:
			return ErrStopped
		case <-time.After(n.tick):
		}
	}
}

// Conf returns the configuration this member last applied.
func (n *Node) Conf() raftpb.ConfState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.p.conf
}

// Step hands the node a message from another member.
func (n *Node) Step(m raftpb.Message) error {
	return n.locked(func(rn *raft.RawNode) error {
		_ = rn.Step(m) // raft refuses stale and foreign messages by design
		return nil
	})
}

// ReportUnreachable tells raft that a message to id was lost.
func (n *Node) ReportUnreachable(id uint64) {
	n.locked(func(rn *raft.RawNode) error { rn.ReportUnreachable(id); return nil })
}

// ReportSnapshot tells raft how sending a snapshot to id went.
func (n *Node) ReportSnapshot(id uint64, ok bool) {
	status := raft.SnapshotFinish
	if !ok {
		status = raft.SnapshotFailure
	}
	n.locked(func(rn *raft.RawNode) error { rn.ReportSnapshot(id, status); return nil })
}

// TransferLeader asks the leader to hand leadership to id.
func (n *Node) TransferLeader(id uint64) {
	n.locked(func(rn *raft.RawNode) error { rn.TransferLeader(id); return nil })
}

// View runs fn while the machine is not being applied to, so fn may read it.
func (n *Node) View(fn func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fn()
}

// Status is what a member knows of the group.
type Status struct {
	ID, Leader      uint64
	Term            uint64
	Commit, Applied uint64
	State           string
	Err             error
}

// Status returns the member's view of the group.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.p.rn.BasicStatus()
	return Status{ID: st.ID, Leader: st.Lead, Term: st.Term, Commit: st.Commit,
		Applied: n.p.applied, State: st.RaftState.String(), Err: n.err}
}

// Stop stops the node; the caller then closes its Disk. Calls after it
// fail with ErrStopped and touch neither raft nor the Disk.
func (n *Node) Stop() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	<-n.done
	n.mu.Lock()
	if n.err == nil {
		n.err = ErrStopped
	}
	n.mu.Unlock()
}

// nextRun counts the member's starts, so that each run's proposals are
// told from the last's.
func (d *Disk) nextRun() (uint64, error) {
	v, _, err := d.get(keyRun)
	if err != nil {
		return 0, err
	}
	var run uint64
	if len(v) == 8 {
		run = binary.BigEndian.Uint64(v)
	}
	run++
	return run, d.db.Set(keyRun, binary.BigEndian.AppendUint64(nil, run), pebble.Sync)
}

var keyRun = []byte("n")
