package proto

import (
	"bytes"
	"sync"
	"time"

	pb "google.golang.org/protobuf/proto"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/zwire"
)

// BatchWait is how long an entry of a Find may wait for more to share its
// batch. A walk on the server yields hundreds of entries in that time, and
// on the links Ferry is for it is a small part of one round trip.
const BatchWait = 2 * time.Millisecond

// BatchPuts is how many puts a PutChunkedBatch stream may have in progress
// at once. The client waits for one to end before it starts another; the
// server refuses a put beyond it (it cannot wait instead: the messages
// that end the puts in progress may come after the new put's in the
// stream). It bounds the goroutines, files and memory one stream takes on
// the server.
const BatchPuts = 64

// SendFind sends the entries of s, in order, with send. With a nil zip each
// entry is one FindReply; otherwise entries go in FindBatch replies of at
// most SendData bytes, compressed by zip where that shrinks them (an entry
// too big for a batch goes alone, as it is). A batch is sent when it is
// full, when the stream ends, or once its first entry has waited
// BatchWait, so a slow walk is not held back. The entries go without the
// attributes omit names (FindReq.omit). SendFind returns the first error
// of send (after closing s) or else the stream's.
func SendFind(s *ferry.Stream[ferry.Entry], send func(*FindReply) error, zip *zwire.Codec, omit ...string) error {
	return sendFind(s, send, zip, BatchWait, omit...)
}

// sendFind is SendFind with wait for BatchWait.
func sendFind(s *ferry.Stream[ferry.Entry], send func(*FindReply) error, zip *zwire.Codec, wait time.Duration, omit ...string) error {
	convert := func(e ferry.Entry) *FindReply {
		m := FromEntry(e)
		OmitAttrs(m.Dir, omit...)
		return m
	}
	if zip == nil {
		for e := range s.All() {
			if err := send(convert(e)); err != nil {
				s.Close()
				return err
			}
		}
		return s.Err()
	}
	var (
		batch   FindBatch
		size    int
		timeout <-chan time.Time
	)
	// flush allocates each batch afresh: gRPC may hold on to a message
	// after Send returns.
	flush := func() error {
		if len(batch.Entries) == 0 {
			return nil
		}
		raw, err := pb.Marshal(&batch)
		if err != nil {
			return err
		}
		m := &FindReply{}
		m.Batch, m.Zstd = zip.Compress(nil, raw)
		clear(batch.Entries)
		batch.Entries, size, timeout = batch.Entries[:0], 0, nil
		return send(m)
	}
	for {
		var (
			e  ferry.Entry
			ok bool
		)
		if timeout == nil {
			e, ok = <-s.C()
		} else {
			select {
			case e, ok = <-s.C():
			case <-timeout:
				if err := flush(); err != nil {
					s.Close()
					return err
				}
				continue
			}
		}
		if !ok {
			if err := flush(); err != nil {
				return err
			}
			return s.Err()
		}
		m := convert(e)
		// An entry's bytes in the batch: itself, its tag and its length.
		n := pb.Size(m) + 8
		var err error
		if size+n > SendData {
			err = flush()
		}
		if err == nil && n > SendData {
			err = send(m)
		} else if err == nil {
			if len(batch.Entries) == 0 {
				timeout = time.After(wait)
			}
			batch.Entries = append(batch.Entries, m)
			size += n
		}
		if err != nil {
			s.Close()
			return err
		}
	}
}

// FromEntry converts a ferry.Entry.
func FromEntry(e ferry.Entry) *FindReply {
	return &FindReply{Dir: FromDir(e.Dir), Data: e.Data, Err: FromError(e.Err)}
}

// ToEntry converts an entry of a Find; m is not a batch.
func ToEntry(m *FindReply) ferry.Entry {
	return ferry.Entry{Dir: ToDir(m.Dir), Data: m.Data, Err: ToError(m.Err)}
}

// UnpackFind returns the entries m carries: m itself, or the entries of its
// batch, decompressed by zip. It fails with KindInvalid if the batch is
// compressed and zip is nil (the client did not ask for that), does not
// decompress, or is not a FindBatch; or if it holds a batch in a batch.
func UnpackFind(m *FindReply, zip *zwire.Codec) ([]ferry.Entry, error) {
	const op = "proto.UnpackFind"
	if m.Batch == nil {
		if m.Zstd {
			return nil, ferry.E(op, "", ferry.KindInvalid, "a compressed reply without a batch")
		}
		return []ferry.Entry{ToEntry(m)}, nil
	}
	raw := m.Batch
	if m.Zstd {
		if zip == nil {
			return nil, ferry.E(op, "", ferry.KindInvalid, "the server sent a compressed batch unasked")
		}
		var err error
		if raw, err = zip.Decompress(nil, m.Batch); err != nil {
			return nil, ferry.E(op, "", ferry.KindInvalid, err)
		}
	}
	var b FindBatch
	if err := pb.Unmarshal(raw, &b); err != nil {
		return nil, ferry.E(op, "", ferry.KindInvalid, err)
	}
	es := make([]ferry.Entry, len(b.Entries))
	for i, x := range b.Entries {
		if x.Batch != nil || x.Zstd {
			return nil, ferry.E(op, "", ferry.KindInvalid, "a batch in a batch")
		}
		es[i] = ToEntry(x)
	}
	return es, nil
}

// Batcher collects the messages of a PutChunkedBatch stream (ChunkPutMsgs
// on the client, ChunkPutReplies on the server) and sends them together,
// as SendFind batches a walk's entries: a batch goes when the next message
// would take it past SendData bytes, when Flush is called, or once its
// first message has waited the Batcher's wait. Many puts' lists, and a
// file's pieces, then share one message and one zstd frame. It is safe for
// concurrent use.
type Batcher[M pb.Message] struct {
	mu    sync.Mutex
	msgs  []M
	size  int
	wait  time.Duration
	timer *time.Timer
	send  func([]M) error
	err   error
}

// NewBatcher returns a Batcher that sends each batch with send, which is
// called with the Batcher locked and must not keep the slice.
func NewBatcher[M pb.Message](wait time.Duration, send func([]M) error) *Batcher[M] {
	return &Batcher[M]{wait: wait, send: send}
}

// Add queues m. It returns the error of the batch it sent, or of an
// earlier one: after a failed send nothing more is sent.
func (b *Batcher[M]) Add(m M) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A message's bytes in the batch: itself, its tag and its length.
	n := pb.Size(m) + 8
	if b.size+n > SendData {
		b.flush()
	}
	if b.err != nil {
		return b.err
	}
	b.msgs = append(b.msgs, m)
	b.size += n
	if len(b.msgs) == 1 {
		if b.timer == nil {
			b.timer = time.AfterFunc(b.wait, func() { b.Flush() })
		} else {
			b.timer.Reset(b.wait)
		}
	}
	return nil
}

// Flush sends what is queued, and returns the error of that or of an
// earlier send.
func (b *Batcher[M]) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flush()
	return b.err
}

// errStopped fails the Adds after Stop.
var errStopped = ferry.E("proto.Batcher", "", ferry.KindCanceled, "the stream has ended")

// Stop sends what is queued, then calls last, if not nil (to close the
// stream, which must not happen while a batch is being sent); later Adds
// fail and send nothing. It returns the first error of these.
func (b *Batcher[M]) Stop(last func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flush()
	err := b.err
	if err == nil && last != nil {
		err = last()
	}
	if b.err == nil {
		b.err = errStopped
	}
	return err
}

func (b *Batcher[M]) flush() {
	if b.timer != nil {
		b.timer.Stop()
	}
	if len(b.msgs) == 0 || b.err != nil {
		return
	}
	b.err = b.send(b.msgs)
	clear(b.msgs)
	b.msgs, b.size = b.msgs[:0], 0
}

// PackPutBatch marshals w (a ChunkPutMsgs or a ChunkPutReplies) into a
// ChunkPutBatch, compressed as the next part of z's stream if z is not
// nil.
func PackPutBatch(w pb.Message, z *zwire.Encoder) (*ChunkPutBatch, error) {
	raw, err := pb.Marshal(w)
	if err != nil {
		return nil, err
	}
	m := &ChunkPutBatch{Batch: raw}
	if z != nil {
		b, err := z.Compress(raw)
		if err != nil {
			return nil, err
		}
		m.Batch, m.Zstd, m.Size = bytes.Clone(b), true, uint32(len(raw))
	}
	return m, nil
}

// UnpackPutBatch unmarshals the batch of m into w, decompressing it with
// z, the decoder of the stream m came on. It fails with KindInvalid if the
// batch is compressed and z is nil (its receiver did not say it takes
// that), does not decompress (z then refuses the rest of the stream), or
// does not unmarshal.
func UnpackPutBatch(m *ChunkPutBatch, z *zwire.Decoder, w pb.Message) error {
	const op = "proto.UnpackPutBatch"
	raw := m.Batch
	if m.Zstd {
		if z == nil {
			return ferry.E(op, "", ferry.KindInvalid, "a compressed batch unasked")
		}
		var err error
		if raw, err = z.Decompress(m.Batch, int(m.Size)); err != nil {
			return ferry.E(op, "", ferry.KindInvalid, err)
		}
	}
	if err := pb.Unmarshal(raw, w); err != nil {
		return ferry.E(op, "", ferry.KindInvalid, err)
	}
	return nil
}
