package server_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/servertest"
)

// recorder is a layer that records every change made through it, as a
// replica layer between the server and the chunk store must see them.
type recorder struct {
	ferry.FS
	mu  sync.Mutex
	ops []string
}

func (r *recorder) Unwrap() ferry.FS { return r.FS }

func (r *recorder) note(op, p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op+" "+p)
}

func (r *recorder) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	r.note("put", p)
	return r.FS.Put(ctx, p, d, off, data)
}

func (r *recorder) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	r.note("move", from+" "+to)
	return r.FS.Move(ctx, from, to)
}

func (r *recorder) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	r.note("link", from+" "+to)
	return r.FS.Link(ctx, from, to)
}

func (r *recorder) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	r.note("remove", p)
	return r.FS.Remove(ctx, p)
}

func (r *recorder) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	r.note("removeall", p)
	return r.FS.RemoveAll(ctx, p)
}

func (r *recorder) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	r.note("wstat", p)
	return r.FS.Wstat(ctx, p, d)
}

// TestEveryChangeThroughLayers: a layer stacked between the server and the
// chunk store sees every change clients make, whatever way the bytes took:
// plain puts, chunked puts, batched puts, and the other calls. Chunked
// puts still go by chunks through it.
func TestEveryChangeThroughLayers(t *testing.T) {
	rec := &recorder{}
	s := servertest.StartChunkedWith(t, "", func(cfg *server.Config) {
		rec.FS = cfg.FS
		cfg.FS = rec
	})
	c := s.Client(t, "u")
	cx := ctx(t)
	big := bytes.Repeat([]byte("a chunked file\n"), 200<<10)
	before := s.Srv.Calls()
	steps := []struct {
		want string
		do   func() error
	}{
		{"put /small", func() error {
			_, err := c.Put(cx, "/small", nil, ferry.Whole, bytes.NewReader([]byte("x"))).Wait()
			return err
		}},
		{"put /big", func() error {
			_, err := c.Put(cx, "/big", nil, ferry.Whole, bytes.NewReader(big)).Wait()
			return err
		}},
		{"put /batched", func() error {
			b := c.PutBatch(cx)
			defer b.Close()
			data := bytes.Repeat([]byte("batched\n"), 20<<10)
			_, err := b.Put(cx, "/batched", nil, io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data)))).Wait()
			return err
		}},
		{"put /dir", func() error {
			_, err := c.Put(cx, "/dir", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait()
			return err
		}},
		{"move /small /dir/small", func() error { _, err := c.Move(cx, "/small", "/dir/small").Wait(); return err }},
		{"link /big /dir/big", func() error { _, err := c.Link(cx, "/big", "/dir/big").Wait(); return err }},
		{"wstat /big", func() error {
			_, err := c.Wstat(cx, "/big", ferry.Dir{ferry.AttrMode: "0600"}).Wait()
			return err
		}},
		{"remove /batched", func() error { _, err := c.Remove(cx, "/batched").Wait(); return err }},
		{"removeall /dir", func() error { _, err := c.RemoveAll(cx, "/dir").Wait(); return err }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.want, err)
		}
		rec.mu.Lock()
		seen := slices.Contains(rec.ops, st.want)
		rec.mu.Unlock()
		if !seen {
			t.Errorf("the layer did not see %q; it saw %q", st.want, rec.ops)
		}
	}
	if got := servertest.CallsSince(s.Srv, before, "putchunked", 2); got < 2 {
		t.Errorf("%d chunked puts through the layer, want the big and the batched file's", got)
	}
}
