package replica

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryfs/ferry/internal/proto"
	pb "google.golang.org/protobuf/proto"
)

// TestOutboxKept: the updates an outbox keeps come back, numbered as they
// were, after a restart: headers of this version and of the earlier one
// (written by a rename) alike; a header torn by a crash is dropped with
// its content; and numbers go on from the highest ever given, whether
// updates are left or all were trimmed.
func TestOutboxKept(t *testing.T) {
	const peer = 2
	for _, tc := range []struct {
		name    string
		acked   uint64 // what the peer acknowledged before the restart
		left    []uint64
		nextSeq uint64
	}{
		{"none acknowledged", 0, []uint64{1, 2, 3}, 4},
		{"some acknowledged", 2, []uint64{3}, 4},
		{"all acknowledged", 3, nil, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o, err := openOutbox(dir, []uint64{peer})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"/a", "/b", "/c"} {
				if _, err := o.add(&proto.Update{Op: "remove", Path: p}, ""); err != nil {
					t.Fatal(err)
				}
			}
			o.ack(peer, tc.acked)
			o, err = openOutbox(dir, []uint64{peer})
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, u := range o.log {
				got = append(got, u.h.Seq)
			}
			if len(got) != len(tc.left) || len(got) > 0 && (got[0] != tc.left[0] || got[len(got)-1] != tc.left[len(tc.left)-1]) {
				t.Errorf("after a restart the outbox holds %v, want %v", got, tc.left)
			}
			seq, err := o.add(&proto.Update{Op: "remove", Path: "/d"}, "")
			if err != nil || seq != tc.nextSeq {
				t.Errorf("the next update got %d (%v), want %d", seq, err, tc.nextSeq)
			}
		})
	}

	t.Run("torn and earlier headers", func(t *testing.T) {
		dir := t.TempDir()
		old, _ := pb.Marshal(&proto.Update{Op: "remove", Path: "/old", Seq: 1})
		if err := os.WriteFile(filepath.Join(dir, "u-00000000000000000001.hdr"), old, 0o600); err != nil {
			t.Fatal(err)
		}
		whole, _ := pb.Marshal(&proto.Update{Op: "put", Path: "/whole", Seq: 2})
		if err := writeHead(filepath.Join(dir, "u-00000000000000000002.hdr"), whole); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "u-00000000000000000002.dat"), []byte("content"), 0o600); err != nil {
			t.Fatal(err)
		}
		torn, _ := pb.Marshal(&proto.Update{Op: "put", Path: "/torn-after-a-crash", Seq: 3})
		tornFile := filepath.Join(dir, "u-00000000000000000003.hdr")
		if err := writeHead(tornFile, torn); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(tornFile)
		if err := os.WriteFile(tornFile, b[:len(b)-3], 0o600); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "u-00000000000000000003.dat"), []byte("half"), 0o600)
		o, err := openOutbox(dir, []uint64{peer})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.log) != 2 || o.log[0].h.Path != "/old" || o.log[1].h.Path != "/whole" || o.log[1].spool == "" {
			t.Fatalf("loaded %d updates (%v), want /old and /whole with its content", len(o.log), o.log)
		}
		for _, f := range []string{"u-00000000000000000003.hdr", "u-00000000000000000003.dat"} {
			if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
				t.Errorf("%s of the torn update is still there: %v", f, err)
			}
		}
	})
}

// TestOutboxInline: a small put's content travels in its update's
// header: held in memory up to the outbox's bound, read again from the
// header past it, and back after a restart; trimming gives the memory
// back.
func TestOutboxInline(t *testing.T) {
	const peer = 2
	dir := t.TempDir()
	o, err := openOutbox(dir, []uint64{peer})
	if err != nil {
		t.Fatal(err)
	}
	o.inlineMax = 25
	for _, c := range []string{"first ten", "second ten", "third, past the bound"} {
		if _, err := o.add(&proto.Update{Op: "put", Path: "/" + c, Data: []byte(c)}, ""); err != nil {
			t.Fatal(err)
		}
	}
	check := func(o *outbox, held []bool) {
		t.Helper()
		for i, u := range o.log {
			if got := len(u.h.Data) > 0; got != held[i] {
				t.Errorf("update %d: content held in memory %v, want %v", u.h.Seq, got, held[i])
			}
			h, err := u.header()
			if err != nil || "/"+string(h.Data) != h.Path {
				t.Errorf("update %d: content %q (%v), want %q", u.h.Seq, h.GetData(), err, h.GetPath()[1:])
			}
		}
	}
	check(o, []bool{true, true, false})
	if o.inline != len("first ten")+len("second ten") {
		t.Errorf("%d bytes held, want 19", o.inline)
	}
	o.ack(peer, 1)
	if o.inline != len("second ten") {
		t.Errorf("%d bytes held after trimming, want 10", o.inline)
	}
	o, err = openOutbox(dir, []uint64{peer})
	if err != nil {
		t.Fatal(err)
	}
	check(o, []bool{true, true})
}

// FuzzDecodeHead: any bytes of a header file are either whole, giving back
// what was written, or refused; none panics.
func FuzzDecodeHead(f *testing.F) {
	dir := f.TempDir()
	name := filepath.Join(dir, "h")
	for _, seed := range [][]byte{nil, []byte("x"), []byte(headMagic), bytes.Repeat([]byte{0xff}, 40)} {
		if err := writeHead(name, seed); err != nil {
			f.Fatal(err)
		}
		b, _ := os.ReadFile(name)
		f.Add(b)
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		data, whole := decodeHead(b)
		if !whole {
			return
		}
		if !bytes.HasPrefix(b, []byte(headMagic)) {
			if !bytes.Equal(data, b) {
				t.Fatalf("an earlier header came back changed")
			}
			return
		}
		// Whole in this format: writing data again gives the same bytes.
		name := filepath.Join(t.TempDir(), "h")
		if err := writeHead(name, data); err != nil {
			t.Fatal(err)
		}
		again, _ := os.ReadFile(name)
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %q from %q, which writes as %q", data, b, again)
		}
	})
}
