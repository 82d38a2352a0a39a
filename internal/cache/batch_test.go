package cache_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/ctl"
)

// TestBatch: files stored through the cache's batch land below after the
// changes of their paths the cache kept back, and the cache knows them
// at once after; over a tree without batches each goes by a Put.
func TestBatch(t *testing.T) {
	for _, st := range []struct {
		name   string
		remote bool
		opt    cache.Options
	}{
		{"local", false, cache.Options{}},
		{"remote", true, cache.Options{}},
		{"remote-writebehind", true, cache.Options{WriteBehind: true}},
	} {
		t.Run(st.name, func(t *testing.T) {
			fsys, dir := below(t, st.remote)
			_, batches := ferry.As[ferry.Batcher](fsys)
			if batches != st.remote {
				t.Fatalf("the tree below has batches: %v, want %v", batches, st.remote)
			}
			if g, ok := ferry.As[ferry.Grouper](fsys); ok {
				// Changes kept back land late: a batched file that
				// did not wait for them would be overwritten.
				fsys = slowGroups{FS: fsys, g: g}
			}
			c := open(t, fsys, st.opt)
			ctx := context.Background()
			// The cache keeps a file's store back once it knows what is
			// there now: here, that nothing is.
			if _, err := c.List(ctx, "/"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Put(ctx, "/f", ferry.Dir{}, ferry.Whole, strings.NewReader("kept back")).Wait(); err != nil {
				t.Fatal(err)
			}
			if st.opt.WriteBehind && !strings.Contains(c.Status(ctx), "writeback.pending: 1 calls") {
				t.Fatalf("the first store is not kept back:\n%s", c.Status(ctx))
			}
			b := c.Batch(ctx)
			var wg sync.WaitGroup
			errs := make(chan error, 3)
			for _, f := range []struct{ p, data string }{{"/f", "batched over it"}, {"/g", "new"}, {"/h", strings.Repeat("h", 200<<10)}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := b.Replace(ctx, f.p, ferry.Dir{ferry.AttrMode: "0640"}, io.NewSectionReader(strings.NewReader(f.data), 0, int64(len(f.data)))).Wait()
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := c.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			for p, want := range map[string]string{"/f": "batched over it", "/g": "new", "/h": strings.Repeat("h", 200<<10)} {
				got, err := os.ReadFile(filepath.Join(dir, p))
				if err != nil || string(got) != want {
					t.Errorf("%s below holds %d bytes (%v), want %d", p, len(got), err, len(want))
				}
				d := c.Known(p)
				if d == nil || d.Size() != int64(len(want)) || d.Mode().Perm() != 0o640 {
					t.Errorf("the cache knows %s as %v, want %d bytes, mode 0640", p, d, len(want))
				}
			}
		})
	}
}

// slowGroups is a tree whose groups of changes commit 300 ms late.
type slowGroups struct {
	ferry.FS
	g ferry.Grouper
}

func (s slowGroups) Unwrap() ferry.FS { return s.FS }

func (s slowGroups) Group() ferry.Group { return slowGroup{s.g.Group()} }

type slowGroup struct{ ferry.Group }

func (g slowGroup) Commit(ctx context.Context) error {
	time.Sleep(300 * time.Millisecond)
	return g.Group.Commit(ctx)
}

// TestCtlThroughCache: the cache passes the control file through, so a
// control layer above it shows the sections below it, and a command
// written there reaches them and is not kept as the file's content.
func TestCtlThroughCache(t *testing.T) {
	fsys, _ := below(t, false)
	low := &controller{status: "low: yes\n"}
	c := cache.New(ctl.New("low", fsys, low), cache.Options{})
	t.Cleanup(func() { c.Close() })
	top := ctl.New("cache", c, c)
	ctx := context.Background()
	read := func() string {
		r := top.Get(ctx, ferry.CtlPath, 0, -1)
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if s := read(); !strings.Contains(s, "[cache]\n") || !strings.Contains(s, "[low]\nlow: yes\n") {
		t.Fatalf("/Ctl over the cache: %q", s)
	}
	if _, err := top.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader("pass hello there")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := low.commands(); len(got) != 1 || got[0] != "hello there" {
		t.Errorf("the layer below the cache ran %q, want [hello there]", got)
	}
	if s := read(); !strings.Contains(s, "[low]\nlow: yes\n") {
		t.Errorf("/Ctl after a command: %q", s)
	}
	// The file's size is what reading it gives, not what was written.
	if d, err := c.Stat(ctx, ferry.CtlPath).Wait(); err != nil || d.Size() != int64(len("[low]\nlow: yes\n")) {
		t.Errorf("the cache answers Stat of /Ctl with %v, %v", d, err)
	}
}

// controller records the commands it is given.
type controller struct {
	status string
	mu     sync.Mutex
	ran    []string
}

func (c *controller) Status(context.Context) string { return c.status }

func (c *controller) Command(_ context.Context, args []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ran = append(c.ran, strings.Join(args, " "))
	return nil
}

func (c *controller) commands() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ran...)
}
