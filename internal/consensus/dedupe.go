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
//
// Each proposal's result is kept with it (the session table of Raft's
// dissertation, 6.3): a member that learned of its own proposal from a
// snapshot rather than by applying it gets the result when the copy it
// proposes again is skipped.
type dedupe map[uint64]*proposer

type proposer struct {
	nonce uint64
	max   uint64
	seen  map[uint64][]byte // key -> the machine's result
}

// first reports whether the proposal is seen for the first time; if not,
// it returns the result it had, if still known.
func (d dedupe) first(id, nonce, key uint64) ([]byte, bool) {
	p := d[id]
	switch {
	case p == nil || nonce > p.nonce:
		p = &proposer{nonce: nonce, seen: map[uint64][]byte{}}
		d[id] = p
	case nonce < p.nonce:
		return nil, false
	}
	if res, ok := p.seen[key]; ok {
		return res, false
	}
	if key+dedupeWindow <= p.max {
		return nil, false
	}
	p.seen[key] = nil
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
	return nil, true
}

// result records the result of a proposal first applied.
func (d dedupe) result(id, key uint64, res []byte) {
	if p := d[id]; p != nil {
		if _, ok := p.seen[key]; ok {
			p.seen[key] = res
		}
	}
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
			b = binary.AppendUvarint(b, uint64(len(p.seen[k])))
			b = append(b, p.seen[k]...)
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
		p := &proposer{nonce: nonce, max: max, seen: make(map[uint64][]byte, nk)}
		for range nk {
			k, ok1 := next()
			n, ok2 := next()
			if !ok1 || !ok2 || k > max || n > uint64(len(b)) {
				return nil, nil, errSnapshot
			}
			p.seen[k] = append([]byte(nil), b[:n]...)
			b = b[n:]
		}
		d[id] = p
	}
	return d, b, nil
}
