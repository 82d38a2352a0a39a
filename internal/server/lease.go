package server

import (
	"context"
	"io"
	"path"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/proto"
)

// session returns the caller's session, tied to its user so that one user
// cannot pass for another's session and keep its breaks from it.
func (h *handler) session(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(proto.SessionHeader)
	if len(v) == 0 || v[0] == "" {
		return ""
	}
	user := ""
	if c, _ := ctx.Value(connKey{}).(*conn); c != nil {
		c.mu.Lock()
		user = c.user
		c.mu.Unlock()
	}
	return user + "\x00" + v[0]
}

// promise records, before a call reads or changes the paths ps, that its
// client may cache their entries (see callback.Table.Promise). Before
// that, it recalls the write leases other clients hold over them.
func (h *handler) promise(ctx context.Context, ps ...string) {
	clean := cleanPaths(ps)
	h.s.leases.Recall(ctx, h.session(ctx), false, clean...)
	h.s.leases.Promise(h.session(ctx), callback.Entry, clean...)
}

// recall waits until the other clients' write leases over ps (with tree,
// also those below them) are given back, so the call sees what they
// changed there (see callback.Table.Recall). A call whose context ends
// meanwhile fails on its own.
func (h *handler) recall(ctx context.Context, tree bool, ps ...string) {
	h.s.leases.Recall(ctx, h.session(ctx), tree, cleanPaths(ps)...)
}

// cleanPaths returns the paths of ps that are valid, cleaned.
func cleanPaths(ps []string) []string {
	clean := make([]string, 0, len(ps))
	for _, p := range ps {
		if p, err := ferry.CleanPath(p); err == nil {
			clean = append(clean, p)
		}
	}
	return clean
}

// promiseFind wraps the entries of a Find or FindGet of root so that what
// they show is promised before it is sent: the whole tree while the stream
// runs, then each entry sent, and the listing of its directory and of each
// directory sent (a walk may stop at one, but the client may count an empty
// directory as listed).
//
// find starts the walk; it is called once the tree is promised, so that no
// entry is read before a change to it would break this client.
func (h *handler) promiseFind(ctx context.Context, root string, find func() *ferry.Stream[ferry.Entry]) *ferry.Stream[ferry.Entry] {
	session := h.session(ctx)
	root, err := ferry.CleanPath(root)
	if err != nil {
		return find()
	}
	h.s.leases.Recall(ctx, session, true, root)
	done := h.s.leases.PromiseTree(session, root)
	s := find()
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		defer done()
		defer s.Close()
		var ents, lists []string
		flush := func() {
			h.s.leases.Promise(session, callback.Entry, ents...)
			h.s.leases.Promise(session, callback.Listing, lists...)
			ents, lists = ents[:0], lists[:0]
		}
		last := ""
		for e := range s.All() {
			if p, err := ferry.CleanPath(e.Dir.Path()); err == nil && e.Data == nil {
				ents = append(ents, p)
				// Entries come directory by directory: each listing once.
				if d := path.Dir(p); p != root && d != last {
					lists, last = append(lists, d), d
				}
				if e.Dir.IsDir() {
					lists = append(lists, p)
				}
				if len(ents) >= 256 {
					flush()
				}
			}
			if err := send(e); err != nil {
				return err
			}
		}
		flush()
		return s.Err()
	})
}

// changed, after a call that changed the tree returned err, breaks the
// other clients' leases over what it changed when it succeeded: the call
// is answered once they dropped it. A change the tree refused breaks
// nothing.
func (h *handler) changed(ctx context.Context, err error, cs ...callback.Change) error {
	if err != nil {
		return err
	}
	return h.s.leases.Break(ctx, h.session(ctx), cs...)
}

// grantWrite answers the write lease request m. A lease given breaks
// first what the other clients cache below its root, and is answered once
// they dropped it: from then on they ask the server about it, which
// recalls the lease, so they see the holder's changes there. A call that
// recalls the lease before the answer is sent is answered on the stream
// before it; the client then takes the lease as refused.
func (h *handler) grantWrite(ctx context.Context, lease *callback.Holder, root string, m *proto.LeaseMsg, out chan<- *proto.WatchEvent) {
	grant := ferry.WriteRefused
	if p, err := ferry.CleanPath(m.WritePath); err == nil && ferry.HasPrefix(p, root) && h.control(ctx, p) {
		if grant = lease.GrantWrite(p); grant != ferry.WriteRefused {
			// A shallow lease breaks the whole subtree too: simpler,
			// and the clients below hold their own leases anyway.
			if err := h.s.leases.Break(ctx, h.session(ctx), callback.Change{Path: p, Tree: true}); err != nil || !h.leased(ctx, p) {
				lease.ReleaseWrite(p)
				grant = ferry.WriteRefused
			}
		}
	}
	select {
	case out <- &proto.WatchEvent{WriteReply: m.WriteReq, WriteGranted: grant != ferry.WriteRefused, WriteShallow: grant == ferry.WriteShallow}:
	case <-ctx.Done():
	}
}

// Controller is a layer that must control a subtree before a client may
// hold a write lease over it: in a replica set, a member's clients keep
// changes back only where that member controls the tree.
type Controller interface {
	Control(ctx context.Context, path string) error
	// Leased is told of a write lease given over path, once this
	// server's other clients dropped what they cache there; it returns
	// once the clients beyond it (another member's) did too.
	Leased(ctx context.Context, path string) error
}

// controlFor bounds how long a write lease request waits for the layer
// below to control its subtree; the client writes through meanwhile.
const controlFor = 5 * time.Second

// control reports whether the layers below control p, or need not.
func (h *handler) control(ctx context.Context, p string) bool {
	return h.controller(ctx, p, Controller.Control, "write lease refused: the subtree is not controlled here")
}

// leased reports whether the layers below had the clients beyond them
// drop what they cache under a write lease given over p, or need not.
func (h *handler) leased(ctx context.Context, p string) bool {
	return h.controller(ctx, p, Controller.Leased, "write lease refused: other members' clients kept what they cache")
}

// controller calls fn on the Controller below, if there is one, within
// controlFor, and reports whether it succeeded; refused says why not.
func (h *handler) controller(ctx context.Context, p string, fn func(Controller, context.Context, string) error, refused string) bool {
	c, ok := ferry.As[Controller](h.s.fs)
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, controlFor)
	defer cancel()
	if err := fn(c, ctx, p); err != nil {
		h.s.cfg.Log.Debug(refused, "path", p, "err", err)
		return false
	}
	return true
}

// Lease implements the Lease call: a watch of the path the first message
// names, with the client's lease over it (see internal/callback).
func (h *handler) Lease(st grpc.BidiStreamingServer[proto.LeaseMsg, proto.WatchEvent]) error {
	const op = "server.Lease"
	w, ok := ferry.As[ferry.Watcher](h.s.fs)
	if !ok {
		return h.done(opLease, ferry.E(op, "", ferry.KindInvalid, "this server cannot watch"))
	}
	first, err := st.Recv()
	if err != nil {
		return h.done(opLease, err)
	}
	root, err := ferry.CleanPath(first.Path)
	if err != nil {
		return h.done(opLease, err)
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	// A stopping server ends the lease: the client then drops its cache
	// and waits for the server to come back.
	defer context.AfterFunc(h.s.stopping, cancel)()
	lease := h.s.leases.Hold(h.session(ctx), root)
	if err := st.Send(&proto.WatchEvent{LeaseMs: h.s.leases.Lease().Milliseconds(), Owners: h.s.cfg.Owners}); err != nil {
		lease.Lost()
		return h.done(opLease, err)
	}

	// One goroutine sends: the watch's events, the breaks and the
	// granted renewals all go through out.
	out := make(chan *proto.WatchEvent, 64)
	errc := make(chan error, 3)
	go func() {
		for {
			m, err := st.Recv()
			if err == io.EOF {
				lease.Release()
				errc <- nil
				return
			}
			if err != nil {
				lease.Lost()
				errc <- err
				return
			}
			if m.Ack != 0 {
				lease.Ack(m.Ack)
			}
			if m.ReleaseWrite != "" {
				if p, err := ferry.CleanPath(m.ReleaseWrite); err == nil {
					lease.ReleaseWrite(p)
				}
			}
			if m.WriteReq != 0 {
				go h.grantWrite(ctx, lease, root, m, out)
			}
			if m.Renew != 0 && lease.Renew() {
				select {
				case out <- &proto.WatchEvent{Renewed: m.Renew}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	go func() {
		for {
			bs, err := lease.Next(ctx)
			if err != nil {
				errc <- err
				return
			}
			for _, b := range bs {
				select {
				case out <- &proto.WatchEvent{Path: b.Path, Lost: b.Tree, Brk: b.Seq, Recall: b.Recall}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	events := w.Watch(ctx, root)
	defer events.Close()
	go func() {
		for e := range events.All() {
			// A subtree lost below the watch's root is a directory
			// removed or moved on the disk: a change there, like any
			// other. The root's own is the watch's start or a gap.
			if p, err := ferry.CleanPath(e.Path); err == nil && (!e.Lost || p != root) {
				lease.Changed(p)
			}
			select {
			case out <- &proto.WatchEvent{Path: e.Path, Lost: e.Lost}:
			case <-ctx.Done():
				return
			}
		}
		err := events.Err()
		if err == nil {
			err = ferry.E(op, root, ferry.KindUnavailable, "the watch ended")
		}
		errc <- err
	}()
	for {
		select {
		case m := <-out:
			if err := st.Send(m); err != nil {
				lease.Lost()
				return h.done(opLease, err)
			}
		case err := <-errc:
			// A lease given up, lost or run out ends the stream; the
			// client then trusts nothing it holds.
			lease.Lost()
			return h.done(opLease, h.s.stoppingErr(op, root, err))
		}
	}
}
