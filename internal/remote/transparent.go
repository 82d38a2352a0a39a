package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
)

// DefaultChunkMin is the least size of a file that Put and Get move by
// chunks. Below it one plain call is cheaper: a chunked put the server must
// be asked about costs a second round trip, and a file of a few chunks
// saves little when one of them changes. Measured by TestChunkMin in
// internal/chunkstore (go test -run TestChunkMin -v ./internal/chunkstore), bytes
// up for a one-line edit re-put, plain against chunked: 8 KiB 8402/8494
// (chunking saves nothing: one chunk), 16 KiB 16734/10331 (38%), 32 KiB
// 33431/10384 (69%), 64 KiB 66751/8952 (87%), 128 KiB 91%, 256 KiB 95%.
// The round trip added is worth what the link carries in it: 25 KB at
// 2 Mbit/s and 100 ms, 50 KB at 4 Mbit/s, so the saving overtakes it
// between 32 KiB (2 Mbit/s) and 64 KiB (4 Mbit/s); 64 KiB never loses on
// the design's target links. Files of at most this size come whole with
// their entry in a chunked Get (inline_max), so a small Get still costs one
// round trip.
const DefaultChunkMin = 64 << 10

// Traffic reports the file data that a Client's Gets and Puts moved and
// what it cost on the wire: payload bytes after chunking and compression,
// without the protocol's framing.
type Traffic struct {
	GetBytes, GetWire int64 // GetBytes is the file data delivered by Gets; GetWire what crossed the wire for it.
	PutBytes, PutWire int64 // PutBytes is the file data stored by Puts; PutWire what crossed the wire for it.
	// Busy counts the pauses of uploads the server refused because its
	// memory was taken (proto.ErrBusy), each followed by another try.
	Busy int64
	// PutBetter is the part of what batch streams sent that they
	// compressed at zwire.Better (see levels), counted before it.
	PutBetter int64
}

type traffic struct {
	getBytes, getWire, putBytes, putWire atomic.Int64
	busy, putBetter                      atomic.Int64
}

// Traffic returns the Client's counts since it was made.
func (c *Client) Traffic() Traffic {
	t := &c.traffic
	return Traffic{GetBytes: t.getBytes.Load(), GetWire: t.getWire.Load(), PutBytes: t.putBytes.Load(), PutWire: t.putWire.Load(), Busy: t.busy.Load(), PutBetter: t.putBetter.Load()}
}

// serverLacksChunks reports whether err says the server does not serve
// chunks (proto.NoChunksOp), and if so remembers it for the connection.
func (c *Client) serverLacksChunks(err error) bool {
	var fe *ferry.Error
	if errors.As(err, &fe) && fe.Kind == ferry.KindInvalid && fe.Op == proto.NoChunksOp {
		c.noChunks.Store(true)
		return true
	}
	return false
}

// Replace replaces the file at p, which the server holds in some version,
// with the size bytes of src and the attributes in d. Unlike Put it goes by
// chunks whatever the size, since the old version most likely shares most
// of them (a sync's changed files): a file the server holds already costs
// its chunk list, and a changed one the chunks that changed. It falls back
// to a Put where a chunked put cannot be made.
func (c *Client) Replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return c.replace(ctx, p, d, src, nil, false)
}

// replace is Replace with the chunked put on the stream of via, if not nil.
// fresh says the server most likely lacks the file (a new tree's): one
// below chunkMin then goes with all its chunks at once, in one round trip
// as a plain Put, instead of asking which the server lacks first.
func (c *Client) replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader, via *PutBatch, fresh bool) *ferry.Future[ferry.Dir] {
	size := src.Size()
	if size == 0 || c.chunkMin < 0 || c.noChunks.Load() || p == ferry.CtlPath || d.Type() != ferry.TypeFile {
		return c.Put(ctx, p, d, ferry.Whole, src)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		dir, err, done := c.putByChunks(ctx, p, d, src, size, via, fresh && size < c.chunkMin)
		if done {
			return dir, err
		}
		return c.Put(ctx, p, d, ferry.Whole, io.NewSectionReader(src, 0, size)).Wait()
	})
}

// chunkable says whether a whole-file put of size bytes goes by chunks.
func (c *Client) chunkable(p string, d ferry.Dir, size int64) bool {
	return c.chunkMin >= 0 && size >= c.chunkMin && !c.noChunks.Load() && p != ferry.CtlPath && d.Type() == ferry.TypeFile
}

// putByChunks puts src by chunks. done is false if the caller should put
// the file plainly instead: the server does not serve chunks, or refused
// the chunked put as invalid (a plain put then gives the real answer). A
// broken connection is ridden out as a resumable put does: the put starts
// again once the client has reconnected, for up to ResumeFor, and a server
// with a trash does not ask again for the chunks it got before the break
// (chunkstore.Put.Abort keeps them). With via not nil the put is made on its
// stream, or as a call of its own if the server has no batched puts. With
// unasked every chunk goes at once, unasked.
func (c *Client) putByChunks(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader, size int64, via *PutBatch, unasked bool) (_ ferry.Dir, _ error, done bool) {
	known := c.knownChunks(src, size)
	if unasked {
		known = func(chunk.Hash) bool { return false }
	}
	var keep func(chunk.Hash, []byte)
	if c.cache != nil {
		// The server holds every chunk of the file once the put commits:
		// the next edit of it can then be sent at once, and a Get of it
		// costs nothing.
		keep = func(h chunk.Hash, data []byte) { c.cache.Add(h, data) }
	}
	var deadline time.Time
	var opts []grpc.CallOption
	for {
		if via != nil && via.plain.Load() {
			via = nil
		}
		dir, st, err := c.putChunked(ctx, p, d, src, size, known, keep, via, opts...)
		if errors.Is(err, errNoBatch) {
			continue
		}
		if err == nil {
			c.traffic.putBytes.Add(st.Bytes)
			if via == nil {
				c.traffic.putWire.Add(st.WireBytes)
			}
			return dir, nil, true
		}
		if c.serverLacksChunks(err) || ferry.IsKind(err, ferry.KindInvalid) {
			return nil, nil, false
		}
		if !c.rideOut(ctx, err, &deadline) {
			return nil, err, true
		}
		if opts == nil {
			// Waiting for the connection is bounded by the deadline.
			dctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			ctx = dctx
			opts = []grpc.CallOption{grpc.WaitForReady(true)}
		}
	}
}

// knownChunks returns which chunks the server is believed to hold, for
// sending the others without being asked (one round trip instead of two):
// those in the cache, if the cache holds at least half the file's bytes.
// Otherwise (no cache, or a file the client has not seen) it returns nil
// and the server is asked, since sending every chunk unasked would resend a
// whole file the server may well hold already. Deciding costs one extra
// local pass over the file, far cheaper than a round trip.
func (c *Client) knownChunks(src *io.SectionReader, size int64) func(chunk.Hash) bool {
	if c.cache == nil || c.cache.Stats().Chunks == 0 {
		return nil
	}
	var refs []chunk.Ref
	err := chunk.Refs(io.NewSectionReader(src, 0, size), chunk.Default, func(r chunk.Ref, _ []byte) error {
		refs = append(refs, r)
		return nil
	})
	if err != nil {
		return nil
	}
	// Asked a chunk list at a time: a cache shared by a mount answers
	// each question over its socket.
	known := map[chunk.Hash]bool{}
	var cached int64
	for batch := range slices.Chunk(refs, proto.MaxRefs) {
		hs := make([]chunk.Hash, len(batch))
		for i, r := range batch {
			hs[i] = r.Hash
		}
		for i, ok := range c.cache.HasMany(hs) {
			if ok {
				known[hs[i]] = true
				cached += int64(batch[i].Len)
			}
		}
	}
	if cached*2 < size {
		return nil
	}
	return func(h chunk.Hash) bool { return known[h] }
}

// getByChunks is a Get of the whole file at p through the cache: a file
// of at most chunkMin bytes comes whole in one round trip; a larger one
// costs about two round trips plus the chunks the cache lacks. If the
// server does not serve chunks, or the chunked transfer fails in a way a
// plain Get may not (a broken connection, a file that changed), the rest
// of the file comes by a plain Get from where delivery stopped.
func (c *Client) getByChunks(ctx context.Context, p string) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		w := &countWriter{w: pw}
		var refs []chunk.Ref
		d, st, err := c.getChunked(ctx, p, c.cache, w, func(r []chunk.Ref) { refs = r }, c.chunkMin)
		if err == nil && !st.Inline {
			c.maps.keep(d, refs)
		}
		c.traffic.getBytes.Add(w.n)
		c.traffic.getWire.Add(st.WireBytes)
		if err == nil || ctx.Err() != nil || !c.fallBack(err, w.n) {
			pw.CloseWithError(err)
			return
		}
		r := c.getStream(ctx, p, w.n, -1)
		_, err = io.Copy(pw, r)
		r.Close()
		pw.CloseWithError(err)
	}()
	return &pipeReader{PipeReader: pr, ctx: ctx, cancel: cancel, path: p}
}

// fallBack says whether a failed chunked Get that delivered n bytes should
// go on with a plain Get.
func (c *Client) fallBack(err error, n int64) bool {
	if c.serverLacksChunks(err) {
		return true
	}
	switch ferry.KindOf(err) {
	case ferry.KindUnavailable:
		return true
	case ferry.KindNotExist, ferry.KindPermission, ferry.KindCanceled, ferry.KindAuth:
		return false
	}
	// Anything else before the first byte (a symbolic link, the control
	// file of a layer below): the plain Get says what it is.
	return n == 0
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// pipeReader is the reading end of a Get served by a goroutine; Close
// cancels the goroutine's transfer.
type pipeReader struct {
	*io.PipeReader
	ctx    context.Context
	cancel context.CancelFunc
	path   string
}

// Read fails once the Get's context is done, even if the data is at hand
// (from the cache), as a plain Get does.
func (r *pipeReader) Read(b []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, ferry.E("remote.Get", r.path, ferry.KindCanceled, err)
	}
	return r.PipeReader.Read(b)
}

func (r *pipeReader) Close() error {
	r.cancel()
	return r.PipeReader.Close()
}

// Sub returns the traffic since before.
func (t Traffic) Sub(before Traffic) Traffic {
	return Traffic{GetBytes: t.GetBytes - before.GetBytes, GetWire: t.GetWire - before.GetWire,
		PutBytes: t.PutBytes - before.PutBytes, PutWire: t.PutWire - before.PutWire, Busy: t.Busy - before.Busy, PutBetter: t.PutBetter - before.PutBetter}
}

// Status implements ctl.Controller: the client's side of a stack's control
// file, for a mount (ferry mount wraps the Client in a ctl layer).
func (c *Client) Status(ctx context.Context) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server: %s\nbulk.conns: %d\n", c.addr, len(c.bulks))
	t := c.Traffic()
	fmt.Fprintf(&b, "get.bytes: %d\nget.wire: %d\nput.bytes: %d\nput.wire: %d\nput.better: %d\nput.busy: %d\n", t.GetBytes, t.GetWire, t.PutBytes, t.PutWire, t.PutBetter, t.Busy)
	if c.cache == nil {
		b.WriteString("cache: none\n")
		return b.String()
	}
	st := c.cache.Stats()
	fmt.Fprintf(&b, "cache.bytes: %d of %d\ncache.chunks: %d\ncache.hits: %d\ncache.misses: %d\ncache.corrupt: %d\ncache.dropped: %d\n",
		st.Bytes, st.MaxBytes, st.Chunks, st.Hits, st.Misses, st.Corrupt, st.Dropped)
	return b.String()
}

// Command implements ctl.Controller: the client takes only sync, which
// has nothing to wait for (it holds no writes back).
func (c *Client) Command(ctx context.Context, args []string) error {
	if len(args) == 1 && args[0] == "sync" {
		return nil
	}
	return ferry.E("remote.Command", ferry.CtlPath, ferry.KindInvalid, "the client knows no command "+args[0]+"; \"pass CMD\" sends one to the server")
}

// HasCache reports whether the Client has a chunk cache, so that whole-file
// Gets move by chunks.
func (c *Client) HasCache() bool { return c.cache != nil }

// Space implements ferry.Spacer with one call.
func (c *Client) Space(ctx context.Context, p string) *ferry.Future[ferry.Space] {
	return ferry.Go(func() (ferry.Space, error) {
		r, err := c.c.Space(ctx, &proto.PathReq{Path: p})
		if err != nil {
			return ferry.Space{}, c.fail("remote.Space", p, err)
		}
		return ferry.Space{Total: r.Total, Free: r.Free, Avail: r.Avail, Files: r.Files, FilesFree: r.FilesFree}, nil
	})
}
