package proto

import (
	"bytes"
	"slices"
	"testing"

	"github.com/ferryfs/ferry/internal/chunk"
)

// FuzzUnpackRefs: a chunk list from the wire is refused or decodes to
// what packs back to the same bytes, and a list longer than the limit
// asked for is refused.
func FuzzUnpackRefs(f *testing.F) {
	f.Add(make([]byte, 64), []byte{1, 2})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, hashes []byte, sizes []byte) {
		m := &ChunkRefs{Hashes: hashes}
		for _, s := range sizes {
			m.Sizes = append(m.Sizes, uint32(s)<<10)
		}
		hs, ss, err := UnpackRefs(m)
		if err != nil {
			return
		}
		if _, _, err := UnpackRefsMax(m, len(hs)-1); len(hs) > 0 && err == nil {
			t.Fatalf("%d refs taken under a limit of %d", len(hs), len(hs)-1)
		}
		refs := make([]chunk.Ref, len(hs))
		for i := range hs {
			refs[i] = chunk.Ref{Hash: hs[i], Len: ss[i]}
		}
		back := PackRefs(refs)
		if !bytes.Equal(back.Hashes, m.Hashes) || len(back.Sizes) != len(m.Sizes) {
			t.Fatal("round trip differs")
		}
		UnpackHashes(hashes)
	})
}

// FuzzUnpackHashes: any bytes decode without panicking; a whole number of
// hashes, up to MaxRefs, decodes to exactly those hashes, and anything else
// is refused.
func FuzzUnpackHashes(f *testing.F) {
	h := chunk.Sum([]byte("x"))
	f.Add(h[:])
	f.Add(append(h[:], 1, 2))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := UnpackHashes(b)
		if len(b)%chunk.HashSize != 0 || len(b)/chunk.HashSize > MaxRefs {
			if err == nil {
				t.Fatalf("%d bytes read as %d hashes", len(b), len(hs))
			}
			return
		}
		if err != nil || len(hs)*chunk.HashSize != len(b) {
			t.Fatalf("%d bytes: %d hashes, %v", len(b), len(hs), err)
		}
		for i, x := range hs {
			if !bytes.Equal(x[:], b[i*chunk.HashSize:(i+1)*chunk.HashSize]) {
				t.Fatalf("hash %d differs from its bytes", i)
			}
		}
	})
}

// FuzzUnpackIndexes: positions from the wire decode to themselves when all
// fall within the list, are refused when one does not, and pack back to
// what came.
func FuzzUnpackIndexes(f *testing.F) {
	f.Add([]byte{0, 1, 2}, 3)
	f.Add([]byte{5}, 5)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		in := make([]uint32, len(b)/4)
		for i := range in {
			in[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
		}
		is, err := UnpackIndexes(in, n)
		beyond := false
		for _, x := range in {
			beyond = beyond || int64(x) >= int64(n)
		}
		if beyond != (err != nil) {
			t.Fatalf("positions %v in a list of %d: %v", in, n, err)
		}
		if err == nil && !slices.Equal(PackIndexes(is), in) {
			t.Fatalf("positions %v came back as %v", in, PackIndexes(is))
		}
	})
}
