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
