package cache

import (
	"context"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
)

// LeaseIdle is how long a write lease is kept with no change under it
// before it is given back (Options.LeaseIdle's default): a burst of
// changes in one directory costs one request for the lease, and another
// client waits on a recall only while this one is busy there.
const LeaseIdle = time.Second

// refuseFor is how long a refused write lease is not asked for again: the
// other client holding one there is likely still busy.
const refuseFor = time.Second

// writeLeases are the subtrees the tree below lent this cache to change on
// its own (ferry.WriteLeaser): changes there are kept back (write-behind)
// and stored in order in the background, and stored before the lease goes
// back, on a recall or once idle.
type writeLeases struct {
	wl ferry.WriteLeaser

	// gate is held for reading from the moment a change decides to go
	// behind under a lease until it is queued, and for writing while a
	// lease is taken away: a recall then waits for every change queued
	// under it.
	gate sync.RWMutex

	mu    sync.Mutex
	roots map[string]time.Time // Held, with their last use.
	// shallow holds the roots lent shallow (ferry.WriteShallow): only
	// the files directly in them are this cache's to keep back.
	shallow map[string]bool
	refused map[string]time.Time
	// asking holds the roots with a request, a recall or a release in
	// flight (see mark): a change under one waits for it.
	asking map[string]chan struct{}
	// echoes holds, by lease, the paths of events taken for echoes of
	// this cache's own changes (see echo).
	echoes map[string]*echoSet
	// revoked holds the requests in flight whose lease was recalled
	// before the answer was taken: the answer is then a refusal.
	revoked map[string]bool
	idler   bool // The idle loop runs.

	granted, shallows, recalls, released, lost atomic.Int64
}

// markLocked records that a request, recall or release of r is in flight
// until unmarkLocked: a change under r waits for it rather than ask for r
// meanwhile. w.mu is held.
func (w *writeLeases) markLocked(r string) {
	w.asking[r] = make(chan struct{})
}

// unmarkLocked ends what markLocked began. w.mu is held.
func (w *writeLeases) unmarkLocked(r string) {
	close(w.asking[r])
	delete(w.asking, r)
}

// covering returns the held root whose lease covers p, a directory if dir,
// if any: a deep one at or above p, or a shallow one at p or, for a file,
// its directory. w.mu is held.
func (w *writeLeases) covering(p string, dir bool) (string, bool) {
	for r := range w.roots {
		if w.shallow[r] {
			if p == r || !dir && path.Dir(p) == r {
				return r, true
			}
		} else if ferry.HasPrefix(p, r) {
			return r, true
		}
	}
	return "", false
}

// isDir reports whether the cache knows p as a directory.
func (c *FS) isDir(p string) bool {
	d := c.meta.last(p)
	return d != nil && d.IsDir()
}

// behind reports whether the change of the paths ps may be kept back,
// and if so returns the func to call once it is queued. Without write
// leases below (a tree with no server), every change may with
// Options.WriteBehind; with them, only one under leases this cache holds,
// or is given now over the directory of each path not yet covered.
func (c *FS) behind(ctx context.Context, ps ...string) (queued func(), ok bool) {
	if !c.opt.WriteBehind {
		return nil, false
	}
	w := c.leases
	if w == nil {
		return func() {}, true
	}
	if !c.meta.leased() {
		return nil, false
	}
	asked := map[string]bool{}
	dirs := make([]bool, len(ps))
	for i, p := range ps {
		dirs[i] = c.isDir(p)
	}
	for {
		w.gate.RLock()
		w.mu.Lock()
		miss := ""
		for i, p := range ps {
			r, ok := w.covering(p, dirs[i])
			if !ok {
				miss = p
				break
			}
			w.roots[r] = time.Now()
		}
		if miss == "" {
			w.mu.Unlock()
			return w.gate.RUnlock, true
		}
		w.gate.RUnlock()
		root := path.Dir(miss)
		if !ferry.HasPrefix(root, c.opt.Root) {
			root = c.opt.Root
		}
		if t, ok := w.refused[root]; asked[root] || ok && time.Since(t) < refuseFor {
			w.mu.Unlock()
			return nil, false
		}
		if ch, ok := w.asking[root]; ok {
			w.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, false
			}
		}
		asked[root] = true
		w.markLocked(root)
		delete(w.revoked, root) // A recall before this request is not its.
		w.mu.Unlock()
		grant, err := w.wl.WriteLease(ctx, root)
		granted := grant != ferry.WriteRefused
		w.mu.Lock()
		w.unmarkLocked(root)
		if w.revoked[root] {
			delete(w.revoked, root)
			granted = false
		}
		if granted {
			w.roots[root] = time.Now()
			w.shallow[root] = grant == ferry.WriteShallow
			w.granted.Add(1)
			if w.shallow[root] {
				w.shallows.Add(1)
			}
			if !w.idler {
				w.idler = true
				go c.idle()
			}
		} else {
			w.refused[root] = time.Now()
			if len(w.refused) > 1024 {
				clear(w.refused)
			}
			if err != nil {
				c.log.Debug("no write lease", "path", root, "err", err)
			}
		}
		w.mu.Unlock()
		if !granted {
			return nil, false
		}
	}
}

// take takes the leases at or below root away from this cache (at or above
// it too, with above), so that no change goes behind under them from now
// on, and returns them.
func (c *FS) take(root string, above bool) []string {
	w := c.leases
	w.gate.Lock()
	defer w.gate.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	var taken []string
	for r := range w.roots {
		if ferry.HasPrefix(r, root) || above && ferry.HasPrefix(root, r) {
			delete(w.roots, r)
			delete(w.shallow, r)
			taken = append(taken, r)
		}
	}
	for r := range w.asking {
		if ferry.HasPrefix(r, root) || above && ferry.HasPrefix(root, r) {
			w.revoked[r] = true
		}
	}
	return taken
}

// recall gives the write lease over root back to the tree below, which
// asked for it: what was kept back under it is stored first, in order,
// and then ack is called.
func (c *FS) recall(root string, ack func()) {
	w := c.leases
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.CallTimeout)
	defer cancel()
	// What the layer above holds goes behind while the lease is held.
	c.handover(ctx, root, false)
	c.take(root, false)
	w.recalls.Add(1)
	// Until the acknowledgement is sent, a change under root waits rather
	// than ask for root again (the server refuses it meanwhile).
	w.mu.Lock()
	marked := w.asking[root] == nil
	if marked {
		w.markLocked(root)
	}
	w.mu.Unlock()
	defer func() {
		if marked {
			w.mu.Lock()
			w.unmarkLocked(root)
			w.mu.Unlock()
		}
	}()
	if err := c.wback.wait(ctx, root); err != nil {
		c.log.Warn("a recalled write lease is given back before what was written under it is stored", "path", root, "err", err)
	}
	if ack != nil {
		ack()
	}
	// Events under the lease were taken for echoes of this cache's own
	// changes, but a change made on the server's disk is reported at the
	// same time as the recall it causes: what is cached under root is
	// checked again.
	c.recheck(root)
}

// echoesMax bounds the events passed over under one lease that a recall
// checks one by one; beyond it, all that is cached under the lease is
// dropped.
const echoesMax = 64

// echoSet holds the paths of the events taken for echoes under one lease,
// each with whether it was a tree's (Lost).
type echoSet struct {
	paths map[string]bool
	over  bool // More than echoesMax: not all are held.
}

// echo reports whether an event for p is the echo of this cache's own
// change: p is under a write lease this cache holds, and no other client
// changes a leased subtree before the lease is recalled. It records p for
// recheck.
func (c *FS) echo(p string) bool {
	return c.leases != nil && c.leases.holds(p, c.isDir(p), holdEcho)
}

// echoTree is echo for an event that puts the whole subtree p in doubt (a
// directory removed or renamed on the server's disk, which the server
// reports as Lost): it is an echo if a deep lease this cache holds covers
// p. Such an echo of a removal kept back can come after this cache made a
// directory of the same name again, whose listing it must not drop.
func (c *FS) echoTree(p string) bool {
	return c.leases != nil && c.leases.holds(p, true, holdTreeEcho)
}

// hold says what holds notes of the path it is asked about.
type hold int

const (
	holdOnly     hold = iota // Nothing.
	holdEcho                 // An event's echo (echo).
	holdTreeEcho             // A subtree's echo, under a deep lease only (echoTree).
)

// holds reports whether a lease held covers p (a deep one for
// holdTreeEcho), and notes p as how says.
func (w *writeLeases) holds(p string, dir bool, how hold) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.covering(p, dir)
	if !ok || how == holdTreeEcho && w.shallow[r] {
		return false
	}
	if how != holdOnly {
		w.recordLocked(r, p, how == holdTreeEcho)
	}
	return true
}

// recordLocked notes p, with tree if a tree's, as an echo under the lease
// at r. w.mu is held.
func (w *writeLeases) recordLocked(r, p string, tree bool) {
	set := w.echoes[r]
	if set == nil {
		set = &echoSet{paths: map[string]bool{}}
		w.echoes[r] = set
	}
	if len(set.paths) < echoesMax {
		set.paths[p] = set.paths[p] || tree
	} else {
		set.over = true
	}
}

// recheck checks the events taken for echoes under root, once its lease is
// recalled: a change made on the server's own disk is reported at the same
// time as the recall it causes, and may have been one of them.
func (c *FS) recheck(root string) {
	w := c.leases
	w.mu.Lock()
	var ps, trees []string
	over := false
	for r, set := range w.echoes {
		if ferry.HasPrefix(r, root) {
			for p, tree := range set.paths {
				if tree {
					trees = append(trees, p)
				} else {
					ps = append(ps, p)
				}
			}
			over = over || set.over
			delete(w.echoes, r)
		}
	}
	w.mu.Unlock()
	if over {
		ps, trees = nil, []string{root}
	}
	for _, p := range trees {
		c.meta.invalidateAll(p)
		c.emit(ferry.Event{Path: p, Lost: true})
	}
	for _, p := range ps {
		go c.check(p)
	}
}

// forgetEchoes forgets the events taken for echoes under r, whose lease
// ends with no recall: they were.
func (w *writeLeases) forgetEchoes(r string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	deleteBelow(w.echoes, r)
}

// WriteLeased reports whether this cache holds a write lease over p: it
// then knows p as the tree below will have it once the changes kept back
// are stored, and no other client changes p meanwhile.
func (c *FS) WriteLeased(p string) bool {
	return c.leases != nil && c.leases.holds(p, c.isDir(p), holdOnly)
}

// release gives the write lease over r back once what was kept back under
// it is stored. It stores first with the lease still held, so that a
// change meanwhile neither waits for that store nor asks for the lease
// again: it keeps the lease, and the release gives up. Until the release
// is sent, a change under r waits rather than ask for r again: a request
// sent before the release would be granted by a server that still holds
// r for this client, and the release after it would then end the lease
// the client thinks it has.
func (c *FS) release(r string) {
	w := c.leases
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.CallTimeout)
	defer cancel()
	c.handover(ctx, r, false)
	started := time.Now()
	if err := c.wback.wait(ctx, r); err != nil {
		return
	}
	w.gate.Lock()
	w.mu.Lock()
	if used, held := w.roots[r]; !held || used.After(started) || c.wback.busy(r) {
		// Recalled meanwhile, or in use again.
		w.mu.Unlock()
		w.gate.Unlock()
		return
	}
	delete(w.roots, r)
	for w.asking[r] != nil {
		// A request for r in flight: give back after its answer.
		ch := w.asking[r]
		w.mu.Unlock()
		<-ch
		w.mu.Lock()
	}
	w.markLocked(r)
	w.mu.Unlock()
	w.gate.Unlock()
	if err := w.wl.ReleaseWrite(ctx, r); err == nil {
		w.released.Add(1)
	}
	w.forgetEchoes(r)
	w.mu.Lock()
	w.unmarkLocked(r)
	w.mu.Unlock()
}

// dropLeases forgets every write lease: the watch that held them ended,
// and the tree below no longer waits for what is kept back under them.
func (c *FS) dropLeases() {
	if c.leases == nil {
		return
	}
	roots := c.take(c.opt.Root, true)
	c.leases.forgetEchoes(c.opt.Root) // Everything is dropped.
	if len(roots) == 0 {
		return
	}
	c.leases.lost.Add(int64(len(roots)))
	if ops, bytes := c.wback.pending(); ops > 0 {
		c.log.Warn("write leases lost with changes not yet stored: other clients may not see them until they are",
			"leases", len(roots), "changes", ops, "bytes", bytes)
	}
}

// idle gives back, once stored, the write leases unused for
// Options.LeaseIdle.
func (c *FS) idle() {
	w := c.leases
	tick := time.NewTicker(c.opt.LeaseIdle / 2)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-c.ctx.Done():
			return
		}
		w.mu.Lock()
		var idle []string
		for r, used := range w.roots {
			if time.Since(used) >= c.opt.LeaseIdle {
				idle = append(idle, r)
			}
		}
		w.mu.Unlock()
		for _, r := range idle {
			c.release(r)
		}
	}
}
