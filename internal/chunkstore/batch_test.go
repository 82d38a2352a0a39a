package chunkstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/zwire"
)

// TestPutBatch makes many puts on one batch, more at once than the server
// takes on a stream (proto.BatchPuts): new files, edits of files the server
// holds, an empty file, and one that cannot be made. Each ends as it would
// alone, on one stream.
func TestPutBatch(t *testing.T) {
	e := start(t, 0)
	ctx := ctxT(t)
	a, b := document(200<<10), document(100<<10)
	e.write(t, "a", a)
	e.write(t, "b", b)
	want := map[string][]byte{
		"/a":     editLine(a, 1000, "a line of a"),
		"/b":     editLine(b, 10, "a line of b"),
		"/empty": {},
	}
	for i := range 2 * proto.BatchPuts {
		want[fmt.Sprintf("/n%03d", i)] = []byte(fmt.Sprintf("small file %d\n", i))
	}
	before := e.srv.Calls()
	batch := e.c.PutBatch(ctx)
	futs := map[string]*ferry.Future[ferry.Dir]{}
	for p, data := range want {
		futs[p] = batch.Replace(ctx, p, ferry.Dir{ferry.AttrMode: "0640"}, io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data))))
	}
	bad := batch.Replace(ctx, "/a/under-a-file", nil, io.NewSectionReader(bytes.NewReader(a), 0, int64(len(a))))
	for p, f := range futs {
		d, err := f.Wait()
		if err != nil {
			t.Fatalf("Replace(%s): %v", p, err)
		}
		if d.Path() != p || d[ferry.AttrName] != p[1:] || d.Size() != int64(len(want[p])) || d[ferry.AttrMode] != "0640" {
			t.Errorf("Replace(%s) = %v, want its path and name, size %d, mode 0640", p, d, len(want[p]))
		}
	}
	if _, err := bad.Wait(); err == nil {
		t.Error("a put below a file succeeded")
	}
	batch.Close()
	for p, data := range want {
		if got := e.read(t, p[1:]); !bytes.Equal(got, data) {
			t.Errorf("%s holds %d bytes, not the %d put", p, len(got), len(data))
		}
	}
	waitNoTemps(t, e)
	if got := servertest.CallsSince(e.srv, before, "putbatch", 1); got != 1 {
		t.Errorf("%d PutChunkedBatch streams, want 1", got)
	}
	// Every put but the empty file's (a plain Put) is one of the stream's.
	if got, want := servertest.CallsSince(e.srv, before, "putchunked", int64(len(want))), int64(len(want)); got != want {
		t.Errorf("%d chunked puts, want %d", got, want)
	}
}

// TestPutBatchBounded: the server refuses a put beyond proto.BatchPuts in
// progress on one stream, and takes one again once a put has ended.
func TestPutBatchBounded(t *testing.T) {
	e := start(t, 0)
	b := openBatch(t, e)
	nw := document(20 << 10)
	refs, _ := chunk.List(bytes.NewReader(nw), chunk.Default)
	begin := func(put uint32) {
		b.send(&proto.ChunkPutMsg{Put: put, Path: fmt.Sprintf("/f%d", put), Dir: &proto.Dir{}, Size: int64(len(nw)), ChunkVersion: chunk.Version, Refs: proto.PackRefs(refs), ListEnd: true})
	}
	await := b.recv
	for i := uint32(1); i <= proto.BatchPuts; i++ {
		begin(i)
		if r := await(i); r.Err != nil || len(r.Need) == 0 {
			t.Fatalf("put %d of %d: %v, want its chunks asked for", i, proto.BatchPuts, r)
		}
	}
	over := uint32(proto.BatchPuts + 1)
	begin(over)
	if r := await(over); ferry.KindOf(proto.ToError(r.Err)) != ferry.KindInvalid {
		t.Errorf("put %d beyond %d at once: %v, want a KindInvalid error", over, proto.BatchPuts, r)
	}
	b.send(&proto.ChunkPutMsg{Put: 1, Abort: true})
	await(1)
	begin(over + 1)
	if r := await(over + 1); r.Err != nil || len(r.Need) == 0 {
		t.Errorf("a put after one ended: %v, want its chunks asked for", r)
	}
	b.st.CloseSend()
}

// TestChunkStreamReadAhead: a chunk stream whose reader does not keep up
// holds what the server reads ahead for it, no more than its share, and a
// cancelled one frees it, as a Get's does.
func TestChunkStreamReadAhead(t *testing.T) {
	const fixed = 1 << 20
	e := startWith(t, 0, setup{server: func(c *server.Config) { c.ReadAheadFixed = fixed }})
	doc := randomDoc(16 << 20)
	e.write(t, "f", doc)
	refs, _ := chunk.List(bytes.NewReader(doc), chunk.Default)
	var hashes []byte
	for _, r := range refs {
		hashes = append(hashes, r.Hash[:]...)
	}
	// Listing the file's chunks indexes it.
	list, err := e.raw(t).ChunkList(ctxT(t), &proto.ChunkListReq{Path: "/f", ChunkVersion: chunk.Version})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := list.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// A client that takes 64 KiB and reads no more: the server's sends
	// stop at once, and what it reads ahead stays with it.
	st, err := e.raw(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).ReadChunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(hashes); i += proto.MaxRefs * chunk.HashSize {
		if err := st.Send(&proto.ChunkReq{Path: "/f", Hashes: hashes[i:min(i+proto.MaxRefs*chunk.HashSize, len(hashes))]}); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := st.Recv(); err != nil || m.Missing {
		t.Fatalf("the first chunk: %v, missing %v", err, m.GetMissing())
	}
	full := func() bool { held, _ := e.srv.ReadAhead(); return held >= fixed }
	if !poll(10*time.Second, full) {
		held, _ := e.srv.ReadAhead()
		t.Errorf("a stalled chunk stream holds %d bytes read ahead, want %d", held, fixed)
	}
	time.Sleep(100 * time.Millisecond) // Nothing more should be read.
	if held, _ := e.srv.ReadAhead(); held > fixed+int64(chunk.Default.Max)+64 {
		t.Errorf("a stalled chunk stream holds %d bytes read ahead, want about %d", held, fixed)
	}
	cancel()
	freed := func() bool { held, cancelled := e.srv.ReadAhead(); return held == 0 && cancelled >= 1 }
	if !poll(10*time.Second, freed) {
		held, cancelled := e.srv.ReadAhead()
		t.Errorf("after the stream was cancelled the server holds %d bytes read ahead, %d streams cancelled", held, cancelled)
	}
}

// TestInlineBounded: a ChunkList that asks for files of any size inline
// gets a file larger than a message of data by its chunks.
func TestInlineBounded(t *testing.T) {
	e := start(t, 0)
	for _, size := range []int{proto.MaxData, proto.MaxData + 1} {
		e.write(t, "f", document(size)[:size])
		st, err := e.raw(t).ChunkList(ctxT(t), &proto.ChunkListReq{Path: "/f", ChunkVersion: chunk.Version, InlineMax: 1 << 40})
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if want := size <= proto.MaxData; m.Inline != want {
			t.Errorf("a file of %d bytes asked for inline: inline %v, want %v", size, m.Inline, want)
		}
	}
}

// TestPutBatchProtocol speaks to the server's end directly: a put the
// client abandons and one cut short by the stream's end fail with their
// errors and leave no trace, a message for a put that ended is dropped,
// and a whole put beside them commits.
func TestPutBatchProtocol(t *testing.T) {
	e := start(t, 0)
	old := document(100 << 10)
	e.write(t, "f", old)
	b := openBatch(t, e)
	st, send, recv := b.st, b.send, b.recv
	nw := document(50 << 10)
	refs, _ := chunk.List(bytes.NewReader(nw), chunk.Default)
	begin := func(put uint32, p string) *proto.ChunkPutMsg {
		return &proto.ChunkPutMsg{Put: put, Path: p, Dir: &proto.Dir{}, Size: int64(len(nw)), ChunkVersion: chunk.Version, Refs: proto.PackRefs(refs[:1])}
	}
	// Put 2 begins before put 1: numbers need not come in order.
	send(begin(2, "/f"), begin(1, "/f"), &proto.ChunkPutMsg{Put: 2, Abort: true})
	if r := recv(2); ferry.KindOf(proto.ToError(r.Err)) != ferry.KindCanceled {
		t.Errorf("abandoned put: reply %v, want a KindCanceled error", r)
	}
	// A message for put 2, which ended, is dropped; put 3 is whole.
	m3 := &proto.ChunkPutMsg{Put: 3, Path: "/g", Dir: &proto.Dir{}, Size: int64(len(nw)), ChunkVersion: chunk.Version, Refs: proto.PackRefs(refs), ListEnd: true}
	send(&proto.ChunkPutMsg{Put: 2, ListEnd: true}, m3)
	r := recv(3)
	for r.Dir == nil && r.Err == nil {
		for _, i := range r.Need {
			ref := refs[i]
			send(&proto.ChunkPutMsg{Put: 3, Hash: ref.Hash[:], Data: nw[ref.Off : ref.Off+int64(ref.Len)]})
		}
		r = recv(3)
	}
	if r.Err != nil || r.Dir == nil {
		t.Fatalf("whole put: %v", r)
	}
	if got := e.read(t, "g"); !bytes.Equal(got, nw) {
		t.Errorf("g holds %d bytes, want %d", len(got), len(nw))
	}
	// Put 1 never ended its list: the stream's end fails it.
	st.CloseSend()
	if r := recv(1); r.Err == nil {
		t.Errorf("a put cut short by the stream's end: %v, want an error", r)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Errorf("stream ended with %v, want EOF", err)
	}
	if got := e.read(t, "f"); !bytes.Equal(got, old) {
		t.Error("f changed by puts that failed")
	}
	waitNoTemps(t, e)
	if len(b.replies[2]) != 0 {
		t.Errorf("replies to a message for an ended put: %v", b.replies[2])
	}
}

// TestPutBatchOutage takes the server away while a batch's puts begin: they
// wait for it, as single puts do, and complete once it is back.
func TestPutBatchOutage(t *testing.T) {
	s := servertest.StartChunked(t, "")
	sw := servertest.SwitchProxy(t, s.Addr)
	c := s.ClientVia(t, "tester", sw.Addr, func(cfg *remote.Config) { cfg.ResumeFor = 20 * time.Second })
	ctx := ctxT(t)
	if _, err := c.Stat(ctx, "/").Wait(); err != nil {
		t.Fatal(err)
	}
	sw.Down()
	batch := c.PutBatch(ctx)
	defer batch.Close()
	want := map[string][]byte{}
	var futs []*ferry.Future[ferry.Dir]
	for i := range 5 {
		p := fmt.Sprintf("/f%d", i)
		want[p] = document((i + 1) << 10)
		futs = append(futs, batch.Replace(ctx, p, nil, io.NewSectionReader(bytes.NewReader(want[p]), 0, int64(len(want[p])))))
	}
	time.Sleep(300 * time.Millisecond)
	sw.Up()
	for i, f := range futs {
		if _, err := f.Wait(); err != nil {
			t.Fatalf("put %d after the outage: %v", i, err)
		}
	}
	for p, data := range want {
		b, err := io.ReadAll(c.Get(ctx, p, 0, -1))
		if err != nil || !bytes.Equal(b, data) {
			t.Errorf("%s: %d bytes, %v; want %d", p, len(b), err, len(data))
		}
	}
}

// batchConn speaks PutChunkedBatch to the server directly.
type batchConn struct {
	t       *testing.T
	st      grpc.BidiStreamingClient[proto.ChunkPutBatch, proto.ChunkPutBatch]
	replies map[uint32][]*proto.ChunkPutReply // Arrived, not yet taken.
}

func openBatch(t *testing.T, e *env) *batchConn {
	st, err := e.raw(t).PutChunkedBatch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return &batchConn{t: t, st: st, replies: map[uint32][]*proto.ChunkPutReply{}}
}

// send sends ms in one batch.
func (b *batchConn) send(ms ...*proto.ChunkPutMsg) {
	b.t.Helper()
	m, err := proto.PackPutBatch(&proto.ChunkPutMsgs{Msgs: ms}, nil)
	if err == nil {
		err = b.st.Send(m)
	}
	if err != nil {
		b.t.Fatal(err)
	}
}

// recv returns the next reply for put, in order.
func (b *batchConn) recv(put uint32) *proto.ChunkPutReply {
	b.t.Helper()
	for len(b.replies[put]) == 0 {
		m, err := b.st.Recv()
		if err != nil {
			b.t.Fatalf("waiting for put %d: %v", put, err)
		}
		var rs proto.ChunkPutReplies
		if err := proto.UnpackPutBatch(m, nil, &rs); err != nil {
			b.t.Fatal(err)
		}
		for _, r := range rs.Replies {
			b.replies[r.Put] = append(b.replies[r.Put], r)
		}
	}
	r := b.replies[put][0]
	b.replies[put] = b.replies[put][1:]
	return r
}

// progressSource is a put's source that counts the put's progress as a
// command's bar does (remote.PutProgress).
type progressSource struct {
	data  []byte
	mu    sync.Mutex
	dones []int64
}

func (s *progressSource) ReadAt(b []byte, off int64) (int, error) {
	return bytes.NewReader(s.data).ReadAt(b, off)
}
func (s *progressSource) Uncounted() io.ReaderAt { return bytes.NewReader(s.data) }
func (s *progressSource) Done(n int64) {
	s.mu.Lock()
	s.dones = append(s.dones, n)
	s.mu.Unlock()
}

// TestPutProgress: a chunked put counts as done the bytes it sends as it
// sends them and what the server held at the end, the file's size in
// all, not its reads (it reads the whole file to cut it before it sends).
func TestPutProgress(t *testing.T) {
	e := start(t, 0)
	doc := randomDoc(1 << 20)
	for round, wantSent := range []bool{true, false} { // The second time the server holds it all.
		src := &progressSource{data: doc}
		if _, err := e.c.Replace(ctxT(t), "/f", nil, io.NewSectionReader(src, 0, int64(len(doc)))).Wait(); err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, n := range src.dones {
			sum += n
		}
		if sum != int64(len(doc)) {
			t.Errorf("round %d: progress %d of %d bytes (%d calls)", round, sum, len(doc), len(src.dones))
		}
		if sent := len(src.dones) > 1; sent != wantSent {
			t.Errorf("round %d: %d progress calls, want them as chunks were sent: %v", round, len(src.dones), wantSent)
		}
	}
}

// TestPutBatchWindow: a server allows a stream a wide window only if its
// first batch asks (and says so in its replies), takes the frames drawing
// on it, and refuses a frame wider than it allowed.
func TestPutBatchWindow(t *testing.T) {
	e := start(t, 0)
	nw := document(50 << 10)
	refs, _ := chunk.List(bytes.NewReader(nw), chunk.Default)
	whole := func(put uint32, p string) []*proto.ChunkPutMsg {
		ms := []*proto.ChunkPutMsg{{Put: put, Path: p, Dir: &proto.Dir{}, Size: int64(len(nw)), ChunkVersion: chunk.Version, Refs: proto.PackRefs(refs), ListEnd: true}}
		for _, ref := range refs {
			ms = append(ms, &proto.ChunkPutMsg{Put: put, Hash: ref.Hash[:], Data: nw[ref.Off : ref.Off+int64(ref.Len)]})
		}
		return ms
	}
	for _, wide := range []bool{true, false} {
		t.Run(fmt.Sprint("wide=", wide), func(t *testing.T) {
			b := openBatch(t, e)
			first, err := proto.PackPutBatch(&proto.ChunkPutMsgs{Msgs: whole(1, "/a")}, nil)
			if err != nil {
				t.Fatal(err)
			}
			first.Wide = wide
			if err := b.st.Send(first); err != nil {
				t.Fatal(err)
			}
			m, err := b.st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if granted := m.Window == zwire.WideWindow; granted != wide {
				t.Fatalf("asked for a wide window: %v; the server allows %d", wide, m.Window)
			}
			enc := zwire.NewEncoderLevel(zwire.WideWindow, zwire.Default)
			defer enc.Close()
			next, err := proto.PackPutBatch(&proto.ChunkPutMsgs{Msgs: whole(2, "/b")}, enc)
			if err != nil {
				t.Fatal(err)
			}
			next.Window = zwire.WideWindow
			if err := b.st.Send(next); err != nil {
				t.Fatal(err)
			}
			if !wide {
				for {
					if _, err = b.st.Recv(); err != nil {
						break
					}
				}
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("a frame wider than allowed: %v, want the stream refused as invalid", err)
				}
				return
			}
			for r := b.recv(2); r.Dir == nil; r = b.recv(2) {
				if r.Err != nil {
					t.Fatalf("a put in a wide frame: %v", proto.ToError(r.Err))
				}
			}
			if got := e.read(t, "b"); !bytes.Equal(got, nw) {
				t.Errorf("b holds %d bytes, want %d", len(got), len(nw))
			}
		})
	}
}
