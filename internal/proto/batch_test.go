package proto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	gproto "google.golang.org/protobuf/proto"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/zwire"
)

// entries makes n entries of a directory walk; every seventh carries data
// of size dataLen and every eleventh an error.
func entries(n, dataLen int) []ferry.Entry {
	es := make([]ferry.Entry, n)
	for i := range es {
		name := fmt.Sprintf("file%05d.go", i)
		es[i].Dir = ferry.Dir{"path": "/src/pkg/" + name, "name": name, "mode": "0644", "size": fmt.Sprint(i * 37), "mtime": "1700000000.000000000", "uid": "root", "gid": "root"}
		if i%7 == 0 && dataLen > 0 {
			es[i].Data = bytes.Repeat([]byte{byte(i)}, dataLen)
		}
		if i%11 == 0 {
			es[i].Err = ferry.E("local.Find", "/src/pkg/"+name, ferry.KindPermission, "denied")
		}
	}
	return es
}

// sendAll runs sendFind over es, with a batch wait so long that batches
// end only when full or at the end, and returns the messages sent.
func sendAll(t *testing.T, es []ferry.Entry, zip *zwire.Codec) []*FindReply {
	t.Helper()
	s := ferry.NewStream(context.Background(), func(ctx context.Context, send func(ferry.Entry) error) error {
		for _, e := range es {
			if err := send(e); err != nil {
				return err
			}
		}
		return nil
	})
	var sent []*FindReply
	if err := sendFind(s, func(m *FindReply) error {
		// Through the wire, as gRPC would.
		b, err := gproto.Marshal(m)
		if err != nil {
			return err
		}
		var got FindReply
		if err := gproto.Unmarshal(b, &got); err != nil {
			return err
		}
		sent = append(sent, &got)
		return nil
	}, zip, time.Hour); err != nil {
		t.Fatalf("SendFind: %v", err)
	}
	return sent
}

// TestFindBatches: whatever the batching, the receiver gets every entry in
// order, with its data and error; batches shrink a walk and stay within
// MaxData.
func TestFindBatches(t *testing.T) {
	zip := zwire.New(MaxData)
	t.Cleanup(zip.Close)
	for _, tc := range []struct {
		name          string
		n, dataLen    int
		zip           *zwire.Codec
		maxMsgs       int // The most messages that may carry the entries.
		minMsgs       int
		smallerThanBy int // The batches' bytes are at most 1/smallerThanBy of the plain messages'.
	}{
		{name: "plain", n: 300, zip: nil, minMsgs: 300, maxMsgs: 300},
		{name: "walk", n: 3000, zip: zip, minMsgs: 2, maxMsgs: 3, smallerThanBy: 4},
		{name: "with data", n: 400, dataLen: 40 << 10, zip: zip, minMsgs: 2, maxMsgs: 60, smallerThanBy: 4},
		{name: "too big for a batch", n: 15, dataLen: MaxData, zip: zip, minMsgs: 3, maxMsgs: 30},
		{name: "empty", n: 0, zip: zip, minMsgs: 0, maxMsgs: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := entries(tc.n, tc.dataLen)
			sent := sendAll(t, es, tc.zip)
			if len(sent) < tc.minMsgs || len(sent) > tc.maxMsgs {
				t.Errorf("%d entries went in %d messages, want %d to %d", tc.n, len(sent), tc.minMsgs, tc.maxMsgs)
			}
			var got []ferry.Entry
			wire := 0
			for _, m := range sent {
				wire += gproto.Size(m)
				if len(m.Batch) > MaxData {
					t.Errorf("a batch of %d bytes, more than MaxData", len(m.Batch))
				}
				es, err := UnpackFind(m, tc.zip)
				if err != nil {
					t.Fatalf("UnpackFind: %v", err)
				}
				got = append(got, es...)
			}
			if len(got) != len(es) {
				t.Fatalf("got %d entries, want %d", len(got), len(es))
			}
			plain := 0
			for i, want := range es {
				plain += gproto.Size(FromEntry(want))
				g := got[i]
				if g.Dir.Path() != want.Dir.Path() || !bytes.Equal(g.Data, want.Data) || (g.Err == nil) != (want.Err == nil) {
					t.Fatalf("entry %d: got %v (%d bytes, err %v), want %v (%d bytes, err %v)", i, g.Dir.Path(), len(g.Data), g.Err, want.Dir.Path(), len(want.Data), want.Err)
				}
				if want.Err != nil && ferry.KindOf(g.Err) != ferry.KindPermission {
					t.Fatalf("entry %d: error %v lost its kind", i, g.Err)
				}
			}
			if tc.smallerThanBy > 0 && wire*tc.smallerThanBy > plain {
				t.Errorf("batches are %d bytes for %d bytes of plain replies, want at most 1/%d", wire, plain, tc.smallerThanBy)
			}
		})
	}
}

// TestSendFindDoesNotHoldBack: an entry goes out within BatchWait even
// when the walk pauses before the next one, so a slow walk on the server
// is not held back for a batch to fill.
func TestSendFindDoesNotHoldBack(t *testing.T) {
	zip := zwire.New(MaxData)
	t.Cleanup(zip.Close)
	es := entries(5, 0)
	got := make(chan int, len(es))
	stuck := errors.New("the entry was not sent while the walk waited")
	s := ferry.NewStream(context.Background(), func(ctx context.Context, send func(ferry.Entry) error) error {
		for i, e := range es {
			if err := send(e); err != nil {
				return err
			}
			// The walk waits for its entry to be on the wire.
			select {
			case n := <-got:
				if n != i+1 {
					return fmt.Errorf("%d entries sent after %d were walked", n, i+1)
				}
			case <-time.After(10 * time.Second):
				return stuck
			}
		}
		return nil
	})
	n := 0
	err := SendFind(s, func(m *FindReply) error {
		es, err := UnpackFind(m, zip)
		n += len(es)
		got <- n
		return err
	}, zip)
	if err != nil {
		t.Fatalf("SendFind: %v", err)
	}
}

// TestSendFindStops: a failed send closes the stream, so the walk on the
// server stops, and SendFind reports the failure.
func TestSendFindStops(t *testing.T) {
	zip := zwire.New(MaxData)
	t.Cleanup(zip.Close)
	for _, z := range []*zwire.Codec{nil, zip} {
		walked := 0
		s := ferry.NewStream(context.Background(), func(ctx context.Context, send func(ferry.Entry) error) error {
			for _, e := range entries(100000, 0) {
				if err := send(e); err != nil {
					return err
				}
				walked++
			}
			return nil
		})
		broken := errors.New("connection reset")
		err := SendFind(s, func(*FindReply) error { return broken }, z)
		if !errors.Is(err, broken) {
			t.Errorf("zip %v: SendFind = %v, want %v", z != nil, err, broken)
		}
		if walked == 100000 {
			t.Errorf("zip %v: the walk went on to its end after the send failed", z != nil)
		}
	}
}

// TestUnpackFindRefuses: malformed batches are refused with KindInvalid.
func TestUnpackFindRefuses(t *testing.T) {
	zip := zwire.New(MaxData)
	t.Cleanup(zip.Close)
	inner, _ := gproto.Marshal(&FindBatch{Entries: []*FindReply{{Batch: []byte{1}}}})
	for _, tc := range []struct {
		name string
		m    *FindReply
		zip  *zwire.Codec
	}{
		{"compressed unasked", &FindReply{Batch: []byte("x"), Zstd: true}, nil},
		{"not zstd", &FindReply{Batch: []byte("not a frame"), Zstd: true}, zip},
		{"not a batch", &FindReply{Batch: []byte{0xff, 0xff, 0xff}}, zip},
		{"batch in a batch", &FindReply{Batch: inner}, zip},
		{"compressed without a batch", &FindReply{Zstd: true}, zip},
	} {
		if _, err := UnpackFind(tc.m, tc.zip); ferry.KindOf(err) != ferry.KindInvalid {
			t.Errorf("%s: UnpackFind = %v, want KindInvalid", tc.name, err)
		}
	}
}

// FuzzUnpackFind: any reply a server may send unpacks or fails cleanly.
func FuzzUnpackFind(f *testing.F) {
	zip := zwire.New(MaxData)
	f.Cleanup(zip.Close)
	raw, _ := gproto.Marshal(&FindBatch{Entries: []*FindReply{FromEntry(entries(1, 3)[0])}})
	z, _ := zip.Compress(nil, bytes.Repeat(raw, 1))
	f.Add(raw, false)
	f.Add(z, true)
	f.Fuzz(func(t *testing.T, b []byte, compressed bool) {
		es, err := UnpackFind(&FindReply{Batch: b, Zstd: compressed}, zip)
		if err != nil && ferry.KindOf(err) != ferry.KindInvalid {
			t.Fatalf("UnpackFind failed with kind %v: %v", ferry.KindOf(err), err)
		}
		for _, e := range es {
			for k := range e.Dir {
				if ferry.IsDecoration(k) {
					t.Fatalf("decoration %q got through", k)
				}
			}
		}
	})
}

// TestBatcher: messages go together until the next would pass SendData,
// or once the first has waited; a failed send fails every later Add.
func TestBatcher(t *testing.T) {
	sent := make(chan int, 16)
	fail := errors.New("broken")
	var failing atomic.Bool
	b := NewBatcher(50*time.Millisecond, func(ms []*ChunkPutMsg) error {
		sent <- len(ms)
		if failing.Load() {
			return fail
		}
		return nil
	})
	big := &ChunkPutMsg{Data: make([]byte, SendData/3)}
	for range 3 {
		if err := b.Add(big); err != nil {
			t.Fatal(err)
		}
	}
	// The third did not fit with the first two.
	if got := <-sent; got != 2 {
		t.Errorf("first batch of %d messages, want 2", got)
	}
	select {
	case got := <-sent:
		t.Fatalf("a batch of %d went before its wait", got)
	case <-time.After(10 * time.Millisecond):
	}
	if got := <-sent; got != 1 {
		t.Errorf("batch sent on time of %d messages, want 1", got)
	}
	b.Add(&ChunkPutMsg{Put: 1})
	b.Add(&ChunkPutMsg{Put: 2})
	failing.Store(true)
	if err := b.Flush(); err != fail {
		t.Errorf("Flush = %v, want %v", err, fail)
	}
	if got := <-sent; got != 2 {
		t.Errorf("flushed batch of %d messages, want 2", got)
	}
	if err := b.Add(&ChunkPutMsg{}); err != fail {
		t.Errorf("Add after a failed send = %v, want %v", err, fail)
	}

	// Stop sends what is queued before its last word; nothing goes after.
	failing.Store(false)
	b = NewBatcher(time.Hour, func(ms []*ChunkPutMsg) error { sent <- len(ms); return nil })
	b.Add(&ChunkPutMsg{})
	closed := false
	if err := b.Stop(func() error { closed = len(sent) == 1; return nil }); err != nil || !closed {
		t.Errorf("Stop = %v, closed after the batch went: %v", err, closed)
	}
	if got := <-sent; got != 1 {
		t.Errorf("batch sent by Stop of %d messages, want 1", got)
	}
	if err := b.Add(&ChunkPutMsg{}); ferry.KindOf(err) != ferry.KindCanceled || b.Flush() == nil || len(sent) != 0 {
		t.Errorf("Add after Stop = %v, want KindCanceled and nothing sent", err)
	}
}

// TestPackPutBatch: batches come back as they were packed, compressed
// as one stream when asked, and a compressed one is refused by a receiver
// without zstd.
func TestPackPutBatch(t *testing.T) {
	var in ChunkPutMsgs
	for i := range 50 {
		in.Msgs = append(in.Msgs, &ChunkPutMsg{Put: uint32(i + 1), Path: fmt.Sprintf("/src/prometheus/file%d.go", i), Size: int64(i)})
	}
	for _, compress := range []bool{false, true} {
		var enc *zwire.Encoder
		var dec *zwire.Decoder
		if compress {
			enc, dec = zwire.NewEncoder(), zwire.NewDecoder(MaxData)
			defer enc.Close()
			defer dec.Close()
		}
		var sizes []int
		for range 3 {
			m, err := PackPutBatch(&in, enc)
			if err != nil {
				t.Fatal(err)
			}
			if m.Zstd != compress {
				t.Errorf("compressed = %v, want %v", m.Zstd, compress)
			}
			sizes = append(sizes, len(m.Batch))
			var out ChunkPutMsgs
			if err := UnpackPutBatch(m, dec, &out); err != nil {
				t.Fatal(err)
			}
			if !gproto.Equal(&in, &out) {
				t.Errorf("unpacked %v, want %v", &out, &in)
			}
			if compress {
				if err := UnpackPutBatch(m, nil, &out); ferry.KindOf(err) != ferry.KindInvalid {
					t.Errorf("compressed batch without zstd: %v, want KindInvalid", err)
				}
			}
		}
		if compress && sizes[1] > sizes[0]/4 {
			t.Errorf("a batch sent again took %d bytes, the first %d: want it to build on the first", sizes[1], sizes[0])
		}
	}
}

func FuzzUnpackPutBatch(f *testing.F) {
	enc := zwire.NewEncoder()
	defer enc.Close()
	raw, _ := gproto.Marshal(&ChunkPutMsgs{Msgs: []*ChunkPutMsg{{Put: 1, Path: "/a", Refs: &ChunkRefs{Hashes: make([]byte, 32), Sizes: []uint32{9}}, ListEnd: true}}})
	z, _ := enc.Compress(raw)
	f.Add(raw, false, uint32(0))
	f.Add(bytes.Clone(z), true, uint32(len(raw)))
	f.Fuzz(func(t *testing.T, b []byte, compressed bool, size uint32) {
		dec := zwire.NewDecoder(MaxData)
		defer dec.Close()
		var ms ChunkPutMsgs
		if err := UnpackPutBatch(&ChunkPutBatch{Batch: b, Zstd: compressed, Size: size}, dec, &ms); err != nil && ferry.KindOf(err) != ferry.KindInvalid {
			t.Fatalf("UnpackPutBatch failed with kind %v: %v", ferry.KindOf(err), err)
		}
		var rs ChunkPutReplies
		if err := UnpackPutBatch(&ChunkPutBatch{Batch: b, Zstd: compressed, Size: size}, dec, &rs); err != nil && ferry.KindOf(err) != ferry.KindInvalid {
			t.Fatalf("UnpackPutBatch failed with kind %v: %v", ferry.KindOf(err), err)
		}
	})
}
