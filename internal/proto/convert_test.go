package proto

import (
	"errors"
	"io/fs"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	gproto "google.golang.org/protobuf/proto"

	"github.com/ferryfs/ferry"
)

// TestErrorsCrossTheWire: every kind survives Status and FromStatus with
// its op, path and message.
func TestErrorsCrossTheWire(t *testing.T) {
	for k := ferry.KindOther; k <= ferry.KindAuth; k++ {
		in := ferry.E("local.Put", "/a/b", k, "why")
		out := FromStatus("remote.Put", "/a/b", Status(in))
		var fe *ferry.Error
		if !errors.As(out, &fe) || fe.Kind != k || fe.Op != "local.Put" || fe.Path != "/a/b" || fe.Err.Error() != "why" {
			t.Errorf("kind %v: %v crossed the wire as %#v", k, in, out)
		}
	}
	if err := FromStatus("op", "/x", Status(ferry.E("op", "/x", ferry.KindNotExist))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	// A status without a ferry detail gets its kind from the code.
	if k := ferry.KindOf(FromStatus("op", "/", status.Error(codes.Unavailable, "down"))); k != ferry.KindUnavailable {
		t.Errorf("a bare unavailable status became kind %v", k)
	}
}

func TestDirsDropDecorations(t *testing.T) {
	d := ferry.Dir{"name": "a", "Addr": "host:1", "Err": "x"}
	got := ToDir(FromDir(d))
	if len(got) != 1 || got["name"] != "a" {
		t.Errorf("round trip of %v = %v, want only the stored attributes", d, got)
	}
}

// FuzzDecode feeds arbitrary bytes to the decoders of every message a peer
// sends and to the conversions that follow: no panic, and no decoration
// ever gets through.
func FuzzDecode(f *testing.F) {
	seed := []gproto.Message{
		&FindReply{Dir: &Dir{Attrs: map[string]string{"path": "/a", "X": "y"}}, Err: &Error{Kind: 99, Msg: "m"}},
		&PutMsg{Path: "/a", Offset: -1, Dir: &Dir{}, Data: []byte("d")},
		&WatchEvent{Path: "/w", Lost: true},
	}
	for _, m := range seed {
		b, _ := gproto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr FindReply
		if gproto.Unmarshal(b, &fr) == nil {
			for k := range ToDir(fr.Dir) {
				if ferry.IsDecoration(k) {
					t.Fatalf("decoration %q got through", k)
				}
			}
			_ = ToError(fr.Err)
		}
		var pm PutMsg
		if gproto.Unmarshal(b, &pm) == nil {
			_ = ToDir(pm.Dir)
		}
		var e Error
		if gproto.Unmarshal(b, &e) == nil {
			if err := ToError(&e); ferry.KindOf(err) != ferry.Kind(e.Kind) && e.Kind != 0 {
				t.Fatalf("kind %d became %v", e.Kind, ferry.KindOf(err))
			}
		}
	})
}
