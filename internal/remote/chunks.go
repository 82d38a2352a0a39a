package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/store"
)

// ChunkStats reports what a chunked transfer moved.
type ChunkStats struct {
	Chunks     int   // Chunks is the length of the file's chunk list.
	Bytes      int64 // Bytes is the file's size.
	SentChunks int   // SentChunks counts chunks whose bytes crossed the wire.
	SentBytes  int64 // SentBytes is the chunk data that crossed the wire, uncompressed.
	WireBytes  int64 // WireBytes is the chunk data as it crossed the wire, compressed where it shrank; for a put in a PutBatch, as sent before the batch's compression (the batch counts its wire bytes in Traffic).
	Optimistic int   // Optimistic counts chunks a put sent before being asked.
	FineLists  int   // FineLists counts needed chunks a put described by their pieces.
	SentPieces int   // SentPieces counts the pieces of those whose bytes crossed the wire.
	Inline     bool  // Inline says a small file came whole with its entry.
}

// GetChunked writes the content of the file at path to w and returns its
// entry as of the start of the transfer, fetching only the chunks that
// cache (which may be nil) lacks and adding those to it. It lists the file
// and requests missing chunks on one stream while the list still arrives,
// so it costs about two round trips plus the missing bytes. Every chunk is
// checked against its hash before it is written. If the file changed on the
// server during the transfer so that a chunk is no longer there, it fails
// with KindUnavailable and the caller may retry; w then holds a prefix.
// Refs, if not nil, is called with the file's chunk list.
func (c *Client) GetChunked(ctx context.Context, p string, cache store.ChunkCache, w io.Writer, refs func([]chunk.Ref)) (ferry.Dir, ChunkStats, error) {
	return c.getChunked(ctx, p, cache, w, refs, 0)
}

// getChunked is GetChunked that asks the server to send a file of at most
// inlineMax bytes whole with its entry, in one round trip.
func (c *Client) getChunked(ctx context.Context, p string, cache store.ChunkCache, w io.Writer, refs func([]chunk.Ref), inlineMax int64) (ferry.Dir, ChunkStats, error) {
	const op = "remote.GetChunked"
	var stats ChunkStats
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	list, err := c.bulk.ChunkList(ctx, &proto.ChunkListReq{Path: p, ChunkVersion: chunk.Version, InlineMax: inlineMax, Zstd: c.zip != nil})
	if err != nil {
		return nil, stats, c.fail(op, p, err)
	}
	m0, err := list.Recv()
	if err == io.EOF {
		return nil, stats, ferry.E(op, p, ferry.KindInvalid, "the server sent no chunk list")
	}
	if err != nil {
		return nil, stats, c.fail(op, p, err)
	}
	if m0.Dir == nil {
		return nil, stats, ferry.E(op, p, ferry.KindInvalid, "the chunk list came without the file's entry")
	}
	if m0.ZstdOk {
		c.zstdOK.Store(true)
	}
	d := proto.ToDir(m0.Dir)
	if m0.Inline {
		data, err := c.unzip(op, p, m0.Data, m0.Zstd, nil)
		if err != nil {
			return nil, stats, err
		}
		if int64(len(data)) != d.Size() {
			return nil, stats, ferry.E(op, p, ferry.KindInvalid, "inline data does not match the entry's size")
		}
		if _, err := w.Write(data); err != nil {
			return nil, stats, ferry.E(op, p, err)
		}
		stats.Inline, stats.Bytes, stats.SentBytes, stats.WireBytes = true, int64(len(data)), int64(len(data)), int64(len(m0.Data))
		return d, stats, nil
	}
	// The streams for the chunks open only now: the requests could not
	// leave before the list arrives anyway, and a small file that came
	// inline never opens one. A large file's chunks are spread over the
	// bulk connections in runs of stripe bytes, each run on the next
	// stream, so that several TCP flows carry them (see DefaultBulkConns).
	streams := make([]grpc.BidiStreamingClient[proto.ChunkReq, proto.ChunkData], 1, len(c.bulkc))
	if streams[0], err = c.bulk.ReadChunks(ctx); err != nil {
		return nil, stats, c.fail(op, p, err)
	}
	if d.Size() >= 2*stripe {
		for _, bc := range c.bulkc[1:] {
			rd, err := bc.ReadChunks(ctx)
			if err != nil {
				break // The first stream will do.
			}
			streams = append(streams, rd)
		}
	}
	// The lister reads the list, asks for the chunks the cache lacks and
	// queues every chunk in file order for the assembler below; stream
	// says which stream a chunk arrives on, -1 for one from the cache.
	type item struct {
		ref    chunk.Ref
		stream int
		// cached reads the cache's chunks of the item's list message in
		// order, for an item from the cache.
		cached func() ([]byte, bool)
	}
	queue := make(chan item, 1<<16)
	listErr := make(chan error, 1)
	go func() {
		defer close(queue)
		var all []chunk.Ref
		var off, run int64
		cur := 0 // The stream of the current run.
		reqs := make([]*proto.ChunkReq, len(streams))
		for i := range reqs {
			// Each stream's first request names the file, whose
			// readers may read its chunks.
			reqs[i] = &proto.ChunkReq{Path: p, Zstd: c.zip != nil}
		}
		sendAll := func() error {
			for i, req := range reqs {
				if len(req.Hashes) > 0 {
					if err := streams[i].Send(req); err != nil {
						return err
					}
					reqs[i] = &proto.ChunkReq{}
				}
			}
			return nil
		}
		m := m0
		for {
			hs, sizes, err := proto.UnpackRefs(m.Refs)
			if err != nil {
				listErr <- err
				return
			}
			var items []item
			var cached []bool
			var hits []chunk.Hash
			if cache != nil {
				cached = cache.HasMany(hs)
			}
			for i, h := range hs {
				r := chunk.Ref{Hash: h, Off: off, Len: sizes[i]}
				off += int64(sizes[i])
				all = append(all, r)
				it := item{ref: r, stream: -1}
				if cache != nil && cached[i] {
					hits = append(hits, h)
				} else {
					if run >= stripe {
						cur, run = (cur+1)%len(streams), 0
					}
					it.stream = cur
					reqs[cur].Hashes = append(reqs[cur].Hashes, h[:]...)
					run += int64(sizes[i])
				}
				items = append(items, it)
			}
			if len(hits) > 0 {
				next := cache.GetMany(ctx, hits)
				for i := range items {
					if items[i].stream < 0 {
						items[i].cached = next
					}
				}
			}
			if sendAll() != nil {
				break // The assembler's Recv says why.
			}
			for _, it := range items {
				select {
				case queue <- it:
				case <-ctx.Done():
					return
				}
			}
			if m, err = list.Recv(); err == io.EOF {
				break
			}
			if err != nil {
				listErr <- c.fail(op, p, err)
				return
			}
		}
		for _, rd := range streams {
			rd.CloseSend()
		}
		if refs != nil {
			refs(all)
		}
		listErr <- nil
	}()
	// The lister must be gone before the caller may close the cache it
	// reads: on an early return, stop it and wait for its queue to close.
	defer func() {
		cancel()
		for range queue {
		}
	}()
	var zbuf []byte
	for it := range queue {
		var data []byte
		if it.stream >= 0 {
			m, err := streams[it.stream].Recv()
			if err != nil {
				if err == io.EOF {
					err = ferry.E(op, p, ferry.KindUnavailable, "chunk stream ended early")
				}
				return nil, stats, c.fail(op, p, err)
			}
			if m.Missing {
				return nil, stats, ferry.E(op, p, ferry.KindUnavailable, "the file changed during the transfer")
			}
			if data, err = c.unzip(op, p, m.Data, m.Zstd, zbuf); err != nil {
				return nil, stats, err
			}
			if m.Zstd {
				zbuf = data
			}
			if h, _ := chunk.FromBytes(m.Hash); h != it.ref.Hash || len(data) != it.ref.Len || chunk.Sum(data) != it.ref.Hash {
				return nil, stats, ferry.E(op, p, ferry.KindIO, "the server sent a chunk that does not match its hash")
			}
			stats.SentChunks++
			stats.SentBytes += int64(len(data))
			stats.WireBytes += int64(len(m.Data))
			if cache != nil {
				cache.Add(it.ref.Hash, data)
			}
		} else {
			var ok bool
			if data, ok = it.cached(); !ok || len(data) != it.ref.Len {
				return nil, stats, ferry.E(op, p, ferry.KindUnavailable, "a cached chunk vanished during the transfer")
			}
		}
		if _, err := w.Write(data); err != nil {
			return nil, stats, ferry.E(op, p, err)
		}
		stats.Chunks++
		stats.Bytes += int64(len(data))
	}
	if err := <-listErr; err != nil {
		return nil, stats, err
	}
	if stats.Bytes != d.Size() {
		return nil, stats, ferry.E(op, p, ferry.KindUnavailable, "the file changed during the transfer")
	}
	return d, stats, nil
}

// stripe is the run of a large Get's chunks that goes on one bulk
// connection before the next takes over: large enough that a run's
// requests are few, small enough that the connections' runs interleave
// finely and the assembler, which takes them in file order, rarely waits
// on one while the others hold data.
const stripe = 2 << 20

// unzip returns data, decompressed into buf if compressed says it is.
func (c *Client) unzip(op, p string, data []byte, compressed bool, buf []byte) ([]byte, error) {
	if !compressed {
		return data, nil
	}
	if c.zip == nil {
		return nil, ferry.E(op, p, ferry.KindInvalid, "the server sent compressed data unasked")
	}
	out, err := c.zip.Decompress(buf, data)
	if err != nil {
		return nil, ferry.E(op, p, ferry.KindIO, err)
	}
	return out, nil
}

// PutChunked replaces the file at path atomically with the size bytes of
// src, with the attributes in d, sending only the chunks the server lacks.
// known, if not nil, says which chunks the server is believed to hold (for
// example the chunk list of the version being replaced, from GetChunked):
// the others are sent at once with the list, without waiting to be asked,
// so the put costs one round trip plus their bytes; with known nil the
// server is asked first, which costs a second round trip. src is read twice
// (to chunk it, and for each chunk sent); if it changes in between, the put
// fails with KindUnavailable and the server keeps the old file.
func (c *Client) PutChunked(ctx context.Context, p string, d ferry.Dir, src io.ReaderAt, size int64, known func(chunk.Hash) bool) (ferry.Dir, ChunkStats, error) {
	return c.putChunked(ctx, p, d, src, size, known, nil, nil)
}

// putChunked is PutChunked that calls keep, if not nil, with each distinct
// chunk as it is cut (the bytes are valid only during the call), and that
// puts on the stream of via if it is not nil.
func (c *Client) putChunked(ctx context.Context, p string, d ferry.Dir, src io.ReaderAt, size int64, known func(chunk.Hash) bool, keep func(chunk.Hash, []byte), via *PutBatch, opts ...grpc.CallOption) (ferry.Dir, ChunkStats, error) {
	const op = "remote.PutChunked"
	var stats ChunkStats
	// cut is what the file is read from to cut it into chunks; a source
	// that counts progress itself is cut through its uncounted view and
	// told the bytes done as they are sent, the rest when the put ends.
	cut := src
	pp := putProgressOf(src)
	if pp != nil {
		cut = pp.view
	}
	var reported int64
	progress := func(n int64) {
		if pp != nil {
			reported += n
			pp.p.Done(n)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var st chunkPutStream
	var err error
	// zip compresses each chunk's data; a batch's are compressed together.
	zip := c.zip
	if via != nil {
		st, err, zip = nil, nil, nil
		st, err = via.open(ctx, opts...)
	} else {
		st, err = c.bulk.PutChunked(declareSize(ctx, size), opts...)
	}
	if err != nil {
		return nil, stats, c.fail(op, p, err)
	}
	if d == nil {
		d = ferry.Dir{}
	}
	m := &proto.ChunkPutMsg{Path: p, Dir: proto.FromDir(d), Size: size, ChunkVersion: chunk.Version, FineOk: !c.noFine}
	// A put staged for a group (Group) is put in place by its Commit.
	m.Stage, _ = ctx.Value(stageKey{}).(string)
	var refs, pending []chunk.Ref
	sent := map[chunk.Hash]bool{}
	// sendErr notes that the stream broke; the server's answer (from Recv
	// below) says why.
	var sendErr error
	var zbuf []byte
	send := func(m *proto.ChunkPutMsg) {
		if sendErr == nil {
			sendErr = st.Send(m)
		}
	}
	sendData := func(h chunk.Hash, data []byte, piece bool) {
		m := &proto.ChunkPutMsg{Hash: h[:], Data: data, Piece: piece}
		if zip != nil && c.zstdOK.Load() {
			// zbuf is reused: Send has copied the message out.
			if m.Data, m.Zstd = zip.Compress(zbuf, data); m.Zstd {
				zbuf = m.Data
			}
		}
		send(m)
		if piece {
			stats.SentPieces++
		} else {
			stats.SentChunks++
		}
		progress(int64(len(data)))
		stats.SentBytes += int64(len(data))
		stats.WireBytes += int64(len(m.Data))
	}
	// fines holds the needed chunks sent as fine lists, until the server
	// says which of their pieces it lacks; fineBytes is their size, which
	// fineBudget bounds (beyond it chunks go whole).
	type fineList struct {
		data   []byte
		pieces []chunk.Ref
	}
	fines := map[chunk.Hash]fineList{}
	var fineBytes int64
	fineOK, needEnd, closed := false, false, false
	flush := func() {
		if len(pending) > 0 || m.Path != "" {
			m.Refs = proto.PackRefs(pending)
			send(m)
			m, pending = &proto.ChunkPutMsg{}, pending[:0]
		}
	}
	// The server answers each part of the list as it arrives (one that
	// predates that, at the list's end): a receiver hands its replies
	// over, and the chunks they ask for go between cuts, so data flows
	// while the rest of a large file is still being cut.
	replies := make(chan putReply, 64)
	go func() {
		for {
			r, err := st.Recv()
			select {
			case replies <- putReply{r, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || r.Dir != nil {
				return
			}
		}
	}()
	var (
		buf    []byte
		result ferry.Dir
		done   bool
	)
	// process acts on one reply: it sends what the server asks for, or
	// takes the put's result.
	process := func(rep putReply) error {
		r, err := rep.r, rep.err
		if err != nil {
			if err == io.EOF {
				err = ferry.E(op, p, ferry.KindUnavailable, "the server ended the put without an answer")
			}
			return c.fail(op, p, err)
		}
		if r.ZstdOk {
			c.zstdOK.Store(true)
		}
		if r.Dir != nil {
			st.CloseSend()
			result, done = proto.ToDir(r.Dir), true
			if via != nil {
				// A batch's reply leaves out what the put named.
				result[ferry.AttrPath], result[ferry.AttrName] = p, path.Base(p)
			}
			return nil
		}
		fineOK = fineOK || r.FineOk
		if r.FineFor != nil {
			h, err := chunk.FromBytes(r.FineFor)
			fl, ok := fines[h]
			if err != nil || !ok {
				return ferry.E(op, p, ferry.KindInvalid, "the server answered a fine list that was not sent")
			}
			delete(fines, h)
			fineBytes -= int64(len(fl.data))
			need, err := proto.UnpackIndexes(r.FineNeed, len(fl.pieces))
			if err != nil {
				return ferry.E(op, p, err)
			}
			sentPiece := map[chunk.Hash]bool{}
			for _, j := range need {
				pr := fl.pieces[j]
				if !sentPiece[pr.Hash] {
					sentPiece[pr.Hash] = true
					sendData(pr.Hash, fl.data[pr.Off:pr.Off+int64(pr.Len)], true)
				}
			}
		}
		need, err := proto.UnpackIndexes(r.Need, len(refs))
		if err != nil {
			return ferry.E(op, p, err)
		}
		for _, i := range need {
			ref := refs[i]
			if sent[ref.Hash] {
				continue
			}
			sent[ref.Hash] = true
			if cap(buf) < ref.Len {
				buf = make([]byte, ref.Len)
			}
			b := buf[:ref.Len]
			if _, err := src.ReadAt(b, ref.Off); err != nil && !errors.Is(err, io.EOF) {
				return ferry.E(op, p, err)
			}
			if chunk.Sum(b) != ref.Hash {
				return ferry.E(op, p, ferry.KindUnavailable, "the source changed during the put")
			}
			if fineOK && ref.Len >= fineFrom && fineBytes+int64(ref.Len) <= fineBudget {
				data := bytes.Clone(b)
				pieces, _ := chunk.List(bytes.NewReader(data), chunk.Fine)
				fines[ref.Hash] = fineList{data, pieces}
				fineBytes += int64(len(data))
				send(&proto.ChunkPutMsg{Hash: ref.Hash[:], Fine: proto.PackRefs(pieces)})
				stats.FineLists++
				continue
			}
			sendData(ref.Hash, b, false)
		}
		needEnd = needEnd || r.NeedEnd
		if needEnd && len(fines) == 0 && !closed {
			closed = true
			st.CloseSend()
		}
		return nil
	}
	// drain processes the replies that have arrived, without waiting.
	drain := func() error {
		for {
			select {
			case rep := <-replies:
				if err := process(rep); err != nil {
					return err
				}
			default:
				return nil
			}
		}
	}
	seen := map[chunk.Hash]bool{}
	var procErr error // What process said while the list was cut.
	err = chunk.Refs(io.NewSectionReader(cut, 0, size), chunk.Default, func(r chunk.Ref, data []byte) error {
		refs = append(refs, r)
		pending = append(pending, r)
		stats.Chunks++
		stats.Bytes += int64(r.Len)
		if keep != nil && !seen[r.Hash] {
			seen[r.Hash] = true
			keep(r.Hash, data)
		}
		if known != nil && !known(r.Hash) && !sent[r.Hash] {
			flush()
			sent[r.Hash] = true
			sendData(r.Hash, data, false)
			stats.Optimistic++
		} else if len(pending) == listPart {
			flush()
		}
		if sendErr != nil {
			return sendErr
		}
		procErr = drain()
		return procErr
	})
	if procErr != nil {
		return nil, stats, procErr
	}
	if err != nil && err != sendErr {
		return nil, stats, ferry.E(op, p, err)
	}
	if sendErr == nil {
		m.Refs = proto.PackRefs(pending)
		m.ListEnd = true
		send(m)
	}
	for !done {
		select {
		case rep := <-replies:
			if err := process(rep); err != nil {
				return nil, stats, err
			}
		case <-ctx.Done():
			return nil, stats, c.fail(op, p, ctx.Err())
		}
	}
	progress(max(size-reported, 0)) // What the server held already.
	return result, stats, nil
}

// PutProgress is implemented by a source of a put that counts the put's
// progress itself (a command's progress bar). A chunked put reads the
// whole file once to cut it and again for the chunks the server lacks, so
// counting reads would reach the end long before the upload does: it
// cuts through Uncounted and calls Done with the bytes of each chunk as it
// sends it, and with the rest (what the server held) when the put ends.
type PutProgress interface {
	Uncounted() io.ReaderAt
	Done(n int64)
}

// sourceProgress is a PutProgress and its uncounted view of the source's
// bytes from 0.
type sourceProgress struct {
	p    PutProgress
	view io.ReaderAt
}

// putProgressOf returns the PutProgress of src, or of the source it is a
// section of, if any.
func putProgressOf(src io.ReaderAt) *sourceProgress {
	if pp, ok := src.(PutProgress); ok {
		return &sourceProgress{pp, pp.Uncounted()}
	}
	if sr, ok := src.(*io.SectionReader); ok {
		outer, off, n := sr.Outer()
		if pp, ok := outer.(PutProgress); ok {
			return &sourceProgress{pp, io.NewSectionReader(pp.Uncounted(), off, n)}
		}
	}
	return nil
}

// putReply is a reply of a chunked put, or why none came.
type putReply struct {
	r   *proto.ChunkPutReply
	err error
}

// listPart is how many chunks a put lists per message: small enough that
// the server's first answer comes while the rest of a large file is cut.
const listPart = 256

// A needed chunk of at least fineFrom bytes goes as a fine list if the
// server takes them: below that a list and its round trip save little.
// Fine lists wait for their answers holding their chunks, at most
// fineBudget bytes of them; beyond that chunks go whole (a put over a file
// whose content is mostly new gains nothing from pieces anyway).
const (
	fineFrom   = 2 * 1024
	fineBudget = 8 << 20
)
