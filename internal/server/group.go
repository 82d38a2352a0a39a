package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/proto"
)

// Limits of groups (see Commit): a staged put not committed within
// stagedFor is dropped, and at most stagedMax wait at once; the outcome of
// the last groupsKept groups is kept for a Commit sent again.
const (
	stagedFor  = 10 * time.Minute
	stagedMax  = 4096
	groupsKept = 1024
)

// groups holds the puts staged for groups of changes not yet committed,
// and the outcome of the groups committed lately, so that a Commit made
// again after a broken connection is answered, not applied twice.
type groups struct {
	mu     sync.Mutex
	staged map[string]*stagedPut
	done   map[string]*groupRun
	order  []string // done's keys, oldest first.
}

// stagedPut is a chunked put assembled and waiting for its group's Commit.
type stagedPut struct {
	u      *chunkstore.Put
	cancel context.CancelFunc
	at     time.Time
}

// groupRun is a group being applied, then applied: reply is set when
// done is closed.
type groupRun struct {
	done  chan struct{}
	reply *proto.CommitReply
}

func newGroups() *groups {
	return &groups{staged: map[string]*stagedPut{}, done: map[string]*groupRun{}}
}

// stage keeps u for the Commit naming key, dropping a put staged under
// the same key before (the client sent it again) and those left too long.
func (g *groups) stage(key string, u *chunkstore.Put, cancel context.CancelFunc) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for k, sp := range g.staged {
		if now.Sub(sp.at) > stagedFor {
			sp.drop()
			delete(g.staged, k)
		}
	}
	if old := g.staged[key]; old != nil {
		old.drop()
	} else if len(g.staged) >= stagedMax {
		return ferry.E(proto.BusyOp, key, ferry.KindUnavailable, fmt.Sprintf("the server is busy: %d staged puts wait for their groups", stagedMax))
	}
	g.staged[key] = &stagedPut{u: u, cancel: cancel, at: now}
	return nil
}

// take returns and forgets the put staged under key.
func (g *groups) take(key string) *stagedPut {
	g.mu.Lock()
	defer g.mu.Unlock()
	sp := g.staged[key]
	delete(g.staged, key)
	return sp
}

func (sp *stagedPut) drop() {
	sp.u.Abort()
	sp.cancel()
}

// begin returns the run of group and whether the caller is to apply it:
// false if it was applied, or is being applied, by an earlier Commit.
func (g *groups) begin(group string) (*groupRun, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r, ok := g.done[group]; ok {
		return r, false
	}
	r := &groupRun{done: make(chan struct{})}
	g.done[group] = r
	g.order = append(g.order, group)
	if len(g.order) > groupsKept {
		delete(g.done, g.order[0])
		g.order = g.order[1:]
	}
	return r, true
}

// Commit applies a group of changes once all of them have arrived, in the
// order sent: a client that dies or loses its connection before the end
// leaves the tree as it was, and one whose Commit applied but whose answer
// was lost gets the same answer when it asks again. The changes are made
// as the single calls make them (recalls, promises and breaks included),
// with a context of their own: once the end has arrived the group is
// applied whole even if the client goes. A change that fails is reported
// in the answer (see apply).
func (h *handler) Commit(st grpc.ClientStreamingServer[proto.CommitMsg, proto.CommitReply]) error {
	return h.done(opCommit, h.commit(st))
}

func (h *handler) commit(st grpc.ClientStreamingServer[proto.CommitMsg, proto.CommitReply]) error {
	const op = "server.Commit"
	var zbuf []byte
	gr := &groupReader{unzip: func(c *proto.Change) ([]byte, error) {
		return h.putData(&proto.PutMsg{Path: c.Path, Data: c.Data, Zstd: c.Zstd}, &zbuf)
	}}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return ferry.E(op, "", ferry.KindInvalid, "the group ended before its end: nothing applied")
		}
		if err != nil {
			return err
		}
		end, err := gr.add(m)
		if err != nil {
			return err
		}
		if end {
			break
		}
	}
	group, changes := gr.group, gr.changes
	run, first := h.s.groups.begin(group)
	if first {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(st.Context()), 10*time.Minute)
		run.reply = h.apply(ctx, changes)
		cancel()
		close(run.done)
	} else {
		select {
		case <-run.done:
		case <-st.Context().Done():
			return st.Context().Err()
		}
	}
	return st.SendAndClose(run.reply)
}

// groupReader puts a group together from the messages of its Commit.
type groupReader struct {
	// unzip returns the data of a change, decompressed; the bytes may
	// be reused by its next call.
	unzip   func(*proto.Change) ([]byte, error)
	group   string
	changes []*proto.Change
	inline  int
	more    bool // The last change's data goes on.
}

// add takes the next message of the group and reports whether it was the
// last.
func (gr *groupReader) add(m *proto.CommitMsg) (end bool, err error) {
	const op = "server.Commit"
	switch {
	case m.Group == "" || len(m.Group) > 64:
		return false, ferry.E(op, "", ferry.KindInvalid, "a group needs a name of 1 to 64 bytes")
	case gr.group != "" && m.Group != gr.group:
		return false, ferry.E(op, "", ferry.KindInvalid, "one Commit names one group")
	}
	gr.group = m.Group
	tooBig := func() error {
		return ferry.E(op, "", ferry.KindInvalid, fmt.Sprintf("a group carries at most %d changes and %d MiB of data", proto.CommitChanges, proto.CommitInline>>20))
	}
	for _, c := range m.Changes {
		data, err := gr.unzip(c)
		if err != nil {
			return false, err
		}
		if gr.inline += len(data); gr.inline > proto.CommitInline {
			return false, tooBig()
		}
		if gr.more {
			// The data of the put before.
			last := gr.changes[len(gr.changes)-1]
			last.Data = append(last.Data, data...)
		} else {
			c.Data, c.Zstd = bytes.Clone(data), false
			if gr.changes = append(gr.changes, c); len(gr.changes) > proto.CommitChanges {
				return false, tooBig()
			}
		}
		gr.more = c.More
	}
	if m.End && gr.more {
		return false, ferry.E(op, "", ferry.KindInvalid, "the group ended in the middle of a put's data")
	}
	return m.End, nil
}

// changeOps are the calls whose counts a change of each kind adds to: the
// counts are of changes made, alone or in a group.
var changeOps = map[int32]int{proto.ChangePut: opPut, proto.ChangeRemove: opRemove, proto.ChangeMove: opMove, proto.ChangeWstat: opWstat}

// apply makes changes in order. One that fails is reported by its index
// and the rest are made: each was made by its client without regard to
// it, as single calls are. A removal of what is not there is no failure:
// what the client wanted holds (its cache may think a file reached the
// server that a rename in an earlier group took away).
func (h *handler) apply(ctx context.Context, changes []*proto.Change) *proto.CommitReply {
	const op = "server.Commit"
	r := &proto.CommitReply{Dirs: make([]*proto.Dir, len(changes))}
	for i, c := range changes {
		var d ferry.Dir
		var err error
		if _, err = ferry.CleanPath(c.Path); err == nil {
			switch c.Kind {
			case proto.ChangePut:
				d, err = h.putChange(ctx, c)
			case proto.ChangeRemove:
				if err = h.remove(ctx, c.Path); ferry.IsKind(err, ferry.KindNotExist) {
					err = nil
				}
			case proto.ChangeMove:
				d, err = h.move(ctx, c.Path, c.To)
			case proto.ChangeWstat:
				d, err = h.wstat(ctx, c.Path, proto.ToDir(c.Dir))
			default:
				err = ferry.E(op, c.Path, ferry.KindInvalid, fmt.Sprintf("no change of kind %d", c.Kind))
			}
		}
		if op, ok := changeOps[c.Kind]; ok {
			h.s.calls[op].Add(1)
		}
		if err != nil {
			h.s.errs.Add(1)
			if r.Failed == nil {
				r.Failed = map[int32]*proto.Error{}
			}
			r.Failed[int32(i)] = proto.FromError(err)
			continue
		}
		r.Dirs[i] = proto.FromDir(d)
	}
	return r
}

// putChange makes a put of a group: the staged put it names, or a put of
// the data it carries.
func (h *handler) putChange(ctx context.Context, c *proto.Change) (ferry.Dir, error) {
	const op = "server.Commit"
	h.promise(ctx, c.Path)
	var d ferry.Dir
	var err error
	if c.Staged != "" {
		sp := h.s.groups.take(c.Staged)
		if sp == nil {
			return nil, ferry.E(op, c.Path, ferry.KindInvalid, "no staged put "+c.Staged+" (it ran out, or the server restarted)")
		}
		d, err = sp.u.Commit(h.s.fs)
		sp.drop() // Only its context is left after a commit.
	} else {
		d, err = h.s.fs.Put(ctx, c.Path, proto.ToDir(c.Dir), ferry.Whole, bytes.NewReader(c.Data)).Wait()
	}
	return d, h.changed(ctx, err, callback.Change{Path: c.Path})
}
