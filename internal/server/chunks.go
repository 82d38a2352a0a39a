package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/store"
	"github.com/ferryfs/ferry/internal/zwire"
)

// ChunkFS is a tree that serves and accepts files by content-defined
// chunks (chunkstore.Tree). A server whose Config.FS is one answers the chunk
// calls; others refuse them with KindInvalid and clients fall back to Get
// and Put.
type ChunkFS interface {
	ChunkList(ctx context.Context, path string, dir func(ferry.Dir) error, fn func(chunk.Ref) error) error
	ReadChunk(ctx context.Context, h chunk.Hash, prefer string, buf []byte) ([]byte, error)
	BeginPut(ctx context.Context, path string, d ferry.Dir, size int64) (*chunkstore.Put, error)
}

var _ ChunkFS = (*chunkstore.Tree)(nil)

// chunkFS returns the served tree's chunk interface, or an error if it has
// none or cuts chunks differently from the client. Both errors have the op
// proto.NoChunksOp, which tells the client to stop asking.
func (h *handler) chunkFS(version int32) (ChunkFS, error) {
	cfs, ok := ferry.As[ChunkFS](h.s.fs)
	if !ok {
		return nil, ferry.E(proto.NoChunksOp, "", ferry.KindInvalid, "this server does not serve chunks")
	}
	if version != chunk.Version {
		return nil, ferry.E(proto.NoChunksOp, "", ferry.KindInvalid, "chunking scheme mismatch")
	}
	return cfs, nil
}

// Indexer is a tree with a chunk index whose statistics the control file
// and the metrics report, and which the "reindex" command rebuilds.
type Indexer interface {
	Index() *store.Index
	Rebuild(ctx context.Context) (files, failed int, err error)
}

var _ Indexer = (*chunkstore.Tree)(nil)

// Trasher is a tree that keeps replaced and removed files for their chunks;
// the control file and the metrics report its size.
type Trasher interface {
	Trash() chunkstore.TrashStats
	EmptyTrash() (files int, bytes int64)
}

var _ Trasher = (*chunkstore.Tree)(nil)

// errInline stops a chunk list whose file is sent inline.
var errInline = errors.New("inline")

// inline reads the whole small file at p (at most max bytes) for a
// ChunkListReply.
func (h *handler) inline(ctx context.Context, p string, max int64) ([]byte, error) {
	rd := h.s.fs.Get(ctx, p, 0, max+1)
	defer rd.Close()
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, ferry.E("server.ChunkList", p, ferry.KindUnavailable, "the file grew while it was read")
	}
	return b, nil
}

// ChunkList streams the file's entry, then its chunk list in pieces of at
// most proto.MaxRefs.
func (h *handler) ChunkList(r *proto.ChunkListReq, st grpc.ServerStreamingServer[proto.ChunkListReply]) error {
	cfs, err := h.chunkFS(r.ChunkVersion)
	if err != nil {
		return h.done(opChunkList, err)
	}
	h.promise(st.Context(), r.Path)
	// A file comes inline in one message, read whole into memory: no
	// larger than a message of data, whatever the client asks.
	inlineMax := min(r.InlineMax, proto.MaxData)
	var d ferry.Dir
	var batch []chunk.Ref
	flush := func() error {
		m := &proto.ChunkListReply{Dir: proto.FromDir(d), Refs: proto.PackRefs(batch), ZstdOk: d != nil && h.s.zstd}
		d, batch = nil, batch[:0]
		return st.Send(m)
	}
	err = cfs.ChunkList(st.Context(), r.Path,
		func(dir ferry.Dir) error {
			d = dir
			if inlineMax > 0 && dir.Size() <= inlineMax {
				return errInline
			}
			return nil
		},
		func(ref chunk.Ref) error {
			batch = append(batch, ref)
			if len(batch) == proto.MaxRefs {
				return flush()
			}
			return nil
		})
	if err == errInline {
		var data []byte
		if data, err = h.inline(st.Context(), r.Path, inlineMax); err == nil {
			d.SetInt(ferry.AttrSize, int64(len(data)))
			m := &proto.ChunkListReply{Dir: proto.FromDir(d), Inline: true, Data: data, ZstdOk: h.s.zstd}
			if r.Zstd && h.s.zstd {
				m.Data, m.Zstd = h.s.zip.Compress(nil, data)
			}
			err = st.Send(m)
		}
		return h.done(opChunkList, err)
	}
	if err == nil && (len(batch) > 0 || d != nil) {
		err = flush()
	}
	return h.done(opChunkList, err)
}

// ReadChunks answers each requested hash in order, as requests arrive.
func (h *handler) ReadChunks(st grpc.BidiStreamingServer[proto.ChunkReq, proto.ChunkData]) error {
	cfs, err := h.chunkFS(chunk.Version)
	if err != nil {
		return h.done(opReadChunks, err)
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	// The requests are read as they come; the chunks they ask for are read
	// (and compressed) ahead of the sender by what the connection carries,
	// within the read-ahead budget, as a Get's data is.
	type ask struct {
		hash   chunk.Hash
		prefer string
		err    error // The requests' end (io.EOF) or failure.
	}
	asks := make(chan ask, 1024)
	zip := make(chan bool, 1)
	go func() {
		prefer := ""
		for first := true; ; first = false {
			r, err := st.Recv()
			if first {
				// Whether replies are compressed, once, whatever came.
				zip <- err == nil && r.Zstd && h.s.zstd
			}
			var hs []chunk.Hash
			if err == nil {
				hs, err = proto.UnpackHashes(r.Hashes)
			}
			if err != nil {
				select {
				case asks <- ask{err: err}:
				case <-ctx.Done():
				}
				return
			}
			if r.Path != "" {
				prefer = r.Path
			}
			for _, hash := range hs {
				select {
				case asks <- ask{hash: hash, prefer: prefer}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	var compress bool
	select {
	case compress = <-zip:
	case <-ctx.Done():
		return h.done(opReadChunks, ctx.Err())
	}
	var a ask // The next request, once ready has it.
	src := source{unit: int64(chunk.Default.Max), ready: func() bool {
		select {
		case a = <-asks:
			return true
		case <-ctx.Done():
			return false
		}
	}, next: func() piece {
		if a.err != nil {
			return piece{err: a.err}
		}
		hash := a.hash // a is the next request's once ready runs again.
		m := &proto.ChunkData{Hash: hash[:]}
		b, err := cfs.ReadChunk(ctx, a.hash, a.prefer, nil)
		switch {
		case err == nil:
			m.Data = b
			if compress {
				m.Data, m.Zstd = h.s.zip.Compress(nil, b)
			}
		case ferry.IsKind(err, ferry.KindNotExist):
			m.Missing = true
		default:
			return piece{err: err}
		}
		return piece{msg: m, size: int64(len(m.Data)) + 64}
	}}
	c, _ := ctx.Value(connKey{}).(*conn)
	ra := startSource(ctx, src, c, h.s.budget, &h.s.cancelledReads)
	defer func() {
		cancel()
		ra.Stop()
	}()
	for {
		p, ok := ra.Next()
		if !ok {
			return h.done(opReadChunks, ferry.E("server.ReadChunks", "", ferry.KindCanceled, ctx.Err()))
		}
		if p.err == io.EOF {
			return h.done(opReadChunks, nil)
		}
		if p.err != nil {
			return h.done(opReadChunks, p.err)
		}
		if err := st.Send(p.msg.(*proto.ChunkData)); err != nil {
			return h.done(opReadChunks, err)
		}
	}
}

// PutChunked runs one chunked upload: list and optimistic data, the
// server's needs, the needed data, and the commit.
func (h *handler) PutChunked(st grpc.BidiStreamingServer[proto.ChunkPutMsg, proto.ChunkPutReply]) error {
	return h.done(opPutChunked, h.putChunked(st))
}

// putStream is the server's end of one chunked put: a PutChunked call, or
// one put of a PutChunkedBatch.
type putStream interface {
	Context() context.Context
	Recv() (*proto.ChunkPutMsg, error)
	Send(*proto.ChunkPutReply) error
}

func (h *handler) putChunked(st putStream) error {
	const op = "server.PutChunked"
	first, err := st.Recv()
	if err == io.EOF {
		return ferry.E(op, "", ferry.KindInvalid, "empty put")
	}
	if err != nil {
		return err
	}
	cfs, err := h.chunkFS(first.ChunkVersion)
	if err != nil {
		return err
	}
	d0 := proto.ToDir(first.Dir)
	if d0 == nil {
		d0 = ferry.Dir{}
	}
	h.promise(st.Context(), first.Path)
	// A staged put outlives its stream: it waits for its group's Commit.
	ctx, cancel := st.Context(), context.CancelFunc(func() {})
	if first.Stage != "" {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), stagedFor+time.Minute)
	}
	u, err := cfs.BeginPut(ctx, first.Path, d0, first.Size)
	if err != nil {
		cancel()
		return err
	}
	staged := false
	defer func() {
		if !staged {
			u.Abort()
			cancel()
		}
	}()
	l := &list{w: h.s.windows, wait: listWait}
	defer l.end()
	m := first
	var zbuf []byte
	fine := false // Both sides take fine lists, and the server has a source.
	for {
		if m.Abort {
			return ferry.E(op, first.Path, ferry.KindCanceled, "the client abandoned the put")
		}
		if m.Refs != nil {
			hs, sizes, err := proto.UnpackRefs(m.Refs)
			if err != nil {
				return err
			}
			if err := l.grow(st.Context(), first.Path, len(hs)); err != nil {
				return err
			}
			if err := u.AddRefs(hs, sizes); err != nil {
				return err
			}
		}
		if m.Fine != nil {
			if !fine {
				return ferry.E(op, first.Path, ferry.KindInvalid, "a fine list the server did not take")
			}
			hash, err := chunk.FromBytes(m.Hash)
			if err != nil {
				return ferry.E(op, first.Path, ferry.KindInvalid, err)
			}
			hs, sizes, err := proto.UnpackRefs(m.Fine)
			if err != nil {
				return err
			}
			need, err := u.AddPieces(hash, hs, sizes)
			if err != nil {
				return err
			}
			r := &proto.ChunkPutReply{FineFor: m.Hash, FineNeed: proto.PackIndexes(need)}
			if err := st.Send(r); err != nil {
				return err
			}
		} else if m.Hash != nil {
			hash, err := chunk.FromBytes(m.Hash)
			if err != nil {
				return ferry.E(op, first.Path, ferry.KindInvalid, err)
			}
			data := m.Data
			if m.Zstd {
				if !h.s.zstd {
					return ferry.E(op, first.Path, ferry.KindInvalid, "compressed data refused")
				}
				if data, err = h.s.zip.Decompress(zbuf, m.Data); err != nil {
					return ferry.E(op, first.Path, ferry.KindInvalid, err)
				}
				zbuf = data
			}
			if m.Piece {
				err = u.WritePiece(hash, data)
			} else {
				err = u.Write(hash, data)
			}
			if err != nil {
				return err
			}
		}
		if m.ListEnd || m.Refs != nil {
			// What the list needs goes back as it arrives, so the
			// client sends chunks while it still cuts the rest.
			var need []int
			if m.ListEnd {
				need, err = u.EndList()
			} else {
				need, err = u.Need()
			}
			if err != nil {
				return err
			}
			// Pieces are worth finding only for what is needed.
			fine = fine || first.FineOk && len(need) > 0 && u.FineSource()
			// At the list's end the client is told it has all it
			// needs, unless the commit that follows tells it.
			for len(need) > 0 || m.ListEnd && !u.Complete() {
				n := min(len(need), 16<<10)
				r := &proto.ChunkPutReply{Need: proto.PackIndexes(need[:n]), NeedEnd: m.ListEnd && n == len(need), ZstdOk: h.s.zstd, FineOk: fine}
				need = need[n:]
				if err := st.Send(r); err != nil {
					return err
				}
				if len(need) == 0 {
					break
				}
			}
		}
		if u.Complete() && first.Stage != "" {
			if _, err := u.Assembled(); err != nil {
				return err
			}
			if err := h.s.groups.stage(first.Stage, u, cancel); err != nil {
				return err
			}
			staged = true
			return st.Send(&proto.ChunkPutReply{Dir: proto.FromDir(ferry.Dir{ferry.AttrPath: first.Path}), NeedEnd: true, ZstdOk: h.s.zstd})
		}
		if u.Complete() {
			d, err := u.Commit(h.s.fs)
			if err = h.changed(st.Context(), err, callback.Change{Path: first.Path}); err != nil {
				return err
			}
			return st.Send(&proto.ChunkPutReply{Dir: proto.FromDir(d), NeedEnd: true, ZstdOk: h.s.zstd})
		}
		m, err = st.Recv()
		if err == io.EOF {
			return ferry.E(op, first.Path, ferry.KindInvalid, "the put ended before every chunk arrived")
		}
		if err != nil {
			return err
		}
	}
}

// PutChunkedBatch runs the puts of the stream, each as PutChunked runs
// one, and sends their replies in batches. A put that fails ends with a
// reply carrying its error; the others go on. The stream's messages for a
// put that has ended are dropped: the client may have sent them before it
// learnt the put failed.
func (h *handler) PutChunkedBatch(st grpc.BidiStreamingServer[proto.ChunkPutBatch, proto.ChunkPutBatch]) error {
	return h.done(opPutBatch, h.putChunkedBatch(st))
}

func (h *handler) putChunkedBatch(st grpc.BidiStreamingServer[proto.ChunkPutBatch, proto.ChunkPutBatch]) error {
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	var in *zwire.Decoder
	if h.s.zstd {
		in = zwire.NewDecoder(proto.MaxData)
		defer func() { in.Close() }()
	}
	// window is the history the client's batches may draw on: wider
	// than a stream's default if it asked and the upload memory has
	// room for a decoder that keeps as much.
	window := uint32(zwire.StreamWindow)
	var zout *zwire.Encoder // Made if the client's first batch takes compressed replies.
	var granted atomic.Uint32
	var received atomic.Uint64 // Bytes of the client's batches.
	out := proto.NewBatcher(proto.BatchWait, func(rs []*proto.ChunkPutReply) error {
		m, err := proto.PackPutBatch(&proto.ChunkPutReplies{Replies: rs}, zout)
		if err != nil {
			return err
		}
		m.ZstdOk, m.Window, m.Received = h.s.zstd, granted.Load(), received.Load()
		return st.Send(m)
	})
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		// Nothing may be sent once the handler returns.
		out.Stop(nil)
		if zout != nil {
			zout.Close()
		}
	}()
	puts := map[uint32]*batchPut{}
	// The puts that ended: every number up to low, and those in ended.
	// Numbers arrive nearly in order, so ended stays small.
	var low uint32
	ended := map[uint32]bool{}
	// end records that put id ended; the caller holds mu.
	end := func(id uint32) {
		for ended[id] = true; ended[low+1]; low++ {
			delete(ended, low+1)
		}
	}
	var omit []string // Attributes the replies leave out.
	var mu sync.Mutex
	for first := true; ; first = false {
		b, err := st.Recv()
		if err == io.EOF {
			// Puts still waiting for messages fail: none will come.
			mu.Lock()
			for _, p := range puts {
				close(p.in)
			}
			mu.Unlock()
			wg.Wait()
			return out.Stop(nil)
		}
		if err != nil {
			return err
		}
		received.Add(uint64(len(b.Batch)))
		if first && b.ZstdOk && h.s.zstd {
			zout = zwire.NewEncoder()
		}
		if first {
			omit = b.Omit
			if b.Wide && h.s.zstd && h.s.windows.tryAcquire(zwire.WideWindow) {
				defer h.s.windows.release(zwire.WideWindow)
				window = zwire.WideWindow
				granted.Store(window)
			}
		}
		if b.Window != 0 {
			// The client begins a new frame, drawing on b.Window bytes.
			if in == nil || b.Window > window {
				return ferry.E("server.PutChunkedBatch", "", ferry.KindInvalid, fmt.Sprintf("a batch drawing on %d bytes of history, beyond the %d allowed", b.Window, window))
			}
			in.Close()
			in = zwire.NewDecoderWindow(proto.MaxData, int(b.Window))
		}
		var msgs proto.ChunkPutMsgs
		if err := proto.UnpackPutBatch(b, in, &msgs); err != nil {
			return err
		}
		for _, m := range msgs.Msgs {
			mu.Lock()
			p := puts[m.Put]
			if p == nil && m.Put > low && !ended[m.Put] && len(puts) >= proto.BatchPuts {
				end(m.Put)
				mu.Unlock()
				err := ferry.E("server.PutChunkedBatch", m.Path, ferry.KindInvalid, fmt.Sprintf("more than %d puts at once on one stream", proto.BatchPuts))
				h.done(opPutChunked, err)
				out.Add(&proto.ChunkPutReply{Put: m.Put, Err: proto.FromError(err)})
				continue
			}
			if p == nil && m.Put > low && !ended[m.Put] {
				// A few messages wait for each put: the stream's reading
				// stops while a put's disk lags, not its memory.
				p = &batchPut{id: m.Put, ctx: ctx, in: make(chan *proto.ChunkPutMsg, 8), ended: make(chan struct{}), out: out, omit: omit}
				puts[m.Put] = p
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer close(p.ended)
					err := h.putChunked(p)
					h.done(opPutChunked, err)
					mu.Lock()
					delete(puts, p.id)
					end(p.id)
					mu.Unlock()
					if err != nil {
						out.Add(&proto.ChunkPutReply{Put: p.id, Err: proto.FromError(err)})
					}
				}()
			}
			mu.Unlock()
			if p == nil {
				continue // A put that ended.
			}
			select {
			case p.in <- m:
			case <-p.ended:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// batchPut is one put of a PutChunkedBatch, a putStream.
type batchPut struct {
	id    uint32
	ctx   context.Context
	in    chan *proto.ChunkPutMsg
	ended chan struct{} // Closed when the put has ended.
	out   *proto.Batcher[*proto.ChunkPutReply]
	omit  []string // The stream's ChunkPutBatch.Omit.
}

func (p *batchPut) Context() context.Context { return p.ctx }

func (p *batchPut) Recv() (*proto.ChunkPutMsg, error) {
	select {
	case m, ok := <-p.in:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-p.ctx.Done():
		return nil, p.ctx.Err()
	}
}

// Send queues r for the stream's next batch. A committed entry goes
// without its path and name, which the client named, and the attributes
// it asked to be left out.
func (p *batchPut) Send(r *proto.ChunkPutReply) error {
	r.Put = p.id
	proto.OmitAttrs(r.Dir, ferry.AttrPath, ferry.AttrName)
	proto.OmitAttrs(r.Dir, p.omit...)
	return p.out.Add(r)
}
