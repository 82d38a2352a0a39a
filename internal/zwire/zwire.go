// Package zwire compresses payloads on the wire with zstd: chunk data and
// file data one message at a time at zstd's fastest level (Codec), each
// flagged as compressed or not by its message, and the batches of a
// stream as one zstd stream (Encoder, Decoder).
//
// A Codec is made by whoever owns a connection (a remote.Client, a
// server.Server) and passed explicitly: there is no global state and
// nothing is registered with gRPC. Compression is per message, so a
// message that does not shrink (already compressed media, encrypted data)
// is sent as it is and costs nothing to receive.
package zwire

import (
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"github.com/ferryfs/ferry"
)

// MinSize is the smallest payload worth compressing: below it the frame
// header and the call cost more than they save.
const MinSize = 256

// Codec compresses and decompresses payloads of at most a bound. It is
// safe for concurrent use.
type Codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
	max int

	in, out  atomic.Int64 // Bytes before and after compression.
	skipped  atomic.Int64 // Payloads sent as they were because they did not shrink.
	inflated atomic.Int64 // Bytes produced by decompression.

	// mu is held for reading while the decoder is in use and for writing
	// by Close, so that a call still in flight when its connection's
	// owner closes (a stream's goroutine) fails instead of racing.
	mu     sync.RWMutex
	closed bool
}

// New returns a Codec for payloads of at most limit bytes: Decompress refuses
// frames that would produce more.
func New(limit int) *Codec {
	// Both constructors fail only on invalid options, which these are not.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithLowerEncoderMem(true), zstd.WithZeroFrames(true))
	if err != nil {
		panic(err)
	}
	// The window is bounded by the payload bound, so a hostile frame
	// cannot make the decoder allocate more than about max.
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(uint64(limit)),
		zstd.WithDecoderMaxWindow(uint64(max(limit, zstd.MinWindowSize))), zstd.WithDecoderLowmem(true))
	if err != nil {
		panic(err)
	}
	return &Codec{enc: enc, dec: dec, max: limit}
}

// Compress returns src compressed, appended to dst[:0], and true; or src
// itself and false if compressing would not shrink it by at least an
// eighth or src is shorter than MinSize. The result owns no part of src
// when compressed.
func (c *Codec) Compress(dst, src []byte) ([]byte, bool) {
	if len(src) < MinSize {
		return src, false
	}
	out := c.enc.EncodeAll(src, dst[:0])
	if len(out) > len(src)-len(src)/8 {
		c.skipped.Add(1)
		return src, false
	}
	c.in.Add(int64(len(src)))
	c.out.Add(int64(len(out)))
	return out, true
}

// Decompress returns the content of the zstd frame src, appended to
// dst[:0]. It fails with KindInvalid if src is not a valid frame or would
// decompress to more than the Codec's bound.
func (c *Codec) Decompress(dst, src []byte) ([]byte, error) {
	const op = "zwire.Decompress"
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, ferry.E(op, "", ferry.KindCanceled, "the codec is closed")
	}
	out, err := c.dec.DecodeAll(src, dst[:0])
	if err != nil {
		return nil, ferry.E(op, "", ferry.KindInvalid, err)
	}
	if len(out) > c.max {
		return nil, ferry.E(op, "", ferry.KindInvalid, "frame larger than the bound")
	}
	c.inflated.Add(int64(len(out)))
	return out, nil
}

// Stats reports what the Codec did since it was made.
type Stats struct {
	In, Out  int64 // In and Out are the bytes before and after compression of payloads that shrank.
	Skipped  int64 // Skipped counts payloads that did not shrink enough and went as they were.
	Inflated int64 // Inflated is the bytes decompression produced.
}

// Stats returns the Codec's counters.
func (c *Codec) Stats() Stats {
	return Stats{In: c.in.Load(), Out: c.out.Load(), Skipped: c.skipped.Load(), Inflated: c.inflated.Load()}
}

// Close releases the decoder's goroutines, once the decompressions in
// progress end; later ones fail with KindCanceled. Compress still works.
func (c *Codec) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.dec.Close()
	}
}
