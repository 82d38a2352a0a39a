package chunkstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/store"
	"github.com/ferryfs/ferry/internal/zwire"
)

// withCache gives the client an in-memory chunk cache that it closes.
func withCache(t *testing.T) func(*remote.Config) {
	return func(cfg *remote.Config) {
		c, err := store.OpenCache("", 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Cache, cfg.CloseCache = c, true
	}
}

// randomDoc returns about n bytes of lines of base64 noise: text that zstd
// shrinks by only a quarter, so that the bytes saved in these tests are
// chunking's, not compression's.
func randomDoc(n int) []byte {
	raw := make([]byte, n*3/4)
	rand.Read(raw)
	enc := base64.StdEncoding.EncodeToString(raw)
	var b bytes.Buffer
	for len(enc) > 0 {
		k := min(len(enc), 63)
		b.WriteString(enc[:k])
		b.WriteByte('\n')
		enc = enc[k:]
	}
	return b.Bytes()
}

func (e *env) put(t *testing.T, c *remote.Client, p string, b []byte) ferry.Dir {
	t.Helper()
	d, err := c.Put(ctxT(t), p, ferry.Dir{ferry.AttrMode: "0644"}, ferry.Whole, bytes.NewReader(b)).Wait()
	if err != nil {
		t.Fatalf("Put(%s): %v", p, err)
	}
	return d
}

func (e *env) get(t *testing.T, c *remote.Client, p string, off int64) []byte {
	t.Helper()
	r := c.Get(ctxT(t), p, off, -1)
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("Get(%s): %v", p, err)
	}
	return b
}

// TestTransparentPut re-puts a file with one line changed through the
// Tree interface and counts the bytes that go up, TLS included.
func TestTransparentPut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		su    setup
		calls int64 // PutChunked calls expected for the two puts.
	}{
		{"no cache", setup{}, 2},
		{"cache", setup{client: withCache(t)}, 2},
		{"no zstd", setup{noZstd: true, client: func(c *remote.Config) { c.NoZstd = true }}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWith(t, 0, tc.su)
			doc := randomDoc(4 << 20)
			e.put(t, e.c, "/doc", doc)
			edited := editLine(doc, 30000, "one changed line")
			up := e.up.Load()
			e.put(t, e.c, "/doc", edited)
			sent := e.up.Load() - up
			if !bytes.Equal(e.read(t, "doc"), edited) {
				t.Fatal("the server's file differs from what was put")
			}
			if sent > int64(len(doc))/10 {
				t.Errorf("re-put of a one-line edit sent %d bytes, want < 10%% of %d", sent, len(doc))
			}
			if got := e.srv.Calls()["putchunked"]; got != tc.calls {
				t.Errorf("putchunked calls: got %d, want %d", got, tc.calls)
			}
			t.Logf("one-line edit of %d bytes re-put: %d bytes up (%.2f%%); traffic %+v", len(doc), sent, 100*float64(sent)/float64(len(doc)), e.c.Traffic())
		})
	}
}

// TestTransparentGet gets a file whole, edits it on the server's disk, and
// gets it again with a warm cache.
func TestTransparentGet(t *testing.T) {
	e := startWith(t, 0, setup{client: withCache(t)})
	doc := randomDoc(4 << 20)
	e.write(t, "doc", doc)
	if got := e.get(t, e.c, "/doc", 0); !bytes.Equal(got, doc) {
		t.Fatalf("first get: %d bytes, want the file's %d", len(got), len(doc))
	}
	edited := editLine(doc, 12345, "a line changed on the server")
	e.write(t, "doc", edited)
	down := e.down.Load()
	if got := e.get(t, e.c, "/doc", 0); !bytes.Equal(got, edited) {
		t.Fatalf("second get: %d bytes, want the edited file's %d", len(got), len(edited))
	}
	got := e.down.Load() - down
	if got > int64(len(doc))/10 {
		t.Errorf("get after a one-line edit received %d bytes, want < 10%% of %d", got, len(doc))
	}
	t.Logf("one-line server edit of %d bytes, warm get: %d bytes down (%.2f%%)", len(doc), got, 100*float64(got)/float64(len(doc)))
	// A Get from an offset is a plain Get.
	if got := e.get(t, e.c, "/doc", 100); !bytes.Equal(got, edited[100:]) {
		t.Fatal("get from an offset: wrong bytes")
	}
	// Small files come whole with their entry: one call, no chunk stream.
	e.write(t, "small", []byte("small file"))
	rc := e.srv.Calls()["readchunks"]
	if got := e.get(t, e.c, "/small", 0); string(got) != "small file" {
		t.Fatalf("small file: %q", got)
	}
	if n := e.srv.Calls()["readchunks"]; n != rc {
		t.Errorf("a small file opened a chunk stream")
	}
	// Errors come as from a plain Get.
	r := e.c.Get(ctxT(t), "/missing", 0, -1)
	if _, err := io.ReadAll(r); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Errorf("get of a missing file: %v, want KindNotExist", err)
	}
	r.Close()
	r = e.c.Get(ctxT(t), "/", 0, -1)
	if _, err := io.ReadAll(r); !ferry.IsKind(err, ferry.KindIsDir) {
		t.Errorf("get of a directory: %v, want KindIsDir", err)
	}
	r.Close()
}

// TestFallback uses a server that does not serve chunks: the client asks
// once, then uses plain calls.
func TestFallback(t *testing.T) {
	e := startWith(t, 0, setup{plain: true, client: withCache(t)})
	doc := randomDoc(1 << 20)
	e.write(t, "doc", doc)
	for i := 0; i < 2; i++ {
		if got := e.get(t, e.c, "/doc", 0); !bytes.Equal(got, doc) {
			t.Fatalf("get %d: wrong bytes", i)
		}
		e.put(t, e.c, "/copy", doc)
		if !bytes.Equal(e.read(t, "copy"), doc) {
			t.Fatalf("put %d: wrong bytes", i)
		}
	}
	calls := e.srv.Calls()
	if calls["chunklist"]+calls["putchunked"] != 1 || calls["get"] != 2 || calls["put"] != 2 {
		t.Errorf("calls %v: want one chunk call, then plain gets and puts", calls)
	}
}

// TestZstdInterop moves compressible data between every pair of peers
// with and without compression.
func TestZstdInterop(t *testing.T) {
	for _, tc := range []struct {
		name            string
		client, server  bool // Whether each compresses.
		chunks, wantSqz bool
	}{
		{"both", true, true, true, true},
		{"client only", true, false, true, false},
		{"server only", false, true, true, false},
		{"neither", false, false, true, false},
		{"both, plain server", true, true, false, true},
		{"client only, plain server", true, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWith(t, 0, setup{plain: !tc.chunks, noZstd: !tc.server, client: func(c *remote.Config) {
				withCache(t)(c)
				c.NoZstd = !tc.client
			}})
			doc := document(1 << 20)
			// A first small put tells the client whether the server
			// takes compressed data.
			e.put(t, e.c, "/small", []byte("hello"))
			e.put(t, e.c, "/doc", doc)
			if !bytes.Equal(e.read(t, "doc"), doc) {
				t.Fatal("put: wrong bytes on the server")
			}
			e.write(t, "doc2", doc)
			if got := e.get(t, e.c, "/doc2", 0); !bytes.Equal(got, doc) {
				t.Fatal("whole get: wrong bytes")
			}
			if got := e.get(t, e.c, "/doc2", 1000); !bytes.Equal(got, doc[1000:]) {
				t.Fatal("get from an offset: wrong bytes")
			}
			tr := e.c.Traffic()
			squeezed := tr.PutWire < tr.PutBytes/2 && tr.GetWire < tr.GetBytes/2
			if squeezed != tc.wantSqz {
				t.Errorf("traffic %+v: compressed %v, want %v", tr, squeezed, tc.wantSqz)
			}
			// Batched puts, as ferry sync makes them: an edit and a new file.
			batch := e.c.PutBatch(ctxT(t))
			edited, other := editLine(doc, 500, "edited"), document(200<<10)
			f1 := batch.Replace(ctxT(t), "/doc", nil, io.NewSectionReader(bytes.NewReader(edited), 0, int64(len(edited))))
			f2 := batch.Replace(ctxT(t), "/doc3", nil, io.NewSectionReader(bytes.NewReader(other), 0, int64(len(other))))
			if _, err := f1.Wait(); err != nil {
				t.Fatal(err)
			}
			if _, err := f2.Wait(); err != nil {
				t.Fatal(err)
			}
			batch.Close()
			if !bytes.Equal(e.read(t, "doc"), edited) || !bytes.Equal(e.read(t, "doc3"), other) {
				t.Fatal("batched puts: wrong bytes on the server")
			}
		})
	}
}

// TestPutRefusedZstd sends compressed chunk data that is not zstd or does
// not decompress to the chunk: each put fails with KindInvalid.
func TestPutRefusedZstd(t *testing.T) {
	e := start(t, 0)
	raw := e.raw(t)
	old := []byte("the old content")
	e.write(t, "f", old)
	good := bytes.Repeat([]byte("new content of the file "), 100)
	h := chunk.Sum(good)
	bad := append([]byte(nil), good...)
	bad[0] ^= 1
	z := zwire.New(1 << 20)
	defer z.Close()
	zbad, ok := z.Compress(nil, bad)
	if !ok {
		t.Fatal("the test's data did not compress")
	}
	for name, data := range map[string][]byte{"not zstd": []byte("garbage, not a frame"), "wrong bytes": zbad} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := raw.PutChunked(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&proto.ChunkPutMsg{Path: "/f", Dir: &proto.Dir{}, Size: int64(len(good)), ChunkVersion: chunk.Version,
			Refs: proto.PackRefs([]chunk.Ref{{Hash: h, Len: len(good)}}), ListEnd: true})
		st.Send(&proto.ChunkPutMsg{Hash: h[:], Data: data, Zstd: true})
		st.CloseSend()
		var rerr error
		for rerr == nil {
			_, rerr = st.Recv()
		}
		cancel()
		if err := proto.FromStatus("", "", rerr); !ferry.IsKind(err, ferry.KindInvalid) {
			t.Errorf("%s: %v, want KindInvalid", name, err)
		}
		if got := e.read(t, "f"); !bytes.Equal(got, old) {
			t.Fatalf("%s: file now %q", name, got)
		}
	}
}

// TestSuiteChunked runs the shared Tree suite through a chunk-serving
// server with a client that moves every whole file by chunks.
func TestSuiteChunked(t *testing.T) {
	fstest.Run(t, func(t *testing.T) (ferry.FS, string) {
		e := startWith(t, 0, setup{client: func(c *remote.Config) {
			withCache(t)(c)
			c.ChunkMin = 1
		}})
		return e.c, e.dir
	})
}

// TestChunkMin measures what a one-line edit costs re-put by chunks and
// plainly, by file size, for choosing remote.DefaultChunkMin; run with -v.
func TestChunkMin(t *testing.T) {
	e := startWith(t, 0, setup{client: func(c *remote.Config) { c.NoZstd = true }})
	plain := startWith(t, 0, setup{plain: true, client: func(c *remote.Config) { c.NoZstd = true; c.ChunkMin = -1 }})
	for _, size := range []int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10} {
		doc := randomDoc(size)
		edited := editLine(doc, len(bytes.Split(doc, []byte("\n")))/2, "one changed line")
		for _, x := range []*env{e, plain} {
			os.WriteFile(filepath.Join(x.dir, "f"), doc, 0o644)
		}
		up := e.up.Load()
		if _, _, err := e.c.PutChunked(ctxT(t), "/f", nil, bytes.NewReader(edited), int64(len(edited)), nil); err != nil {
			t.Fatal(err)
		}
		chunkedUp := e.up.Load() - up
		up = plain.up.Load()
		plain.put(t, plain.c, "/f", edited)
		plainUp := plain.up.Load() - up
		t.Logf("%4d KiB: plain put %7d bytes up, chunked %7d (saves %7d, %3.0f%%)", size>>10, plainUp, chunkedUp, plainUp-chunkedUp, 100*float64(plainUp-chunkedUp)/float64(plainUp))
	}
}

// TestZstdAfterFind: a client whose first call is a Find (as a sync's is)
// learns from the compressed answer that the server takes compressed data,
// so its first Put is compressed.
func TestZstdAfterFind(t *testing.T) {
	e := start(t, 0)
	for i := range 20 {
		e.write(t, fmt.Sprintf("f%02d", i), []byte("x"))
	}
	c, err := remote.Dial(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := c.Find(ctxT(t), "/", "")
	for range s.All() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	e.put(t, c, "/doc", document(32<<10))
	if tr := c.Traffic(); tr.PutWire*2 > tr.PutBytes {
		t.Errorf("the first put after a Find sent %d bytes on the wire for %d, want it compressed", tr.PutWire, tr.PutBytes)
	}
}
