package fusefs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestTwoMounts checks coherence through the server's watch: two mounts of
// one server, with metadata trusted for an hour without a watch, see each
// other's changes, and changes made directly in the served directory, at
// once rather than after a timeout.
func TestTwoMounts(t *testing.T) {
	needFUSE(t)
	srv := servertest.Start(t, "")
	ca, cb := srv.Client(t, "a"), srv.Client(t, "b")
	if _, ok := ferry.FS(ca).(ferry.Watcher); !ok {
		t.Skip("skipping: the remote client offers no watch yet")
	}
	writeFile(t, filepath.Join(srv.Dir, "f"), "v1")
	opt := Options{TTL: time.Hour}
	a, sa := mountFS(t, ca, opt)
	b, sb := mountFS(t, cb, opt)
	if !waitFor(5*time.Second, func() bool { return sa.cache.Leased() && sb.cache.Leased() }) {
		t.Fatal("the mounts got no watch")
	}
	if got := readFile(t, filepath.Join(b, "f")); got != "v1" {
		t.Fatalf("b reads %q", got)
	}
	seen := func(p, want string) bool {
		return waitFor(3*time.Second, func() bool {
			got, _ := os.ReadFile(p)
			return string(got) == want
		})
	}
	// A close in one mount is seen by an open in the other.
	if err := os.WriteFile(filepath.Join(a, "f"), []byte("v2 from a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !seen(filepath.Join(b, "f"), "v2 from a") {
		t.Errorf("b does not see a's change")
	}
	// A new file and a new directory.
	os.Mkdir(filepath.Join(b, "dir"), 0o755)
	os.WriteFile(filepath.Join(b, "dir/new"), []byte("new from b"), 0o644)
	if !seen(filepath.Join(a, "dir/new"), "new from b") {
		t.Errorf("a does not see b's new file")
	}
	// A process writing directly into the served directory.
	writeFile(t, filepath.Join(srv.Dir, "f"), "v3 on the server")
	if !seen(filepath.Join(a, "f"), "v3 on the server") || !seen(filepath.Join(b, "f"), "v3 on the server") {
		t.Errorf("the mounts do not see a change made on the server")
	}
	// A removal.
	os.Remove(filepath.Join(a, "dir/new"))
	if !waitFor(3*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(b, "dir/new"))
		return os.IsNotExist(err)
	}) {
		t.Errorf("b still sees a removed file")
	}
}

// TestDirCache: on a leased mount the kernel keeps a directory's listing
// across opens, so listing it again does not come to the mount; a change
// made on the server still shows at once (the watch's invalidation drops
// the kernel's copy), and so does one made through the mount.
func TestDirCache(t *testing.T) {
	needFUSE(t)
	dir, tree := localTree(t)
	writeFile(t, filepath.Join(dir, "d", "a"), "a")
	mnt, s := mountFS(t, tree, Options{})
	names := func() string { t.Helper(); return listNames(t, filepath.Join(mnt, "d")) }
	if got := names(); got != "a" {
		t.Fatalf("listing = %q, want %q", got, "a")
	}
	// The kernel resets its copy whenever the directory's mtime or
	// version it holds moves; in about one run in twenty something moves
	// it once here (not pinned down), so the check is made up to three
	// times: one listing the kernel answers itself shows it keeps them.
	var readdirs, opendirs int64
	for range 3 {
		before, opens := s.readdirs.Load(), s.kernel.opendirs.Load()
		if got := names(); got != "a" {
			t.Fatalf("second listing = %q, want %q", got, "a")
		}
		readdirs, opendirs = s.readdirs.Load()-before, s.kernel.opendirs.Load()-opens
		if readdirs == 0 && opendirs == 0 {
			break
		}
	}
	if readdirs != 0 {
		t.Errorf("listing the directory again came to the mount %d times, want 0 (the kernel keeps it)", readdirs)
	}
	if opendirs != 0 {
		t.Errorf("opening the directory again came to the mount %d times, want 0 (the kernel opens it itself)", opendirs)
	}
	// Made on the server: the watch drops the kernel's listing.
	writeFile(t, filepath.Join(dir, "d", "b"), "b")
	for i := 0; names() != "a b"; i++ {
		if i == 250 {
			t.Fatalf("a file made on the server is not listed after 5 s: %q", names())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Made through the mount: the kernel drops its listing itself.
	if err := os.Remove(filepath.Join(mnt, "d", "a")); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "b" {
		t.Errorf("after removing a through the mount, listing = %q, want %q", got, "b")
	}
}

// TestNegativeEntries: on a leased mount the kernel keeps "no such file"
// for a name, so asking again does not come to the mount; a file made on
// the server under that name still shows at once (the watch's
// invalidation drops the kernel's entry).
func TestNegativeEntries(t *testing.T) {
	needFUSE(t)
	dir, tree := localTree(t)
	writeFile(t, filepath.Join(dir, "d", "a"), "a")
	mnt, s := mountFS(t, tree, Options{})
	nope := filepath.Join(mnt, "d", "nope")
	// As in TestDirCache, something now and then makes the kernel drop
	// what it holds for d once, early: the check is made up to three
	// times, and one run in which the kernel answered itself shows it
	// keeps the answer.
	var came []string
	for range 3 {
		came = came[:0]
		for i := range 3 {
			before := s.kernel.lookups.Load()
			if _, err := os.Stat(nope); !os.IsNotExist(err) {
				t.Fatalf("stat %d of a missing name: %v, want no such file", i, err)
			}
			if n := s.kernel.lookups.Load() - before; i > 0 && n != 0 {
				came = append(came, fmt.Sprintf("stat %d of a missing name came to the mount %d times", i, n))
			}
		}
		if len(came) == 0 {
			break
		}
	}
	for _, c := range came {
		t.Errorf("%s, want 0 (the kernel keeps the answer)", c)
	}
	writeFile(t, filepath.Join(dir, "d", "nope"), "here")
	if !waitFor(5*time.Second, func() bool { _, err := os.Stat(nope); return err == nil }) {
		t.Fatalf("a file made on the server under a name the kernel knew missing is not there after 5 s")
	}
	if got := readFile(t, nope); got != "here" {
		t.Errorf("read %q, want %q", got, "here")
	}
}

// TestListingExpiresWithoutLease: once the kernel opens directories itself
// it keeps their listings, so a listing made after the lease was lost must
// still be dropped after the TTL, as entries are.
func TestListingExpiresWithoutLease(t *testing.T) {
	needFUSE(t)
	dir, tree := localTree(t)
	writeFile(t, filepath.Join(dir, "d", "a"), "a")
	w := &watching{FS: tree, watches: make(chan chan ferry.Event, 4)}
	// The watch does not come back within the test once it ends.
	mnt, s := mountFS(t, w, Options{TTL: 200 * time.Millisecond, Cache: cache.Options{WatchBackoff: time.Hour}})
	events := <-w.watches
	if !waitFor(5*time.Second, s.cache.Leased) {
		t.Fatal("no lease after the watch's first event")
	}
	list := func() string { t.Helper(); return listNames(t, filepath.Join(mnt, "d")) }
	if got := list(); got != "a" {
		t.Fatalf("listing = %q, want %q", got, "a")
	}
	if !s.kernel.noOpendir.Load() {
		t.Fatal("the kernel still opens directories through the mount under a lease")
	}
	close(events)
	if !waitFor(5*time.Second, func() bool { return !s.cache.Leased() }) {
		t.Fatal("the lease outlived its watch")
	}
	if got := list(); got != "a" {
		t.Fatalf("listing without a lease = %q, want %q", got, "a")
	}
	// Made on the server with no watch to tell, and the directory's time
	// put back as rsync -a does, so that the kernel cannot tell by it:
	// seen once the TTL is over.
	st, err := os.Stat(filepath.Join(dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "d", "b"), "b")
	if err := os.Chtimes(filepath.Join(dir, "d"), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return list() == "a b" }) {
		t.Errorf("5 s after a file was made on the server without a lease, listing = %q, want %q", list(), "a b")
	}
}

// listNames returns the names in dir, space-separated, in order.
func listNames(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return strings.Join(out, " ")
}

// TestCloseToOpen: a file closed by another client is seen, at once and
// every time, by an open in a mount whose link to the server is slower
// than the writer's (so the server's watch event reaches it late): a new
// file, a rewrite, an append and a removal, each read right after the
// writer's call returned. The writer is another mount, or a native client
// (ferry put, rm). The writer's call waits for the reading mount's
// callback acknowledgement.
func TestCloseToOpen(t *testing.T) {
	needFUSE(t)
	// writer makes the changes of one round: write (or append to) the
	// file at the tree path p, or remove it.
	type writer struct {
		write  func(p, data string, appendTo bool) error
		remove func(p string) error
	}
	mountWriter := func(writeBack, kernelOpens bool) func(t *testing.T, c *remote.Client) writer {
		return func(t *testing.T, c *remote.Client) writer {
			a, sa := mountFS(t, c, Options{TTL: time.Hour, WriteBack: writeBack, KernelOpens: kernelOpens})
			if !waitFor(5*time.Second, sa.cache.Leased) {
				t.Fatal("the writing mount got no watch")
			}
			t.Cleanup(func() {
				// The rounds must have run as the options say
				// (kernelFS).
				if kernelOpens != sa.kernel.noOpen.Load() {
					t.Errorf("the writing mount let the kernel open files: %v, want %v", sa.kernel.noOpen.Load(), kernelOpens)
				}
			})
			return writer{
				write: func(p, data string, appendTo bool) error {
					flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
					if appendTo {
						flag = os.O_WRONLY | os.O_APPEND
					}
					f, err := os.OpenFile(filepath.Join(a, p), flag, 0o644)
					if err != nil {
						return err
					}
					f.WriteString(data)
					return f.Close()
				},
				remove: func(p string) error { return os.Remove(filepath.Join(a, p)) },
			}
		}
	}
	tests := []struct {
		name   string
		writer func(t *testing.T, c *remote.Client) writer
	}{
		{"another mount", mountWriter(false, false)},
		// Its changes are kept back under write leases, which the
		// reader's opens recall.
		{"another mount with write-back", mountWriter(true, false)},
		// And stored before the recall is acknowledged, with no close
		// heard (unclosed.go).
		{"another mount with write-back, kernel opens", mountWriter(true, true)},
		{"a native client", func(t *testing.T, c *remote.Client) writer {
			ctx := context.Background()
			return writer{
				write: func(p, data string, appendTo bool) error {
					off := ferry.Whole
					if appendTo {
						d, err := c.Stat(ctx, p).Wait()
						if err != nil {
							return err
						}
						off = d.Size()
					}
					_, err := c.Put(ctx, p, ferry.Dir{}, off, strings.NewReader(data)).Wait()
					return err
				},
				remove: func(p string) error { _, err := c.Remove(ctx, p).Wait(); return err },
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := servertest.Start(t, "")
			w := tt.writer(t, srv.Client(t, "a"))
			cb := srv.ClientVia(t, "b", servertest.DelayProxy(t, srv.Addr, 5*time.Millisecond))
			b, sb := mountFS(t, cb, Options{TTL: time.Hour})
			if !waitFor(5*time.Second, sb.cache.Leased) {
				t.Fatal("the reading mount got no watch")
			}
			const rounds = 30
			stale := 0
			check := func(i, step int, name, want string) {
				got, err := readFileErr(filepath.Join(b, name))
				if want == "" && !os.IsNotExist(err) || want != "" && got != want {
					stale++
					t.Errorf("round %d step %d: b read %q (%v) right after the other client's change, want %q", i, step, got, err, want)
				}
				// B caches this version before the next step changes it.
				readFileErr(filepath.Join(b, name))
			}
			for i := range rounds {
				name := fmt.Sprintf("f%d", i)
				// B looks first, so that it caches the name's absence.
				check(i, 0, name, "")
				steps := []struct {
					data     string
					appendTo bool
					want     string
				}{
					{"new " + name, false, "new " + name},
					{"rewritten " + name, false, "rewritten " + name},
					{" appended", true, "rewritten " + name + " appended"},
				}
				for step, s := range steps {
					if err := w.write("/"+name, s.data, s.appendTo); err != nil {
						t.Fatal(err)
					}
					check(i, step+1, name, s.want)
				}
				if i%2 == 1 {
					if err := w.remove("/" + name); err != nil {
						t.Fatal(err)
					}
					check(i, len(steps)+1, name, "")
				}
			}
			if stale > 0 {
				t.Errorf("%d opens after another client's change were stale", stale)
			}
		})
	}
}

func readFileErr(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}
