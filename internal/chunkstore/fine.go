package chunkstore

import (
	"io"
	"os"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/local"
)

// Fine deltas. A chunk the server lacks in a put over an existing file is
// most often an edited version of one of that file's chunks, of which an
// edit changed a few hundred bytes. So the client may list the chunk's
// pieces (chunk.Fine, about 1 KiB) instead of sending it; the server takes
// the pieces the version being replaced holds from there, and the client
// sends the rest. Every piece is checked against its hash when it is taken,
// and every chunk against its own once its pieces are all there, so a
// source that changed meanwhile, or a client whose list lies, costs a
// refusal, never a wrong file.

// fineMax bounds the version being replaced that the server cuts into
// pieces: cutting reads it all (about a millisecond per MiB here) and its
// map of pieces takes some 50 bytes per KiB.
const fineMax = 64 << 20

// fine is a Put's state of fine deltas.
type fine struct {
	src  *os.File                 // The version being replaced, or nil.
	have map[chunk.Hash]chunk.Ref // The pieces of src, by hash.
	// got holds where in the temporary file each piece that arrived was
	// written, a source for the pieces of later chunks.
	got map[chunk.Hash]int64
	// left counts the pieces each chunk being assembled (by its index in
	// the list) still lacks.
	left map[int]int
	// asked holds where each piece asked of the client goes.
	asked map[chunk.Hash][]place
	buf   []byte
}

// place is where a piece goes: into the chunk at index i of the list, at
// off in the file.
type place struct {
	i   int
	off int64
	n   int
}

// FineSource prepares the version of the file the put replaces as a source
// of pieces and reports whether there is one: a regular file of at most
// fineMax bytes that Allowed lets the caller read. Only then may the put
// take AddPieces.
func (u *Put) FineSource() bool {
	if u.fine != nil {
		return u.fine.src != nil
	}
	u.fine = &fine{got: map[chunk.Hash]int64{}, left: map[int]int{}, asked: map[chunk.Hash][]place{}}
	if u.t.Allowed != nil && !u.t.Allowed(u.path) {
		return false
	}
	f, fi, err := local.OpenRegular(u.t.root, u.path[1:])
	if err != nil {
		return false
	}
	if fi.Size() == 0 || fi.Size() > fineMax {
		f.Close()
		return false
	}
	have := map[chunk.Hash]chunk.Ref{}
	err = chunk.Refs(io.NewSectionReader(f, 0, fi.Size()), chunk.Fine, func(r chunk.Ref, _ []byte) error {
		if _, ok := have[r.Hash]; !ok {
			have[r.Hash] = r
		}
		return u.ctx.Err()
	})
	if err != nil {
		f.Close()
		return false
	}
	u.fine.src, u.fine.have = f, have
	return true
}

// closeFine closes the source of pieces, if any.
func (u *Put) closeFine() {
	if u.fine != nil && u.fine.src != nil {
		u.fine.src.Close()
		u.fine.src = nil
	}
}

// AddPieces takes the fine list of the listed chunk h, which the server
// lacks: the hashes and sizes of its pieces, in order. It writes the pieces
// it finds (in the version being replaced, or among pieces that arrived
// for other chunks), read back and checked, and returns the indexes in the
// fine list of the others, which the client then sends with WritePiece. A
// chunk already there needs nothing. It fails with KindInvalid before
// FineSource said yes, if h is not in the list or its pieces were listed
// already, or if the sizes do not add up to the chunk's.
func (u *Put) AddPieces(h chunk.Hash, hashes []chunk.Hash, sizes []int) ([]int, error) {
	const op = "chunkstore.Put"
	if u.fine == nil || u.fine.src == nil {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "pieces before the server took them")
	}
	at, ok := u.where[h]
	if !ok {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "pieces of chunk "+h.String()+", which is not in the list")
	}
	if !u.asked[h] {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "pieces of chunk "+h.String()+" before the server asked for it")
	}
	i := at[0]
	if u.filled[i] {
		return nil, nil
	}
	if _, ok := u.fine.left[i]; ok {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "pieces of chunk "+h.String()+" listed twice")
	}
	if len(hashes) != len(sizes) {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "as many hashes as sizes needed")
	}
	total := 0
	for _, n := range sizes {
		if n <= 0 || n > u.refs[i].Len {
			return nil, ferry.E(op, u.path, ferry.KindInvalid, "a piece larger than its chunk")
		}
		total += n
	}
	if total != u.refs[i].Len {
		return nil, ferry.E(op, u.path, ferry.KindInvalid, "pieces do not add up to their chunk")
	}
	var need []int
	left := 0
	off := u.refs[i].Off
	for j, ph := range hashes {
		n := sizes[j]
		found, err := u.pieceAt(ph, n, off)
		if err != nil {
			return nil, err
		}
		if !found {
			need = append(need, j)
			u.fine.asked[ph] = append(u.fine.asked[ph], place{i: i, off: off, n: n})
			left++
		}
		off += int64(n)
	}
	u.fine.left[i] = left
	if left == 0 {
		return nil, u.assembled(i)
	}
	return need, nil
}

// pieceAt writes the piece ph of n bytes at off if the version being
// replaced or a piece that arrived holds it with those bytes.
func (u *Put) pieceAt(ph chunk.Hash, n int, off int64) (bool, error) {
	var (
		from io.ReaderAt
		at   int64
	)
	if r, ok := u.fine.have[ph]; ok && r.Len == n {
		from, at = u.fine.src, r.Off
	} else if o, ok := u.fine.got[ph]; ok {
		from, at = u.f, o
	} else {
		return false, nil
	}
	if cap(u.fine.buf) < n {
		u.fine.buf = make([]byte, n)
	}
	b := u.fine.buf[:n]
	if _, err := from.ReadAt(b, at); err != nil || chunk.Sum(b) != ph {
		return false, nil // Changed since it was cut: ask the client.
	}
	if _, err := u.f.WriteAt(b, off); err != nil {
		return false, ferry.FromOS("chunkstore.Put", u.path, err)
	}
	return true, nil
}

// WritePiece supplies the bytes of a piece AddPieces asked for; a piece
// that arrived already is taken again without a word, since two chunks
// listed before it arrived both asked for it. Bytes that do not hash to ph,
// or a piece never asked for, fail with KindInvalid.
func (u *Put) WritePiece(ph chunk.Hash, data []byte) error {
	const op = "chunkstore.Put"
	var places []place
	if u.fine != nil {
		places = u.fine.asked[ph]
	}
	if len(places) == 0 {
		if _, ok := u.fine.got[ph]; ok {
			// Asked for again by a chunk listed before it arrived.
			return nil
		}
		return ferry.E(op, u.path, ferry.KindInvalid, "piece "+ph.String()+" was not asked for")
	}
	if chunk.Sum(data) != ph {
		return ferry.E(op, u.path, ferry.KindInvalid, "piece "+ph.String()+": bytes do not match the hash")
	}
	for _, pl := range places {
		if pl.n != len(data) {
			return ferry.E(op, u.path, ferry.KindInvalid, "piece "+ph.String()+": listed with another size")
		}
	}
	delete(u.fine.asked, ph)
	u.fine.got[ph] = places[0].off
	for _, pl := range places {
		if u.filled[pl.i] {
			continue // The chunk came whole meanwhile.
		}
		if _, err := u.f.WriteAt(data, pl.off); err != nil {
			return ferry.FromOS(op, u.path, err)
		}
		if u.fine.left[pl.i]--; u.fine.left[pl.i] == 0 {
			if err := u.assembled(pl.i); err != nil {
				return err
			}
		}
	}
	return nil
}

// assembled checks the chunk at index i, whose pieces are all written, and
// fills every other place of it.
func (u *Put) assembled(i int) error {
	r := u.refs[i]
	if u.filled[i] {
		return nil
	}
	b := make([]byte, r.Len)
	if _, err := u.f.ReadAt(b, r.Off); err != nil {
		return ferry.FromOS("chunkstore.Put", u.path, err)
	}
	if chunk.Sum(b) != r.Hash {
		return ferry.E("chunkstore.Put", u.path, ferry.KindInvalid, "the pieces of chunk "+r.Hash.String()+" do not make it")
	}
	return u.fill(r.Hash, b)
}
