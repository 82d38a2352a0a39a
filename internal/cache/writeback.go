package cache

import (
	"context"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
)

// Limits of write-back (Options.WriteBack). A closed file is copied into
// memory and stored in the background, so snapshotMax bounds the file that
// may be, and writebackMax all those not yet stored; beyond them close
// stores synchronously, as without write-back. writebackOps bounds the
// stores in flight: enough to keep a 100 ms link busy with small files.
const (
	snapshotMax  = 16 << 20
	writebackMax = 256 << 20
	writebackOps = 64
)

// writeback orders the calls a mount makes to the server when some of them
// run in the background: a call on a path starts only after every earlier
// background call on the same path, on a directory above it or on a path
// below it has finished, so the server sees them in the order the programs
// made them. Failures of background calls are kept, by path, until a
// flush or fsync of that path (or of a directory above it) reports them.
type writeback struct {
	mu    sync.Mutex
	ops   []*wbOp          // Issued and not finished, oldest first.
	errs  map[string]error // Failures not yet reported.
	bytes int64            // Snapshot bytes held by ops.
	sem   chan struct{}
	// timeout bounds each background call (Options.CallTimeout).
	timeout time.Duration
}

type wbOp struct {
	paths []string
	size  int64
	done  chan struct{}
}

func newWriteback(timeout time.Duration) *writeback {
	return &writeback{errs: map[string]error{}, sem: make(chan struct{}, writebackOps), timeout: timeout}
}

// related reports whether a call on a must be ordered with one on b.
func related(a, b string) bool { return ferry.HasPrefix(a, b) || ferry.HasPrefix(b, a) }

// before returns the unfinished ops on paths related to any of ps. w.mu is
// held.
func (w *writeback) before(ps []string) []*wbOp {
	var deps []*wbOp
	for _, op := range w.ops {
		if op.touches(ps) {
			deps = append(deps, op)
		}
	}
	return deps
}

// touches reports whether the op must be ordered with a call on any of ps.
func (op *wbOp) touches(ps []string) bool {
	for _, q := range op.paths {
		for _, p := range ps {
			if related(q, p) {
				return true
			}
		}
	}
	return false
}

// start runs call, a change of p, in the background, after the earlier
// calls it must follow, holding size bytes of the budget until it ends.
// It reports false, and runs nothing, if the budget cannot take size: the
// caller then makes the call itself.
func (w *writeback) start(p string, size int64, call func(ctx context.Context) error) bool {
	return w.startAll([]string{p}, size, call)
}

// startAll is start for a call that changes all of ps (a rename); a
// failure is kept for the first.
func (w *writeback) startAll(ps []string, size int64, call func(ctx context.Context) error) bool {
	p := ps[0]
	w.mu.Lock()
	if w.bytes+size > writebackMax {
		w.mu.Unlock()
		return false
	}
	deps := w.before(ps)
	op := &wbOp{paths: ps, size: size, done: make(chan struct{})}
	w.ops = append(w.ops, op)
	w.bytes += size
	w.mu.Unlock()
	go func() {
		for _, d := range deps {
			<-d.done
		}
		w.sem <- struct{}{}
		// A background call outlives the request that queued it; it
		// has its own deadline, like every call of the mount.
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		err := call(ctx)
		cancel()
		<-w.sem
		w.mu.Lock()
		for i, o := range w.ops {
			if o == op {
				w.ops = append(w.ops[:i], w.ops[i+1:]...)
				break
			}
		}
		w.bytes -= size
		if err != nil && w.errs[p] == nil {
			w.errs[p] = err
		}
		w.mu.Unlock()
		close(op.done)
	}()
	return true
}

// wait blocks until every background call issued so far on a path related
// to any of ps has finished, or ctx is done.
func (w *writeback) wait(ctx context.Context, ps ...string) error {
	w.mu.Lock()
	deps := w.before(ps)
	w.mu.Unlock()
	for _, d := range deps {
		select {
		case <-d.done:
		case <-ctx.Done():
			return ferry.E("cache.Sync", ps[0], ferry.KindCanceled, ctx.Err())
		}
	}
	return nil
}

// sync waits for the background calls on p and below it, then returns and
// forgets the first failure recorded for them.
func (w *writeback) sync(ctx context.Context, p string) error {
	if err := w.wait(ctx, p); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, err := range w.errs {
		if ferry.HasPrefix(q, p) {
			delete(w.errs, q)
			return err
		}
	}
	return nil
}

// failed returns and forgets a failure recorded for p, without waiting.
func (w *writeback) failed(p string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.errs[p]
	delete(w.errs, p)
	return err
}

// pending reports the calls not yet finished and the bytes they hold.
func (w *writeback) pending() (ops int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ops), w.bytes
}
