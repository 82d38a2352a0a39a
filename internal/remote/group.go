package remote

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "google.golang.org/protobuf/proto"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
)

var _ ferry.Grouper = (*Client)(nil)

// Group implements ferry.Grouper. Its changes go in one Commit call;
// files the client puts by chunks are staged before it, each by a chunked
// put that sends only the chunks the server lacks. A server that predates
// Commit gets the changes one call each, in order, at Commit.
func (c *Client) Group() ferry.Group {
	return &group{c: c, id: randomID(), done: make(chan struct{})}
}

type group struct {
	c  *Client
	id string

	mu        sync.Mutex
	changes   []*proto.Change
	committed bool
	// newDirs are the directories the group makes (see made).
	newDirs map[string]bool
	stages  int // Puts staged, which number their keys.
	// staging counts the staged puts under way; stageErr is the first
	// that failed, which fails the group.
	staging  sync.WaitGroup
	stageErr error

	done chan struct{} // Closed when dirs, failed and err are set.
	dirs []ferry.Dir
	// failed holds the errors of the changes that failed, by index;
	// err fails them all.
	failed map[int]error
	err    error
}

// made notes that the group puts a directory at p (or may: a rename's
// target), which the tree below has not until the group commits.
func (g *group) made(p string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.newDirs == nil {
		g.newDirs = map[string]bool{}
	}
	g.newDirs[p] = true
}

// inMade reports whether p lies in a directory the group makes.
func (g *group) inMade(p string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for d := path.Dir(p); ; d = path.Dir(d) {
		if g.newDirs[d] {
			return true
		}
		if d == "/" || d == "." {
			return false
		}
	}
}

// stageKey is the context key of the group a chunked put is staged for
// (ChunkPutMsg.Stage).
type stageKey struct{}

// add records ch and returns its index in the group.
func (g *group) add(ch *proto.Change) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.committed {
		return 0, ferry.E("remote.Group", ch.Path, ferry.KindInvalid, "a change after the group's Commit")
	}
	g.changes = append(g.changes, ch)
	return len(g.changes) - 1, nil
}

// result waits for the group's Commit and returns the i'th change's entry.
func (g *group) result(i int) (ferry.Dir, error) {
	<-g.done
	if g.err != nil {
		return nil, g.err
	}
	if err := g.failed[i]; err != nil {
		return nil, err
	}
	return g.dirs[i], nil
}

func (g *group) record(ch *proto.Change) *ferry.Future[ferry.Dir] {
	i, err := g.add(ch)
	if err != nil {
		return ferry.Resolved[ferry.Dir](nil, err)
	}
	return ferry.Go(func() (ferry.Dir, error) { return g.result(i) })
}

func (g *group) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	const op = "remote.Group"
	if off != ferry.Whole {
		return ferry.Resolved[ferry.Dir](nil, ferry.E(op, p, ferry.KindInvalid, "a group puts whole files only"))
	}
	var buf []byte
	if data != nil {
		var err error
		if buf, err = io.ReadAll(data); err != nil {
			return ferry.Resolved[ferry.Dir](nil, ferry.E(op, p, ferry.KindIO, err))
		}
	}
	if d == nil {
		d = ferry.Dir{}
	}
	ch := &proto.Change{Kind: proto.ChangePut, Path: p, Dir: proto.FromDir(d), Data: buf}
	size := int64(len(buf))
	if d.IsDir() {
		g.made(p)
	}
	if !g.c.chunkable(p, d, size) || g.inMade(p) {
		// A file in a directory the group makes cannot be staged
		// before it: it goes with the group.
		return g.record(ch)
	}
	// Staged now, while the other changes are recorded; Commit waits
	// for it.
	ch.Data = nil
	g.mu.Lock()
	g.stages++
	ch.Staged = fmt.Sprintf("%s/%d", g.id, g.stages)
	via := g.c.groupBatch().carries(size)
	g.mu.Unlock()
	f := g.record(ch)
	g.staging.Add(1)
	go func() {
		defer g.staging.Done()
		sctx := context.WithValue(ctx, stageKey{}, ch.Staged)
		_, err, done := g.c.putByChunks(sctx, p, d, io.NewSectionReader(bytes.NewReader(buf), 0, size), size, via, false)
		g.mu.Lock()
		defer g.mu.Unlock()
		switch {
		case !done:
			// The server takes no chunked put of it: it goes with the
			// group.
			ch.Staged, ch.Data = "", buf
		case err != nil && g.stageErr == nil:
			g.stageErr = err
		}
	}()
	return f
}

func (g *group) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	g.made(to)
	return g.record(&proto.Change{Kind: proto.ChangeMove, Path: from, To: to})
}

func (g *group) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	f := g.record(&proto.Change{Kind: proto.ChangeRemove, Path: p})
	return ferry.Go(func() (struct{}, error) {
		_, err := f.Wait()
		return struct{}{}, err
	})
}

func (g *group) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	return g.record(&proto.Change{Kind: proto.ChangeWstat, Path: p, Dir: proto.FromDir(d)})
}

// errNoCommit says the server does not know Commit.
var errNoCommit = fmt.Errorf("the server does not take groups of changes")

// Commit implements ferry.Group. A connection that breaks is ridden out
// as a put's is (the same group is sent again, and a server that applied
// it already answers as it did), for up to ResumeFor.
func (g *group) Commit(ctx context.Context) error {
	g.mu.Lock()
	if g.committed {
		g.mu.Unlock()
		return ferry.E("remote.Group", "", ferry.KindInvalid, "a group is committed once")
	}
	g.committed = true
	g.mu.Unlock()
	g.staging.Wait()
	dirs, err := g.commit(ctx)
	g.dirs, g.err = dirs, err
	close(g.done)
	return err
}

func (g *group) commit(ctx context.Context) ([]ferry.Dir, error) {
	if g.stageErr != nil {
		return nil, g.stageErr
	}
	if len(g.changes) == 0 {
		return nil, nil
	}
	var deadline time.Time
	var opts []grpc.CallOption
	for {
		dirs, err := g.send(ctx, opts...)
		if err == errNoCommit {
			return g.oneByOne(ctx)
		}
		if err == nil || !g.c.rideOut(ctx, err, &deadline) {
			return dirs, err
		}
		opts = []grpc.CallOption{grpc.WaitForReady(true)}
	}
}

// send makes one Commit call of the group's changes.
func (g *group) send(ctx context.Context, opts ...grpc.CallOption) ([]ferry.Dir, error) {
	const op = "remote.Commit"
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var inline int64
	for _, ch := range g.changes {
		inline += int64(len(ch.Data))
	}
	st, err := g.c.bulk.Commit(declareSize(ctx, inline), opts...)
	if err != nil {
		return nil, g.c.fail(op, "", err)
	}
	// Messages hold up to a message's worth of data; a larger file's
	// data goes on in the changes after it (Change.more).
	m := &proto.CommitMsg{Group: g.id}
	size := 0
	var sendErr error
	flush := func(end bool) {
		m.End = end
		if sendErr == nil {
			sendErr = st.Send(m)
		}
		m, size = &proto.CommitMsg{Group: g.id}, 0
	}
	for _, ch := range g.changes {
		data, first := ch.Data, true
		for {
			part := data[:min(len(data), proto.SendData)]
			data = data[len(part):]
			c := &proto.Change{} // Data that goes on.
			if first {
				c = &proto.Change{Kind: ch.Kind, Path: ch.Path, To: ch.To, Dir: ch.Dir, Staged: ch.Staged}
				first = false
			}
			c.More = len(data) > 0
			c.Data = part
			if g.c.zip != nil && g.c.zstdOK.Load() {
				c.Data, c.Zstd = g.c.zip.Compress(nil, part)
			}
			g.c.traffic.putBytes.Add(int64(len(part)))
			g.c.traffic.putWire.Add(int64(len(c.Data)))
			n := pb.Size(c)
			if size > 0 && size+n > proto.SendData {
				flush(false)
			}
			m.Changes = append(m.Changes, c)
			size += n
			if len(data) == 0 {
				break
			}
		}
	}
	flush(true)
	r, err := st.CloseAndRecv()
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return nil, errNoCommit
		}
		return nil, g.c.fail(op, "", err)
	}
	if len(r.Dirs) != len(g.changes) {
		return nil, ferry.E(op, "", ferry.KindInvalid, fmt.Sprintf("the server answered %d of %d changes", len(r.Dirs), len(g.changes)))
	}
	dirs := make([]ferry.Dir, len(r.Dirs))
	for i, d := range r.Dirs {
		dirs[i] = proto.ToDir(d)
	}
	g.failed = map[int]error{}
	for i, e := range r.Failed {
		if i < 0 || int(i) >= len(g.changes) {
			return nil, ferry.E(op, "", ferry.KindInvalid, fmt.Sprintf("the server failed change %d of %d", i, len(g.changes)))
		}
		g.failed[int(i)] = proto.ToError(e)
	}
	return dirs, nil
}

// oneByOne makes the group's changes one call each, in order, for a
// server without Commit: a file staged there was put already (it took
// the stage for an ordinary chunked put).
func (g *group) oneByOne(ctx context.Context) ([]ferry.Dir, error) {
	dirs := make([]ferry.Dir, len(g.changes))
	g.failed = map[int]error{}
	for i, ch := range g.changes {
		var d ferry.Dir
		var err error
		switch ch.Kind {
		case proto.ChangePut:
			if ch.Staged != "" {
				d, err = g.c.Stat(ctx, ch.Path).Wait()
			} else {
				d, err = g.c.Put(ctx, ch.Path, proto.ToDir(ch.Dir), ferry.Whole, bytes.NewReader(ch.Data)).Wait()
			}
		case proto.ChangeRemove:
			_, err = g.c.Remove(ctx, ch.Path).Wait()
		case proto.ChangeMove:
			d, err = g.c.Move(ctx, ch.Path, ch.To).Wait()
		case proto.ChangeWstat:
			d, err = g.c.Wstat(ctx, ch.Path, proto.ToDir(ch.Dir)).Wait()
		}
		if err != nil {
			g.failed[i] = err
		}
		dirs[i] = d
	}
	return dirs, nil
}
