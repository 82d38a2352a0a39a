package proto

import (
	"bytes"
	"testing"

	"github.com/ferryfs/ferry/internal/chunk"
)

// FuzzUnpackRefs: a chunk list from the wire is refused or decodes to
// what packs back to the same bytes.
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
