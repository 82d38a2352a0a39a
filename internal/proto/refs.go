package proto

import (
	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
)

// PackRefs returns refs as a wire ChunkRefs.
func PackRefs(refs []chunk.Ref) *ChunkRefs {
	m := &ChunkRefs{Hashes: make([]byte, 0, len(refs)*chunk.HashSize), Sizes: make([]uint32, 0, len(refs))}
	for _, r := range refs {
		m.Hashes = append(m.Hashes, r.Hash[:]...)
		m.Sizes = append(m.Sizes, uint32(r.Len))
	}
	return m
}

// UnpackRefs decodes a wire ChunkRefs. It fails with KindInvalid if the
// hashes and sizes do not pair up, a size is 0 or above chunk.MaxSize, or
// there are more than MaxRefs.
func UnpackRefs(m *ChunkRefs) ([]chunk.Hash, []int, error) {
	return UnpackRefsMax(m, MaxRefs)
}

// UnpackRefsMax is UnpackRefs taking up to limit refs, for the calls that
// carry a whole file's list.
func UnpackRefsMax(m *ChunkRefs, limit int) ([]chunk.Hash, []int, error) {
	const op = "proto.UnpackRefs"
	if m == nil {
		return nil, nil, nil
	}
	n := len(m.Sizes)
	if len(m.Hashes) != n*chunk.HashSize || n > limit {
		return nil, nil, ferry.E(op, "", ferry.KindInvalid, "malformed chunk list")
	}
	hs, sizes := make([]chunk.Hash, n), make([]int, n)
	for i, s := range m.Sizes {
		if s == 0 || s > chunk.MaxSize {
			return nil, nil, ferry.E(op, "", ferry.KindInvalid, "chunk size out of range")
		}
		copy(hs[i][:], m.Hashes[i*chunk.HashSize:])
		sizes[i] = int(s)
	}
	return hs, sizes, nil
}

// UnpackHashes decodes hashes sent back to back; at most MaxRefs.
func UnpackHashes(b []byte) ([]chunk.Hash, error) {
	if len(b)%chunk.HashSize != 0 || len(b)/chunk.HashSize > MaxRefs {
		return nil, ferry.E("proto.UnpackHashes", "", ferry.KindInvalid, "malformed hash list")
	}
	hs := make([]chunk.Hash, len(b)/chunk.HashSize)
	for i := range hs {
		copy(hs[i][:], b[i*chunk.HashSize:])
	}
	return hs, nil
}

// PackIndexes returns positions in a chunk list as sent: the chunks a
// put's receiver needs, the pieces of a fine list it lacks, the chunks a
// replica member fetches.
func PackIndexes(is []int) []uint32 {
	out := make([]uint32, len(is))
	for i, x := range is {
		out[i] = uint32(x)
	}
	return out
}

// UnpackIndexes decodes positions received in a list of n chunks. It fails
// with KindInvalid if one is beyond the list.
func UnpackIndexes(is []uint32, n int) ([]int, error) {
	out := make([]int, len(is))
	for i, x := range is {
		if int64(x) >= int64(n) {
			return nil, ferry.E("proto.UnpackIndexes", "", ferry.KindInvalid, "a position beyond the chunk list")
		}
		out[i] = int(x)
	}
	return out, nil
}
