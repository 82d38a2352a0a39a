package cache

import (
	"context"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
)

// SnapshotMax is the largest file write-back (Options.WriteBack) stores in
// the background: a closed file is copied into memory (or handed over, see
// Snapshotter) and stored from there; a larger one is stored at close, as
// without write-back.
const SnapshotMax = 16 << 20

// Limits of write-back: writebackMax bounds the files not yet stored, and
// beyond it close stores synchronously; writebackOps bounds the stores in
// flight: enough to keep a 100 ms link busy with small files.
const (
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
	// aging is how long a file's store waits (see aging).
	aging time.Duration
	// grouper, if not nil, is the tree below's way of applying changes
	// together: ops then wait in queue, and flush sends them in groups,
	// each applied whole or not at all, so that the tree below always
	// shows a state this cache was in.
	grouper ferry.Grouper
	// below is what ops are made through one call each.
	below changer
	queue []*wbOp       // Ops in no group yet, oldest first.
	kick  chan struct{} // Wakes flush.
	// groups and grouped count the groups committed and the ops in
	// them; followed counts changes made at once that had to wait for
	// ops kept back (follow).
	groups, grouped, followed atomic.Int64
	// cutting is held for writing while flush cuts a group, and for
	// reading by a change made of more than one op (a rename of a file
	// whose store has not started: its removal and the store under the
	// new name), so that no group holds one without the other.
	cutting sync.RWMutex
	stop    chan struct{} // Closed by close: flush ends.
	flusher sync.Once
	// seq counts the ops issued and rewritten, to order them (see
	// wbOp.seq).
	seq uint64
}

type wbOp struct {
	paths []string
	size  int64
	done  chan struct{}
	// call makes the op's change through t; aged is when it is due.
	call func(ctx context.Context, t changer, f *fileStore) error
	aged time.Time
	// file, for a whole file stored or removed, is the state the op
	// leaves the file in: until the op starts, a later change of the
	// same file replaces it (see rewrite).
	file    *fileStore
	started bool
	// hurry is closed when something waits for the op: a file's store
	// then starts without aging.
	hurry     chan struct{}
	hurryOnce sync.Once
	// seq is the writeback's count when the op was issued, and touched
	// when it was last rewritten in place: a group cut before an op
	// issued after that rewrite would hold a later state of this op
	// than of that one (see flush).
	seq, touched uint64
}

// fileStore is what a wbOp leaves a file as: stored whole, or gone.
type fileStore struct {
	d    ferry.Dir
	buf  []byte
	gone bool
	gen  uint64
	// creates: the tree below has no file at the path before the op.
	creates bool
}

// aging is how long a file's store waits before it starts, unless
// something waits for it sooner (a recall, a release, fsync, a call that
// must follow it): as in Coda's client log, a file written again is
// stored once, and a file created and removed meanwhile (configure's
// conftest files) is never stored.
const aging = time.Second

func (op *wbOp) hasten() { op.hurryOnce.Do(func() { close(op.hurry) }) }

func newWriteback(timeout time.Duration, below changer, grouper ferry.Grouper) *writeback {
	return &writeback{errs: map[string]error{}, sem: make(chan struct{}, writebackOps), timeout: timeout, aging: aging,
		below: below, grouper: grouper, kick: make(chan struct{}, 1), stop: make(chan struct{})}
}

// changer is what a change in the background is made through: the tree
// below, or a group of its changes (ferry.Group).
type changer interface {
	Put(ctx context.Context, path string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir]
	Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir]
	Remove(ctx context.Context, path string) *ferry.Future[struct{}]
	Wstat(ctx context.Context, path string, d ferry.Dir) *ferry.Future[ferry.Dir]
}

// close ends flush; ops still queued are left as they are.
func (w *writeback) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
}

// nudge wakes flush.
func (w *writeback) nudge() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
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
func (w *writeback) start(p string, size int64, call func(ctx context.Context, t changer) error) bool {
	return w.startAll([]string{p}, size, call)
}

// startAll is start for a call that changes all of ps (a rename); a
// failure is kept for the first.
func (w *writeback) startAll(ps []string, size int64, call func(ctx context.Context, t changer) error) bool {
	return w.issue(&wbOp{paths: ps, size: size}, func(ctx context.Context, t changer, _ *fileStore) error { return call(ctx, t) })
}

// startFile is start for the whole-file store (or removal) f of p, which
// ages first (see aging). call is given f as it is when the op starts.
func (w *writeback) startFile(p string, f *fileStore, call func(ctx context.Context, t changer, f *fileStore) error) bool {
	return w.issue(&wbOp{paths: []string{p}, size: int64(len(f.buf)), file: f}, call)
}

// issue queues op, running call once the ops before it are done.
func (w *writeback) issue(op *wbOp, call func(ctx context.Context, t changer, f *fileStore) error) bool {
	w.mu.Lock()
	if w.bytes+op.size > writebackMax {
		w.mu.Unlock()
		return false
	}
	// Without groups, each op waits for those before it it must follow;
	// groups keep the order themselves.
	var deps []*wbOp
	if w.grouper == nil {
		deps = w.before(op.paths)
	}
	w.seq++
	op.seq, op.touched = w.seq, w.seq
	op.done, op.hurry = make(chan struct{}), make(chan struct{})
	aged := time.Now().Add(w.aging)
	file := op.file != nil
	w.ops = append(w.ops, op)
	w.bytes += op.size
	if w.grouper != nil {
		op.call, op.aged = call, aged
		w.queue = append(w.queue, op)
		w.mu.Unlock()
		w.flusher.Do(func() { go w.flush() })
		w.nudge()
		return true
	}
	w.mu.Unlock()
	go func() {
		for _, d := range deps {
			<-d.done
		}
		if file {
			t := time.NewTimer(time.Until(aged))
			select {
			case <-t.C:
			case <-op.hurry:
			}
			t.Stop()
		}
		w.sem <- struct{}{}
		w.mu.Lock()
		op.started = true
		f := op.file
		w.mu.Unlock()
		// A background call outlives the request that queued it; it
		// has its own deadline, like every call of the mount.
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		err := call(ctx, w.below, f)
		cancel()
		<-w.sem
		w.finish(op, err)
	}()
	return true
}

// finish records that op ended with err.
func (w *writeback) finish(op *wbOp, err error) {
	p := op.paths[0]
	w.mu.Lock()
	for i, o := range w.ops {
		if o == op {
			w.ops = append(w.ops[:i], w.ops[i+1:]...)
			break
		}
	}
	w.bytes -= op.size
	if err != nil && w.errs[p] == nil {
		w.errs[p] = err
	}
	w.mu.Unlock()
	close(op.done)
}

// last returns the last op on p, if it stores or removes the whole file
// p and no op issued after it must follow it. w.mu is held.
func (w *writeback) last(p string) *wbOp {
	// From the end: an unpack queues thousands of ops, and the last on
	// a file is most often among the last queued.
	ps := []string{p}
	for i := len(w.ops) - 1; i >= 0; i-- {
		op := w.ops[i]
		if !op.touches(ps) {
			continue
		}
		if op.file == nil || len(op.paths) != 1 || op.paths[0] != p {
			return nil
		}
		return op
	}
	return nil
}

// rewrite replaces the state of p that an op not yet started leaves with
// what change makes of it (nil: none), if the budget takes the new state.
// The op keeps its place in the order. It returns the state replaced.
// A later store of the file, its removal, a change of its attributes and
// its rename all go through here.
func (w *writeback) rewrite(p string, change func(old *fileStore) *fileStore) (*fileStore, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	op := w.last(p)
	if op == nil || op.started || op.file.gone && op.file.creates {
		// None, or one left with nothing to do and hastened to its
		// end: a new op ages afresh.
		return nil, false
	}
	f := change(op.file)
	if f == nil {
		return nil, false
	}
	size := int64(len(f.buf))
	if w.bytes-op.size+size > writebackMax {
		return nil, false
	}
	old := op.file
	w.bytes += size - op.size
	op.size, op.file = size, f
	w.seq++
	op.touched = w.seq
	if f.gone && f.creates {
		op.hasten() // Nothing is left to do.
		w.nudge()
	}
	return old, true
}

// content returns the bytes the last op on p stores, while it is not
// finished and no later op touches p: what the file is until then, read
// back from here rather than waited for (the kept contents hold files of
// up to 1 MiB only; a linker reads back archives of several).
func (w *writeback) content(p string) ([]byte, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	op := w.last(p)
	if op == nil || op.file.gone {
		return nil, false
	}
	return op.file.buf, true
}

// wait blocks until every background call issued so far on a path related
// to any of ps has finished, or ctx is done.
func (w *writeback) wait(ctx context.Context, ps ...string) error {
	w.mu.Lock()
	deps := w.before(ps)
	w.hastenLocked(deps)
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

// follow waits, before a change of ps made at once, for the background
// calls it must follow: those on related paths and, with groups, every
// one made before it, so that the tree below never shows the change
// without them.
func (w *writeback) follow(ctx context.Context, ps ...string) error {
	if w.grouper != nil {
		ps = []string{"/"}
	}
	if w.busy(ps[0]) || len(ps) > 1 && w.busy(ps[1]) {
		w.followed.Add(1)
	}
	return w.wait(ctx, ps...)
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

// hastenLocked starts ops without aging, and every op they wait for.
// w.mu is held.
func (w *writeback) hastenLocked(waited []*wbOp) {
	ops := slices.Clone(waited)
	seen := map[*wbOp]bool{}
	for len(ops) > 0 {
		op := ops[len(ops)-1]
		ops = ops[:len(ops)-1]
		if seen[op] {
			continue
		}
		seen[op] = true
		op.hasten()
		w.nudge()
		for _, o := range w.ops {
			if o == op {
				break
			}
			if o.touches(op.paths) {
				ops = append(ops, o)
			}
		}
	}
}

// busy reports whether a background call on a path related to p is not
// yet finished.
func (w *writeback) busy(p string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.before([]string{p})) > 0
}

// pending reports the calls not yet finished and the bytes they hold.
func (w *writeback) pending() (ops int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ops), w.bytes
}
