package server

import (
	"encoding/binary"
	"testing"

	pb "google.golang.org/protobuf/proto"

	"github.com/ferryfs/ferry/internal/proto"
)

// FuzzGroupReader feeds a Commit's messages, each a marshaled CommitMsg
// of any bytes, to the group reader: it never panics, never takes more
// changes or data than a group may carry, and joins a put's data sent in
// parts into one change.
func FuzzGroupReader(f *testing.F) {
	add := func(ms ...*proto.CommitMsg) {
		var in []byte
		for _, m := range ms {
			b, _ := pb.Marshal(m)
			in = binary.AppendUvarint(in, uint64(len(b)))
			in = append(in, b...)
		}
		f.Add(in)
	}
	add(&proto.CommitMsg{Group: "g", End: true, Changes: []*proto.Change{{Kind: proto.ChangePut, Path: "/a", Data: []byte("a")}}})
	add(&proto.CommitMsg{Group: "g", Changes: []*proto.Change{{Kind: proto.ChangePut, Path: "/b", Data: []byte("one "), More: true}}},
		&proto.CommitMsg{Group: "g", End: true, Changes: []*proto.Change{{Data: []byte("two")}, {Kind: proto.ChangeRemove, Path: "/c"}}})
	add(&proto.CommitMsg{Group: "g", End: true, Changes: []*proto.Change{{Kind: proto.ChangePut, Path: "/b", Data: []byte("x"), More: true}}})
	add(&proto.CommitMsg{Group: "g"}, &proto.CommitMsg{Group: "h", End: true})
	f.Fuzz(func(t *testing.T, in []byte) {
		gr := &groupReader{unzip: func(c *proto.Change) ([]byte, error) { return c.Data, nil }}
		sent := 0
		for len(in) > 0 {
			n, k := binary.Uvarint(in)
			if k <= 0 || n > uint64(len(in)-k) {
				return
			}
			var m proto.CommitMsg
			if pb.Unmarshal(in[k:k+int(n)], &m) != nil {
				return
			}
			in = in[k+int(n):]
			for _, c := range m.Changes {
				sent += len(c.Data)
			}
			end, err := gr.add(&m)
			if err != nil {
				return
			}
			if len(gr.changes) > proto.CommitChanges || gr.inline > proto.CommitInline {
				t.Fatalf("took %d changes and %d bytes", len(gr.changes), gr.inline)
			}
			held := 0
			for _, c := range gr.changes {
				held += len(c.Data)
			}
			if held != sent {
				t.Fatalf("the changes hold %d bytes of the %d sent", held, sent)
			}
			if end {
				if gr.more {
					t.Fatal("ended in the middle of a put's data")
				}
				return
			}
		}
	})
}
