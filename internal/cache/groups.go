package cache

import (
	"context"
	"io"
	"slices"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
)

// Limits of one group of write-back (see flush): what it carries stays
// well within what a Commit takes, and a larger backlog goes in several.
const (
	groupBytes = proto.CommitInline / 2
	groupOps   = proto.CommitChanges / 4
	// groupRateFloor is the slowest link, in bytes a second, a group's
	// deadline allows for its data (1 Mbit/s).
	groupRateFloor = 1_000_000 / 8
)

// flush sends the queued ops in groups, one group at a time, in the order
// they were made, while the writeback lasts: a group is cut when its
// oldest op has aged (see aging), or at once when something waits for an
// op (hasten). Each group takes every op queued at the cut, up to its
// limits, so that a state the tree below shows is one this cache was in:
// a group applies whole or not at all, and after the groups before it.
func (w *writeback) flush() {
	for {
		w.mu.Lock()
		// An op left with nothing to do (see void) ends at once: what
		// waits for it need not wait for a group.
		var void []*wbOp
		w.queue = slices.DeleteFunc(w.queue, func(op *wbOp) bool {
			if op.void() {
				op.started = true
				void = append(void, op)
				return true
			}
			return false
		})
		var due time.Duration
		if len(w.queue) > 0 {
			due = time.Until(w.queue[0].aged)
			for _, op := range w.queue {
				if op.hurried() {
					due = 0
					break
				}
			}
		}
		if len(void) > 0 {
			w.mu.Unlock()
			for _, op := range void {
				w.finish(op, nil)
			}
			continue
		}
		if len(w.queue) == 0 || due > 0 {
			w.mu.Unlock()
			t := time.NewTimer(due)
			if due <= 0 {
				t.Stop()
			}
			select {
			case <-w.kick:
			case <-t.C:
			case <-w.stop:
				t.Stop()
				return
			}
			t.Stop()
			continue
		}
		// A change of several ops is queued whole before a cut: the lock
		// is taken without w.mu, then the queue read again.
		w.mu.Unlock()
		w.cutting.Lock()
		w.mu.Lock()
		var cut []*wbOp
		var bytes int64
		var touched uint64
		take := func() {
			op := w.queue[0]
			w.queue = w.queue[1:]
			op.started = true
			bytes += op.size
			touched = max(touched, op.touched)
			cut = append(cut, op)
		}
		for len(w.queue) > 0 && len(cut) < groupOps && (len(cut) == 0 || bytes+w.queue[0].size <= groupBytes) {
			take()
		}
		// An op of the cut rewritten in place (a file stored again)
		// after an op left out was issued holds a later state than that
		// op's: the cut takes the ops up to that rewrite too, beyond its
		// limits, within what a Commit takes.
		for len(w.queue) > 0 && w.queue[0].seq <= touched &&
			len(cut) < proto.CommitChanges/2 && bytes+w.queue[0].size <= proto.CommitInline {
			take()
		}
		w.mu.Unlock()
		w.cutting.Unlock()
		if len(cut) == 0 {
			continue
		}
		w.runGroup(cut)
	}
}

// void reports whether op is a file's store left with nothing to do: made
// and removed before it started. w.mu is held.
func (op *wbOp) void() bool { return op.file != nil && op.file.gone && op.file.creates }

// hurried reports whether something waits for op.
func (op *wbOp) hurried() bool {
	select {
	case <-op.hurry:
		return true
	default:
		return false
	}
}

// runGroup makes the ops of cut, in order, as one group, and returns once
// each has ended. Each op's call records its change in the group and
// waits for the group's Commit; the next call starts once it recorded, so
// that the group holds the changes in the order the ops were made.
func (w *writeback) runGroup(cut []*wbOp) {
	// The group's deadline is a call's, and as long again as its data
	// takes at groupRateFloor: a group carries up to groupBytes, which a
	// slow link takes longer than a call's bound to send.
	var size int64
	for _, op := range cut {
		size += op.size
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout+time.Duration(size)*time.Second/groupRateFloor)
	defer cancel()
	g := w.grouper.Group()
	ended := make(chan struct{}, len(cut))
	for _, op := range cut {
		rec := &recorder{g: g, made: make(chan struct{}, 1)}
		w.mu.Lock()
		f := op.file
		w.mu.Unlock()
		returned := make(chan struct{})
		go func() {
			err := op.call(ctx, rec, f)
			close(returned)
			w.finish(op, err)
			ended <- struct{}{}
		}()
		// A call that makes no change (a file made and removed in the
		// same breath) returns without recording one.
		select {
		case <-rec.made:
		case <-returned:
		}
	}
	g.Commit(ctx)
	w.groups.Add(1)
	w.grouped.Add(int64(len(cut)))
	for range cut {
		<-ended
	}
}

// recorder is the changer an op's call makes its change through in a
// group: it tells runGroup when the change is recorded.
type recorder struct {
	g    ferry.Group
	made chan struct{}
}

func (r *recorder) recorded() {
	select {
	case r.made <- struct{}{}:
	default:
	}
}

func (r *recorder) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	defer r.recorded()
	return r.g.Put(ctx, p, d, off, data)
}

func (r *recorder) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	defer r.recorded()
	return r.g.Move(ctx, from, to)
}

func (r *recorder) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	defer r.recorded()
	return r.g.Remove(ctx, p)
}

func (r *recorder) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	defer r.recorded()
	return r.g.Wstat(ctx, p, d)
}
