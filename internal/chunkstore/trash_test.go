package chunkstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/remote"
)

// dial returns another client of e's server, without a chunk cache, whose
// bytes count in e's counters.
func (e *env) dial(t *testing.T) *remote.Client {
	t.Helper()
	cfg := e.cfg
	cfg.Cache, cfg.CloseCache = nil, false
	c, err := remote.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Stat(context.Background(), "/").Wait(); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTrashPut puts a file from one client and, from another, neither with
// a chunk cache, removes or truncates it and puts it again with one line
// changed: with the trash, only the changed chunks go up.
func TestTrashPut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  chunkstore.Options
		clear func(ctx context.Context, c *remote.Client) error // What the second client does before its put.
		most  float64                                           // The most bytes up, as a share of the file.
	}{
		{"remove", chunkstore.Options{}, func(ctx context.Context, c *remote.Client) error {
			_, err := c.Remove(ctx, "/doc").Wait()
			return err
		}, 0.10},
		{"truncate", chunkstore.Options{}, func(ctx context.Context, c *remote.Client) error {
			_, err := c.Wstat(ctx, "/doc", ferry.Dir{ferry.AttrSize: "0"}).Wait()
			return err
		}, 0.10},
		{"move over", chunkstore.Options{}, func(ctx context.Context, c *remote.Client) error {
			if _, err := c.Put(ctx, "/other", nil, ferry.Whole, bytes.NewReader(randomDoc(100<<10))).Wait(); err != nil {
				return err
			}
			_, err := c.Move(ctx, "/other", "/doc").Wait()
			return err
		}, 0.10},
		// Without the trash the same put sends nearly the whole file: the
		// test measures the trash, not something else.
		{"remove, no trash", chunkstore.Options{TrashMax: -1}, func(ctx context.Context, c *remote.Client) error {
			_, err := c.Remove(ctx, "/doc").Wait()
			return err
		}, 1.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startWith(t, 0, setup{opts: tc.opts})
			doc := randomDoc(4 << 20)
			e.put(t, e.c, "/doc", doc)
			c2 := e.dial(t)
			if err := tc.clear(ctxT(t), c2); err != nil {
				t.Fatal(err)
			}
			// The control file says what the trash holds.
			r := c2.Get(ctxT(t), ferry.CtlPath, 0, -1)
			ctl, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			want := "trash.files: 1\n"
			if tc.opts.TrashMax < 0 {
				want = "trash.files: 0\n"
			}
			if !strings.Contains(string(ctl), want) {
				t.Errorf("control file lacks %q:\n%s", want, ctl)
			}
			edited := editLine(doc, 30000, "one changed line")
			up := e.up.Load()
			e.put(t, c2, "/doc", edited)
			sent := e.up.Load() - up
			if !bytes.Equal(e.read(t, "doc"), edited) {
				t.Fatal("the server's file differs from what was put")
			}
			if share := float64(sent) / float64(len(doc)); share > tc.most {
				t.Errorf("put after %s sent %d bytes (%.1f%% of %d), want at most %.0f%%", tc.name, sent, 100*share, len(doc), 100*tc.most)
			}
			if tc.opts.TrashMax == 0 && e.tree.Trash().Files == 0 {
				t.Error("the trash holds no file")
			}
			t.Logf("%s, then a one-line edit of %d bytes put from a cold client: %d bytes up (%.2f%%)", tc.name, len(doc), sent, 100*float64(sent)/float64(len(doc)))
		})
	}
}

// hashes returns the chunk hashes of b.
func hashes(t *testing.T, b []byte) []chunk.Hash {
	var hs []chunk.Hash
	if err := chunk.Refs(bytes.NewReader(b), chunk.Default, func(r chunk.Ref, _ []byte) error {
		hs = append(hs, r.Hash)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return hs
}

// holds reports whether tr serves every chunk of b.
func holds(t *testing.T, tr *chunkstore.Tree, b []byte) bool {
	for _, h := range hashes(t, b) {
		if _, err := tr.ReadChunk(ctxT(t), h, "", nil); err != nil {
			return false
		}
	}
	return true
}

func openTree(t *testing.T, dir string, o chunkstore.Options) *chunkstore.Tree {
	t.Helper()
	lt, err := local.NewServed(dir)
	if err != nil {
		t.Fatal(err)
	}
	o.MaxChunks = 1 << 20
	tr, err := chunkstore.Open(lt, o)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestTrashBounds fills the trash past its bound in bytes, then checks that
// the oldest files went first, that the trash survives a restart, and that
// files leave it as they age.
func TestTrashBounds(t *testing.T) {
	dir, trashDir, indexDir := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "index")
	o := chunkstore.Options{IndexDir: indexDir, TrashDir: trashDir, TrashMax: 350 << 10, TrashMin: 1}
	tr := openTree(t, dir, o)
	ctx := ctxT(t)
	var docs [][]byte
	for i := range 4 {
		doc := randomDoc(100 << 10)
		docs = append(docs, doc)
		if err := os.WriteFile(filepath.Join(dir, "f"), doc, 0o644); err != nil {
			t.Fatal(err)
		}
		var ino uint64
		if fi, err := os.Stat(filepath.Join(dir, "f")); err == nil {
			ino = fi.Sys().(*syscall.Stat_t).Ino
		}
		if _, err := tr.Remove(ctx, "/f").Wait(); err != nil {
			t.Fatal(err)
		}
		// The file went to the trash as a hard link, not a copy.
		ents, _ := os.ReadDir(trashDir)
		last, _ := ents[len(ents)-1].Info()
		if got := last.Sys().(*syscall.Stat_t).Ino; got != ino {
			t.Errorf("file %d: trash inode %d, want the removed file's %d (a hard link)", i, got, ino)
		}
	}
	if got, want := tr.Trash(), (chunkstore.TrashStats{Files: 3, Bytes: int64(len(docs[1]) + len(docs[2]) + len(docs[3]))}); got != want {
		t.Errorf("trash after 4 files of 100 KiB in 350 KiB: got %+v, want %+v", got, want)
	}
	// Give the background indexing of the trash time to finish.
	waitFor(t, "the kept files' chunks", func() bool { return holds(t, tr, docs[1]) && holds(t, tr, docs[3]) })
	if holds(t, tr, docs[0]) {
		t.Error("the oldest file's chunks are still served after its eviction")
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	o.TrashAge = 300 * time.Millisecond
	tr = openTree(t, dir, o)
	defer tr.Close()
	if got := tr.Trash().Files; got != 3 && got != 0 {
		t.Errorf("trash after a restart holds %d files, want 3", got)
	}
	waitFor(t, "the trash to empty with age", func() bool { return tr.Trash().Files == 0 })
	if holds(t, tr, docs[3]) {
		t.Error("an aged file's chunks are still served")
	}
	if ents, _ := os.ReadDir(trashDir); len(ents) != 0 {
		t.Errorf("trash directory holds %d entries after they aged, want 0", len(ents))
	}
}

// waitFor waits up to 10 s for ok, failing the test if it never holds.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	if !poll(10*time.Second, ok) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll checks cond until it holds or d has passed, and says whether it
// held.
func poll(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// TestTrashHidden checks that nothing of the trash is reachable through the
// Tree: it lies outside the served directory and no path names it.
func TestTrashHidden(t *testing.T) {
	trashDir := t.TempDir()
	e := startWith(t, 0, setup{opts: chunkstore.Options{TrashDir: trashDir}})
	doc := randomDoc(200 << 10)
	e.put(t, e.c, "/doc", doc)
	e.put(t, e.c, "/doc", randomDoc(200<<10))
	ctx := ctxT(t)
	if _, err := e.c.Remove(ctx, "/doc").Wait(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(trashDir)
	if len(ents) != 2 {
		t.Fatalf("trash directory holds %d files, want 2", len(ents))
	}
	if got := fstest.Leftovers(e.dir); len(got) != 0 {
		t.Errorf("served directory holds %v, want nothing", got)
	}
	for e := range e.c.Find(ctx, "/", "").All() {
		if e.Dir.Path() != "/" {
			t.Errorf("Find lists %s, want nothing but /", e.Dir.Path())
		}
	}
	for _, p := range []string{"/" + chunkstore.TrashPrefix + ents[0].Name(), chunkstore.TrashPrefix + ents[0].Name(), "/" + ents[0].Name(), "/../" + filepath.Base(trashDir) + "/" + ents[0].Name()} {
		if _, err := e.c.Stat(ctx, p).Wait(); err == nil {
			t.Errorf("Stat(%q) succeeded, want an error", p)
		}
		r := e.c.Get(ctx, p, 0, -1)
		if _, err := io.ReadAll(r); err == nil {
			t.Errorf("Get(%q) succeeded, want an error", p)
		}
		r.Close()
		s := e.c.Find(ctx, p, "")
		for range s.All() {
		}
		if err := s.Err(); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("Find(%q): got %v, want an error", p, err)
		}
	}
	if !holds(t, e.tree, doc) {
		t.Error("the trash does not serve the chunks of the removed file")
	}
}

// TestPutResumes: a put cut off after some of its chunks arrived, tried
// again, sends only the chunks that had not arrived; a put cut off before
// any arrived leaves nothing in the trash.
func TestPutResumes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sendHalf bool
	}{
		{"half the chunks arrived", true},
		{"none arrived", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, 0)
			raw := e.raw(t)
			nw := randomDoc(1 << 20)
			refs, _ := chunk.List(bytes.NewReader(nw), chunk.Default)
			ctx, cancel := context.WithCancel(context.Background())
			st, err := raw.PutChunked(ctx)
			if err != nil {
				t.Fatal(err)
			}
			st.Send(&proto.ChunkPutMsg{Path: "/f", Dir: &proto.Dir{}, Size: int64(len(nw)), ChunkVersion: chunk.Version, Refs: proto.PackRefs(refs), ListEnd: true})
			r, err := st.Recv()
			if err != nil || len(r.Need) != len(refs) {
				t.Fatalf("need %d chunks (%v), want all %d", len(r.GetNeed()), err, len(refs))
			}
			sent := 0
			if tc.sendHalf {
				for _, n := range r.Need[:len(r.Need)/2] {
					ref := refs[n]
					if err := st.Send(&proto.ChunkPutMsg{Hash: ref.Hash[:], Data: nw[ref.Off : ref.Off+int64(ref.Len)]}); err != nil {
						t.Fatal(err)
					}
					sent++
				}
			}
			// The client goes away: the server takes what it sent,
			// then the end of the stream, and aborts.
			st.CloseSend()
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
			cancel()
			waitNoTemps(t, e)
			if _, err := os.Stat(filepath.Join(e.dir, "f")); !os.IsNotExist(err) {
				t.Fatalf("the cut put made the file: %v", err)
			}
			trashed := e.tree.Trash().Files
			if want := map[bool]int{true: 1, false: 0}[tc.sendHalf]; trashed != want {
				t.Errorf("the trash holds %d files after the cut put, want %d", trashed, want)
			}
			_, stats, err := e.c.PutChunked(ctxT(t), "/f", nil, bytes.NewReader(nw), int64(len(nw)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.read(t, "f"), nw) {
				t.Fatal("the put tried again did not store the file")
			}
			if want := len(refs) - sent; stats.SentChunks != want {
				t.Errorf("the put tried again sent %d chunks, want %d (%d of %d had arrived)", stats.SentChunks, want, sent, len(refs))
			}
		})
	}
}

// TestSalvage: the temporary file of a put whose server was killed (no
// Abort ran) holds the chunks that had arrived, in place, with holes for
// the rest; once a restarted server salvages it, the put tried again sends
// only what had not arrived, give or take the chunk cut across the edge of
// what arrived.
func TestSalvage(t *testing.T) {
	e := start(t, 0)
	nw := randomDoc(1 << 20)
	refs, _ := chunk.List(bytes.NewReader(nw), chunk.Default)
	arrived := len(refs) / 2
	tmp := e.tree.TempName("/f")
	f, err := os.OpenFile(filepath.Join(e.dir, tmp[1:]), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(nw))); err != nil {
		t.Fatal(err)
	}
	for _, r := range refs[:arrived] {
		if _, err := f.WriteAt(nw[r.Off:r.Off+int64(r.Len)], r.Off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	files, _, err := e.tree.Sweep(ctxT(t), time.Now().Add(time.Minute))
	if err != nil || files != 1 {
		t.Fatalf("swept %d files (%v), want 1", files, err)
	}
	if temps := e.temps(); len(temps) != 0 {
		t.Fatalf("temporary files left: %v", temps)
	}
	_, stats, err := e.c.PutChunked(ctxT(t), "/f", nil, bytes.NewReader(nw), int64(len(nw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(e.read(t, "f"), nw) {
		t.Fatal("the put tried again did not store the file")
	}
	if max := len(refs) - arrived + 1; stats.SentChunks > max {
		t.Errorf("the put tried again sent %d chunks, want at most %d (%d of %d had arrived)", stats.SentChunks, max, arrived, len(refs))
	}
	t.Logf("sent %d of %d chunks; %d had arrived", stats.SentChunks, len(refs), arrived)
}

// TestTrashEmpty: "trash empty" through the control file frees what the
// trash keeps at once, on disk and in the counts.
func TestTrashEmpty(t *testing.T) {
	trashDir := t.TempDir()
	e := startWith(t, 0, setup{opts: chunkstore.Options{TrashDir: trashDir}})
	e.put(t, e.c, "/doc", randomDoc(200<<10))
	ctx := ctxT(t)
	if _, err := e.c.Remove(ctx, "/doc").Wait(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(trashDir); len(ents) == 0 || e.tree.Trash().Files == 0 {
		t.Fatalf("nothing in the trash after a remove: %d files on disk, %+v", len(ents), e.tree.Trash())
	}
	if _, err := e.c.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader("trash empty\n")).Wait(); err != nil {
		t.Fatalf("trash empty: %v", err)
	}
	if ents, _ := os.ReadDir(trashDir); len(ents) != 0 || e.tree.Trash().Files != 0 || e.tree.Trash().Bytes != 0 {
		t.Errorf("after trash empty: %d files on disk, %+v", len(ents), e.tree.Trash())
	}
}
