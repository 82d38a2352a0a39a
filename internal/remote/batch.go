package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/zwire"
)

// chunkPutStream is the client's end of one chunked put: a PutChunked
// call, or one put of a PutBatch's stream.
type chunkPutStream interface {
	Send(*proto.ChunkPutMsg) error
	Recv() (*proto.ChunkPutReply, error)
	CloseSend() error
}

// PutBatch runs the chunked puts made through it on one PutChunkedBatch
// stream of the bulk connection, their messages sent in batches that
// compress together: a tree's worth of puts (ferry sync) then costs about
// what one put of all their lists and pieces would, rather than a call's
// headers, frames and replies per file. A server without the call gets
// the puts one call each. It is safe for concurrent use.
type PutBatch struct {
	c     *Client
	ctx   context.Context
	mu    sync.Mutex
	s     *batchStream // The stream open now; nil before the first put.
	next  uint32       // The number of the last put begun on s.
	plain atomic.Bool  // The server has no PutChunkedBatch.
	// idle, if set, closes a stream once it has had no put for as long:
	// a batch that lives as long as its client holds no stream (and no
	// server memory) between bursts.
	idle time.Duration
}

// errNoBatch fails the puts of a stream the server does not know: they are
// made again one call each.
var errNoBatch = errors.New("the server does not take batched puts")

// PutBatch returns a batch whose streams live until ctx ends or Close.
func (c *Client) PutBatch(ctx context.Context) *PutBatch {
	return &PutBatch{c: c, ctx: ctx}
}

// Batch implements ferry.Batcher with a PutBatch.
func (c *Client) Batch(ctx context.Context) ferry.Batch { return c.PutBatch(ctx) }

var _ ferry.Batcher = (*Client)(nil)

// BatchMax is the largest file a PutBatch puts on its stream: one that
// fits in the history a stream may draw on, so that the next file finds
// its bytes (linked binaries repeat their libraries). A larger one goes on
// a stream of its own, as Client.Replace puts it: it has no per-file cost
// worth sharing.
const BatchMax = zwire.WideWindow

// groupBatchIdle is how long the batch that write-back groups share keeps
// its stream without a put.
const groupBatchIdle = 5 * time.Second

// groupBatch returns the batch the puts of every group share (see
// Client.Group): one stream for a whole burst of write-back, whose history
// each group's files draw on, where a stream per group would start
// empty each time.
func (c *Client) groupBatch() *PutBatch {
	c.batchOnce.Do(func() {
		c.batch.Store(&PutBatch{c: c, ctx: context.Background(), idle: groupBatchIdle})
	})
	return c.batch.Load()
}

// Replace is Client.Replace with the chunked put made on the batch's
// stream if the file is at most BatchMax bytes.
func (b *PutBatch) Replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return b.put(ctx, p, d, src, false)
}

// Put is Replace for a file the server most likely lacks (a new tree's): a
// file below the client's ChunkMin goes with all its data at once, in one
// round trip as a plain Put would, and a larger one by the chunks the
// server lacks.
func (b *PutBatch) Put(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return b.put(ctx, p, d, src, true)
}

func (b *PutBatch) put(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader, fresh bool) *ferry.Future[ferry.Dir] {
	return b.c.replace(ctx, p, d, src, b.carries(src.Size()), fresh)
}

// carries returns b if a file of size bytes goes on its stream, else nil.
func (b *PutBatch) carries(size int64) *PutBatch {
	if size > BatchMax {
		return nil
	}
	return b
}

// Close ends the batch's stream; call it when the batch's puts have
// returned. It does not wait for the server's end of the stream, a round
// trip later: every put has its answer by then.
func (b *PutBatch) Close() error {
	b.mu.Lock()
	s := b.s
	b.s = nil
	b.mu.Unlock()
	if s != nil {
		s.out.Stop(s.st.CloseSend)
	}
	return nil
}

// open begins a put on the batch's stream, opening a stream with opts if
// there is none or the last one broke; the put ends when ctx does.
func (b *PutBatch) open(ctx context.Context, opts ...grpc.CallOption) (chunkPutStream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.s == nil || b.s.broken() {
		s, err := b.start(ctx, opts...)
		if err != nil {
			return nil, err
		}
		b.s, b.next = s, 0
		if b.idle > 0 {
			s.idle = func() { time.AfterFunc(b.idle, func() { b.closeIdle(s) }) }
		}
	}
	s := b.s
	// The server takes proto.BatchPuts puts at once on a stream; the
	// others wait here for a put to end.
	select {
	case s.slots <- struct{}{}:
	case <-s.ended:
		return nil, s.err
	case <-ctx.Done():
		return nil, ferry.E("remote.PutBatch", "", ferry.KindCanceled, ctx.Err())
	}
	b.next++
	p := &batchPut{id: b.next, s: s, ctx: ctx, in: make(chan *proto.ChunkPutReply, 16), resumeFor: b.c.resumeFor}
	s.mu.Lock()
	s.puts[p.id] = p
	s.mu.Unlock()
	go func() {
		// A put abandoned before its last reply is ended on the server
		// too, so that it does not wait for the stream's end.
		select {
		case <-ctx.Done():
			if s.take(p.id) != nil {
				s.out.Add(&proto.ChunkPutMsg{Put: p.id, Abort: true})
			}
		case <-s.ended:
		}
	}()
	return p, nil
}

// closeIdle closes s if it is still the batch's stream and has had no put
// for b.idle.
func (b *PutBatch) closeIdle(s *batchStream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.mu.Lock()
	idle := len(s.puts) == 0 && time.Since(s.lastEnd) >= b.idle
	s.mu.Unlock()
	if b.s != s || !idle {
		return
	}
	b.s = nil
	s.out.Stop(s.st.CloseSend)
}

// start opens a stream and starts receiving its replies. Opening it waits
// no longer than wait allows.
func (b *PutBatch) start(wait context.Context, opts ...grpc.CallOption) (*batchStream, error) {
	c := b.c
	ctx, cancel := context.WithCancel(b.ctx)
	stop := context.AfterFunc(wait, cancel)
	st, err := c.bulk.PutChunkedBatch(ctx, opts...)
	if !stop() {
		err = wait.Err()
	}
	if err != nil {
		cancel()
		return nil, c.fail("remote.PutBatch", "", err)
	}
	s := &batchStream{st: st, cancel: cancel, puts: map[uint32]*batchPut{}, slots: make(chan struct{}, proto.BatchPuts), ended: make(chan struct{}), act: c.acts[1], levels: newLevels(time.Now, &c.level)}
	if c.zip != nil {
		s.in = zwire.NewDecoder(proto.MaxData)
	}
	first := true
	s.out = proto.NewBatcher(proto.BatchWait, func(ms []*proto.ChunkPutMsg) error {
		// Batches are compressed from the first after the server has
		// said it takes zstd, each building on those before. Once the
		// server allows more history, a new frame begins that draws on
		// it, and so at a change of level (see levels).
		var frame uint32
		if c.zip != nil && c.zstdOK.Load() {
			w, l := max(int(s.grant.Load()), zwire.StreamWindow), s.levels.choose()
			if s.zout == nil || w > s.window || l != s.level {
				if s.zout != nil || w != zwire.StreamWindow {
					frame = uint32(w)
				}
				if s.zout != nil {
					s.zout.Close()
				}
				s.zout, s.window, s.level = zwire.NewEncoderLevel(w, l), w, l
			}
		}
		began := time.Now()
		m, err := proto.PackPutBatch(&proto.ChunkPutMsgs{Msgs: ms}, s.zout)
		if err != nil {
			return err
		}
		s.levels.sent(m, time.Since(began))
		if m.Zstd && s.level == zwire.Better {
			c.traffic.putBetter.Add(int64(m.Size))
		}
		if first {
			m.Omit, m.Wide = c.findOmit, c.zip != nil
		}
		m.Window = frame
		m.ZstdOk, first = first && s.in != nil, false
		// All the batch counts as put data: lists and pieces alike.
		c.traffic.putWire.Add(int64(len(m.Batch)))
		return st.Send(m)
	})
	go s.receive(b)
	return s, nil
}

// batchStream is one PutChunkedBatch stream and its puts in progress.
type batchStream struct {
	st     grpc.BidiStreamingClient[proto.ChunkPutBatch, proto.ChunkPutBatch]
	cancel context.CancelFunc
	out    *proto.Batcher[*proto.ChunkPutMsg]
	mu     sync.Mutex
	puts   map[uint32]*batchPut
	slots  chan struct{} // One per put in puts.
	// stalled says the stream was cancelled because a put waited for a
	// reply while the connection received nothing for ResumeFor.
	stalled atomic.Bool
	act     *activity     // The connection's.
	ended   chan struct{} // Closed when the stream has ended, err then says why.
	err     error
	in      *zwire.Decoder // Of the server's batches, if the client takes zstd.
	zout    *zwire.Encoder // Of the client's batches once the server takes zstd; out's to use.
	window  int            // The history zout draws on; out's to use.
	level   zwire.Level    // zout's level; out's to use.
	levels  *levels
	grant   atomic.Uint32 // The history the server allows, if more than zwire.StreamWindow.
	// idle, if set, is called whenever the stream is left without puts;
	// the last ended at lastEnd.
	idle    func()
	lastEnd time.Time
}

func (s *batchStream) broken() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

// take removes put id from the stream and returns it, or nil if it had
// ended.
func (s *batchStream) take(id uint32) *batchPut {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.puts[id]
	if p != nil {
		delete(s.puts, id)
		<-s.slots
		s.lastEnd = time.Now()
		if len(s.puts) == 0 && s.idle != nil {
			s.idle()
		}
	}
	return p
}

// receive hands each reply to its put until the stream ends.
func (s *batchStream) receive(b *PutBatch) {
	const op = "remote.PutBatch"
	err := func() error {
		for {
			m, err := s.st.Recv()
			if err != nil {
				return err
			}
			if m.ZstdOk {
				b.c.zstdOK.Store(true)
			}
			if m.Window > 0 {
				s.grant.Store(m.Window)
			}
			if m.Received > 0 {
				s.levels.received(int64(m.Received))
			}
			var rs proto.ChunkPutReplies
			if err := proto.UnpackPutBatch(m, s.in, &rs); err != nil {
				return err
			}
			for _, r := range rs.Replies {
				s.mu.Lock()
				p := s.puts[r.Put]
				s.mu.Unlock()
				if p != nil && (r.Dir != nil || r.Err != nil) {
					s.take(r.Put)
				}
				if p == nil {
					continue // A put abandoned.
				}
				select {
				case p.in <- r:
				case <-p.ctx.Done():
				}
			}
		}
	}()
	if s.stalled.Load() {
		err = ferry.E(op, "", ferry.KindUnavailable, fmt.Errorf("%w for %v", errStalled, b.c.resumeFor))
	} else if status.Code(err) == codes.Unimplemented {
		b.plain.Store(true)
		err = errNoBatch
	} else if err == io.EOF {
		err = ferry.E(op, "", ferry.KindUnavailable, "the server ended the stream")
	} else {
		err = b.c.fail(op, "", err)
	}
	s.err = err
	close(s.ended)
	s.out.Stop(nil)
	if s.zout != nil {
		s.zout.Close()
	}
	if s.in != nil {
		s.in.Close()
	}
	s.cancel()
}

// batchPut is one put of a batch's stream, a chunkPutStream.
type batchPut struct {
	id        uint32
	s         *batchStream
	ctx       context.Context
	in        chan *proto.ChunkPutReply
	resumeFor time.Duration
}

// Send queues m for the stream's next batch. Its data is copied, since the
// caller may reuse it once Send returns, as with a gRPC stream.
func (p *batchPut) Send(m *proto.ChunkPutMsg) error {
	m.Put = p.id
	if m.Data != nil {
		m.Data = bytes.Clone(m.Data)
	}
	return p.s.out.Add(m)
}

// Recv returns the put's next reply, or its error; the replies that
// arrived go first, even after the stream ended.
func (p *batchPut) Recv() (*proto.ChunkPutReply, error) {
	var r *proto.ChunkPutReply
	select {
	case r = <-p.in:
	default:
		// A link gone silent ends the stream, and so every put on it,
		// after ResumeFor (as callGuard does for other calls).
		defer p.s.act.watch(p.resumeFor, func() {
			p.s.stalled.Store(true)
			p.s.cancel()
		})()
		select {
		case r = <-p.in:
		case <-p.s.ended:
			return nil, p.s.err
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
	}
	if r.Err != nil {
		return nil, proto.ToError(r.Err)
	}
	return r, nil
}

// CloseSend does nothing: the server commits a put once every chunk
// arrived, and the stream is the batch's to close.
func (p *batchPut) CloseSend() error { return nil }
