package server

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/transport"
)

// The server's memory budget (Config.Memory) is shared by everything its
// calls hold in memory on a client's behalf: the read-ahead of downloads
// (a quarter of it, see budget) and what uploads have sent ahead of their
// handlers (the rest, windows below).
//
// An upload's data waits in gRPC's receive buffers until its handler
// reads it, up to the stream's flow-control window; gRPC returns the
// connection's window as data arrives, so only the number of streams
// bounds the sum. A handler that waits (for a lease recall, a slow disk)
// lets its stream's window fill. So every stream that carries file data
// reserves, before gRPC takes it, what its window lets the client send
// ahead: the window, or the size the client declares (proto.SizeKey) plus
// a message, whichever is less. A stream that finds the budget taken is
// refused at once with codes.ResourceExhausted, before any of its data is
// kept; the client waits and tries again (remote.Client's busy pause).
// That is the back-pressure: uploads beyond the budget wait at their
// clients, not in the server's memory.

// DefaultMemory is Config.Memory by default.
const DefaultMemory = 1 << 30

// windows is the part of the memory budget reserved by upload streams and
// the chunk lists of their puts: a budget, as read-ahead's is, which
// streams take without waiting and lists wait for.
type windows struct {
	*budget
	streams atomic.Int64
	refused atomic.Int64
}

func newWindows(total int64) *windows { return &windows{budget: newBudget(total, 0)} }

// reserve takes n bytes for a stream, if they are free.
func (w *windows) reserve(n int64) bool {
	if !w.tryAcquire(n) {
		return false
	}
	w.streams.Add(1)
	return true
}

// unreserve gives back what a stream reserved.
func (w *windows) unreserve(n int64) {
	w.release(n)
	w.streams.Add(-1)
}

// take reserves n bytes of a put's chunk list, waiting for them until ctx
// is done or wait has passed, and reports whether it got them.
func (w *windows) take(ctx context.Context, n int64, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return w.acquire(ctx, n)
}

func (w *windows) stats() (reserved, total int64, streams int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.used, w.total, int(w.streams.Load())
}

// refMemory is what one entry of a put's chunk list holds in the chunk
// store while the put runs (about 200 bytes measured, with its index
// entries), and listWait how long a put waits for the memory of more of
// its list before it gives up as busy.
const (
	refMemory = 256
	listWait  = 10 * time.Second
)

// list is the chunk list memory of one put, which waits up to wait for
// more of it.
type list struct {
	w    *windows
	wait time.Duration
	held int64
}

// grow takes the memory of n more entries. A list that would not fit the
// upload memory even alone fails with KindInvalid, which makes the client
// put the file whole instead; one that does not fit beside the others
// waits, then fails as busy.
func (l *list) grow(ctx context.Context, path string, n int) error {
	const op = "server.PutChunked"
	more := int64(n) * refMemory
	if l.held+more > l.w.total {
		return ferry.E(op, path, ferry.KindInvalid, fmt.Sprintf(
			"its chunk list needs more than the server's %d MiB of upload memory (serve --memory): put it whole", l.w.total>>20))
	}
	if !l.w.take(ctx, more, l.wait) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.w.refused.Add(1)
		return ferry.E(proto.BusyOp, path, ferry.KindUnavailable, "the server is busy: uploads in progress hold its upload memory")
	}
	l.held += more
	return nil
}

// end gives the list's memory back.
func (l *list) end() { l.w.release(l.held) }

// uploadMethods are the calls whose requests carry file data, and whether
// one carries a single file (so that its declared size bounds it).
var uploadMethods = map[string]bool{
	proto.Ferry_Put_FullMethodName:             true,
	proto.Ferry_PutChunked_FullMethodName:      true,
	proto.Ferry_PutChunkedBatch_FullMethodName: false,
	proto.Ferry_Commit_FullMethodName:          true,
}

// admit is the server's tap: it reserves an upload stream's window before
// gRPC keeps any of its data, or refuses the stream if the budget is
// taken. Other calls pass untouched. It runs on the connection's reader,
// so it never waits.
func (s *Server) admit(ctx context.Context, info *tap.Info) (context.Context, error) {
	single, ok := uploadMethods[info.FullMethodName]
	if !ok {
		return ctx, nil
	}
	n := int64(transport.StreamWindow)
	if single {
		if v := info.Header.Get(proto.SizeKey); len(v) == 1 {
			if size, err := strconv.ParseInt(v[0], 10, 64); err == nil && size >= 0 {
				n = min(n, size+proto.MaxData)
			}
		}
	}
	if !s.windows.reserve(n) {
		s.windows.refused.Add(1)
		_, total, streams := s.windows.stats()
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"the server is busy: %d uploads in progress hold its upload memory (%d MiB; serve --memory)", streams, total>>20))
	}
	// gRPC cancels a stream's context whenever the stream ends, also
	// when it ends before its handler begins.
	context.AfterFunc(ctx, func() { s.windows.unreserve(n) })
	return ctx, nil
}

// countingPool is gRPC's buffer pool for the server's connections, which
// counts the bytes of the buffers taken and not yet returned: mostly
// received data that no handler has read yet.
type countingPool struct {
	mem.BufferPool
	held atomic.Int64
}

func (p *countingPool) Get(length int) *[]byte {
	b := p.BufferPool.Get(length)
	p.held.Add(int64(cap(*b)))
	return b
}

func (p *countingPool) Put(b *[]byte) {
	p.held.Add(-int64(cap(*b)))
	p.BufferPool.Put(b)
}

// Received returns the bytes the server's connections hold in gRPC's
// buffers now: data received that no handler has read yet.
func (s *Server) Received() int64 { return s.pool.held.Load() }

// Uploads returns the memory reserved by upload streams in progress, the
// most they may reserve, and how many streams were refused for want of it.
func (s *Server) Uploads() (reserved, total, refused int64) {
	reserved, total, _ = s.windows.stats()
	return reserved, total, s.windows.refused.Load()
}
