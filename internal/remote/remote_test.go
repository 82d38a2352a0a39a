package remote_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestSuite runs the shared suite through a real server on loopback, so
// every call, its errors and its cancellation cross the wire.
func TestSuite(t *testing.T) {
	fstest.Run(t, func(t *testing.T) (ferry.FS, string) {
		s := servertest.Start(t, "")
		return s.Client(t, "tester"), s.Dir
	})
}

func TestWatch(t *testing.T) {
	fstest.RunWatch(t, func(t *testing.T) (ferry.Watcher, ferry.FS, string) {
		s := servertest.Start(t, "")
		c := s.Client(t, "tester")
		return c, c, s.Dir
	})
}

// TestSmallGetOnCallConnection: a Get of at most SmallGet bytes goes on
// the connection that carries Stat, not behind bulk data; a Get to the end
// of the file goes on the bulk connection. The server counts calls per
// connection.
func TestSmallGetOnCallConnection(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(filepath.Join(s.Dir, "small"), []byte("a small file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, "tester")
	ctx := context.Background()
	for range 2 {
		if _, err := c.Stat(ctx, "/small").Wait(); err != nil {
			t.Fatal(err)
		}
	}
	for _, count := range []int64{13, remote.SmallGet, -1} {
		r := c.Get(ctx, "/small", 0, count)
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != "a small file\n" {
			t.Fatalf("Get(count %d) = %q, %v", count, b, err)
		}
	}
	// Two Stats and the two small Gets on one connection, the Get to the
	// end on the other.
	calls := map[string]bool{}
	for _, line := range strings.Split(s.Srv.Status(ctx), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[0] == "conn:" {
			calls[f[4]] = true
		}
	}
	if !calls["calls=4"] || !calls["calls=1"] || len(calls) != 2 {
		t.Errorf("calls per connection %v, want calls=4 (two Stats, two small Gets) and calls=1 (the Get to the end)", calls)
	}
}

// TestGetCancelledAfterArrival: a Get whose data has all arrived still
// fails once its context is cancelled, rather than ending as if the file
// were complete (the shared suite's Cancel met this under load).
func TestGetCancelledAfterArrival(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), []byte(strings.Repeat("x", 100<<10)), 0o644); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, "tester")
	ctx, cancel := context.WithCancel(context.Background())
	r := c.Get(ctx, "/f", 0, -1)
	defer r.Close()
	if _, err := io.ReadFull(r, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // The rest arrives meanwhile, over loopback.
	cancel()
	b, err := io.ReadAll(r)
	if ferry.KindOf(err) != ferry.KindCanceled {
		t.Errorf("read %d bytes more, then %v; want KindCanceled", len(b), err)
	}
}

// TestFindOmit: a client configured with FindOmit gets Find results and
// batched Put answers without those attributes; one without gets them.
func TestFindOmit(t *testing.T) {
	s := servertest.StartChunked(t, "")
	if err := os.WriteFile(filepath.Join(s.Dir, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, omit := range [][]string{nil, remote.BriefAttrs} {
		c := s.ClientVia(t, "tester", s.Addr, func(cfg *remote.Config) { cfg.FindOmit = omit })
		var got []ferry.Dir
		for e := range c.Find(ctx, "/", "name=f").All() {
			got = append(got, e.Dir)
		}
		b := c.PutBatch(ctx)
		d, err := b.Put(ctx, "/g", ferry.Dir{ferry.AttrType: ferry.TypeFile}, io.NewSectionReader(strings.NewReader("g"), 0, 1)).Wait()
		b.Close()
		if err != nil || len(got) != 1 {
			t.Fatalf("omit %v: Find = %v; Put = %v, %v", omit, got, d, err)
		}
		for _, k := range remote.BriefAttrs {
			for what, d := range map[string]ferry.Dir{"Find": got[0], "Put": d} {
				if _, has := d[k]; has != (omit == nil) {
					t.Errorf("omit %v: %s answer %v; has %s: %v, want %v", omit, what, d, k, has, omit == nil)
				}
			}
		}
		if got[0].Size() != 1 || got[0][ferry.AttrMtime] == "" {
			t.Errorf("omit %v: Find answer %v lacks size or mtime", omit, got[0])
		}
	}
}

// TestParentTimes: the entry a Put, Move or Link returns carries the times
// of its directory on the server right after the call.
func TestParentTimes(t *testing.T) {
	s := servertest.Start(t, "")
	if err := os.Mkdir(filepath.Join(s.Dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, "tester")
	ctx := context.Background()
	calls := []struct {
		name string
		call func() (ferry.Dir, error)
	}{
		{"Put", func() (ferry.Dir, error) {
			return c.Put(ctx, "/d/f", ferry.Dir{ferry.AttrType: ferry.TypeFile}, ferry.Whole, strings.NewReader("f")).Wait()
		}},
		{"Link", func() (ferry.Dir, error) { return c.Link(ctx, "/d/f", "/d/g").Wait() }},
		{"Move", func() (ferry.Dir, error) { return c.Move(ctx, "/d/g", "/d/h").Wait() }},
	}
	for _, tc := range calls {
		d, err := tc.call()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(s.Dir, "d"), &st); err != nil {
			t.Fatal(err)
		}
		if got, want := d.Int(ferry.AttrParentMtime), st.Mtim.Nano(); got != want {
			t.Errorf("%s: parent mtime %d, want %d", tc.name, got, want)
		}
		if got, want := d.Int(ferry.AttrParentCtime), st.Ctim.Nano(); got != want {
			t.Errorf("%s: parent ctime %d, want %d", tc.name, got, want)
		}
	}
}
