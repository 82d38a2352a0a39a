package consensus

import (
	"encoding/binary"
	"errors"
	"slices"
)

// dedupeWindow is how many keys behind a proposer's newest a proposal may
// commit and still be applied; raft commits a member's proposals nearly in
// the order made.
const dedupeWindow = 4096

// dedupe applies each proposal at most once. Raft may log a proposal
// twice (a forwarded proposal sent again, a message a link duplicated), and
// a command applied twice can undo what came between (a grant applied
// again after its release). It is part of the replicated state: every
// member skips the same entries, and it travels in snapshots.
//
// A member numbers its runs (nonce, growing with each start) and its
// proposals within a run (key). Once a run's proposal is applied, the
// proposals of the member's earlier runs are skipped: nobody waits for
// them, and a restarted member relearns what it holds from the table.
type dedupe map[uint64]*proposer

type proposer struct {
	nonce uint64
	max   uint64
	seen  map[uint64]bool
}

// first reports whether the proposal is seen for the first time, and
// records it.
func (d dedupe) first(id, nonce, key uint64) bool {
	p := d[id]
	switch {
	case p == nil || nonce > p.nonce:
		p = &proposer{nonce: nonce, seen: map[uint64]bool{}}
		d[id] = p
	case nonce < p.nonce:
		return false
	}
	if p.seen[key] || key+dedupeWindow <= p.max {
		return false
	}
	p.seen[key] = true
	if key > p.max {
		p.max = key
		if len(p.seen) > 2*dedupeWindow {
			for k := range p.seen {
				if k+dedupeWindow <= p.max {
					delete(p.seen, k)
				}
			}
		}
	}
	return true
}

// encode appends d to b, deterministically.
func (d dedupe) encode(b []byte) []byte {
	ids := make([]uint64, 0, len(d))
	for id := range d {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		p := d[id]
		keys := make([]uint64, 0, len(p.seen))
		for k := range p.seen {
			if k+dedupeWindow > p.max {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		b = binary.AppendUvarint(b, id)
		b = binary.AppendUvarint(b, p.nonce)
		b = binary.AppendUvarint(b, p.max)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = binary.AppendUvarint(b, k)
		}
	}
	return b
}

var errSnapshot = errors.New("consensus: malformed snapshot")

// decodeDedupe reads what encode wrote and returns the rest of b.
func decodeDedupe(b []byte) (dedupe, []byte, error) {
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	n, ok := next()
	if !ok || n > uint64(len(b)) {
		return nil, nil, errSnapshot
	}
	d := dedupe{}
	for range n {
		id, ok1 := next()
		nonce, ok2 := next()
		max, ok3 := next()
		nk, ok4 := next()
		if !ok1 || !ok2 || !ok3 || !ok4 || nk > uint64(len(b)) || d[id] != nil {
			return nil, nil, errSnapshot
		}
		p := &proposer{nonce: nonce, max: max, seen: make(map[uint64]bool, nk)}
		for range nk {
			k, ok := next()
			if !ok || k > max {
				return nil, nil, errSnapshot
			}
			p.seen[k] = true
		}
		d[id] = p
	}
	return d, b, nil
}
