package cache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
)

// sub is a watch of a layer above.
type sub struct {
	path string
	ch   chan ferry.Event
	gone chan struct{} // Closed when the watch ends.
}

// covers reports whether the event ev concerns the watch.
func (s *sub) covers(ev ferry.Event) bool {
	return ferry.HasPrefix(ev.Path, s.path) || ev.Lost && ferry.HasPrefix(s.path, ev.Path)
}

// Watch implements ferry.Watcher: the events the cache acted on, after it
// dropped what they name, so that the layer above can drop its copies. The
// first call starts the cache's own watch of the tree below (its lease).
// An event with Ack is a callback break: the tree below is told once every
// watcher here has acknowledged it. A watcher's first event is a Lost
// event for path once the cache holds its lease.
func (c *FS) Watch(ctx context.Context, p string) *ferry.Stream[ferry.Event] {
	p, err := ferry.CleanPath(p)
	if err != nil {
		return ferry.ErrStream[ferry.Event](err)
	}
	s := &sub{path: p, ch: make(chan ferry.Event, 64), gone: make(chan struct{})}
	c.subMu.Lock()
	c.subs[s] = struct{}{}
	c.subMu.Unlock()
	c.watchOnce.Do(func() { go c.run() })
	leased := c.meta.leased()
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Event) error) error {
		defer c.unsubscribe(s)
		if leased {
			if err := send(ferry.Event{Path: p, Lost: true}); err != nil {
				return err
			}
		}
		for {
			select {
			case ev := <-s.ch:
				if err := send(ev); err != nil {
					if ev.Ack != nil {
						ev.Ack()
					}
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			case <-c.ctx.Done():
				return ferry.E("cache.Watch", p, ferry.KindCanceled, "the cache is closed")
			}
		}
	})
}

// unsubscribe ends s, acknowledging the breaks it had not passed on.
func (c *FS) unsubscribe(s *sub) {
	c.subMu.Lock()
	delete(c.subs, s)
	c.subMu.Unlock()
	close(s.gone)
	for {
		select {
		case ev := <-s.ch:
			if ev.Ack != nil {
				ev.Ack()
			}
		default:
			return
		}
	}
}

// emit passes ev to every watcher above it concerns. Its Ack, if any, is
// called once every one of them has acknowledged it (at once if there is
// none).
func (c *FS) emit(ev ferry.Event) {
	c.subMu.Lock()
	var to []*sub
	for s := range c.subs {
		if s.covers(ev) {
			to = append(to, s)
		}
	}
	c.subMu.Unlock()
	ack := ev.Ack
	if ack != nil {
		if len(to) == 0 {
			ack()
			return
		}
		var left atomic.Int64
		left.Store(int64(len(to)))
		ev.Ack = func() {
			if left.Add(-1) == 0 {
				ack()
			}
		}
	}
	for _, s := range to {
		e := ev
		if e.Ack != nil {
			var once sync.Once
			all := ev.Ack
			e.Ack = func() { once.Do(all) }
		}
		select {
		case s.ch <- e:
		case <-s.gone:
			if e.Ack != nil {
				e.Ack()
			}
		case <-c.ctx.Done():
			if e.Ack != nil {
				e.Ack()
			}
		}
	}
}

// heldDir reports whether the layer above holds p as a directory.
func (c *FS) heldDir(p string) bool {
	return c.opt.HeldDir != nil && c.opt.HeldDir(p)
}

// run holds one watch on the root for as long as the cache is open, if the
// tree below offers watches. The watch is the cache's lease: from its first
// (Lost) event what is fetched is trusted; each event drops what it names.
// When the watch ends, everything is dropped and it is re-established with
// backoff; meanwhile nothing is trusted for longer than Options.TTL.
func (c *FS) run() {
	defer close(c.done)
	defer c.setReady()
	w, ok := ferry.As[ferry.Watcher](c.below)
	if !ok {
		c.log.Info("the tree offers no watch: metadata is trusted for a short time only", "ttl", c.opt.TTL)
		return
	}
	root := c.opt.Root
	backoff := c.opt.WatchBackoff
	for c.ctx.Err() == nil {
		began := time.Now()
		st := w.Watch(c.ctx, root)
		leased := false
		for ev := range st.All() {
			p, err := ferry.CleanPath(ev.Path)
			if err != nil || !ferry.HasPrefix(p, root) && !(ev.Lost && ferry.HasPrefix(root, p)) {
				if ev.Ack != nil {
					ev.Ack()
				}
				continue
			}
			if ev.Recall {
				if c.leases == nil {
					if ev.Ack != nil {
						ev.Ack()
					}
					continue
				}
				go c.recall(p, ev.Ack)
				continue
			}
			if ev.Ack != nil {
				if !ferry.HasPrefix(p, root) {
					p = root // A change above the root: all of it is in doubt.
				}
				c.broken(p, ev.Lost, ev.Ack)
				continue
			}
			if ev.Lost && p != root && c.echoTree(p) {
				continue
			}
			if ev.Lost {
				if p == root {
					c.meta.dropAll()
				} else {
					c.meta.invalidateAll(p)
				}
				c.emit(ferry.Event{Path: p, Lost: true})
				if !leased && p == root {
					leased = true
					c.meta.setLease(true)
					c.log.Info("watch in place: metadata is cached until it changes")
					c.setReady()
				}
				continue
			}
			if c.echo(p) {
				continue
			}
			// A directory held above is checked too: its name is
			// forgotten only if the tree says it is gone.
			if c.heldDir(p) || !c.meta.invalidateForeign(p) {
				go c.check(p)
				continue
			}
			c.emit(ferry.Event{Path: p, Gone: true})
		}
		err := st.Err()
		c.setReady()
		c.dropLeases()
		if leased {
			c.meta.setLease(false)
		}
		c.meta.dropAll()
		c.emit(ferry.Event{Path: root, Lost: true})
		if c.ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			backoff = c.opt.WatchBackoff
		}
		c.log.Warn("watch ended; cached metadata dropped", "err", err, "retry in", backoff)
		select {
		case <-time.After(backoff):
		case <-c.ctx.Done():
			return
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// broken drops p (with tree, everything below it too) for a callback
// break: another client changed it through the server, and that client's
// call waits until ack is called, once the watchers above have dropped it
// too.
func (c *FS) broken(p string, tree bool, ack func()) {
	c.breaks.Add(1)
	if tree {
		c.meta.invalidateAll(p)
	} else {
		c.meta.invalidate(p)
	}
	dir := c.heldDir(p)
	c.emit(ferry.Event{Path: p, Lost: tree, Ack: ack})
	if dir {
		go c.check(p)
	}
}

// check handles an event for p that may be the echo of this cache's own
// change, or a directory's change of times: it asks the tree, and drops
// the cache (passing the event up) only if the cache does not already
// agree.
func (c *FS) check(p string) {
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.CallTimeout)
	defer cancel()
	// The tree's answer is not newer than this cache's own calls on p
	// still in the background (an unlink behind a close, say): believed
	// before they are done, it would bring back what they removed.
	if c.wback.wait(ctx, p) != nil {
		return
	}
	_, _, seq := c.meta.stamp()
	d, err := c.below.Stat(ctx, p).Wait()
	agrees, attrs := c.meta.check(p, d, err, seq)
	switch {
	case agrees && attrs:
		c.emit(ferry.Event{Path: p, Attrs: true})
	case !agrees:
		if c.meta.invalidateUnchanged(p, seq) {
			c.emit(ferry.Event{Path: p, Gone: ferry.IsKind(err, ferry.KindNotExist) || err == nil && !d.IsDir()})
		}
	}
}
