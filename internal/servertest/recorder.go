package servertest

import (
	"context"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/server"
)

// Recorder is a layer that records every change made through it, as a
// replica layer between the server and the chunk store must see them:
// "put P", "move FROM TO", "link FROM TO", "remove P", "removeall P",
// "wstat P". StartRecording stacks one.
type Recorder struct {
	ferry.FS
	mu  sync.Mutex
	ops []string
}

// StartRecording starts a server of chunks, as StartChunked does, with a
// Recorder between the server and the chunk store, and returns both.
func StartRecording(t testing.TB) (*Server, *Recorder) {
	rec := &Recorder{}
	s := StartChunkedWith(t, "", func(cfg *server.Config) {
		rec.FS = cfg.FS
		cfg.FS = rec
	})
	return s, rec
}

// Unwrap implements ferry.Unwrapper.
func (r *Recorder) Unwrap() ferry.FS { return r.FS }

func (r *Recorder) note(op, p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op+" "+p)
}

// Ops returns the changes recorded so far, in the order made.
func (r *Recorder) Ops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Saw reports whether the change op was recorded.
func (r *Recorder) Saw(op string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.ops, op)
}

// Put implements ferry.Tree.
func (r *Recorder) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	r.note("put", p)
	return r.FS.Put(ctx, p, d, off, data)
}

// Move implements ferry.Tree.
func (r *Recorder) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	r.note("move", from+" "+to)
	return r.FS.Move(ctx, from, to)
}

// Link implements ferry.Tree.
func (r *Recorder) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	r.note("link", from+" "+to)
	return r.FS.Link(ctx, from, to)
}

// Remove implements ferry.Tree.
func (r *Recorder) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	r.note("remove", p)
	return r.FS.Remove(ctx, p)
}

// RemoveAll implements ferry.Tree.
func (r *Recorder) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	r.note("removeall", p)
	return r.FS.RemoveAll(ctx, p)
}

// Wstat implements ferry.Tree.
func (r *Recorder) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	r.note("wstat", p)
	return r.FS.Wstat(ctx, p, d)
}
