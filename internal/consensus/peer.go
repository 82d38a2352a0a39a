// Package consensus drives one raft group (go.etcd.io/raft/v3) whose log
// feeds a deterministic state machine, such as a replica set's control
// table (internal/control). The raft library decides; this package keeps
// its log durable, applies what it commits, hands its messages to a
// transport and routes each result back to the call that proposed it.
//
// The core, peer, handles one raft Ready at a time and never reads a clock;
// a Node runs it on a goroutine with a ticker and a transport, and the
// deterministic simulation in the tests runs several on virtual time.
package consensus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Machine is the state machine the log feeds. Apply must be deterministic:
// given the same sequence of entries every member's machine returns the
// same results and reaches the same state.
type Machine interface {
	// Apply applies the command committed at index and returns its result.
	Apply(index uint64, cmd []byte) []byte
	// Snapshot returns the machine's whole state.
	Snapshot() []byte
	// Restore replaces the machine's state with a snapshot's.
	Restore(data []byte) error
}

// Membership is a Machine that learns of the members configuration
// changes add to the group and remove from it: Added and Removed are
// called, in log order with the machine's commands, with the change's
// index, the member's id and the change's context.
type Membership interface {
	// Admits reports whether member id may be added (or promoted): a
	// change it refuses is not applied, the same way at every member.
	Admits(id uint64) bool
	Added(index, id uint64, info []byte)
	Removed(index, id uint64, info []byte)
}

// Config sets a peer's raft parameters; ticks are the Node's Tick period.
type Config struct {
	ID    uint64   // this member's raft id, not 0
	Peers []uint64 // every member's id, the same at every member
	// Join starts a member with an empty log that the group adds by a
	// configuration change (Node.ChangeConf) instead of one of Peers: it
	// waits, neither voting nor campaigning, until the leader sends it the
	// log.
	Join          bool
	ElectionTicks int    // ticks without a leader before a campaign (10)
	HeartbeatTick int    // ticks between heartbeats (1)
	SnapshotEvery uint64 // entries between snapshots (1024)
	Logger        raft.Logger
}

func (c *Config) fill() {
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTick == 0 {
		c.HeartbeatTick = 1
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = 1024
	}
	if c.Logger == nil {
		c.Logger = quiet{}
	}
}

// bootIndex is the index of the snapshot every member starts from: the
// member list with an empty machine. Raft's log then begins after it.
const bootIndex = 1

// bootSnapshot is where a new member's log starts.
func bootSnapshot(peers []uint64) raftpb.Snapshot {
	return raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
		Index: bootIndex, Term: 1, ConfState: raftpb.ConfState{Voters: peers},
	}}
}

// peer is one member's raft state machine and log, advanced one Ready at a
// time by its owner (a Node, or the simulation).
type peer struct {
	cfg     Config
	rn      *raft.RawNode
	mem     *raft.MemoryStorage // raft's view of the log, mirrored on disk
	disk    *Disk               // nil in the simulation, whose storage outlives restarts
	sm      Machine
	applied uint64
	snapAt  uint64
	snapNow bool // snapshot after this Ready
	conf    raftpb.ConfState
	// done is called for each applied entry this peer proposed, with the
	// proposal's key and the machine's result.
	done func(key uint64, result []byte)
	// nonce tells this peer's proposals from those of its earlier runs.
	nonce  uint64
	dedupe dedupe
}

// newPeer starts a peer on mem, which holds what the member stored
// before (or nothing, for a new member).
func newPeer(cfg Config, mem *raft.MemoryStorage, disk *Disk, sm Machine, nonce uint64) (*peer, error) {
	cfg.fill()
	if cfg.ID == 0 {
		return nil, errors.New("consensus: member id 0")
	}
	snap, err := mem.Snapshot()
	if err != nil {
		return nil, err
	}
	if raft.IsEmptySnap(snap) && !cfg.Join {
		snap = bootSnapshot(cfg.Peers)
		if err := mem.ApplySnapshot(snap); err != nil {
			return nil, err
		}
		if disk != nil {
			if err := disk.save(raftpb.HardState{}, nil, snap); err != nil {
				return nil, err
			}
		}
	}
	d, err := restore(sm, snap)
	if err != nil {
		return nil, err
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:              cfg.ID,
		ElectionTick:    cfg.ElectionTicks,
		HeartbeatTick:   cfg.HeartbeatTick,
		Storage:         mem,
		Applied:         snap.Metadata.Index,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		CheckQuorum:     true,
		PreVote:         true,
		// A leader removed from the group steps down, so that the
		// others elect one of their own; else it led on, taking no
		// proposal.
		StepDownOnRemoval: true,
		Logger:            cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &peer{cfg: cfg, rn: rn, mem: mem, disk: disk, sm: sm,
		applied: snap.Metadata.Index, snapAt: snap.Metadata.Index,
		conf: snap.Metadata.ConfState, nonce: nonce, dedupe: d}, nil
}

// restore loads a snapshot into the machine and returns the proposals it
// had applied.
func restore(sm Machine, snap raftpb.Snapshot) (dedupe, error) {
	if len(snap.Data) == 0 {
		return dedupe{}, sm.Restore(nil)
	}
	d, rest, err := decodeDedupe(snap.Data)
	if err == nil {
		err = sm.Restore(rest)
	}
	if err != nil {
		return nil, fmt.Errorf("consensus: restore snapshot at %d: %w", snap.Metadata.Index, err)
	}
	return d, nil
}

// propose hands cmd to raft under key; the peer calls done with key once
// it applies it. Raft drops a proposal when no leader is known.
func (p *peer) propose(key uint64, cmd []byte) error {
	return p.rn.Propose(envelope(p.cfg.ID, p.nonce, key, cmd))
}

// ready handles what raft has ready: the log and hard state are made
// durable before any message that depends on them leaves, then committed
// entries are applied. It returns the messages to send.
func (p *peer) ready() ([]raftpb.Message, error) {
	if !p.rn.HasReady() {
		return nil, nil
	}
	rd := p.rn.Ready()
	if p.disk != nil {
		if err := p.disk.save(rd.HardState, rd.Entries, rd.Snapshot); err != nil {
			return nil, err
		}
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := p.mem.ApplySnapshot(rd.Snapshot); err != nil {
			return nil, err
		}
		d, err := restore(p.sm, rd.Snapshot)
		if err != nil {
			return nil, err
		}
		p.dedupe = d
		p.applied, p.snapAt = rd.Snapshot.Metadata.Index, rd.Snapshot.Metadata.Index
		p.conf = rd.Snapshot.Metadata.ConfState
	}
	if err := p.mem.Append(rd.Entries); err != nil {
		return nil, err
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := p.mem.SetHardState(rd.HardState); err != nil {
			return nil, err
		}
	}
	msgs := rd.Messages
	for _, e := range rd.CommittedEntries {
		if err := p.apply(e); err != nil {
			return nil, err
		}
	}
	p.rn.Advance(rd)
	return msgs, p.maybeSnapshot()
}

func (p *peer) apply(e raftpb.Entry) error {
	if e.Index <= p.applied {
		return nil // covered by a snapshot already restored
	}
	p.applied = e.Index
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			return nil // a new leader's empty entry
		}
		id, nonce, key, cmd, err := openEnvelope(e.Data)
		if err != nil {
			return fmt.Errorf("consensus: entry %d: %w", e.Index, err)
		}
		mine := id == p.cfg.ID && nonce == p.nonce && p.done != nil
		res, first := p.dedupe.first(id, nonce, key)
		if !first {
			// Logged twice, or from an earlier run: not applied again,
			// but answered if this member waits for it.
			if mine && res != nil {
				p.done(key, res)
			}
			return nil
		}
		res = p.sm.Apply(e.Index, cmd)
		p.dedupe.result(id, key, res)
		if mine {
			p.done(key, res)
		}
	case raftpb.EntryConfChange:
		var cc raftpb.ConfChange
		if err := cc.Unmarshal(e.Data); err != nil {
			return err
		}
		ms, _ := p.sm.(Membership)
		add := cc.Type == raftpb.ConfChangeAddNode || cc.Type == raftpb.ConfChangeAddLearnerNode
		if refuse(p.conf, cc) || add && ms != nil && !ms.Admits(cc.NodeID) {
			return nil
		}
		p.conf = *p.rn.ApplyConfChange(cc)
		switch cc.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if ms != nil {
				ms.Added(e.Index, cc.NodeID, cc.Context)
			}
			// A new member whose log is empty gets a snapshot, which it
			// takes only if the snapshot's configuration names it.
			p.snapNow = true
		case raftpb.ConfChangeRemoveNode:
			if ms != nil {
				ms.Removed(e.Index, cc.NodeID, cc.Context)
			}
		}
	case raftpb.EntryConfChangeV2:
		var cc raftpb.ConfChangeV2
		if err := cc.Unmarshal(e.Data); err != nil {
			return err
		}
		p.conf = *p.rn.ApplyConfChange(cc)
	}
	return nil
}

// refuse reports whether the change cc, committed while the
// configuration is conf, is not applied, the same way at every member: an
// addition of a learner that is a voter already (a proposal made again
// after the member's promotion would demote it), a removal of the last
// voter (raft cannot apply it) or of no member.
func refuse(conf raftpb.ConfState, cc raftpb.ConfChange) bool {
	switch cc.Type {
	case raftpb.ConfChangeAddLearnerNode:
		return slices.Contains(conf.Voters, cc.NodeID)
	case raftpb.ConfChangeRemoveNode:
		voter := slices.Contains(conf.Voters, cc.NodeID)
		return voter && len(conf.Voters) == 1 || !voter && !slices.Contains(conf.Learners, cc.NodeID)
	}
	return false
}

// maybeSnapshot snapshots the machine every SnapshotEvery entries and
// drops the log before it, keeping a tail for followers a little behind.
func (p *peer) maybeSnapshot() error {
	if p.applied-p.snapAt < p.cfg.SnapshotEvery && !p.snapNow {
		return nil
	}
	p.snapNow = false
	snap, err := p.mem.CreateSnapshot(p.applied, &p.conf, append(p.dedupe.encode(nil), p.sm.Snapshot()...))
	if err != nil {
		return err
	}
	if p.disk != nil {
		if err := p.disk.saveSnapshot(snap); err != nil {
			return err
		}
	}
	p.snapAt = p.applied
	if keep := p.cfg.SnapshotEvery / 4; p.applied > keep {
		if err := p.mem.Compact(p.applied - keep); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return err
		}
		if p.disk != nil {
			return p.disk.compact(p.applied - keep)
		}
	}
	return nil
}

// envelope wraps a command with who proposed it, so that the proposer
// alone answers its caller: the member's id, the nonce of its run, and
// the proposal's key within that run.
func envelope(id, nonce, key uint64, cmd []byte) []byte {
	b := make([]byte, 0, 3*binary.MaxVarintLen64+len(cmd))
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, nonce)
	b = binary.AppendUvarint(b, key)
	return append(b, cmd...)
}

// openEnvelope undoes envelope.
func openEnvelope(b []byte) (id, nonce, key uint64, cmd []byte, err error) {
	var f [3]uint64
	for i := range f {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, 0, 0, nil, errors.New("malformed proposal")
		}
		f[i], b = v, b[n:]
	}
	return f[0], f[1], f[2], b, nil
}

// quiet drops raft's logs but its panics.
type quiet struct{}

func (quiet) Debug(...any)              {}
func (quiet) Debugf(string, ...any)     {}
func (quiet) Error(...any)              {}
func (quiet) Errorf(string, ...any)     {}
func (quiet) Info(...any)               {}
func (quiet) Infof(string, ...any)      {}
func (quiet) Warning(...any)            {}
func (quiet) Warningf(string, ...any)   {}
func (quiet) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (quiet) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (quiet) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (quiet) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
