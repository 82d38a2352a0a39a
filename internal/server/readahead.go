package server

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/transport"
)

// Read-ahead, after TPF (Lim and Park, 2007): the server reads ahead of each
// Get by what its connection carries, not by a fixed amount. A stream keeps
// about readAheadRTTs round trips of the connection's measured delivery rate
// ready in memory, so that the disk is never what the link waits for; a
// 1 Mbit/s client pins a few KiB, a 1 Gbit/s one some MiB. All streams share
// one budget, each capped at an equal share of it while others want memory.
// A stream that is cancelled, or whose connection breaks, stops its reader
// at once and frees what it held.
//
// With Config.ReadAheadFixed every stream instead reads a fixed amount
// ahead whatever its connection, as servers commonly do; that exists so
// that bench/load can measure what the adaptive sizing saves.
const (
	readAheadRTTs = 4
	// minReadAhead keeps one message ready even before any measurement.
	minReadAhead = proto.SendData
	// maxReadAhead bounds one stream whatever its connection.
	maxReadAhead = 64 << 20
)

// budget is memory shared by the read-ahead of all streams.
type budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	total int64
	used  int64
	// fixed, if positive, is every stream's depth, whatever its
	// connection and share (see Config.ReadAheadFixed).
	fixed int64
	// live are the streams started and not yet stopped: those holding or
	// waiting for memory.
	live map[*readAhead]struct{}
}

// newBudget returns a budget of total bytes; fixed, if positive, is the
// depth of every stream, within minReadAhead and maxReadAhead.
func newBudget(total, fixed int64) *budget {
	b := &budget{total: total, live: map[*readAhead]struct{}{}}
	if fixed > 0 {
		b.fixed = min(max(fixed, minReadAhead), maxReadAhead)
	}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// share is the most one stream may hold now.
func (b *budget) share() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total / int64(max(len(b.live), 1))
}

// acquire waits until n bytes are free or ctx is done.
func (b *budget) acquire(ctx context.Context, n int64) bool {
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used+n > b.total && b.used > 0 {
		if ctx.Err() != nil {
			return false
		}
		b.cond.Wait()
	}
	if ctx.Err() != nil {
		return false
	}
	b.used += n
	return true
}

// tryAcquire takes n bytes if they are free now.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total {
		return false
	}
	b.used += n
	return true
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.cond.Broadcast()
	b.mu.Unlock()
}

// join counts ra among the streams that share the budget.
func (b *budget) join(ra *readAhead) {
	b.mu.Lock()
	b.live[ra] = struct{}{}
	b.mu.Unlock()
}

// leave forgets ra, which holds nothing any more.
func (b *budget) leave(ra *readAhead) {
	b.mu.Lock()
	delete(b.live, ra)
	b.mu.Unlock()
}

// budgetStats is what a budget holds, for the control file and metrics.
type budgetStats struct {
	used, total int64
	fixed       int64 // 0: adaptive.
	streams     int
	// orphaned is the part of used held by streams whose context is done
	// (cancelled, or their connection broke) and which have not freed it
	// yet: how long that lasts is how fast a dead client's memory returns.
	orphaned int64
}

func (b *budget) stats() budgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := budgetStats{used: b.used, total: b.total, fixed: b.fixed, streams: len(b.live)}
	for ra := range b.live {
		if ra.ctx.Err() != nil {
			st.orphaned += ra.held.Load()
		}
	}
	return st
}

// readAhead reads rd ahead of the sender into a queue whose depth follows
// the connection c (nil: no measurements) and the budget. Next returns the
// pieces in order; the reader goroutine stops when ctx is done.
type readAhead struct {
	ctx     context.Context
	q       chan piece
	space   chan struct{} // Signalled when the sender takes a piece.
	b       *budget
	c       *conn
	held    atomic.Int64 // Bytes read ahead and not yet sent.
	depth   atomic.Int64 // The current target depth in bytes.
	cancels *atomic.Int64
	done    chan struct{}
}

// remeasure is how often a stream re-reads its connection's measurements.
const remeasure = 100 * time.Millisecond

// piece is what a stream sends next: data (for a Get) or a message (for a
// chunk stream), and the bytes it holds of the budget (the source's unit
// if the source leaves it 0).
type piece struct {
	data []byte
	msg  any
	err  error // io.EOF after the last.
	size int64
}

// source yields a stream's pieces in order: next reads one, of at most
// about unit bytes (the budget is asked for unit before it reads, and the
// difference settled after).
type source struct {
	unit int64
	next func() piece
	// ready, if not nil, waits until next has something to read, so that
	// a stream waiting for its client's requests holds nothing; false
	// ends the stream.
	ready func() bool
}

// readerSource reads rd in pieces of a message's data.
func readerSource(rd io.Reader) source {
	return source{unit: proto.SendData, next: func() piece {
		buf := make([]byte, proto.SendData)
		n, err := io.ReadFull(rd, buf)
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		return piece{data: buf[:n], err: err}
	}}
}

func startReadAhead(ctx context.Context, rd io.Reader, c *conn, b *budget, cancels *atomic.Int64) *readAhead {
	return startSource(ctx, readerSource(rd), c, b, cancels)
}

// startSource reads src ahead of the sender.
func startSource(ctx context.Context, src source, c *conn, b *budget, cancels *atomic.Int64) *readAhead {
	ra := &readAhead{
		ctx: ctx,
		q:   make(chan piece, maxReadAhead/proto.SendData), space: make(chan struct{}, 1),
		b: b, c: c, cancels: cancels, done: make(chan struct{}),
	}
	if b.fixed > 0 {
		ra.setDepth(b.fixed)
	} else {
		ra.setDepth(minReadAhead)
	}
	b.join(ra)
	go func() {
		defer close(ra.done)
		defer close(ra.q)
		var next time.Time
		measure := func() {
			if b.fixed == 0 && c != nil && c.raw != nil && time.Now().After(next) {
				ra.setDepth(targetDepth(c, b))
				next = time.Now().Add(remeasure)
			}
		}
		for {
			measure()
			// Wait while the queue is as deep as the connection warrants.
			for ra.held.Load() >= ra.depth.Load() {
				select {
				case <-ctx.Done():
					ra.cancels.Add(1)
					return
				case <-ra.space:
				case <-time.After(remeasure):
				}
				measure()
			}
			if src.ready != nil && !src.ready() {
				ra.cancels.Add(1)
				return
			}
			if !b.acquire(ctx, src.unit) {
				ra.cancels.Add(1)
				return
			}
			p := src.next()
			if p.size <= 0 {
				p.size = src.unit
			}
			switch {
			case p.size < src.unit:
				b.release(src.unit - p.size)
			case p.size > src.unit && !b.acquire(ctx, p.size-src.unit):
				b.release(src.unit)
				ra.cancels.Add(1)
				return
			}
			ra.hold(p.size)
			select {
			case ra.q <- p:
			case <-ctx.Done():
				ra.hold(-p.size)
				b.release(p.size)
				ra.cancels.Add(1)
				return
			}
			err := p.err
			if err != nil {
				if err != io.EOF && ctx.Err() != nil {
					ra.cancels.Add(1) // The read failed because the stream ended.
				}
				return
			}
		}
	}()
	return ra
}

// targetDepth is what a stream on c should keep ready: readAheadRTTs round
// trips at the measured delivery rate, within the stream's share.
func targetDepth(c *conn, b *budget) int64 {
	info, err := transport.ConnInfo(c.raw)
	if err != nil || info.DeliveryRate == 0 {
		return minReadAhead
	}
	want := int64(float64(info.DeliveryRate) * info.RTT.Seconds() * readAheadRTTs)
	return min(max(want, minReadAhead), maxReadAhead, max(b.share(), minReadAhead))
}

// Next returns the next piece; ok is false after the last.
func (ra *readAhead) Next() (piece, bool) {
	p, ok := <-ra.q
	if ok {
		ra.hold(-p.size)
		ra.b.release(p.size)
		select {
		case ra.space <- struct{}{}:
		default:
		}
	}
	return p, ok
}

// setDepth sets the stream's target depth, and its part of its
// connection's.
func (ra *readAhead) setDepth(d int64) {
	old := ra.depth.Swap(d)
	if ra.c != nil {
		ra.c.readAheadTarget.Add(d - old)
	}
}

// hold counts n more bytes held, for the stream and its connection.
func (ra *readAhead) hold(n int64) {
	ra.held.Add(n)
	if ra.c != nil {
		ra.c.readAhead.Add(n)
	}
}

// Stop waits for the reader to end (its context must be done or the data
// consumed) and frees what is still queued.
func (ra *readAhead) Stop() {
	<-ra.done
	for p := range ra.q {
		ra.hold(-p.size)
		ra.b.release(p.size)
	}
	ra.setDepth(0)
	ra.b.leave(ra)
}
