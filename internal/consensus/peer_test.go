package consensus

import (
	"go.etcd.io/raft/v3/raftpb"

	"bytes"
	"fmt"
	"testing"
)

func FuzzEnvelope(f *testing.F) {
	f.Add(envelope(1, 2, 3, []byte("cmd")))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		id, nonce, key, cmd, err := openEnvelope(in)
		if err != nil {
			return
		}
		again := envelope(id, nonce, key, cmd)
		if id2, n2, k2, c2, err := openEnvelope(again); err != nil || id2 != id || n2 != nonce || k2 != key || !bytes.Equal(c2, cmd) {
			t.Fatalf("envelope of %x does not round-trip", in)
		}
	})
}

func FuzzDedupeDecode(f *testing.F) {
	d := dedupe{}
	d.first(1, 1, 5)
	d.first(2, 7, 9)
	f.Add(append(d.encode(nil), "machine"...))
	f.Add([]byte{5, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		d, rest, err := decodeDedupe(in)
		if err != nil {
			return
		}
		again := append(d.encode(nil), rest...)
		d2, rest2, err := decodeDedupe(again)
		if err != nil || !bytes.Equal(rest, rest2) || len(d2) != len(d) {
			t.Fatalf("snapshot %x does not round-trip: %v", in, err)
		}
	})
}

func TestDedupe(t *testing.T) {
	d := dedupe{}
	steps := []struct {
		id, nonce, key uint64
		first          bool
	}{
		{1, 1, 1, true},
		{1, 1, 1, false}, // logged twice
		{1, 1, 3, true},
		{1, 1, 2, true},  // committed out of order
		{2, 1, 1, true},  // another member
		{1, 2, 1, true},  // a new run
		{1, 1, 4, false}, // the earlier run's late proposal
		{1, 2, dedupeWindow + 10, true},
		{1, 2, 5, false}, // far behind the window
	}
	for i, s := range steps {
		if _, got := d.first(s.id, s.nonce, s.key); got != s.first {
			t.Fatalf("step %d: first %v, want %v", i, got, s.first)
		}
		d.result(s.id, s.key, []byte(fmt.Sprint("result ", i)))
	}
	d2, rest, err := decodeDedupe(d.encode(nil))
	if err != nil || len(rest) != 0 {
		t.Fatalf("decoded dedupe: %v", err)
	}
	if res, first := d2.first(1, 2, dedupeWindow+10); first || string(res) != "result 7" {
		t.Fatalf("a duplicate after a snapshot: first %v, result %q", first, res)
	}
	if _, first := d2.first(1, 2, dedupeWindow+11); !first {
		t.Fatal("a new proposal after a snapshot is taken for a duplicate")
	}
}

// TestRefuse: the configuration changes every member skips alike.
func TestRefuse(t *testing.T) {
	conf := raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}
	one := raftpb.ConfState{Voters: []uint64{1}}
	for _, tc := range []struct {
		name string
		conf raftpb.ConfState
		cc   raftpb.ConfChange
		want bool
	}{
		{"add a learner", conf, raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: 4}, false},
		{"add a learner again", conf, raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: 3}, false},
		{"demote a voter by adding it as a learner", conf, raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: 2}, true},
		{"promote a learner", conf, raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: 3}, false},
		{"remove a voter", conf, raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: 2}, false},
		{"remove a learner", conf, raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: 3}, false},
		{"remove no member", conf, raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: 9}, true},
		{"remove the last voter", one, raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: 1}, true},
	} {
		if got := refuse(tc.conf, tc.cc); got != tc.want {
			t.Errorf("%s: refused %v, want %v", tc.name, got, tc.want)
		}
	}
}
