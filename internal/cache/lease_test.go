package cache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/testenv"
)

// done reports whether f was already resolved when the call returned: the
// change was kept back, not made on the server first.
func done[T any](f *ferry.Future[T]) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

// readAll reads the whole file at p from fsys.
func readAll(ctx context.Context, fsys ferry.Tree, p string) (string, error) {
	r := fsys.Get(ctx, p, 0, -1)
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

// TestWriteLeaseCloseToOpen: a cache with write-behind over a server that
// lends write leases keeps its changes back (the call returns before the
// server has them), and another client's call right after each change
// sees it, because the server recalls the lease first: rewrites, new
// files, a file created and removed, renames and attribute changes, over
// a link with a round trip of 40 ms, many rounds. The history of what
// the other client saw is checked against what was written, in order.
func TestWriteLeaseCloseToOpen(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	slow := servertest.DelayProxy(t, s.Addr, 20*time.Millisecond)
	c := open(t, s.ClientVia(t, "a", slow), cache.Options{WriteBehind: true})
	other := s.Client(t, "b")
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	kept := 0
	type step struct{ what, want, got string }
	var history []step
	for i := range 20 {
		content := fmt.Sprintf("round %d %s", i, strings.Repeat("x", i))
		f := c.Put(ctx, "/d/f", ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte(content)))
		if done(f) {
			kept++
		}
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(ctx, other, "/d/f")
		if err != nil {
			got = "error: " + err.Error()
		}
		history = append(history, step{fmt.Sprintf("rewrite %d", i), content, got})

		name := fmt.Sprintf("/d/new%d", i)
		if _, err := c.Put(ctx, name, ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte(name))).Wait(); err != nil {
			t.Fatal(err)
		}
		got, err = readAll(ctx, other, name)
		if err != nil {
			got = "error: " + err.Error()
		}
		history = append(history, step{"create " + name, name, got})

		tmp := fmt.Sprintf("/d/tmp%d", i)
		c.Put(ctx, tmp, ferry.Dir{}, ferry.Whole, bytes.NewReader([]byte("tmp"))).Wait()
		if _, err := c.Remove(ctx, tmp).Wait(); err != nil {
			t.Fatal(err)
		}
		_, err = other.Stat(ctx, tmp).Wait()
		history = append(history, step{"create and remove " + tmp, "absent", map[bool]string{true: "absent", false: fmt.Sprintf("%v", err)}[ferry.IsKind(err, ferry.KindNotExist)]})

		moved := fmt.Sprintf("/d/moved%d", i)
		if _, err := c.Move(ctx, name, moved).Wait(); err != nil {
			t.Fatal(err)
		}
		got, err = readAll(ctx, other, moved)
		if err != nil {
			got = "error: " + err.Error()
		}
		history = append(history, step{"rename to " + moved, name, got})

		mode := fmt.Sprintf("06%d0", i%8)
		if _, err := c.Wstat(ctx, moved, ferry.Dir{ferry.AttrMode: mode}).Wait(); err != nil {
			t.Fatal(err)
		}
		got = "error"
		if d, err := other.Stat(ctx, moved).Wait(); err == nil {
			got = d[ferry.AttrMode]
		}
		history = append(history, step{"chmod " + moved, mode, got})
	}
	for _, h := range history {
		if h.got != h.want && !strings.HasPrefix(h.got, h.want+" ") {
			t.Errorf("%s: the other client saw %q, want %q", h.what, h.got, h.want)
		}
	}
	if kept < 10 {
		t.Errorf("only %d of 20 rewrites returned before the server had them: the cache did not keep changes back under its lease", kept)
	}
	status := c.Status(ctx)
	if !strings.Contains(status, "leases.write: ") || strings.Contains(status, " 0 recalled") {
		t.Errorf("the cache's status shows no recalls:\n%s", status)
	}
	if !strings.Contains(status, "writeback.groups: ") || strings.Contains(status, "writeback.groups: 0 groups") {
		t.Errorf("the cache's status counts no group of changes stored:\n%s", status)
	}
	if strings.Contains(status, "writeback.stored: 0 files") {
		t.Errorf("the cache's status counts no file stored in the background:\n%s", status)
	}
	t.Logf("%d of 20 rewrites kept back; %s", kept, strings.SplitN(status[strings.Index(status, "leases.write"):], "\n", 2)[0])
}

// TestWriteLeaseHolderGone: a holder whose link goes silent with changes
// kept back delays another client's call under its lease by at most the
// lease's term, and no longer; the holder counts the lease lost and logs
// that what it kept back is not stored.
func TestWriteLeaseHolderGone(t *testing.T) {
	const lease = time.Second
	s := servertest.StartWith(t, "", func(c *server.Config) { c.Lease = lease })
	ctx := context.Background()
	sw := servertest.SwitchProxy(t, s.Addr)
	var logged servertest.Buffer
	c := open(t, s.ClientVia(t, "a", sw.Addr), cache.Options{WriteBehind: true, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	other := s.Client(t, "b")
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	// The link goes silent; a change under the lease the cache holds is
	// kept back, and cannot be stored.
	sw.Freeze()
	defer sw.Thaw()
	f := c.Put(ctx, "/d/f", ferry.Dir{}, ferry.Whole, strings.NewReader("held"))
	if !done(f) {
		t.Fatal("a put under the lease waited for the server")
	}
	began := time.Now()
	_, err := other.Stat(ctx, "/d/f").Wait()
	took := time.Since(began)
	if !ferry.IsKind(err, ferry.KindNotExist) {
		t.Fatalf("Stat of a file the silent holder kept back: %v, want not found", err)
	}
	// The bound is the lease's term, with room for a busy machine; the
	// client being silent, nothing else ends the wait.
	if took > 3*lease+2*time.Second {
		t.Errorf("a call under the lease of a silent holder waited %s, more than the lease of %s", took, lease)
	}
	t.Logf("the other client's call waited %s (lease %s); it saw %v", took.Round(time.Millisecond), lease, err)
	// The holder learns it lost the lease, with what it had not stored,
	// and says so.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.Status(ctx), " 1 lost") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if status := c.Status(ctx); !strings.Contains(status, " 1 lost") {
		t.Errorf("the holder across the silent link does not count its write lease lost:\n%s", status)
	}
	if !strings.Contains(logged.String(), "write leases lost with changes not yet stored") {
		t.Errorf("the holder did not log the changes it lost with its lease; it logged:\n%s", logged.String())
	}
}

// TestWriteLeaseRecalledByDiskChange: a change made directly on the
// server's disk under a write lease recalls it, with no other client's
// call; the holder's own stores do not.
func TestWriteLeaseRecalledByDiskChange(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	c := open(t, s.ClientVia(t, "a", servertest.DelayProxy(t, s.Addr, 5*time.Millisecond)), cache.Options{WriteBehind: true, LeaseIdle: time.Hour})
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := c.Put(ctx, fmt.Sprintf("/d/f%d", i), ferry.Dir{}, ferry.Whole, strings.NewReader("mine")).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		st := c.Status(ctx)
		i := strings.Index(st, "leases.write: ")
		return strings.SplitN(st[i:], "\n", 2)[0]
	}
	// The holder's own stores reached the server's disk and its watch:
	// no recall for those.
	time.Sleep(500 * time.Millisecond)
	if st := status(); !strings.Contains(st, " 0 recalled") || strings.Contains(st, " 0 held") {
		t.Fatalf("after the holder's own stores: %s, want the lease held and no recall", st)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "d", "direct"), []byte("on the disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(status(), " 0 recalled") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := status(); strings.Contains(st, " 0 recalled") || !strings.Contains(st, " 0 held") {
		t.Errorf("after a change on the server's disk under the lease: %s, want it recalled", st)
	}
}

// TestKeptBackLog: under a write lease, what is kept back of a file is the
// state it is to be left in, until its store starts. Each case makes its
// changes in a burst, then syncs, and counts the calls the server took:
// a file written ten times is stored once; a file created and removed
// is never sent; a new file renamed is stored under its new name only,
// and removed later only there; the events of new files cost no call;
// a file's attributes changed before its store go with it; configure's
// cycle (write conftest.er1,
// rename it over conftest.err, remove both) sends nothing. The server's
// tree must end as the changes left it.
func TestKeptBackLog(t *testing.T) {
	cases := []struct {
		name  string
		burst func(ctx context.Context, c *cache.FS) error
		want  map[string]string // The tree's files after, by path.
		calls map[string]int64  // Calls the server takes, at most.
		modes map[string]os.FileMode
	}{
		{"rewrites", func(ctx context.Context, c *cache.FS) error {
			for i := range 10 {
				if _, err := c.Put(ctx, "/d/log", ferry.Dir{}, ferry.Whole, strings.NewReader(strings.Repeat("line\n", i+1))).Wait(); err != nil {
					return err
				}
			}
			return nil
		}, map[string]string{"/d/log": strings.Repeat("line\n", 10)}, map[string]int64{"put": 1}, nil},
		{"created and removed", func(ctx context.Context, c *cache.FS) error {
			for i := range 5 {
				if _, err := c.Put(ctx, "/d/conftest.c", ferry.Dir{}, ferry.Whole, strings.NewReader(fmt.Sprint(i))).Wait(); err != nil {
					return err
				}
				if _, err := c.Remove(ctx, "/d/conftest.c").Wait(); err != nil {
					return err
				}
			}
			return nil
		}, map[string]string{"/d/conftest.c": ""}, map[string]int64{"put": 0, "remove": 0}, nil},
		{"renamed", func(ctx context.Context, c *cache.FS) error {
			if _, err := c.Put(ctx, "/d/a.tmp", ferry.Dir{}, ferry.Whole, strings.NewReader("a")).Wait(); err != nil {
				return err
			}
			_, err := c.Move(ctx, "/d/a.tmp", "/d/a").Wait()
			return err
		}, map[string]string{"/d/a.tmp": "", "/d/a": "a"}, map[string]int64{"put": 1, "move": 0, "remove": 0}, nil},
		{"new files, their events taken for echoes", func(ctx context.Context, c *cache.FS) error {
			for i := range 20 {
				if _, err := c.Put(ctx, fmt.Sprintf("/d/f%d", i), ferry.Dir{}, ferry.Whole, strings.NewReader("f")).Wait(); err != nil {
					return err
				}
			}
			if err := c.Sync(ctx, "/"); err != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond) // The events arrive.
			return nil
		}, map[string]string{"/d/f0": "f", "/d/f19": "f"}, map[string]int64{"put": 20, "stat": 0}, nil},
		{"a linker's output", func(ctx context.Context, c *cache.FS) error {
			for i := range 5 {
				if _, err := c.Put(ctx, "/d/conftest", ferry.Dir{}, ferry.Whole, strings.NewReader(fmt.Sprint(i))).Wait(); err != nil {
					return err
				}
				if _, err := c.Wstat(ctx, "/d/conftest", ferry.Dir{ferry.AttrMode: "0755"}).Wait(); err != nil {
					return err
				}
				if i < 4 {
					if _, err := c.Remove(ctx, "/d/conftest").Wait(); err != nil {
						return err
					}
				}
			}
			return nil
		}, map[string]string{"/d/conftest": "4"}, map[string]int64{"put": 1, "wstat": 0, "remove": 0}, map[string]os.FileMode{"/d/conftest": 0o755}},
		{"made above, stored at once, then rewritten and removed", func(ctx context.Context, c *cache.FS) error {
			// A file too big to keep back is stored at once; the
			// server has it from then on, though the front end made it.
			c.Created(ferry.Dir{ferry.AttrPath: "/d/big", ferry.AttrName: "big", ferry.AttrType: ferry.TypeFile, ferry.AttrMode: "0644"})
			if _, err := c.Put(ctx, "/d/big", ferry.Dir{}, ferry.Whole, bytes.NewReader(make([]byte, 17<<20))).Wait(); err != nil {
				return err
			}
			if _, err := c.Put(ctx, "/d/big", ferry.Dir{}, ferry.Whole, strings.NewReader("small")).Wait(); err != nil {
				return err
			}
			_, err := c.Remove(ctx, "/d/big").Wait()
			return err
		}, map[string]string{"/d/big": ""}, nil, nil},
		{"an archive read back before its store", func(ctx context.Context, c *cache.FS) error {
			// Bigger than the contents the cache keeps (1 MiB), as a
			// linker's archive is.
			archive := bytes.Repeat([]byte("!<arch>\n"), 3<<20/8)
			if _, err := c.Put(ctx, "/d/libssh.a", ferry.Dir{}, ferry.Whole, bytes.NewReader(archive)).Wait(); err != nil {
				return err
			}
			for _, r := range []struct{ off, count int64 }{{0, -1}, {1 << 20, 4096}, {3<<20 - 10, 100}} {
				got, err := io.ReadAll(c.Get(ctx, "/d/libssh.a", r.off, r.count))
				if err != nil {
					return err
				}
				end := int64(len(archive))
				if r.count >= 0 {
					end = min(end, r.off+r.count)
				}
				if !bytes.Equal(got, archive[r.off:end]) {
					return fmt.Errorf("reading %d bytes at %d back: %d bytes, not what was written", r.count, r.off, len(got))
				}
			}
			return nil
		}, map[string]string{"/d/libssh.a": strings.Repeat("!<arch>\n", 3<<20/8)}, map[string]int64{"get": 0, "readchunks": 0}, nil},
		{"configure's cycle", func(ctx context.Context, c *cache.FS) error {
			for i := range 5 {
				for _, f := range []string{"/d/conftest.err", "/d/conftest.er1"} {
					if _, err := c.Put(ctx, f, ferry.Dir{}, ferry.Whole, strings.NewReader(fmt.Sprint(i))).Wait(); err != nil {
						return err
					}
				}
				if _, err := c.Move(ctx, "/d/conftest.er1", "/d/conftest.err").Wait(); err != nil {
					return err
				}
				if _, err := c.Remove(ctx, "/d/conftest.err").Wait(); err != nil {
					return err
				}
			}
			return nil
		}, map[string]string{"/d/conftest.err": "", "/d/conftest.er1": ""}, map[string]int64{"put": 0, "move": 0, "remove": 0}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c := behindWithDir(t)
			ctx := context.Background()
			before := s.Srv.Calls()
			if err := tc.burst(ctx, c); err != nil {
				t.Fatal(err)
			}
			if err := c.Sync(ctx, "/"); err != nil {
				t.Fatal(err)
			}
			// A server counts a call as its handler returns, a moment
			// after the client has the answer.
			time.Sleep(100 * time.Millisecond)
			for op, most := range tc.calls {
				if n := servertest.CallsSince(s.Srv, before, op, 0); n > most {
					t.Errorf("the server took %d %s calls, want at most %d", n, op, most)
				}
			}
			for p, want := range tc.modes {
				if fi, err := os.Stat(filepath.Join(s.Dir, p)); err != nil || fi.Mode().Perm() != want {
					t.Errorf("%s on the server: %v, %v; want mode %v", p, fi.Mode(), err, want)
				}
			}
			for p, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(s.Dir, p))
				if want == "" {
					if !os.IsNotExist(err) {
						t.Errorf("%s on the server: %d bytes, %v; want none", p, len(b), err)
					}
					continue
				}
				if string(b) != want {
					t.Errorf("%s on the server: %q, %v; want %q", p, b, err, want)
				}
			}
		})
	}
}

// TestOwnerBehind: owner changes (tar run by root gives every directory
// away) go behind under a write lease once the tree is known to take them:
// from the first when the server said it gives files away (server.Config
// Owners, as ferry serve run by root sets it), else from the first that
// took. The server ends with every owner.
func TestOwnerBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "giving a file away needs a server run by root")
	}
	for _, tc := range []struct {
		name   string
		owners bool
		kept   []bool
	}{
		{"server says nothing", false, []bool{false, true, true, true}},
		{"server gives files away", true, []bool{true, true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := servertest.StartWith(t, "", func(cfg *server.Config) { cfg.Owners = tc.owners })
			ctx := context.Background()
			c := open(t, s.Client(t, "a"), cache.Options{WriteBehind: true})
			var kept []bool
			for i := range 4 {
				p := fmt.Sprintf("/d%d", i)
				if _, err := c.Make(ctx, p, ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
					t.Fatal(err)
				}
				f := c.Wstat(ctx, p, ferry.Dir{ferry.AttrUid: "1000", ferry.AttrGid: "1000"})
				kept = append(kept, done(f))
				if _, err := f.Wait(); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(kept, tc.kept) {
				t.Errorf("owner changes kept back: %v, want %v", kept, tc.kept)
			}
			if err := c.Sync(ctx, "/"); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				fi, err := os.Stat(filepath.Join(s.Dir, fmt.Sprintf("d%d", i)))
				if err != nil {
					t.Fatal(err)
				}
				if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
					t.Errorf("d%d on the server is owned by %d:%d, want 1000:1000", i, st.Uid, st.Gid)
				}
			}
		})
	}
}

// TestShallowLease: a client that writes in a directory where another
// holds a write lease below gets a shallow lease over it: its new files
// there are kept back, and the other client still sees each right after
// its close (the server recalls the shallow lease); a change in the other
// client's subtree, and a new directory, are not kept back.
func TestShallowLease(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	slow := servertest.DelayProxy(t, s.Addr, 10*time.Millisecond)
	a := open(t, s.ClientVia(t, "a", slow), cache.Options{WriteBehind: true, LeaseIdle: time.Hour})
	b := open(t, s.ClientVia(t, "b", slow), cache.Options{WriteBehind: true, LeaseIdle: time.Hour})
	if err := os.MkdirAll(filepath.Join(s.Dir, "d", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Each knows the directories, so that a new file's absence is known.
	for _, c := range []*cache.FS{a, b} {
		c.Lookup(ctx, "/d/sub", "mine")
		c.Lookup(ctx, "/d", "b0")
	}
	// a takes the deep lease over /d/sub with its first file there.
	if _, err := a.Put(ctx, "/d/sub/mine", ferry.Dir{}, ferry.Whole, strings.NewReader("a's")).Wait(); err != nil {
		t.Fatal(err)
	}
	if !a.WriteLeased("/d/sub/mine") {
		t.Fatal("a holds no lease over /d/sub")
	}
	kept := 0
	for i := range 5 {
		name := fmt.Sprintf("/d/b%d", i)
		f := b.Put(ctx, name, ferry.Dir{}, ferry.Whole, strings.NewReader(name))
		if done(f) {
			kept++
		}
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(ctx, a, name); err != nil || got != name {
			t.Errorf("a reads %s right after b's close: %q, %v", name, got, err)
		}
	}
	if kept < 3 {
		t.Errorf("only %d of b's 5 files beside a's subtree were kept back", kept)
	}
	if st := b.Status(ctx); !strings.Contains(st, "shallow)") || strings.Contains(st, "(0 shallow)") {
		t.Errorf("b's status shows no shallow lease:\n%s", st)
	}
	// In a's subtree, and a new directory: not b's to keep back.
	if b.WriteLeased("/d/sub/theirs") {
		t.Error("b's shallow lease over /d covers a file in a's /d/sub")
	}
	if b.WriteLeased("/d/sub") {
		t.Error("b's shallow lease over /d covers the directory /d/sub")
	}
	if _, err := b.Put(ctx, "/d/sub/theirs", ferry.Dir{}, ferry.Whole, strings.NewReader("b's")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(s.Dir, "d", "sub", "theirs")); err != nil || string(got) != "b's" {
		t.Errorf("b's file in a's subtree was not stored at its close: %q, %v", got, err)
	}
	if got, err := readAll(ctx, a, "/d/sub/mine"); err != nil || got != "a's" {
		t.Errorf("a's own file: %q, %v", got, err)
	}
}

// TestSymlinkBehind: under a write lease a symbolic link is made in the
// background, in order with the other changes kept back, as a directory
// is (configure makes and removes links in some of its checks): the call
// returns before the server has it, the cache shows it at once, and a sync
// leaves it on the server.
func TestSymlinkBehind(t *testing.T) {
	s, c := behindWithDir(t)
	ctx := context.Background()
	if _, err := c.Make(ctx, "/d/link", ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: "target"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir, "d/link")); !os.IsNotExist(err) {
		t.Errorf("the link was on the server as its call returned (%v): it was made at once", err)
	}
	d, err := c.Stat(ctx, "/d/link").Wait()
	if err != nil || d.Type() != ferry.TypeSymlink || d[ferry.AttrTarget] != "target" || d.Size() != 6 {
		t.Errorf("the cache shows the link as %v, %v", d, err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(s.Dir, "d/link")); err != nil || got != "target" {
		t.Errorf("the link on the server after a sync: %q, %v", got, err)
	}
}

// behindWithDir starts a server and a write-behind cache over it, and
// makes /d through the cache, stored.
func behindWithDir(t *testing.T) (*servertest.Server, *cache.FS) {
	t.Helper()
	s := servertest.Start(t, "")
	c := open(t, s.Client(t, "a"), cache.Options{WriteBehind: true})
	ctx := context.Background()
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	return s, c
}

// TestTreeEchoKeepsListing: under a deep write lease, the server's report
// of a directory this cache removed (Lost, as the directory's own watch
// ends) is an echo: the cache still answers for the name from its listing
// of the parent, where it would otherwise doubt it and ask the server.
// configure makes and removes the same directories again and again. A
// directory removed on the server's own disk under the lease is still
// dropped: the server recalls the lease.
func TestTreeEchoKeepsListing(t *testing.T) {
	s, c, events := leasedDirs(t, "/d", "/d/x", "/d/z")
	ctx := context.Background()
	asked := func() string { return statusLine(c, "meta.finds") + ", " + statusLine(c, "meta.stats") }
	if _, err := c.List(ctx, "/d"); err != nil {
		t.Fatal(err)
	}
	before := asked()
	if _, err := c.Remove(ctx, "/d/x").Wait(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	// The server reports the removal from the same disk events as this
	// watch: once this one has seen the directory lost, the cache's has
	// been sent it.
	waitLost(t, events, "/d/x")
	time.Sleep(200 * time.Millisecond)
	if _, err := c.Lookup(ctx, "/d", "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lookup of the removed /d/x: %v, want not found", err)
	}
	if after := asked(); after != before {
		t.Errorf("the removal's own echo made the cache ask the server: %s before, %s after\n%s", before, after, c.Status(ctx))
	}

	// The server takes a disk event on a path it served a call on in the
	// last 2 s for that call's echo (callback.servedFor).
	time.Sleep(2100 * time.Millisecond)
	if err := os.Remove(filepath.Join(s.Dir, "d", "z")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Lookup(ctx, "/d", "z")
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/d/z removed on the server's disk is still there for the cache: %v\n%s", err, c.Status(ctx))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := c.Status(ctx); !strings.Contains(st, " 1 recalled") {
		t.Errorf("the removal on the server's disk did not recall the lease:\n%s", st)
	}
}

// leasedDirs starts a server and a write-behind cache over it that keeps
// its write leases while idle, makes the directories ps through the cache,
// stored, and returns with a watch of the server's disk.
func leasedDirs(t *testing.T, ps ...string) (*servertest.Server, *cache.FS, *ferry.Stream[ferry.Event]) {
	t.Helper()
	s := servertest.Start(t, "")
	ctx := context.Background()
	c := open(t, s.Client(t, "a"), cache.Options{WriteBehind: true, LeaseIdle: time.Hour})
	for _, p := range ps {
		if _, err := c.Make(ctx, p, ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	disk, err := local.New(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	events := disk.Watch(wctx, "/")
	t.Cleanup(func() {
		cancel()
		events.Close()
	})
	// The watch is in place once it reports the tree lost, its first
	// event: a change made before that would not be seen.
	if ev, ok := events.Next(); !ok || !ev.Lost || ev.Path != "/" {
		t.Fatalf("the watch of the server's disk began with %v, %v; want / lost", ev, events.Err())
	}
	return s, c, events
}

// statusLine returns the line of c's status that starts with key.
func statusLine(c *cache.FS, key string) string {
	for l := range strings.Lines(c.Status(context.Background())) {
		if strings.HasPrefix(l, key+": ") {
			return strings.TrimSuffix(l, "\n")
		}
	}
	return ""
}

// waitLost waits until events reports the subtree p lost.
func waitLost(t *testing.T, events *ferry.Stream[ferry.Event], p string) {
	t.Helper()
	got := make(chan struct{})
	go func() {
		defer close(got)
		for ev := range events.All() {
			if ev.Lost && ev.Path == p {
				return
			}
		}
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatalf("no Lost event for %s on the server's disk", p)
	}
}

// TestOwnRenameKeepsLease: the holder's own rename of a directory with
// files in it leaves its lease in place (the server's disk reports an
// event for each entry of the directory renamed into place, and those
// are the rename's), while an empty directory renamed on the server's
// own disk, which the disk reports only as its subtree lost, recalls it.
func TestOwnRenameKeepsLease(t *testing.T) {
	s, c, events := leasedDirs(t, "/d", "/d/x", "/d/e")
	ctx := context.Background()
	for i := range 3 {
		if _, err := c.Put(ctx, fmt.Sprintf("/d/x/f%d", i), ferry.Dir{}, ferry.Whole, strings.NewReader("x")).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	leases := func() string { return statusLine(c, "leases.write") }
	if _, err := c.Move(ctx, "/d/x", "/d/y").Wait(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	waitLost(t, events, "/d/y")
	time.Sleep(300 * time.Millisecond)
	if st := leases(); !strings.Contains(st, " 0 recalled") {
		t.Errorf("the holder's own rename of a directory recalled its lease: %s", st)
	}

	time.Sleep(2100 * time.Millisecond) // past callback.servedFor
	if err := os.Rename(filepath.Join(s.Dir, "d", "e"), filepath.Join(s.Dir, "d", "e2")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(leases(), " 0 recalled") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := leases(); strings.Contains(st, " 0 recalled") {
		t.Errorf("an empty directory renamed on the server's disk under the lease: %s, want it recalled", st)
	}
	// The recall's recheck drops what the cache held there.
	for {
		_, err := c.Lookup(ctx, "/d", "e2")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup of /d/e2, renamed on the server's disk: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRmdirBehind: under a write lease, the removal of a directory the
// cache knows to be empty returns at once and runs in the background, in
// order with the changes around it (configure makes and removes the same
// directories again and again); a directory not known empty still asks
// the server, which refuses a full one.
func TestRmdirBehind(t *testing.T) {
	s, c := behindWithDir(t)
	ctx := context.Background()
	for _, p := range []string{"/d/x", "/d/full"} {
		if _, err := c.Make(ctx, p, ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "/d/full/f", ferry.Dir{}, ferry.Whole, strings.NewReader("f")).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	f := c.Remove(ctx, "/d/x")
	if !done(f) {
		t.Error("the rmdir of an empty directory waited for the server")
	}
	if _, err := f.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, "/d", "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lookup of /d/x after its rmdir: %v, want not found", err)
	}
	// Made again at once, and removed and made once more: the server
	// must end with the directory, as the calls left it.
	if _, err := c.Make(ctx, "/d/x", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove(ctx, "/d/x").Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Make(ctx, "/d/x", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove(ctx, "/d/full").Wait(); !errors.Is(err, syscall.ENOTEMPTY) && !strings.Contains(fmt.Sprint(err), "not empty") {
		t.Errorf("rmdir of a full directory: %v, want it refused as not empty", err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(s.Dir, "d", "x")); err != nil || !fi.IsDir() {
		t.Errorf("/d/x on the server after make, rmdir, make, rmdir, make: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "d", "full", "f")); err != nil {
		t.Errorf("the full directory's file: %v", err)
	}
	if _, err := c.Remove(ctx, "/d/x").Wait(); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "d", "x")); !os.IsNotExist(err) {
		t.Errorf("/d/x on the server after its last rmdir and a sync: %v", err)
	}
}

// TestLookupBesideABacklog: under a write lease, a lookup of a name in a
// directory the cache has not listed, while changes below it are still
// kept back (an unpack's, thousands at a long round trip), asks for that
// name alone: it used to list the directory, which waits until every one
// of those changes is stored (`tar xf && touch done` waited seconds).
func TestLookupBesideABacklog(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	// A long round trip: stores that aged out are still under way for
	// as long again.
	slow := servertest.DelayProxy(t, s.Addr, 200*time.Millisecond)
	c := open(t, s.ClientVia(t, "a", slow), cache.Options{WriteBehind: true})
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	const files = 40
	kept := 0
	for i := range files {
		f := c.Put(ctx, fmt.Sprintf("/d/f%d", i), ferry.Dir{}, ferry.Whole, strings.NewReader("x"))
		if done(f) {
			kept++
		}
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if kept < files/2 {
		t.Fatalf("only %d of %d stores were kept back", kept, files)
	}
	// The root, which the cache has not listed.
	if _, err := c.Lookup(ctx, "/", "done"); !ferry.IsKind(err, ferry.KindNotExist) {
		t.Fatalf("looking up a name not there: %v", err)
	}
	// Stores age a second before they go and then take a round trip:
	// had the lookup waited for them, none would be left.
	st := c.Status(ctx)
	i := strings.Index(st, "writeback.pending: ")
	var pending int
	if i < 0 {
		t.Fatalf("no writeback.pending in the status:\n%s", st)
	}
	fmt.Sscanf(st[i+len("writeback.pending: "):], "%d", &pending)
	if pending == 0 {
		t.Errorf("the lookup waited for the %d files kept back to be stored", files)
	}
	if _, err := c.Stat(ctx, "/d/f1").Wait(); err != nil {
		t.Errorf("a file kept back: %v", err)
	}
}
