package replica

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/control"
	"github.com/ferryfs/ferry/internal/proto"
)

// DefaultIdle is how long a member keeps a control it no longer uses.
const DefaultIdle = time.Second

// FS is the replica layer: a ferry.FS over this member's copy of the tree
// (the chunk store) that keeps it one tree with the other members' copies.
//
// A change to a path first makes this member its controller: covered by a
// control it holds already, or granted one (deep over the parent
// directory, so that a burst of changes there costs one agreement; shallow
// on the path where that cannot be had). A path another member controls
// waits until that member, asked to revoke, has given it up. The first
// change under a new control returns only once every member applied its
// grant. The change is then made here, kept on disk, answered, and queued
// for every other member in the order made (small files whole, large ones
// as chunk lists); they apply it only under the control it names. A
// control is given up after Idle without use, once every member applied
// its last update.
//
// A read of what another member controls first asks that member how far
// its updates go and waits until they are applied here, so an open after
// a close at another site sees that close; from then on that member's
// changes there wait for the reader (see interest).
type FS struct {
	ferry.FS // this member's copy
	set      *Set
	out      *outbox
	spool    string
	idle     time.Duration
	shallow  bool

	applyMu sync.Mutex // local changes are queued in the order made
	leases  atomic.Pointer[Leases]

	mu   sync.Mutex
	held map[string]*use // control path -> its use here
	// interest records, per control held here, the members that read
	// under it (Sync): their clients may cache what they read, so a
	// change under it returns only once they applied it (and dropped
	// their clients' copies). Members that never read there cost nothing.
	interest map[string]map[uint64]bool

	// inMu is held for reading while another member's update is applied,
	// and for writing while the copy is listed for a member that joins
	// (copyList), so the listing holds whole updates only.
	inMu sync.RWMutex

	// forwarding holds, by path, the spool file of a put forwarded from
	// here until the holder's update of it is applied: its chunks are
	// taken from there rather than fetched back.
	forwarding sync.Map

	ctx     context.Context // ends when the layer closes
	stop    context.CancelFunc
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
	streams map[uint64]context.CancelFunc // each member's update stream
}

// use is what this member does with a control it holds.
type use struct {
	epoch     uint64
	last      time.Time // of the last change under it
	seq       uint64    // the last update made under it
	busy      int       // changes in progress under it
	revoked   bool      // another member asked for it
	pinned    bool      // granted by an administrator's command: kept until released
	releasing bool
}

var (
	_ ferry.FS        = (*FS)(nil)
	_ ferry.Unwrapper = (*FS)(nil)
)

// Leases is what the replica layer needs of its server's clients' leases
// (callback.Table): a member recalls its clients' write leases before
// another member reads or takes over what they cover, keeps its control
// while they hold one, and drops what its clients cache of what another
// member changes or is granted.
type Leases interface {
	Recall(ctx context.Context, session string, tree bool, paths ...string) error
	Break(ctx context.Context, session string, changes ...callback.Change) error
	WriteLeased(p string) bool
}

// SetLeases wires the server's leases in; until then the layer keeps no
// client's cache coherent across members.
func (f *FS) SetLeases(l Leases) { f.leases.Store(&l) }

func (f *FS) lease() Leases {
	if l := f.leases.Load(); l != nil {
		return *l
	}
	return nil
}

// recall has this member's clients store what they keep back at or
// (with tree) below p.
func (f *FS) recall(ctx context.Context, tree bool, p string) error {
	if l := f.lease(); l != nil {
		return l.Recall(ctx, "", tree, p)
	}
	return nil
}

// drop has this member's clients drop what they cache of changes.
func (f *FS) drop(ctx context.Context, changes ...callback.Change) {
	if l := f.lease(); l != nil && len(changes) > 0 {
		l.Break(ctx, "", changes...) // a client that does not answer loses its lease
	}
}

// Control makes this member the deep controller of p, for a client of its
// server that asks for a write lease over p: while the client holds it,
// the control stays here, and another member's read or change under p
// first recalls it. It fails if another member keeps something below p
// or will not let p go within the call's context.
func (f *FS) Control(ctx context.Context, p string) error {
	if err := f.set.waitReady(ctx); err != nil {
		return err
	}
	self := f.set.self.Name
	wait := 5 * time.Millisecond
	for {
		if c, ok := f.set.Controller(p); ok && c.Holder == self && c.Deep {
			f.mu.Lock()
			u := f.useLocked(c)
			releasing := u.releasing
			u.last = time.Now()
			f.mu.Unlock()
			if !releasing {
				return nil
			}
		} else {
			granted, err := f.ask(ctx, true, p)
			if err != nil {
				return err
			}
			if granted != nil {
				f.unreserve(granted)
				if c, ok := f.set.Controller(p); ok && c.Holder == self && !c.Deep {
					return ferry.E("replica.Control", p, ferry.KindUnavailable, "another member controls something below")
				}
				continue
			}
		}
		if err := pause(ctx, &wait); err != nil {
			return ferry.E("replica.Control", p, ferry.KindUnavailable, err)
		}
	}
}

// Leased has the members that read under this member's controls at or
// below p drop what their clients cache there, once a client of this
// member was given a write lease over p: its changes stay in that client
// until a read recalls them, and a read at another member recalls them
// only if it comes here (Sync), not if that member's client has a copy.
func (f *FS) Leased(ctx context.Context, p string) error {
	readers := map[uint64]bool{}
	at := f.heldAt(p, true)
	f.mu.Lock()
	for _, c := range at {
		for id := range f.interest[c.Path] {
			readers[id] = true
		}
	}
	f.mu.Unlock()
	if len(readers) == 0 {
		return nil
	}
	return f.eachMember(ctx, readers, func(ctx context.Context, c proto.ReplicaClient) error {
		_, err := c.Applied(ctx, &proto.AppliedReq{Paths: []string{p}})
		return err
	})
}

// Options tune the replica layer.
type Options struct {
	Spool string        // where updates' content waits until every member has it
	Idle  time.Duration // how long an unused control is kept (DefaultIdle)
	// ShallowOnly asks for the changed path alone, never deep control
	// over its directory (for measuring what deep control saves).
	ShallowOnly bool
}

// NewFS stacks the replica layer over below, this member's copy of the
// tree, and starts sending its updates to the other members.
func NewFS(below ferry.FS, set *Set, opt Options) (*FS, error) {
	spool, idle := opt.Spool, opt.Idle
	if idle == 0 {
		idle = DefaultIdle
	}
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return nil, ferry.E("replica.NewFS", spool, err)
	}
	// The members are steady while the layer starts: one added from now
	// on finds it and is sent updates (addPeer).
	set.mu.Lock()
	defer set.mu.Unlock()
	var peers []uint64
	for id := range set.links {
		peers = append(peers, id)
	}
	out, err := openOutbox(spool, peers)
	if err != nil {
		return nil, ferry.E("replica.NewFS", spool, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &FS{FS: below, set: set, out: out, spool: spool, idle: idle, ctx: ctx, streams: map[uint64]context.CancelFunc{},
		shallow: opt.ShallowOnly, held: map[string]*use{}, interest: map[string]map[uint64]bool{}, stop: cancel}
	set.fs.Store(f)
	f.closeMu.Lock()
	for _, l := range set.links {
		f.sendTo(l)
	}
	f.closeMu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.releaser(ctx)
	}()
	return f, nil
}

// sendTo streams this member's updates to l's member until the layer
// closes or the member leaves (dropPeer); called under set.mu and
// f.closeMu.
func (f *FS) sendTo(l *link) {
	ctx, stop := context.WithCancel(f.ctx)
	f.streams[l.m.ID] = stop
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		backoff(ctx, func(ctx context.Context) error { return f.streamUpdates(ctx, l) }, func(err error) {
			f.set.log.Debug("replica: update stream to member lost", "member", l.m.Name, "err", err)
		})
	}()
}

// dropPeer stops sending updates to member id, which left the set, and
// waits for it no more: its acknowledgements, its reads' interest.
func (f *FS) dropPeer(id uint64) {
	f.closeMu.Lock()
	if stop := f.streams[id]; stop != nil {
		stop()
		delete(f.streams, id)
	}
	f.closeMu.Unlock()
	f.out.removePeer(id)
	f.mu.Lock()
	for _, readers := range f.interest {
		delete(readers, id)
	}
	f.mu.Unlock()
}

// addPeer sends this member's updates to a member added to the set,
// beginning with every update still kept: called under set.mu.
func (f *FS) addPeer(l *link) {
	f.closeMu.Lock()
	defer f.closeMu.Unlock()
	if f.closed {
		return
	}
	f.out.addPeer(l.m.ID)
	f.sendTo(l)
}

// Unwrap implements ferry.Unwrapper.
func (f *FS) Unwrap() ferry.FS { return f.FS }

// Close stops sending updates and releasing controls.
func (f *FS) Close() error {
	f.closeMu.Lock()
	f.closed = true
	f.closeMu.Unlock()
	f.stop()
	f.wg.Wait()
	f.set.fs.CompareAndSwap(f, nil)
	return nil
}

// --- control ---

// acquire makes this member the controller of every path and marks the
// controls busy until done is called.
func (f *FS) acquire(ctx context.Context, paths ...string) (done func(seq uint64), err error) {
	const op = "replica"
	if err := f.set.waitReady(ctx); err != nil {
		return nil, err
	}
	self := f.set.self.Name
	wait := 5 * time.Millisecond
	triedParent := map[string]bool{}
	forwarded := isForwarded(ctx)
	// reserved are controls granted to this call, kept busy until it uses
	// them: a control released before its first use (idle while the
	// grant spread, or revoked by a rival) would starve both.
	var reserved []*use
	defer func() { f.unreserve(reserved) }()
	for {
		var need []string
		var got []*use
		f.mu.Lock()
		ok := true
		for _, p := range paths {
			c, covered := f.set.Controller(p)
			if !covered || c.Holder != self {
				need = append(need, p)
				continue
			}
			u := f.useLocked(c)
			// A control to be given up takes no more forwarded
			// changes, which would keep it busy: their members ask
			// for it instead.
			if u.releasing || forwarded && u.revoked {
				ok = false // being given up: wait, then ask again
				continue
			}
			got = append(got, u)
		}
		if ok && len(need) == 0 {
			for _, u := range got {
				u.busy++
			}
			for _, u := range reserved {
				u.busy-- // the call holds them now
			}
			reserved = nil
			f.mu.Unlock()
			return func(seq uint64) {
				f.mu.Lock()
				defer f.mu.Unlock()
				for _, u := range got {
					u.busy--
					if !forwarded {
						u.last = time.Now()
					}
					u.seq = max(u.seq, seq)
				}
			}, nil
		}
		f.mu.Unlock()
		if forwarded {
			return nil, errNotHolder
		}
		if len(need) > 0 {
			deep, ask := false, need
			if dir := path.Dir(need[0]); len(need) == 1 && dir != "/" && !triedParent[dir] && !f.shallow {
				triedParent[dir] = true
				deep, ask = true, []string{dir}
			}
			granted, err := f.ask(ctx, deep, ask...)
			if err != nil {
				return nil, err
			}
			if granted != nil {
				reserved = append(reserved, granted...)
				continue
			}
			// Refused: another member holds what is still needed. The
			// controls granted to this call are let go meanwhile, or
			// two calls each holding what the other needs (a rename
			// at each of two sites, say) would wait for ever.
			f.unreserve(reserved)
			reserved = nil
		}
		if err := pause(ctx, &wait); err != nil {
			return nil, ferry.E(op, paths[0], ferry.KindUnavailable, fmt.Sprintf("another member controls it: %v", err))
		}
	}
}

// ask asks the set to grant paths to this member and, once granted, waits
// until every member applied the grant, so that each then sends reads of
// those paths through this one. The controls granted come back in use
// (busy) for the caller, so that none is released before it is used. On
// a refusal it asks the holder to give the control up and returns none.
func (f *FS) ask(ctx context.Context, deep bool, paths ...string) ([]*use, error) {
	res, err := f.set.Grant(ctx, deep, paths...)
	if err != nil {
		return nil, err
	}
	if !res.OK {
		if len(res.Controls) > 0 && res.Controls[0].Holder != f.set.self.Name {
			f.askRevoke(ctx, res.Controls[0])
		}
		return nil, nil
	}
	var granted []*use
	f.mu.Lock()
	for _, c := range res.Controls {
		u := f.useLocked(c)
		u.busy++
		granted = append(granted, u)
	}
	f.mu.Unlock()
	if err := f.everyoneApplied(ctx, res.Controls); err != nil {
		f.unreserve(granted)
		return nil, err
	}
	return granted, nil
}

// unreserve ends the use ask gave the caller.
func (f *FS) unreserve(us []*use) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range us {
		u.busy--
	}
}

// pause waits before a control is asked for again, longer each time up
// to 200 ms, and fails once ctx is done. The wait is drawn at random
// around *wait, so that rivals asking for the same controls fall out of
// step.
func pause(ctx context.Context, wait *time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(*wait/2 + rand.N(*wait)):
	}
	*wait = min(2**wait, 200*time.Millisecond)
	return nil
}

// useLocked returns this member's use of its control c, new for a new
// grant: a use belongs to one epoch of the control.
func (f *FS) useLocked(c control.Control) *use {
	u := f.held[c.Path]
	if u == nil || u.epoch != c.Epoch {
		// Until it is used, a control may cover any update still queued
		// (one kept from before a restart, say): it is released only
		// once every member has them all.
		u = &use{epoch: c.Epoch, last: time.Now(), seq: f.out.last()}
		f.held[c.Path] = u
	}
	return u
}

// everyoneApplied waits until every other member applied the grants of cs,
// so that each of them then sends reads of those paths through us.
func (f *FS) everyoneApplied(ctx context.Context, cs []control.Control) error {
	var index uint64
	var paths []string
	for _, c := range cs {
		index = max(index, c.Epoch)
		paths = append(paths, c.Path)
	}
	return f.eachMember(ctx, nil, func(ctx context.Context, c proto.ReplicaClient) error {
		_, err := c.Applied(ctx, &proto.AppliedReq{Index: index, Paths: paths})
		return err
	})
}

// eachMember calls fn for every other member at once, or only for those
// in only if it is not nil; it fails if fn fails for a member still in
// the set.
func (f *FS) eachMember(ctx context.Context, only map[uint64]bool, fn func(context.Context, proto.ReplicaClient) error) error {
	var wg sync.WaitGroup
	links := f.set.linkList()
	errs := make(chan error, len(links))
	for _, l := range links {
		if only != nil && !only[l.m.ID] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, proto.NewReplicaClient(l.ctl)); err != nil && f.set.link(l.m.ID) == l {
				// (A member removed meanwhile is waited for no more.)
				errs <- ferry.E("replica", l.m.Name, ferry.KindUnavailable, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// askRevoke asks c's holder to give it up soon.
func (f *FS) askRevoke(ctx context.Context, c control.Control) {
	m, ok := f.set.member(c.Holder)
	if !ok {
		return
	}
	if l := f.set.link(m.ID); l != nil {
		f.set.stats.revokesSent.Add(1)
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		proto.NewReplicaClient(l.ctl).Revoke(rctx, &proto.RevokeReq{Path: c.Path}) // best effort: the grant is asked again
	}
}

// pin keeps the control at p, granted by an administrator, until pinned
// is false.
func (f *FS) pin(c control.Control, pinned bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.useLocked(c).pinned = pinned
}

// revoke marks the control covering p to be given up.
func (f *FS) revoke(p string) {
	c, ok := f.set.Controller(p)
	if !ok || c.Holder != f.set.self.Name {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.useLocked(c).revoked = true
}

// releaser gives up controls idle for f.idle, or revoked, once every other
// member applied their last update.
func (f *FS) releaser(ctx context.Context) {
	t := time.NewTicker(min(f.idle/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range f.set.held() {
			f.mu.Lock()
			if u := f.held[c.Path]; u != nil && u.epoch != c.Epoch {
				f.mu.Unlock()
				continue // the row is older than what this member uses
			}
			u := f.useLocked(c) // new for one held from before a restart
			revoked := u.revoked
			f.mu.Unlock()
			// A client's write lease keeps the control here; a member
			// that wants it has the client store and give the lease up.
			if l := f.lease(); l != nil && l.WriteLeased(c.Path) {
				if !revoked {
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				f.recall(rctx, true, c.Path)
				cancel()
			}
			f.mu.Lock()
			ready := u.busy == 0 && !u.releasing && !u.pinned && (u.revoked || time.Since(u.last) >= f.idle) && f.out.applied(u.seq)
			if ready {
				u.releasing = true
			}
			f.mu.Unlock()
			if !ready {
				continue
			}
			if l := f.lease(); l != nil && l.WriteLeased(c.Path) {
				// A lease given before releasing was set: keep it.
				f.mu.Lock()
				u.releasing = false
				f.mu.Unlock()
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := f.set.Release(rctx, c)
			cancel()
			f.mu.Lock()
			if err != nil {
				u.releasing = false
			} else {
				f.set.stats.released.Add(1)
				if f.held[c.Path] == u {
					delete(f.held, c.Path)
				}
				delete(f.interest, c.Path)
			}
			f.mu.Unlock()
		}
	}
}

// --- changes ---

// change makes a change to paths under this member's control: apply does
// it on this member's copy and returns the update (and the spool file of
// its content) for the others.
func (f *FS) change(ctx context.Context, paths []string, apply func() (*proto.Update, string, error)) error {
	done, err := f.acquire(ctx, paths...)
	if err != nil {
		return err
	}
	var seq uint64
	defer func() { done(seq) }() // the controls stay busy until the readers have it
	u, err := f.applyQueued(&seq, apply)
	if err != nil {
		return err
	}
	return f.reachReaders(ctx, seq, u.Path, u.To)
}

// applyQueued applies a change here and queues its update, one change at
// a time, so that the others apply them in the order made.
func (f *FS) applyQueued(seq *uint64, apply func() (*proto.Update, string, error)) (*proto.Update, error) {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	u, spool, err := apply()
	if err != nil {
		return nil, err
	}
	// Each path's update names the control it was made under; the
	// controls stand while the change is busy under them.
	c, _ := f.set.Controller(u.Path)
	u.Epoch = c.Epoch
	if u.To != "" {
		c, _ := f.set.Controller(u.To)
		u.ToEpoch = c.Epoch
	}
	*seq, err = f.out.add(u, spool)
	return u, err
}

// noteInterest records that member id reads p (with tree, anything below
// it) under this member's controls.
func (f *FS) noteInterest(id uint64, p string, tree bool) {
	at := f.heldAt(p, tree)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range at {
		if f.interest[c.Path] == nil {
			f.interest[c.Path] = map[uint64]bool{}
		}
		f.interest[c.Path][id] = true
	}
}

// heldAt returns the controls this member holds that cover p or, with
// tree, lie below it; called without f.mu, as the table's lock comes
// first.
func (f *FS) heldAt(p string, tree bool) []control.Control {
	var at []control.Control
	for _, c := range f.set.held() {
		if c.Covers(p) || tree && ferry.HasPrefix(c.Path, p) {
			at = append(at, c)
		}
	}
	return at
}

// reachReaders waits until every member that read under the controls of
// paths applied update seq.
func (f *FS) reachReaders(ctx context.Context, seq uint64, paths ...string) error {
	ids := map[uint64]bool{}
	f.mu.Lock()
	for _, p := range paths {
		if p == "" {
			continue
		}
		if c, ok := f.set.Controller(p); ok {
			for id := range f.interest[c.Path] {
				ids[id] = true
			}
		}
	}
	f.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	if err := f.out.waitAcked(ctx, ids, seq); err != nil {
		return ferry.E("replica", paths[0], ferry.KindUnavailable, fmt.Errorf("changed here, not yet at a member that reads it: %w", err))
	}
	return nil
}

// spoolFile copies r into a new spool file.
func (f *FS) spoolFile(r io.Reader) (string, error) {
	tmp, err := os.CreateTemp(f.spool, "put-*")
	if err != nil {
		return "", err
	}
	_, err = io.Copy(tmp, r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}

// sendAttrs are the attributes an update sets on the other copies.
var sendAttrs = []string{ferry.AttrType, ferry.AttrMode, ferry.AttrMtime, ferry.AttrTarget, ferry.AttrRdev}

func attrsOf(d ferry.Dir) ferry.Dir {
	out := ferry.Dir{}
	for _, k := range sendAttrs {
		if v, ok := d[k]; ok {
			out[k] = v
		}
	}
	return out
}

// Put implements ferry.Tree.
func (f *FS) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		// The content waits here, not holding the order of changes while
		// a slow client sends it: in memory if small, else in a spool
		// file.
		var small []byte
		in := ""
		if data != nil {
			var err error
			if small, in, err = f.take(data); err != nil {
				return nil, ferry.E("replica.Put", p, err)
			}
			defer func() {
				if in != "" {
					os.Remove(in)
				}
			}()
		}
		q := &proto.ForwardReq{Op: "put", Path: p, Dir: proto.FromDir(d), Off: off, Content: data != nil}
		if out, ok, err := f.forward(ctx, q, small, in); ok {
			return out, err
		}
		var out ferry.Dir
		err := f.change(ctx, []string{p}, func() (*proto.Update, string, error) {
			var r io.Reader
			switch {
			case in != "":
				fh, err := os.Open(in)
				if err != nil {
					return nil, "", err
				}
				defer fh.Close()
				r = fh
			case data != nil:
				r = bytes.NewReader(small)
			}
			var err error
			if out, err = f.FS.Put(ctx, p, d, off, r).Wait(); err != nil {
				return nil, "", err
			}
			u := &proto.Update{Op: "put", Path: p, Dir: proto.FromDir(attrsOf(out))}
			spool := ""
			switch {
			case out.Type() != ferry.TypeFile:
			case off == ferry.Whole && in != "":
				spool, in = in, "" // what was put is the content
			case off == ferry.Whole && data != nil:
				u.Data = small
			default:
				rc := f.FS.Get(ctx, p, 0, -1)
				u.Data, spool, err = f.take(rc)
				rc.Close()
				if err != nil {
					return nil, "", err
				}
			}
			return u, spool, nil
		})
		return out, err
	})
}

// take reads r whole: its bytes if fewer than byChunks (an update carries
// them in its header), else the spool file it copied them into.
func (f *FS) take(r io.Reader) (small []byte, spool string, err error) {
	small, err = io.ReadAll(io.LimitReader(r, byChunks))
	if err != nil || len(small) < byChunks {
		return small, "", err
	}
	spool, err = f.spoolFile(io.MultiReader(bytes.NewReader(small), r))
	return nil, spool, err
}

// Move implements ferry.Tree.
func (f *FS) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return f.changeDir(ctx, &proto.ForwardReq{Op: "move", Path: from, To: to}, func() (ferry.Dir, error) { return f.FS.Move(ctx, from, to).Wait() })
}

// Link implements ferry.Tree.
func (f *FS) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return f.changeDir(ctx, &proto.ForwardReq{Op: "link", Path: from, To: to}, func() (ferry.Dir, error) { return f.FS.Link(ctx, from, to).Wait() })
}

// Wstat implements ferry.Tree.
func (f *FS) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	return f.changeDir(ctx, &proto.ForwardReq{Op: "wstat", Path: p, Dir: proto.FromDir(d)}, func() (ferry.Dir, error) { return f.FS.Wstat(ctx, p, d).Wait() })
}

// Remove implements ferry.Tree.
func (f *FS) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	return f.changeNone(ctx, p, "remove", func() error { return wait0(f.FS.Remove(ctx, p)) })
}

// RemoveAll implements ferry.Tree.
func (f *FS) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	return f.changeNone(ctx, p, "removeall", func() error { return wait0(f.FS.RemoveAll(ctx, p)) })
}

// changeDir makes the change q, which fn makes on this copy, here or
// (forward) at the member that controls its paths.
func (f *FS) changeDir(ctx context.Context, q *proto.ForwardReq, fn func() (ferry.Dir, error)) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		if out, ok, err := f.forward(ctx, q, nil, ""); ok {
			return out, err
		}
		var out ferry.Dir
		err := f.change(ctx, pathsOf(q.Path, q.To), func() (*proto.Update, string, error) {
			var err error
			if out, err = fn(); err != nil {
				return nil, "", err
			}
			u := &proto.Update{Op: q.Op, Path: q.Path, To: q.To}
			if q.To == "" {
				u.Dir = proto.FromDir(attrsOf(out))
			}
			return u, "", nil
		})
		return out, err
	})
}

func (f *FS) changeNone(ctx context.Context, p, op string, fn func() error) *ferry.Future[struct{}] {
	return ferry.Go(func() (struct{}, error) {
		if _, ok, err := f.forward(ctx, &proto.ForwardReq{Op: op, Path: p}, nil, ""); ok {
			return struct{}{}, err
		}
		return struct{}{}, f.change(ctx, []string{p}, func() (*proto.Update, string, error) {
			if err := fn(); err != nil {
				return nil, "", err
			}
			return &proto.Update{Op: op, Path: p}, "", nil
		})
	})
}

// --- reads ---

// syncFor waits until this copy has every update of the members that
// control p (or, for a tree, anything in it).
func (f *FS) syncFor(ctx context.Context, p string, tree bool) error {
	if err := f.set.waitReady(ctx); err != nil {
		return err
	}
	self := f.set.self.Name
	holders := map[string]bool{}
	if tree {
		for _, c := range f.set.rows() {
			if c.Holder != self && (c.Covers(p) || ferry.HasPrefix(c.Path, p)) {
				holders[c.Holder] = true
			}
		}
	} else if c, ok := f.set.Controller(p); ok && c.Holder != self {
		holders[c.Holder] = true
	}
	for h := range holders {
		m, ok := f.set.member(h)
		l := f.set.link(m.ID)
		if !ok || l == nil {
			continue
		}
		r, err := proto.NewReplicaClient(l.ctl).Sync(ctx, &proto.SyncReq{Path: p, Tree: tree})
		if err != nil {
			return ferry.E("replica", p, ferry.KindUnavailable, fmt.Errorf("asking %s for its updates: %w", h, err))
		}
		if err := f.set.inbox.wait(ctx, m.ID, r.Seq); err != nil {
			return err
		}
	}
	return nil
}

// Stat implements ferry.Tree.
func (f *FS) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	return ferry.Go(func() (ferry.Dir, error) {
		if err := f.syncFor(ctx, p, false); err != nil {
			return nil, err
		}
		return f.FS.Stat(ctx, p).Wait()
	})
}

// Get implements ferry.Tree.
func (f *FS) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	if err := f.syncFor(ctx, p, false); err != nil {
		return ferry.ErrReader(err)
	}
	return f.FS.Get(ctx, p, off, count)
}

// Find implements ferry.Finder.
func (f *FS) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	if err := f.syncFor(ctx, p, true); err != nil {
		return ferry.ErrStream[ferry.Entry](err)
	}
	return f.FS.Find(ctx, p, pred)
}

// FindGet implements ferry.Finder.
func (f *FS) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	if err := f.syncFor(ctx, p, true); err != nil {
		return ferry.ErrStream[ferry.Entry](err)
	}
	return f.FS.FindGet(ctx, p, pred)
}

// chunkFS is the chunk store's interface the server uses.
type chunkFS interface {
	ChunkList(ctx context.Context, path string, dir func(ferry.Dir) error, fn func(chunk.Ref) error) error
	ReadChunk(ctx context.Context, h chunk.Hash, prefer string, buf []byte) ([]byte, error)
	BeginPut(ctx context.Context, path string, d ferry.Dir, size int64) (*chunkstore.Put, error)
}

func (f *FS) chunks() (chunkFS, error) {
	c, ok := ferry.As[chunkFS](f.FS)
	if !ok {
		return nil, ferry.E(proto.NoChunksOp, "", ferry.KindInvalid, "this server does not serve chunks")
	}
	return c, nil
}

// ChunkList serves a file's chunk list once this copy is current; the
// server reads files by chunks through it.
func (f *FS) ChunkList(ctx context.Context, p string, dir func(ferry.Dir) error, fn func(chunk.Ref) error) error {
	c, err := f.chunks()
	if err != nil {
		return err
	}
	if err := f.syncFor(ctx, p, false); err != nil {
		return err
	}
	return c.ChunkList(ctx, p, dir, fn)
}

// ReadChunk reads a chunk from this copy.
func (f *FS) ReadChunk(ctx context.Context, h chunk.Hash, prefer string, buf []byte) ([]byte, error) {
	c, err := f.chunks()
	if err != nil {
		return nil, err
	}
	return c.ReadChunk(ctx, h, prefer, buf)
}

// BeginPut starts a chunked put; its commit is a Put through the whole
// stack, and so through this layer.
func (f *FS) BeginPut(ctx context.Context, p string, d ferry.Dir, size int64) (*chunkstore.Put, error) {
	c, err := f.chunks()
	if err != nil {
		return nil, err
	}
	return c.BeginPut(ctx, p, d, size)
}

// assemble writes the content an update lists by chunks: those this copy
// holds, in the file's current version or elsewhere in the chunk index,
// from here; the rest fetched from the member that made it. Every chunk
// is checked against its hash.
func (f *FS) assemble(ctx context.Context, from Member, h *proto.Update, w io.Writer) error {
	const op = "replica.assemble"
	hashes, sizes, err := proto.UnpackRefsMax(h.Refs, maxRefs)
	if err != nil {
		return err
	}
	l := f.set.link(from.ID)
	if l == nil {
		return ferry.E(op, h.Path, ferry.KindInvalid, "an update from an unknown member")
	}
	cur := f.currentChunks(ctx, h.Path)
	sent, closeSent := f.forwardedChunks(h.Path)
	defer closeSent()
	cfs, indexed := ferry.As[chunkFS](f.FS)
	buf := make([]byte, chunk.Default.Max)
	// local reads chunk i from this copy, or fails.
	local := func(i int) ([]byte, error) {
		if b, ok := sent.read(hashes[i]); ok {
			return b, nil
		}
		if r, ok := cur[hashes[i]]; ok {
			rc := f.FS.Get(ctx, h.Path, r.Off, int64(r.Len))
			b, err := io.ReadAll(rc)
			rc.Close()
			if err == nil && chunk.Sum(b) == hashes[i] {
				return b, nil
			}
		}
		if indexed {
			return cfs.ReadChunk(ctx, hashes[i], h.Path, buf)
		}
		return nil, ferry.E(op, h.Path, ferry.KindNotExist, "chunk not held")
	}
	have := make([]bool, len(hashes))
	var want []int
	for i, hsh := range hashes {
		if _, ok := cur[hsh]; ok || sent.has(hsh) {
			have[i] = true
			continue
		}
		if indexed {
			if _, err := cfs.ReadChunk(ctx, hsh, h.Path, buf); err == nil {
				have[i] = true
				continue
			}
		}
		want = append(want, i)
	}
	var st *chunksIn
	if len(want) > 0 {
		if st, err = f.set.fetchChunks(ctx, l, h.Seq, want); err != nil {
			return err
		}
	}
	for i, hsh := range hashes {
		var b []byte
		fetched := !have[i]
		if have[i] {
			if b, err = local(i); err != nil {
				// Gone since it was looked up: ask for it alone.
				one, err := f.set.fetchChunks(ctx, l, h.Seq, []int{i})
				if err != nil {
					return err
				}
				if b, err = one.next(); err != nil {
					return err
				}
				fetched = true
			}
		} else {
			if b, err = st.next(); err != nil {
				return err
			}
		}
		if len(b) != sizes[i] || chunk.Sum(b) != hsh {
			return ferry.E(op, h.Path, ferry.KindInvalid, fmt.Sprintf("chunk %d does not match its hash", i))
		}
		if fetched {
			f.set.stats.fetchedBytes.Add(int64(len(b)))
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// currentChunks returns the chunks of the version of p this copy holds,
// by hash (none if there is no such file).
func (f *FS) currentChunks(ctx context.Context, p string) map[chunk.Hash]chunk.Ref {
	cur := map[chunk.Hash]chunk.Ref{}
	f.chunkList(ctx, p, func(ferry.Dir) {}, func(r chunk.Ref) { cur[r.Hash] = r })
	return cur
}

// pathsOf returns the paths a change names: p, and to if it has one
// (move, link).
func pathsOf(p, to string) []string {
	if to == "" {
		return []string{p}
	}
	return []string{p, to}
}

// changesOf returns what a change op of p (and to) changes, as its
// callback breaks name it: a move or removeall the whole tree there.
func changesOf(op, p, to string) []callback.Change {
	tree := op == "move" || op == "removeall"
	var cs []callback.Change
	for _, x := range pathsOf(p, to) {
		cs = append(cs, callback.Change{Path: x, Tree: tree})
	}
	return cs
}

// wait0 waits for a future of nothing.
func wait0(f *ferry.Future[struct{}]) error {
	_, err := f.Wait()
	return err
}

// --- applying other members' updates ---

// applyUpdate applies one of from's updates to this copy, reading the
// rest of its content from st. An update not made under the control its
// paths have here is refused (fenced), and an update applied before is
// skipped.
func (f *FS) applyUpdate(ctx context.Context, from Member, h *proto.Update, st *updateIn) error {
	// rest drains the pieces of content that follow h.
	more := h.More
	rest := func(w io.Writer) error {
		for more {
			m, err := st.Recv()
			if err != nil {
				return err
			}
			if m.Seq != h.Seq {
				return ferry.E("replica.Updates", h.Path, ferry.KindInvalid, "content of another update")
			}
			if _, err := w.Write(m.Data); err != nil {
				return err
			}
			more = m.More
		}
		return nil
	}
	f.inMu.RLock()
	defer f.inMu.RUnlock()
	if h.Seq <= f.set.inbox.last(from.ID) {
		return rest(io.Discard)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := f.set.waitApplied(actx, max(h.Epoch, h.ToEpoch)); err != nil {
		rest(io.Discard)
		return err
	}
	fenced := ""
	for p, epoch := range map[string]uint64{h.Path: h.Epoch, h.To: h.ToEpoch} {
		if p == "" {
			continue
		}
		if c, ok := f.set.Controller(p); !ok || c.Holder != from.Name || c.Epoch != epoch {
			fenced = p
		}
	}
	var err error
	switch {
	case fenced != "":
		err = fmt.Errorf("not under %s's control of epoch %d", from.Name, h.Epoch)
		rest(io.Discard)
	case h.Op == "put":
		d := proto.ToDir(h.Dir)
		if d.Type() != ferry.TypeFile {
			_, err = f.FS.Put(ctx, h.Path, d, ferry.Whole, nil).Wait()
			break
		}
		pr, pw := io.Pipe()
		go func() {
			var werr error
			if h.Refs != nil {
				werr = f.assemble(ctx, from, h, pw)
			} else if _, werr = pw.Write(h.Data); werr == nil {
				werr = rest(pw)
			}
			pw.CloseWithError(werr)
		}()
		_, err = f.FS.Put(ctx, h.Path, d, ferry.Whole, pr).Wait()
		pr.CloseWithError(io.ErrClosedPipe)
	case h.Op == "remove":
		err = wait0(f.FS.Remove(ctx, h.Path))
	case h.Op == "removeall":
		err = wait0(f.FS.RemoveAll(ctx, h.Path))
	case h.Op == "move":
		_, err = f.FS.Move(ctx, h.Path, h.To).Wait()
	case h.Op == "link":
		_, err = f.FS.Link(ctx, h.Path, h.To).Wait()
	case h.Op == "wstat":
		_, err = f.FS.Wstat(ctx, h.Path, proto.ToDir(h.Dir)).Wait()
	default:
		err = fmt.Errorf("unknown update %q", h.Op)
	}
	if err != nil && ctx.Err() != nil {
		// The stream ended under it: not applied, the origin sends it
		// again.
		return ctx.Err()
	}
	if fenced != "" {
		f.set.stats.fenced.Add(1)
	} else {
		f.set.stats.applied.Add(1)
		f.drop(actx, changesOf(h.Op, h.Path, h.To)...)
	}
	if err != nil {
		// The copies may now differ; a later update of the path mends it.
		f.set.log.Warn("replica: an update from another member was not applied", "member", from.Name, "op", h.Op, "path", h.Path, "err", err)
	}
	return f.set.inbox.done(from.ID, h.Seq)
}
