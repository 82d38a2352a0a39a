package zwire

import (
	"bytes"
	"errors"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/ferryfs/ferry"
)

// StreamWindow is the history a Stream's payloads are compressed against:
// the last MiB sent in its direction, which holds the names, attributes
// and chunk lists that the next payload repeats. A decoder keeps as much.
const StreamWindow = 1 << 20

// WideWindow is the history a stream draws on where its receiver allows it
// (a PutChunkedBatch's, proto.ChunkPutBatch.window): enough to find one
// file's bytes again in the next, as a build's linked binaries repeat the
// libraries in them. A decoder keeps as much, so a server allows it to
// only a few streams at once.
const WideWindow = 8 << 20

// Encoder compresses a stream's payloads in order as one zstd stream, each
// flushed at its end so that it can be decompressed as soon as it arrives.
// Unlike a Codec's frames, a small payload (a batch of a few replies)
// compresses as well as a large one, since it builds on those before it.
// It compresses at zstd's default level, not the fastest a Codec uses:
// with a history to draw on, that level finds much more (figures in
// bench/REPORT-writeback.md), and a batch carries only files of at most
// 4 MiB.
// It is not safe for concurrent use.
type Encoder struct {
	enc *zstd.Encoder
	out bytes.Buffer
}

// Level is how hard an Encoder looks for what its history repeats.
type Level int

const (
	// Default is zstd's default level.
	Default Level = iota
	// Better is zstd's "better" level: two to three times Default's CPU,
	// for a quarter fewer bytes of a build's outputs in a wide window.
	Better
)

// NewEncoder returns an Encoder whose stream draws on StreamWindow bytes
// of history; Close frees it.
func NewEncoder() *Encoder { return NewEncoderLevel(StreamWindow, Default) }

// NewEncoderLevel returns an Encoder at level l whose stream draws on
// window bytes of history, a power of two from StreamWindow to
// WideWindow; its receiver must decode it with a Decoder of at least that
// window.
func NewEncoderLevel(window int, l Level) *Encoder {
	e := &Encoder{}
	level := zstd.SpeedDefault
	if l == Better {
		level = zstd.SpeedBetterCompression
	}
	// NewWriter fails only on invalid options, which these are not.
	enc, err := zstd.NewWriter(&e.out, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1),
		zstd.WithLowerEncoderMem(true), zstd.WithWindowSize(window))
	if err != nil {
		panic(err)
	}
	e.enc = enc
	return e
}

// Compress returns p compressed as the stream's next payload. The result
// is valid until the next call. The receiver must decompress every
// payload, in order.
func (e *Encoder) Compress(p []byte) ([]byte, error) {
	e.out.Reset()
	if _, err := e.enc.Write(p); err != nil {
		return nil, err
	}
	if err := e.enc.Flush(); err != nil {
		return nil, err
	}
	return e.out.Bytes(), nil
}

// Close frees the Encoder.
func (e *Encoder) Close() { e.enc.Close() }

// Decoder decompresses the payloads of an Encoder's stream, in order. It is
// not safe for concurrent use.
type Decoder struct {
	dec *zstd.Decoder
	in  payload
	max int
	err error
}

// NewDecoder returns a Decoder of payloads of at most limit bytes each,
// of a stream that draws on StreamWindow bytes of history; Close frees it.
func NewDecoder(limit int) *Decoder { return NewDecoderWindow(limit, StreamWindow) }

// NewDecoderWindow is NewDecoder for a stream that draws on window bytes
// of history; it refuses a stream that declares more.
func NewDecoderWindow(limit, window int) *Decoder {
	d := &Decoder{max: limit}
	// Decoding in the calling goroutine reads a block only when its bytes
	// are wanted, so it never asks for a payload that has not arrived.
	dec, err := zstd.NewReader(&d.in, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(uint64(window)), zstd.WithDecoderMaxMemory(uint64(max(limit, window))))
	if err != nil {
		panic(err)
	}
	d.dec = dec
	return d
}

// errNoInput is what the decoder meets if a payload ends mid-block.
var errNoInput = errors.New("the payload ends within a block")

// Decompress returns the stream's next payload, of size bytes once
// decompressed, from its compressed bytes p. It fails with KindInvalid,
// and so does every later call, if size is beyond the Decoder's bound, p
// is not a whole number of the stream's blocks or holds fewer than size
// bytes. (A size below what p holds leaves the rest to come first in the
// next payload: the sender garbles its own stream, as with any wrong
// content it sends.)
func (d *Decoder) Decompress(p []byte, size int) ([]byte, error) {
	const op = "zwire.Decompress"
	if d.err != nil {
		return nil, d.err
	}
	if size < 0 || size > d.max {
		d.err = ferry.E(op, "", ferry.KindInvalid, "a payload beyond the bound")
		return nil, d.err
	}
	d.in.b = p
	out := make([]byte, size)
	if _, err := io.ReadFull(d.dec, out); err != nil {
		d.err = ferry.E(op, "", ferry.KindInvalid, err)
		return nil, d.err
	}
	if len(d.in.b) > 0 {
		d.err = ferry.E(op, "", ferry.KindInvalid, "a payload longer than its content")
		return nil, d.err
	}
	return out, nil
}

// Close frees the Decoder.
func (d *Decoder) Close() { d.dec.Close() }

// payload is the compressed bytes of the payload being decompressed.
type payload struct{ b []byte }

func (p *payload) Read(b []byte) (int, error) {
	if len(p.b) == 0 {
		return 0, errNoInput
	}
	n := copy(b, p.b)
	p.b = p.b[n:]
	return n, nil
}
