package replica

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
)

// A change to paths that another member controls is forwarded to that
// member, which makes it under its control and answers: one round trip,
// where taking the control over costs a revoke, a release and a grant,
// each waiting for every member, and two members writing in one place
// would pass the control to and fro. The caller then waits for the
// holder's update that carries the change, so that its client reads
// what it wrote here. A forwarded change does not keep the holder's
// control from going idle, and a holder that made no change of its own
// there for half its idle time gives the control up at once: the
// forwarding member is then granted it at its next change, so a burst at
// one site ends up local there, while two sites writing in one place at
// once stay with one holder.

// errNotHolder is what a forwarded change fails with where the paths are
// no longer controlled: nothing was changed, and the caller takes the
// control itself.
var errNotHolder = errors.New("replica: this member no longer controls the path")

// forwardedKey marks the context of a change forwarded by another member:
// it is made under controls this member holds, or not at all.
type forwardedKey struct{}

func isForwarded(ctx context.Context) bool { return ctx.Value(forwardedKey{}) != nil }

// holderOf returns the link to the one other member that controls every
// path, if there is one.
func (f *FS) holderOf(paths []string) (Member, *link, bool) {
	self, holder := f.set.self.Name, ""
	for _, p := range paths {
		c, ok := f.set.Controller(p)
		if !ok || c.Holder == self || holder != "" && c.Holder != holder {
			return Member{}, nil, false
		}
		holder = c.Holder
	}
	m, ok := f.set.member(holder)
	if !ok {
		return Member{}, nil, false
	}
	l := f.set.link(m.ID)
	return m, l, l != nil
}

// forward makes the change q at the member that controls its paths, with
// a put's content in small or, if spool is not empty, in that file. It
// reports whether it did: not when no other member controls them all, or
// the one that did has given them up meanwhile.
func (f *FS) forward(ctx context.Context, q *proto.ForwardReq, small []byte, spool string) (ferry.Dir, bool, error) {
	const op = "replica.Forward"
	if isForwarded(ctx) || f.set.waitReady(ctx) != nil {
		return nil, false, nil
	}
	m, l, ok := f.holderOf(pathsOf(q.Path, q.To))
	if !ok {
		return nil, false, nil
	}
	if spool != "" && q.Op == "put" && q.Off == ferry.Whole {
		f.forwarding.Store(q.Path, spool)
		defer f.forwarding.CompareAndDelete(q.Path, spool)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := proto.NewReplicaClient(l.bulk).Forward(sctx)
	if err != nil {
		return nil, true, proto.FromStatus(op, q.Path, err)
	}
	if err := sendForward(st, q, small, spool); err != nil {
		return nil, true, ferry.E(op, q.Path, ferry.KindUnavailable, err)
	}
	r, err := st.CloseAndRecv()
	if err != nil {
		return nil, true, proto.FromStatus(op, q.Path, err)
	}
	if r.NotHolder {
		return nil, false, nil
	}
	f.set.stats.forwarded.Add(1)
	if err := f.set.inbox.wait(ctx, m.ID, r.Seq); err != nil {
		return nil, true, err
	}
	// This copy has the change now: its attributes here are the ones
	// the caller's later reads see.
	d := proto.ToDir(r.Dir)
	switch q.Op {
	case "remove", "removeall":
		return nil, true, nil
	case "move", "link":
		if here, err := f.FS.Stat(ctx, q.To).Wait(); err == nil {
			d = here
		}
	default:
		if here, err := f.FS.Stat(ctx, q.Path).Wait(); err == nil {
			d = here
		}
	}
	return d, true, nil
}

// sendForward sends q and then, in pieces, small or spool's content.
func sendForward(st grpc.ClientStreamingClient[proto.ForwardReq, proto.ForwardReply], q *proto.ForwardReq, small []byte, spool string) error {
	if spool == "" {
		q.Data = small
		return st.Send(q)
	}
	fh, err := os.Open(spool)
	if err != nil {
		return err
	}
	defer fh.Close()
	return eachPiece(fh, func(data []byte, first, _ bool) error {
		m := &proto.ForwardReq{Data: data}
		switch {
		case first:
			m = q
			m.Data = data
		case len(data) == 0:
			return nil // the stream's end says it
		}
		return st.Send(m)
	})
}

// forwardData reads a forwarded put's content as it arrives.
type forwardData struct {
	st  grpc.ClientStreamingServer[proto.ForwardReq, proto.ForwardReply]
	buf []byte
}

func (r *forwardData) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.st.Recv()
		if err != nil {
			return 0, err // io.EOF once the caller sent it all
		}
		r.buf = m.Data
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Forward makes a change another member's client asked for under this
// member's controls (see forward).
func (r receiver) Forward(st grpc.ClientStreamingServer[proto.ForwardReq, proto.ForwardReply]) error {
	const op = "replica.Forward"
	if _, err := r.set.caller(st.Context()); err != nil {
		return err
	}
	f := r.set.fs.Load()
	if f == nil {
		return proto.Status(ferry.E(op, "", ferry.KindUnavailable, "this member serves no tree yet"))
	}
	q, err := st.Recv()
	if err != nil {
		return err
	}
	switch q.Op {
	case "put", "move", "link", "wstat", "remove", "removeall":
	default:
		return proto.Status(ferry.E(op, q.Path, ferry.KindInvalid, "unknown change "+q.Op))
	}
	p, err := ferry.CleanPath(q.Path)
	if err != nil {
		return proto.Status(err)
	}
	to := ""
	if q.Op == "move" || q.Op == "link" {
		if to, err = ferry.CleanPath(q.To); err != nil {
			return proto.Status(err)
		}
	}
	ctx := context.WithValue(st.Context(), forwardedKey{}, true)
	changes := changesOf(q.Op, p, to)
	// This member's clients store what they keep back there first, and
	// drop what they cache of it after, as for a change of their own.
	for _, c := range changes {
		if err := f.recall(ctx, c.Tree, c.Path); err != nil {
			return proto.Status(ferry.E(op, c.Path, ferry.KindUnavailable, err))
		}
	}
	var out ferry.Dir
	switch q.Op {
	case "put":
		var data io.Reader
		if q.Content {
			data = &forwardData{st: st, buf: q.Data}
		}
		out, err = f.Put(ctx, p, proto.ToDir(q.Dir), q.Off, data).Wait()
	case "move":
		out, err = f.Move(ctx, p, to).Wait()
	case "link":
		out, err = f.Link(ctx, p, to).Wait()
	case "wstat":
		out, err = f.Wstat(ctx, p, proto.ToDir(q.Dir)).Wait()
	case "remove":
		err = wait0(f.Remove(ctx, p))
	case "removeall":
		err = wait0(f.RemoveAll(ctx, p))
	}
	if errors.Is(err, errNotHolder) {
		return st.SendAndClose(&proto.ForwardReply{NotHolder: true})
	}
	if err != nil {
		return proto.Status(err)
	}
	r.set.stats.forwardsServed.Add(1)
	f.yieldIdle(pathsOf(p, to)...)
	f.drop(ctx, changes...)
	reply := &proto.ForwardReply{Seq: f.out.last()}
	if out != nil {
		reply.Dir = proto.FromDir(out)
	}
	return st.SendAndClose(reply)
}

// yieldIdle marks the controls of paths to be given up (see releaser)
// where this member made no change of its own for half its idle time.
func (f *FS) yieldIdle(paths ...string) {
	self := f.set.self.Name
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range paths {
		c, ok := f.set.Controller(p)
		if !ok || c.Holder != self {
			continue
		}
		if u := f.useLocked(c); time.Since(u.last) >= f.idle/2 {
			u.revoked = true
		}
	}
}

// sentChunks are the chunks of a put's content forwarded from here, by
// hash, read from its spool file.
type sentChunks struct {
	fh   *os.File
	refs map[chunk.Hash]chunk.Ref
}

// forwardedChunks returns the chunks of the put of p forwarded from here
// that waits for its update, if one does, and a function that closes it.
func (f *FS) forwardedChunks(p string) (*sentChunks, func()) {
	s := &sentChunks{refs: map[chunk.Hash]chunk.Ref{}}
	spool, ok := f.forwarding.Load(p)
	if !ok {
		return s, func() {}
	}
	fh, err := os.Open(spool.(string))
	if err != nil {
		return s, func() {}
	}
	refs, err := chunk.List(fh, chunk.Default)
	if err != nil {
		fh.Close()
		return s, func() {}
	}
	for _, r := range refs {
		s.refs[r.Hash] = r
	}
	s.fh = fh
	return s, func() { fh.Close() }
}

func (s *sentChunks) has(h chunk.Hash) bool {
	_, ok := s.refs[h]
	return ok
}

// read returns the chunk h, checked against its hash.
func (s *sentChunks) read(h chunk.Hash) ([]byte, bool) {
	r, ok := s.refs[h]
	if !ok {
		return nil, false
	}
	b := make([]byte, r.Len)
	if _, err := s.fh.ReadAt(b, r.Off); err != nil || chunk.Sum(b) != h {
		return nil, false
	}
	return b, true
}
