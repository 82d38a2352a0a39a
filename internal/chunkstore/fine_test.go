package chunkstore_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/remote"
)

// TestPutFine: a put over a file the server holds sends a changed chunk as
// the pieces of it that changed, not whole, and the file is the new one;
// a client that does not take fine lists sends whole chunks, more bytes.
func TestPutFine(t *testing.T) {
	e := start(t, 0)
	whole := startWith(t, 0, setup{client: func(c *remote.Config) { c.NoFine = true }})
	ctx := ctxT(t)
	doc := document(1 << 20)
	edited := editLine(doc, 5000, "one changed line")
	edited = editLine(edited, 9000, "and another, further on")
	sent := map[string]remote.ChunkStats{}
	for name, env := range map[string]*env{"fine": e, "whole": whole} {
		if _, _, err := env.c.PutChunked(ctx, "/doc", nil, bytes.NewReader(doc), int64(len(doc)), nil); err != nil {
			t.Fatal(err)
		}
		_, st, err := env.c.PutChunked(ctx, "/doc", ferry.Dir{ferry.AttrMode: "0600"}, bytes.NewReader(edited), int64(len(edited)), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := env.read(t, "doc"); !bytes.Equal(got, edited) {
			t.Fatalf("%s: the server holds %d bytes, equal %v; want the edited %d", name, len(got), bytes.Equal(got, edited), len(edited))
		}
		if tmp := env.temps(); len(tmp) > 0 {
			t.Errorf("%s: temporary files left: %v", name, tmp)
		}
		sent[name] = st
		t.Logf("%s: %+v", name, st)
	}
	f, w := sent["fine"], sent["whole"]
	if f.FineLists == 0 || f.SentChunks != 0 || f.SentPieces == 0 {
		t.Errorf("fine put: %+v; want the changed chunks as fine lists and pieces, no whole chunk", f)
	}
	if w.FineLists != 0 || w.SentChunks == 0 {
		t.Errorf("put without fine lists: %+v; want whole chunks", w)
	}
	// Each edit touches a piece or two of about 1 KiB where a chunk is
	// about 8 KiB.
	if f.SentBytes*3 > w.SentBytes || f.SentBytes > 4*int64(chunk.Fine.Max) {
		t.Errorf("fine put sent %d bytes of data, whole chunks %d; want under a third", f.SentBytes, w.SentBytes)
	}
}

// TestPutFineNoSource: a put of a new file, or over one the server cannot
// use as a source, sends whole chunks.
func TestPutFineNoSource(t *testing.T) {
	e := start(t, 0)
	ctx := ctxT(t)
	doc := document(256 << 10)
	_, st, err := e.c.PutChunked(ctx, "/new", nil, bytes.NewReader(doc), int64(len(doc)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.FineLists != 0 || st.SentBytes != int64(len(doc)) || !bytes.Equal(e.read(t, "new"), doc) {
		t.Errorf("put of a new file: %+v; want every chunk whole", st)
	}
	// An empty old version holds no pieces.
	e.write(t, "empty", nil)
	if _, st, err = e.c.PutChunked(ctx, "/empty", nil, bytes.NewReader(doc), int64(len(doc)), nil); err != nil || st.FineLists != 0 {
		t.Errorf("put over an empty file: %+v, %v; want whole chunks", st, err)
	}
}

// TestPutFineSharedPiece: two new chunks share a piece the server lacks;
// both fine lists ask for it before it arrives, the client sends it for
// each, and the put commits the right bytes.
func TestPutFineSharedPiece(t *testing.T) {
	e := start(t, 0)
	e.write(t, "f", []byte("the old content, nothing like the new"))
	raw := e.raw(t)
	ctx := ctxT(t)
	p, x1, x2 := []byte("a shared new piece"), []byte("then one tail"), []byte("and another tail")
	a, b := append(append([]byte{}, p...), x1...), append(append([]byte{}, p...), x2...)
	ref := func(d []byte) chunk.Ref { return chunk.Ref{Hash: chunk.Sum(d), Len: len(d)} }
	ha, hb, hp, h1, h2 := chunk.Sum(a), chunk.Sum(b), chunk.Sum(p), chunk.Sum(x1), chunk.Sum(x2)
	st, err := raw.PutChunked(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*proto.ChunkPutMsg{
		{Path: "/f", Dir: &proto.Dir{}, Size: int64(len(a) + len(b)), ChunkVersion: chunk.Version, FineOk: true,
			Refs: proto.PackRefs([]chunk.Ref{ref(a), ref(b)}), ListEnd: true},
		{Hash: ha[:], Fine: proto.PackRefs([]chunk.Ref{ref(p), ref(x1)})},
		{Hash: hb[:], Fine: proto.PackRefs([]chunk.Ref{ref(p), ref(x2)})},
		{Hash: hp[:], Data: p, Piece: true},
		{Hash: h1[:], Data: x1, Piece: true},
		{Hash: hp[:], Data: p, Piece: true},
		{Hash: h2[:], Data: x2, Piece: true},
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	st.CloseSend()
	var committed bool
	for {
		r, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("put: %v", proto.FromStatus("", "", err))
		}
		committed = committed || r.Dir != nil
	}
	if want := append(append([]byte{}, a...), b...); !committed || !bytes.Equal(e.read(t, "f"), want) {
		t.Errorf("committed %v, file %q; want %q", committed, e.read(t, "f"), want)
	}
}

// FuzzFinePut feeds a fine put whatever pieces a client might describe:
// cut at arbitrary sizes, some lying about their hashes, some sent with
// wrong bytes. The put must never panic, and whatever it commits must be
// the new content.
func FuzzFinePut(f *testing.F) {
	f.Add([]byte("the old version of the file, mostly the same"), []byte("the new version of the file, mostly the same"), []byte{10, 20, 0, 7}, byte(0))
	f.Add([]byte("x"), []byte("abcdefghij"), []byte{3, 3, 3, 1}, byte(5))
	f.Add([]byte("the old version of the file, mostly the same"), []byte("the new version of the file, mostly the same"), []byte{10, 20, 30}, byte(0))
	f.Fuzz(func(t *testing.T, old, data, cuts []byte, lies byte) {
		if len(data) == 0 || len(old) == 0 || len(data) > 64<<10 {
			return
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "f"), old, 0o644); err != nil {
			t.Fatal(err)
		}
		tree, u := beginPut(t, dir, int64(len(data)))
		h := chunk.Sum(data)
		if err := u.AddRefs([]chunk.Hash{h}, []int{len(data)}); err != nil {
			t.Fatal(err)
		}
		need, err := u.EndList()
		if err != nil || len(need) != 1 || !u.FineSource() {
			return
		}
		// Pieces: cut where cuts say (a zero cut is a bad size), the
		// rest in one; every lies-th piece lies about its hash.
		var hashes []chunk.Hash
		var sizes []int
		var pieces [][]byte
		rest := data
		for i, c := range cuts {
			n := min(int(c), len(rest))
			if i == len(cuts)-1 || n == len(rest) {
				n = len(rest)
			}
			p := rest[:n]
			ph := chunk.Sum(p)
			if lies != 0 && i%int(lies) == 0 {
				ph[0] ^= 1
			}
			hashes, sizes, pieces = append(hashes, ph), append(sizes, n), append(pieces, p)
			if rest = rest[n:]; len(rest) == 0 {
				break
			}
		}
		want, err := u.AddPieces(h, hashes, sizes)
		if err != nil {
			return
		}
		for _, j := range want {
			if j < 0 || j >= len(pieces) {
				t.Fatalf("asked for piece %d of %d", j, len(pieces))
			}
			if err := u.WritePiece(hashes[j], pieces[j]); err != nil {
				return
			}
		}
		if !u.Complete() {
			return
		}
		if _, err := u.Commit(tree); err != nil {
			t.Fatalf("a complete put did not commit: %v", err)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "f"))
		if !bytes.Equal(got, data) {
			t.Fatalf("committed %q, want %q", got, data)
		}
	})
}

// FuzzPutList sends a put's list in pieces of any size, asks what each
// needs as it arrives (Need), and sends some chunks unasked in between, the
// way a client may; the list is made of a few blocks in any order, so
// hashes repeat across pieces. Sending each chunk the answers asked for,
// once per hash, must complete the put with the right content, and nothing
// may panic.
func FuzzPutList(f *testing.F) {
	f.Add([]byte("abc"), []byte{0, 1, 0, 2, 0, 1}, []byte{1, 0, 2, 1, 3})
	f.Add([]byte("x"), []byte{0, 0, 0, 0}, []byte{1, 3, 1, 1})
	f.Add([]byte("a block"), []byte{2, 1, 2, 1, 0, 0}, []byte{2, 7, 1, 0, 9, 1})
	f.Fuzz(func(t *testing.T, seed, order, ops []byte) {
		if len(seed) == 0 || len(order) == 0 || len(order) > 64 || len(ops) > 64 {
			return
		}
		var blocks [][]byte
		for k := range 4 {
			blocks = append(blocks, append(bytes.Clone(seed), byte(k)))
		}
		var refs []chunk.Ref
		var data [][]byte
		var content []byte
		for _, o := range order {
			b := blocks[int(o)%len(blocks)]
			refs = append(refs, chunk.Ref{Hash: chunk.Sum(b), Off: int64(len(content)), Len: len(b)})
			data = append(data, b)
			content = append(content, b...)
		}
		dir := t.TempDir()
		tree, u := beginPut(t, dir, int64(len(content)))
		listed := 0
		sent := map[chunk.Hash]bool{}
		send := func(i int) {
			if !sent[refs[i].Hash] {
				sent[refs[i].Hash] = true
				if err := u.Write(refs[i].Hash, data[i]); err != nil {
					t.Fatalf("writing listed chunk %d: %v", i, err)
				}
			}
		}
		ask := func(need []int) {
			for _, i := range need {
				if i < 0 || i >= listed {
					t.Fatalf("asked for chunk %d of %d listed", i, listed)
				}
				send(i)
			}
		}
		list := func(n int) {
			n = min(n, len(refs)-listed)
			hs, sizes := make([]chunk.Hash, n), make([]int, n)
			for j := range n {
				hs[j], sizes[j] = refs[listed+j].Hash, refs[listed+j].Len
			}
			if err := u.AddRefs(hs, sizes); err != nil {
				t.Fatalf("listing %d chunks: %v", n, err)
			}
			listed += n
		}
		for _, op := range ops {
			switch {
			case op%2 == 0 && listed > 0:
				send(int(op/2) % listed) // Unasked, as an optimistic client does.
			default:
				list(int(op/2)%4 + 1)
				need, err := u.Need()
				if err != nil {
					t.Fatal(err)
				}
				ask(need)
			}
		}
		list(len(refs))
		need, err := u.EndList()
		if err != nil {
			t.Fatal(err)
		}
		ask(need)
		if !u.Complete() {
			t.Fatalf("every chunk asked for was sent, but the put is not complete")
		}
		if _, err := u.Commit(tree); err != nil {
			t.Fatalf("a complete put did not commit: %v", err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "f")); !bytes.Equal(got, content) {
			t.Fatalf("committed %q, want %q", got, content)
		}
	})
}

// beginPut begins a put of size bytes at /f of a chunked tree over dir,
// and returns the tree and the put, both ended when the test ends.
func beginPut(t *testing.T, dir string, size int64) (*chunkstore.Tree, *chunkstore.Put) {
	t.Helper()
	lt, err := local.NewServed(dir)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := chunkstore.Open(lt, chunkstore.Options{MaxChunks: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tree.Close() })
	u, err := tree.BeginPut(context.Background(), "/f", ferry.Dir{ferry.AttrType: ferry.TypeFile}, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Abort)
	return tree, u
}
