// Package callback keeps close-to-open between the clients of one server:
// a change is acknowledged to its writer only once every other client that
// may cache the changed path has acknowledged that it dropped it (the
// callback break of AFS and Coda), or that client's lease has run out.
//
// A client holds a lease over a subtree for as long as it renews it. The
// server's view of a lease runs from when it received a renewal; the
// client's from when it sent it, so the client stops trusting its cache no
// later than the server stops waiting for it. Once a break has waited a
// third of a lease for its acknowledgement, renewals are not granted: a
// client that cannot acknowledge loses its lease, and the writer waits at
// most a lease and a third. (A client that acknowledges keeps its lease
// however many breaks it gets: another client's write leases break it
// often.)
//
// Only clients that may cache what changed are broken. The server records,
// for each session holding a lease, the entries and the directory listings
// it was sent (its promises, in AFS's terms), before it reads them; a
// change at a path breaks only the sessions promised that entry or its
// directory's listing. A stream of a whole tree promises all of it while it
// runs, and afterwards what it sent.
package callback

import (
	"context"
	"path"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
)

// DefaultLease is how long a renewal holds unless the server says
// otherwise: long enough that a renewal every third of it survives a few
// lost packets, short enough that a writer waits only that long for a
// client that vanished without a word.
const DefaultLease = 10 * time.Second

// Table records the leases a server has given.
type Table struct {
	lease time.Duration
	now   func() time.Time

	mu      sync.Mutex
	holders map[*Holder]struct{}
	// sessions holds the promises of each session that holds a lease.
	sessions map[string]*promises
	seq      uint64 // The last break's number; also how many were sent.
	// writes counts the write leases held, so that a call when there
	// are none costs no walk of the holders; recalls counts the recalls
	// sent.
	writes, recalls uint64
	// served holds the paths calls of the server touched lately, with
	// when: a watch event for one of them is likely that call's, not a
	// change made directly on the disk (see Changed).
	served map[string]time.Time
	// servedTrees is served for calls that changed a whole subtree (a
	// directory renamed or removed with what it held): an event below
	// one is that call's too.
	servedTrees map[string]time.Time
	// waited and waitTime count the changes that waited for breaks and
	// the time they waited.
	waited   uint64
	waitTime time.Duration
}

// New returns a Table whose renewals hold for lease (DefaultLease if 0).
func New(lease time.Duration) *Table {
	if lease <= 0 {
		lease = DefaultLease
	}
	return &Table{lease: lease, now: time.Now, holders: map[*Holder]struct{}{}, sessions: map[string]*promises{}}
}

// Lease is how long a renewal holds.
func (t *Table) Lease() time.Duration { return t.lease }

// Holder is one client's lease over a subtree.
type Holder struct {
	t       *Table
	session string
	root    string

	// The fields below are guarded by t.mu.
	expiry  time.Time
	queue   []Break
	pending map[uint64]chan struct{}
	since   map[uint64]time.Time // When each pending break was sent.
	timer   *time.Timer          // Set while a break waits: drops the holder at expiry.
	dropped bool
	// writes holds the roots of the holder's write leases, each with the
	// number of the recall waiting for it, or 0; shallow those of them
	// that are shallow (ferry.WriteShallow).
	writes  map[string]uint64
	shallow map[string]bool

	wake chan struct{} // Signalled when queue grows or the holder is dropped.
	gone chan struct{} // Closed when the holder is dropped.
}

// Break is one change a holder must acknowledge.
type Break struct {
	Seq  uint64
	Path string
	// Tree says everything at or below Path may have changed.
	Tree bool
	// Recall asks for the write lease over Path back: the client stores
	// what it changed under Path first, then acknowledges.
	Recall bool
}

// Change names what a call changed: Path, and with Tree everything below
// it (a rename or a removal of a directory).
type Change struct {
	Path string
	Tree bool
}

// Hold gives the client of session a lease over root, beginning now.
// The caller sends what Next returns, and calls Ack, Renew and Release or
// Lost as the client's messages and the stream's end come.
func (t *Table) Hold(session, root string) *Holder {
	h := &Holder{t: t, session: session, root: root, pending: map[uint64]chan struct{}{}, since: map[uint64]time.Time{},
		wake: make(chan struct{}, 1), gone: make(chan struct{})}
	t.mu.Lock()
	h.expiry = t.now().Add(t.lease)
	t.holders[h] = struct{}{}
	if t.sessions[session] == nil {
		t.sessions[session] = &promises{paths: map[string]Cache{}, trees: map[string]int{}}
	}
	t.sessions[session].holders++
	t.mu.Unlock()
	return h
}

// promises are what a session may cache.
type promises struct {
	holders int              // Its holders; the promises go with the last.
	paths   map[string]Cache // What it was sent, by path.
	trees   map[string]int   // Trees being streamed to it, counted.
	all     bool             // Too many paths to list: everything.
}

// Cache says what a client may cache of a path.
type Cache uint8

const (
	// Entry is the path's entry (or that there is none): a change at the
	// path breaks it.
	Entry Cache = 1 << iota
	// Listing is the names in the directory at the path: a change at any
	// of them breaks it.
	Listing
)

// maxPromised bounds the paths recorded for one session; beyond it every
// change breaks the session.
const maxPromised = 1 << 18

// Promise records that session is about to be sent what c says of each of
// paths (clean paths), so that later changes to it break its lease. A
// session without a lease is not recorded: its client trusts nothing.
func (t *Table) Promise(session string, c Cache, paths ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.sessions[session]
	if ps == nil || ps.all {
		return
	}
	for _, p := range paths {
		ps.paths[p] |= c
	}
	if len(ps.paths) > maxPromised {
		ps.all = true
		clear(ps.paths)
	}
}

// PromiseTree records that session is about to be streamed the tree at
// root: every change below it breaks the session until the returned func
// is called, by when what was sent must have been promised.
func (t *Table) PromiseTree(session, root string) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.sessions[session]
	if ps == nil {
		return func() {}
	}
	ps.trees[root]++
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if ps.trees[root]--; ps.trees[root] <= 0 {
				delete(ps.trees, root)
			}
		})
	}
}

// promised reports whether a change c may break what ps promised. t.mu is
// held.
func (ps *promises) promised(c Change) bool {
	if ps.all {
		return true
	}
	dir := path.Dir(c.Path)
	for root := range ps.trees {
		if ferry.HasPrefix(dir, root) || c.Tree && ferry.HasPrefix(root, c.Path) {
			return true
		}
	}
	if ps.paths[c.Path]&Entry != 0 || ps.paths[dir]&Listing != 0 {
		return true
	}
	if c.Tree {
		for p := range ps.paths {
			if ferry.HasPrefix(p, c.Path) {
				return true
			}
		}
	}
	return false
}

// covers reports whether a change at c affects what a holder of root may
// cache.
func covers(root string, c Change) bool {
	return ferry.HasPrefix(c.Path, root) || c.Tree && ferry.HasPrefix(root, c.Path)
}

// WriteLeases returns how many write leases are held.
func (t *Table) WriteLeases() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.writes
}

// Holders returns how many leases are held.
func (t *Table) Holders() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.holders)
}

// Breaks returns how many breaks were sent.
func (t *Table) Breaks() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq
}

// Waits returns how many changes waited for breaks, and how long in all.
func (t *Table) Waits() (uint64, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waited, t.waitTime
}

// Break tells every holder but those of session (the writer's own) about
// the changes, and returns once each has acknowledged or lost its lease,
// or ctx is done. A holder whose lease ran out before is dropped.
func (t *Table) Break(ctx context.Context, session string, changes ...Change) error {
	var waits []brokenWait
	t.mu.Lock()
	now := t.now()
	for h := range t.holders {
		if session != "" && h.session == session {
			continue
		}
		if !now.Before(h.expiry) {
			h.dropLocked()
			continue
		}
		ps := t.sessions[h.session]
		for _, c := range changes {
			if !covers(h.root, c) || !ps.promised(c) {
				continue
			}
			t.seq++
			ch := make(chan struct{})
			h.pending[t.seq] = ch
			h.since[t.seq] = now
			h.queue = append(h.queue, Break{Seq: t.seq, Path: c.Path, Tree: c.Tree})
			if h.timer == nil {
				// No renewal is granted from now until the break is
				// acknowledged, so the lease ends at expiry.
				h.timer = time.AfterFunc(h.expiry.Sub(now), h.drop)
			}
			waits = append(waits, brokenWait{h, ch})
		}
		if len(h.queue) > 0 {
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}
	t.mu.Unlock()
	return t.await(ctx, "callback.Break", waits)
}

// brokenWait is a break or recall sent to h, done when ch is closed.
type brokenWait struct {
	h  *Holder
	ch chan struct{}
}

// await returns once every wait is acknowledged or its holder dropped, or
// ctx is done.
func (t *Table) await(ctx context.Context, op string, waits []brokenWait) error {
	if len(waits) == 0 {
		return nil
	}
	began := time.Now()
	defer func() {
		t.mu.Lock()
		t.waited++
		t.waitTime += time.Since(began)
		t.mu.Unlock()
	}()
	for _, w := range waits {
		select {
		case <-w.ch:
		case <-w.h.gone:
		case <-ctx.Done():
			return ferry.E(op, "", ferry.KindCanceled, ctx.Err())
		}
	}
	return nil
}

// Next returns the breaks to send to the holder's client, waiting for one
// if there are none. It fails once the holder is dropped or ctx is done.
func (h *Holder) Next(ctx context.Context) ([]Break, error) {
	for {
		h.t.mu.Lock()
		q, dropped := h.queue, h.dropped
		h.queue = nil
		h.t.mu.Unlock()
		if dropped {
			return nil, ferry.E("callback.Next", h.root, ferry.KindUnavailable, "the lease ran out")
		}
		if len(q) > 0 {
			return q, nil
		}
		select {
		case <-h.wake:
		case <-h.gone:
		case <-ctx.Done():
			return nil, ferry.E("callback.Next", h.root, ferry.KindCanceled, ctx.Err())
		}
	}
}

// Ack records the client's acknowledgement of break seq. The
// acknowledgement of a recall gives the write lease back.
func (h *Holder) Ack(seq uint64) {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	for w, r := range h.writes {
		if r == seq {
			h.deleteWriteLocked(w)
		}
	}
	h.ackLocked(seq)
}

// ackLocked completes break seq. t.mu is held.
func (h *Holder) ackLocked(seq uint64) {
	ch, ok := h.pending[seq]
	if !ok {
		return
	}
	delete(h.pending, seq)
	delete(h.since, seq)
	close(ch)
	if len(h.pending) == 0 && h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
}

// GrantWrite gives the holder's client a write lease over the subtree at p
// (a clean path), with its lease: it may keep its changes under p to
// itself until the lease is recalled, released or lost. It is refused
// while another session holds a write lease over p or a deep one above it,
// and while a recall of this one over p waits: the acknowledgement that
// ends the recall would end the lease given again. It is shallow while
// another session holds one below p.
func (h *Holder) GrantWrite(p string) ferry.WriteGrant {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.dropped || h.writes[p] != 0 {
		return ferry.WriteRefused
	}
	grant := ferry.WriteDeep
	for g := range t.holders {
		if g.session == h.session {
			continue
		}
		for w := range g.writes {
			switch {
			case w == p, ferry.HasPrefix(p, w) && !g.shallow[w]:
				return ferry.WriteRefused
			case ferry.HasPrefix(w, p):
				// Below: the paper's downgrade to shallow control.
				grant = ferry.WriteShallow
			}
		}
	}
	if h.writes == nil {
		h.writes, h.shallow = map[string]uint64{}, map[string]bool{}
	}
	if _, ok := h.writes[p]; !ok {
		h.writes[p] = 0
		t.writes++
	}
	h.shallow[p] = grant == ferry.WriteShallow
	return grant
}

// leaseCovers reports whether a write lease over w, shallow or deep,
// covers a call on q. A shallow lease covers w and what is directly in
// it; the client keeps back only changes of files there (see
// ferry.WriteShallow), but a call on a directory in it may list or change
// its entry.
func leaseCovers(w string, shallow bool, q string) bool {
	if shallow {
		return q == w || path.Dir(q) == w
	}
	return ferry.HasPrefix(q, w)
}

// ReleaseWrite ends the holder's write lease over p: its client stored
// what it changed there. A recall waiting for it is done.
func (h *Holder) ReleaseWrite(p string) {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if seq, ok := h.writes[p]; ok {
		h.deleteWriteLocked(p)
		if seq != 0 {
			h.ackLocked(seq)
		}
	}
}

// Writes returns the roots of the holder's write leases.
func (h *Holder) Writes() []string {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	var ws []string
	for w := range h.writes {
		ws = append(ws, w)
	}
	return ws
}

// WriteLeased reports whether a client holds a write lease over p, or
// below it: a replica member keeps its control of p while one does.
func (t *Table) WriteLeased(p string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.writes == 0 {
		return false
	}
	for h := range t.holders {
		for w := range h.writes {
			if ferry.HasPrefix(w, p) || ferry.HasPrefix(p, w) {
				return true
			}
		}
	}
	return false
}

// deleteWriteLocked forgets the write lease over w. t.mu is held.
func (h *Holder) deleteWriteLocked(w string) {
	if _, ok := h.writes[w]; ok {
		delete(h.writes, w)
		delete(h.shallow, w)
		h.t.writes--
	}
}

// Recall asks every holder but those of session (the caller's own) whose
// write lease covers one of the paths (clean paths), or with tree lies
// below one of them, to store what it changed there and give the lease
// back, and returns once each has, or has lost its lease, or ctx is done:
// a call that reads or changes a path must see the changes another client
// made there first.
func (t *Table) Recall(ctx context.Context, session string, tree bool, paths ...string) error {
	t.mu.Lock()
	if t.writes == 0 {
		t.mu.Unlock()
		return nil
	}
	t.touchedLocked(paths)
	var waits []brokenWait
	now := t.now()
	for h := range t.holders {
		if session != "" && h.session == session || len(h.writes) == 0 {
			continue
		}
		if !now.Before(h.expiry) {
			h.dropLocked()
			continue
		}
		for w := range h.writes {
			hit := false
			for _, q := range paths {
				if leaseCovers(w, h.shallow[w], q) || tree && ferry.HasPrefix(w, q) {
					hit = true
					break
				}
			}
			if hit {
				seq := h.recallLocked(w, now)
				waits = append(waits, brokenWait{h, h.pending[seq]})
			}
		}
	}
	t.mu.Unlock()
	return t.await(ctx, "callback.Recall", waits)
}

// servedFor is how long after a call touched a path an event for it is
// taken to be that call's.
const servedFor = 2 * time.Second

// touchedLocked records that a call of the server is about to read or
// change the paths ps: the events their changes cause are not direct
// changes on the disk. t.mu is held.
func (t *Table) touchedLocked(ps []string) {
	if t.writes != 0 {
		stamp(&t.served, ps, t.now())
	}
}

// ChangingTrees records, as touchedLocked does, that a call is about to
// change the whole subtrees ps: the disk reports a directory renamed into
// place with an event for each entry below it.
func (t *Table) ChangingTrees(ps ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.writes != 0 {
		stamp(&t.servedTrees, ps, t.now())
	}
}

// stamp records now for each of ps in *m, which starts anew once it holds
// more than 16,384 paths (those older than servedFor are of no use).
func stamp(m *map[string]time.Time, ps []string, now time.Time) {
	if *m == nil || len(*m) > 1<<14 {
		*m = map[string]time.Time{}
	}
	for _, p := range ps {
		(*m)[p] = now
	}
}

// servedLocked reports whether a call touched p, or changed a subtree that
// holds it, in the last servedFor. t.mu is held.
func (t *Table) servedLocked(p string, now time.Time) bool {
	if at, ok := t.served[p]; ok && now.Sub(at) < servedFor {
		return true
	}
	for q := p; ; q = path.Dir(q) {
		if at, ok := t.servedTrees[q]; ok && now.Sub(at) < servedFor {
			return true
		}
		if q == "/" || q == "." {
			return false
		}
	}
}

// Changed takes note of a change at p that the holder's watch reported:
// one no call of the server made lately was made directly on the
// server's disk, and recalls the holder's write lease over p, without
// waiting (no call waits for it). The holder stores what it kept back
// there, after the change. Each holder's watch covers its write leases,
// so each holder looks at its own only.
func (h *Holder) Changed(p string) {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(h.writes) == 0 {
		return
	}
	now := t.now()
	if t.servedLocked(p, now) {
		return
	}
	for w := range h.writes {
		if leaseCovers(w, h.shallow[w], p) {
			h.recallLocked(w, now)
		}
	}
}

// recallLocked sends the holder a recall of its write lease over w, unless
// one waits already, and returns its number. t.mu is held.
func (h *Holder) recallLocked(w string, now time.Time) uint64 {
	if seq := h.writes[w]; seq != 0 {
		return seq
	}
	t := h.t
	t.seq++
	t.recalls++
	seq := t.seq
	h.writes[w] = seq
	h.pending[seq] = make(chan struct{})
	h.since[seq] = now
	h.queue = append(h.queue, Break{Seq: seq, Path: w, Recall: true})
	if h.timer == nil {
		h.timer = time.AfterFunc(h.expiry.Sub(now), h.drop)
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return seq
}

// Recalls returns how many recalls were sent.
func (t *Table) Recalls() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.recalls
}

// Renew extends the lease by a full term from now, and reports whether it
// did: not once a break has waited a third of the lease for its
// acknowledgement, nor once the lease is lost. A client busy with breaks
// it acknowledges keeps its lease (another client's grants break it
// often); one that does not acknowledge loses it within a lease and a
// third of the break.
func (h *Holder) Renew() bool {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	now := h.t.now()
	if h.dropped {
		return false
	}
	for _, at := range h.since {
		if now.Sub(at) >= h.t.lease/3 {
			return false
		}
	}
	h.expiry = now.Add(h.t.lease)
	if h.timer != nil {
		h.timer.Reset(h.expiry.Sub(now))
	}
	return true
}

// Release ends the lease at once: the client said it trusts nothing more.
func (h *Holder) Release() { h.drop() }

// Lost says the holder's stream broke: the client may still trust its
// cache until its lease runs out, so breaks wait for that, and then the
// holder is dropped.
func (h *Holder) Lost() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.dropped {
		return
	}
	if h.timer == nil {
		h.timer = time.AfterFunc(h.expiry.Sub(h.t.now()), h.drop)
	}
}

// Gone is closed when the lease has ended.
func (h *Holder) Gone() <-chan struct{} { return h.gone }

func (h *Holder) drop() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	h.dropLocked()
}

func (h *Holder) dropLocked() {
	if h.dropped {
		return
	}
	h.dropped = true
	h.t.writes -= uint64(len(h.writes))
	h.writes, h.shallow = nil, nil
	delete(h.t.holders, h)
	if ps := h.t.sessions[h.session]; ps != nil {
		if ps.holders--; ps.holders <= 0 {
			delete(h.t.sessions, h.session)
		}
	}
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	close(h.gone)
}
