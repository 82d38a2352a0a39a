package remote_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/transport"
	"github.com/ferryfs/ferry/internal/zwire"
)

// TestGroup: the changes of a group, a large file staged by chunks among
// them, show on the server only once the group commits, all of them and in
// order; a Commit made again (an answer lost) is answered, not applied
// again; a group never committed changes nothing.
func TestGroup(t *testing.T) {
	s := servertest.StartChunked(t, "")
	c := s.Client(t, "a")
	ctx := context.Background()
	for p, data := range map[string]string{"a": "old", "gone": "x", "m": "move me"} {
		if err := os.WriteFile(filepath.Join(s.Dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, 300<<10)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	before := s.Srv.Calls()
	start := before
	g := c.Group()
	futures := []interface{ Done() <-chan struct{} }{
		g.Put(ctx, "/dir", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil),
		g.Put(ctx, "/dir/in", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("in"))),
		g.Put(ctx, "/big", ferry.Dir{}, ferry.Whole, bytes.NewReader(big)),
		// In a directory the group makes: it cannot be staged before.
		g.Put(ctx, "/dir/big", ferry.Dir{}, ferry.Whole, bytes.NewReader(big[7:])),
		g.Move(ctx, "/m", "/dir/moved"),
		g.Remove(ctx, "/gone"),
		g.Wstat(ctx, "/a", ferry.Dir{ferry.AttrMode: "0600"}),
		g.Put(ctx, "/a", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("new"))),
	}
	// The large file is staged: its data is on the server, its name not.
	if n := servertest.CallsSince(s.Srv, before, "putchunked", 1); n != 1 {
		t.Fatalf("%d chunked puts staged the large file, want 1", n)
	}
	exists := func(p string) bool {
		_, err := os.Lstat(filepath.Join(s.Dir, p))
		return err == nil
	}
	for _, p := range []string{"dir", "big"} {
		if exists(p) {
			t.Errorf("%s is on the server before its group committed", p)
		}
	}
	if !exists("gone") || !exists("m") {
		t.Errorf("a removal or rename showed before its group committed")
	}
	for _, f := range futures {
		select {
		case <-f.Done():
			t.Fatal("a change of the group was answered before its Commit")
		default:
		}
	}
	if err := g.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range futures {
		<-f.Done()
	}
	check := func() {
		t.Helper()
		for p, want := range map[string]string{"dir/in": "in", "dir/moved": "move me", "big": string(big), "dir/big": string(big[7:]), "a": "new"} {
			if got, err := os.ReadFile(filepath.Join(s.Dir, p)); err != nil || string(got) != want {
				t.Errorf("%s after the commit: %d bytes, %v; want %d bytes", p, len(got), err, len(want))
			}
		}
		if exists("gone") || exists("m") {
			t.Error("a removed or renamed file is still there after the commit")
		}
		// The mode set in the group is kept by the put after it.
		if fi, err := os.Stat(filepath.Join(s.Dir, "a")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("/a after the commit: %v, %v; want mode 0600", fi.Mode(), err)
		}
	}
	check()
	moves := s.Srv.Calls()["move"]
	dirs, err := remote.SendAgain(ctx, g)
	if err != nil || len(dirs) != len(futures) {
		t.Fatalf("the same Commit again: %d entries, %v; want %d and no error", len(dirs), err, len(futures))
	}
	if n := s.Srv.Calls()["move"]; n != moves {
		t.Errorf("the Commit made again moved again (%d moves, then %d)", moves, n)
	}
	check()

	// A change that fails fails alone; removing what is not there is
	// what was wanted.
	g3 := c.Group()
	bad := g3.Move(ctx, "/nope", "/x")
	after := g3.Put(ctx, "/after", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("after")))
	nothing := g3.Remove(ctx, "/nothing")
	if err := g3.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Wait(); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Errorf("moving a missing file in a group: %v, want not found", err)
	}
	if _, err := after.Wait(); err != nil || !exists("after") {
		t.Errorf("a put after a failed change of its group: %v, on the server: %v", err, exists("after"))
	}
	if _, err := nothing.Wait(); err != nil {
		t.Errorf("removing a missing file in a group: %v, want done", err)
	}

	// A group that never commits leaves nothing, its staged put included.
	before = s.Srv.Calls()
	g2 := c.Group()
	g2.Put(ctx, "/never", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("never")))
	g2.Put(ctx, "/never-big", ferry.Dir{}, ferry.Whole, bytes.NewReader(big[1:]))
	g2.Remove(ctx, "/a")
	servertest.CallsSince(s.Srv, before, "putchunked", 1)
	c.Close()
	// The groups' staged puts went on one batch stream, which lives
	// from group to group until the client closes.
	if n := servertest.CallsSince(s.Srv, start, "putbatch", 1); n != 1 {
		t.Errorf("%d batch streams carried the groups' staged puts, want 1", n)
	}
	for _, p := range []string{"never", "never-big"} {
		if exists(p) {
			t.Errorf("%s, of a group never committed, is on the server", p)
		}
	}
	if !exists("a") {
		t.Error("a removal of a group never committed was made")
	}
}

// TestGroupsDrawOnEachOther: files of successive groups, alike but with no
// chunk in common (as linked binaries are), compress against each other
// on the groups' one stream where the server allows a wide window, and do
// not where its upload memory has no room for one.
func TestGroupsDrawOnEachOther(t *testing.T) {
	base := make([]byte, 3<<20)
	rand.NewChaCha8([32]byte{3, 4}).Read(base)
	for _, tc := range []struct {
		name   string
		memory int64 // the server's; 0 for its default
		// known: the client knows the server takes zstd before the
		// stream begins, so it compresses the stream's first batches
		// with the default window, then begins a wide frame.
		known bool
		wide  bool
	}{
		{"wide window", 0, false, true},
		{"wide window after the default", 0, true, true},
		// Room for a batch stream's flow-control window and a Commit's,
		// not for a wide window besides.
		{"no room for a wide window", (transport.StreamWindow + zwire.WideWindow - 1<<20) * 4 / 3, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := servertest.StartChunkedWith(t, "", func(cfg *server.Config) { cfg.Memory = tc.memory })
			c := s.Client(t, "a")
			ctx := context.Background()
			put := func(p string, data []byte) {
				t.Helper()
				g := c.Group()
				f := g.Put(ctx, p, ferry.Dir{}, ferry.Whole, bytes.NewReader(data))
				if err := g.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := f.Wait(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.known {
				if _, err := c.Put(ctx, "/known", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("zstd?"))).Wait(); err != nil {
					t.Fatal(err)
				}
			}
			// The first group learns what the server allows.
			put("/first", base[:200<<10])
			sent := c.Traffic().PutWire
			for i := range 3 {
				data := bytes.Clone(base)
				for j := 100 * i; j < len(data); j += 4 << 10 {
					data[j]++
				}
				p := fmt.Sprintf("/f%d", i)
				put(p, data)
				if got, err := os.ReadFile(filepath.Join(s.Dir, p)); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%s on the server: %d bytes, %v; want the %d put", p, len(got), err, len(data))
				}
			}
			ratio := float64(c.Traffic().PutWire-sent) / float64(3*len(base))
			t.Logf("%.2f of the files' bytes sent", ratio)
			if small := ratio < 0.5; small != tc.wide {
				t.Errorf("sent %.2f of the files' bytes; want under half: %v", ratio, tc.wide)
			}
		})
	}
}
