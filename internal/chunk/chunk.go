// Package chunk cuts byte streams into content-defined chunks and names each
// chunk by its BLAKE3 hash, so that two versions of a file share every chunk
// that an edit did not touch (the LBFS idea).
//
// Boundaries come from FastCDC (Xia et al., 2016): a gear rolling hash over
// the last 64 bytes, tested against a stricter mask before the average size
// and a looser one after it ("normalized chunking"), which pulls chunk sizes
// towards the average. No boundary is taken before Params.Min bytes and one
// is forced at Params.Max, so a pathological input (a long run of zeros, a
// short repeating pattern) costs chunks of Max bytes, never tiny ones.
//
// The gear table, the masks, Default and Fine are part of the wire protocol: two
// sides that cut the same bytes must find the same boundaries to share
// chunks. Changing any of them needs a new Version.
package chunk

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strings"

	"github.com/zeebo/blake3"
)

// Version names the chunking scheme (gear table, masks, Default, Fine). Peers
// exchange it and share chunk hashes only when theirs match.
const Version = 1

// Params are the minimum, average and maximum chunk sizes in bytes. Avg must
// be a power of two, and Min <= Avg <= Max.
type Params struct {
	Min, Avg, Max int
}

// Default is the chunking every Ferry peer uses: 2 KiB minimum, 8 KiB
// average, 64 KiB maximum, LBFS's sizes. TestMeasureParams compared
// candidates on this machine's data (bytes sent = missing chunks + a 38-byte
// list entry per chunk):
//
//	min/avg/max  5 module upgrades   one-line edit, 897 KB file  chunks/MiB of go/src
//	1/4/16 KiB   21.48 of 36.76 MB   12.8 KB                     274
//	2/8/64 KiB   22.12 MB            14.8 KB                     173
//	4/16/64 KiB  22.60 MB            24.3 KB                     126
//	8/32/128 KiB 23.16 MB            46.0 KB                     104
//	16/64/256    23.52 MB            92.4 KB                     96
//
// 2/8/64 sends within 3% of 1/4/16 on upgrades and 2 KB more per edit, with
// 37% fewer chunks to index, list and fetch; larger sizes lose on edits fast.
var Default = Params{Min: 2 << 10, Avg: 8 << 10, Max: 64 << 10}

// Fine cuts a chunk into pieces, for sending a changed chunk as the few
// pieces an edit touched while the receiver finds the rest in the version
// it holds (chunkstore.Put.AddPieces). Pieces are listed only for chunks the
// receiver lacks, so their 36-byte list entries cost little; at 1 KiB they
// come near rsync's blocks (about 700 bytes for files of tens of KiB). It
// is part of the protocol as Default is.
var Fine = Params{Min: 256, Avg: 1 << 10, Max: 8 << 10}

// MaxSize is the largest Max that Check accepts, so a chunk always fits in
// one wire message.
const MaxSize = 1 << 20

// Check reports whether p is usable.
func (p Params) Check() error {
	switch {
	case p.Min < 64 || p.Max > MaxSize:
		return fmt.Errorf("chunk: sizes must lie in [64, %d]: %+v", MaxSize, p)
	case p.Avg&(p.Avg-1) != 0:
		return fmt.Errorf("chunk: average %d is not a power of two", p.Avg)
	case p.Min > p.Avg || p.Avg > p.Max:
		return fmt.Errorf("chunk: want min <= avg <= max: %+v", p)
	}
	return nil
}

// masks returns the strict (before Avg) and loose (after Avg) masks of
// normalized chunking at level 2: two bits more and two bits fewer than
// log2(Avg). The one bits sit just below the top bit, where each bit of the
// gear hash depends on the most input bytes; the top bit stays out so that
// cut can test a hash shifted left by one (mask<<1 then tests exactly the
// same bits).
func (p Params) masks() (strict, loose uint64) {
	b := bits.Len(uint(p.Avg)) - 1
	hi := func(n int) uint64 {
		n = min(max(n, 0), 63)
		return (^uint64(0) << (64 - n)) >> 1
	}
	return hi(b + normLevel), hi(b - normLevel)
}

// normLevel is the normalization level of FastCDC: level 2 concentrates sizes
// near Avg, so an edit rewrites less (measured: 10.4 KB sent per one-byte edit
// of random data against 13.4 KB at level 1 and 15.7 KB at level 0).
const normLevel = 2

// gear is the table of the gear hash: 256 fixed pseudo-random words from
// splitmix64 with a fixed seed. It must never change within a Version.
// gearLS is gear shifted left by one.
var gear, gearLS = func() (g, ls [256]uint64) {
	x := uint64(0x6665727279636463) // "ferrycdc"
	for i := range g {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		g[i] = z ^ z>>31
		ls[i] = g[i] << 1
	}
	return g, ls
}()

// Cut returns the length of the first chunk of b. If b is shorter than Max
// and more data follows it, the answer may be wrong: callers pass at least
// Max bytes, or the rest of the input.
func (p Params) Cut(b []byte) int {
	strict, loose := p.masks()
	return cut(b, p.Min, p.Avg, p.Max, strict, loose)
}

// cut finds the first boundary in b. The gear hash after byte i is
// h(i) = h(i-1)<<1 + gear[b[i]]; a boundary follows byte i if h(i)&mask is
// zero. The loops take two bytes a step (FastCDC 2020's "rolling two bytes"):
// h(i)<<1 = h(i-1)<<2 + gearLS[b[i]] is tested against mask<<1, and adding
// gear[b[i+1]] gives h(i+1), one shift fewer per byte with the same
// boundaries.
func cut(b []byte, lo, avg, hi int, strict, loose uint64) int {
	n := len(b)
	if n <= lo {
		return n
	}
	if n > hi {
		n = hi
	}
	mid := min(avg, n)
	b = b[:n]
	var h uint64
	i := lo
	for s2 := strict << 1; i+1 < mid; i += 2 {
		h = h<<2 + gearLS[b[i]]
		if h&s2 == 0 {
			return i + 1
		}
		h += gear[b[i+1]]
		if h&strict == 0 {
			return i + 2
		}
	}
	if i < mid {
		h = h<<1 + gear[b[i]]
		if h&strict == 0 {
			return i + 1
		}
		i++
	}
	for l2 := loose << 1; i+1 < n; i += 2 {
		h = h<<2 + gearLS[b[i]]
		if h&l2 == 0 {
			return i + 1
		}
		h += gear[b[i+1]]
		if h&loose == 0 {
			return i + 2
		}
	}
	if i < n {
		h = h<<1 + gear[b[i]]
		if h&loose == 0 {
			return i + 1
		}
	}
	return n
}

// HashSize is the length of a Hash in bytes.
const HashSize = 32

// Hash is the BLAKE3-256 hash of a chunk's bytes, which names the chunk.
type Hash [HashSize]byte

// Sum returns the hash of b.
func Sum(b []byte) Hash { return Hash(blake3.Sum256(b)) }

// String returns "blake3:" and the hash in hex, the form of ferry.AttrHash.
func (h Hash) String() string { return "blake3:" + hex.EncodeToString(h[:]) }

// ParseHash parses the String form of a Hash.
func ParseHash(s string) (Hash, error) {
	var h Hash
	hx, ok := strings.CutPrefix(s, "blake3:")
	if !ok || len(hx) != 2*HashSize {
		return h, fmt.Errorf("chunk: malformed hash %q", s)
	}
	if _, err := hex.Decode(h[:], []byte(hx)); err != nil {
		return h, fmt.Errorf("chunk: malformed hash %q", s)
	}
	return h, nil
}

// FromBytes returns the Hash in b, which must be HashSize bytes long.
func FromBytes(b []byte) (Hash, error) {
	var h Hash
	if len(b) != HashSize {
		return h, fmt.Errorf("chunk: hash of %d bytes, want %d", len(b), HashSize)
	}
	copy(h[:], b)
	return h, nil
}

// Ref describes one chunk of a stream: where it lies and what it hashes to.
type Ref struct {
	Hash Hash
	Off  int64 // Off is the offset of the chunk's first byte in the stream.
	Len  int   // Len is the chunk's length; 0 only for an empty stream's lack of chunks.
}

// Chunker cuts a stream into chunks as it reads it, holding at most a few
// times Params.Max bytes.
type Chunker struct {
	r    io.Reader
	p    Params
	buf  []byte
	lo   int // buf[lo:hi] is read but not yet returned.
	hi   int
	off  int64
	eof  bool
	err  error
	s, l uint64
}

// bufSize is the Chunker's buffer: large reads, and room for a whole chunk.
func bufSize(p Params) int { return max(4*p.Max, 1<<20) }

// NewChunker returns a Chunker over r with params p, which must pass Check.
func NewChunker(r io.Reader, p Params) *Chunker {
	c := &Chunker{r: r, p: p, buf: make([]byte, bufSize(p))}
	c.s, c.l = p.masks()
	return c
}

// Next returns the next chunk and its offset in the stream. The data is
// owned by the Chunker and valid until the next call. At the end of the
// stream Next returns io.EOF; a read error ends the stream with that error.
// An empty stream has no chunks.
func (c *Chunker) Next() (data []byte, off int64, err error) {
	if c.hi-c.lo < c.p.Max && !c.eof {
		c.fill()
	}
	if c.hi == c.lo {
		if c.err != nil {
			return nil, c.off, c.err
		}
		return nil, c.off, io.EOF
	}
	n := cut(c.buf[c.lo:c.hi], c.p.Min, c.p.Avg, c.p.Max, c.s, c.l)
	data, off = c.buf[c.lo:c.lo+n], c.off
	c.lo += n
	c.off += int64(n)
	return data, off, nil
}

// fill moves the unread bytes to the front and reads until the buffer is
// full or the stream ends.
func (c *Chunker) fill() {
	if c.lo > 0 {
		c.hi = copy(c.buf, c.buf[c.lo:c.hi])
		c.lo = 0
	}
	for c.hi < len(c.buf) && !c.eof {
		n, err := c.r.Read(c.buf[c.hi:])
		c.hi += n
		if err != nil {
			c.eof = true
			if !errors.Is(err, io.EOF) {
				c.err = err
			}
		}
	}
}

// Refs reads r to its end and calls fn with the Ref and bytes of each chunk
// in order; the bytes are valid only during the call. It stops at the first
// error fn returns and returns it.
func Refs(r io.Reader, p Params, fn func(ref Ref, data []byte) error) error {
	if err := p.Check(); err != nil {
		return err
	}
	c := NewChunker(r, p)
	for {
		data, off, err := c.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(Ref{Hash: Sum(data), Off: off, Len: len(data)}, data); err != nil {
			return err
		}
	}
}

// List returns the Refs of all of r's chunks.
func List(r io.Reader, p Params) ([]Ref, error) {
	var refs []Ref
	err := Refs(r, p, func(ref Ref, _ []byte) error {
		refs = append(refs, ref)
		return nil
	})
	return refs, err
}
