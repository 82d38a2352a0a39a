package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/control"
	"github.com/ferryfs/ferry/internal/proto"
)

// Joining a running set.
//
// An administrator adds a member at any member ("add NAME ADDR
// FINGERPRINT" in the control file): one raft configuration change makes
// it a learner, and every member, applying it, connects to it and keeps
// every update it makes from then on until the new member applied it.
// The new member, started with Config.Join on an empty log, gets the
// table by a snapshot, waits until every member applied its addition, and
// then copies the tree from one member (Copy): that member lists its copy
// holding still, as of a cut of the updates it applied (per member, the
// last; its own, the last it made), and the new member fetches only the
// chunks it lacks, in one stream per batch of files, puts what differs and
// removes what the listing lacks. It takes no update before that; then
// it skips those the cut holds and applies the rest, in order, under the
// controls they were made under (whose release waited for it). Last it
// promotes itself to a voter and serves.

// copyBatch is how many entries one CopyBatch carries.
const copyBatch = 256

// Copy lists this member's copy of the tree for a member that joins.
func (r receiver) Copy(q *proto.CopyReq, st grpc.ServerStreamingServer[proto.CopyBatch]) error {
	const op = "replica.Copy"
	if _, err := r.set.caller(st.Context()); err != nil {
		return err
	}
	f := r.set.fs.Load()
	if f == nil {
		return ferry.E(op, "", ferry.KindUnavailable, "this member serves no tree")
	}
	cut, entries, err := f.copyList(st.Context())
	if err != nil {
		return err
	}
	b := &proto.CopyBatch{Cut: cut}
	for i, e := range entries {
		b.Entries = append(b.Entries, e)
		if len(b.Entries) == copyBatch || i == len(entries)-1 {
			if err := st.Send(b); err != nil {
				return err
			}
			b = &proto.CopyBatch{}
		}
	}
	if len(entries) == 0 {
		return st.Send(b)
	}
	return nil
}

// copyList lists this copy, every entry with its attributes and a file
// with its chunk list, while no change is made to it, and the cut of
// updates it holds.
func (f *FS) copyList(ctx context.Context) ([]*proto.CutSeq, []*proto.CopyEntry, error) {
	const op = "replica.Copy"
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	f.inMu.Lock()
	defer f.inMu.Unlock()
	var cut []*proto.CutSeq
	for _, m := range f.set.memberList() {
		seq := f.set.inbox.last(m.ID)
		if m.ID == f.set.self.ID {
			seq = f.out.last()
		}
		cut = append(cut, &proto.CutSeq{Member: m.ID, Seq: seq})
	}
	var entries []*proto.CopyEntry
	s := f.FS.Find(ctx, "/", "")
	defer s.Close()
	for e := range s.All() {
		if e.Err != nil {
			return nil, nil, ferry.E(op, e.Dir.Path(), e.Err)
		}
		p := e.Dir.Path()
		if p == "/" {
			continue
		}
		d := e.Dir
		ce := &proto.CopyEntry{Path: p}
		if d.Type() == ferry.TypeFile {
			var refs []chunk.Ref
			if err := f.chunkList(ctx, p, func(got ferry.Dir) { d = got }, func(r chunk.Ref) { refs = append(refs, r) }); err != nil {
				return nil, nil, ferry.E(op, p, err)
			}
			ce.Refs = proto.PackRefs(refs)
		}
		ce.Dir = proto.FromDir(attrsOf(d))
		entries = append(entries, ce)
	}
	if err := s.Err(); err != nil {
		return nil, nil, ferry.E(op, "/", err)
	}
	return cut, entries, nil
}

// chunkList gives p's attributes and chunk list in this copy: from the
// chunk index where there is one, else cut here.
func (f *FS) chunkList(ctx context.Context, p string, dir func(ferry.Dir), fn func(chunk.Ref)) error {
	if cfs, ok := ferry.As[chunkFS](f.FS); ok {
		return cfs.ChunkList(ctx, p, func(d ferry.Dir) error { dir(d); return nil }, func(r chunk.Ref) error { fn(r); return nil })
	}
	rc := f.FS.Get(ctx, p, 0, -1)
	defer rc.Close()
	refs, err := chunk.List(rc, chunk.Default)
	for _, r := range refs {
		fn(r)
	}
	return err
}

// hashes returns the hashes of p's chunks in this copy, in order.
func (f *FS) hashes(ctx context.Context, p string) []chunk.Hash {
	var hs []chunk.Hash
	f.chunkList(ctx, p, func(ferry.Dir) {}, func(r chunk.Ref) { hs = append(hs, r.Hash) })
	return hs
}

// chunksByRefs sends the chunks q.Refs names, read from this copy; one it
// no longer holds is sent as missing.
func (r receiver) chunksByRefs(f *FS, q *proto.ChunksReq, st grpc.ServerStreamingServer[proto.ChunksData]) error {
	hashes, sizes, err := proto.UnpackRefsMax(q.Refs, maxRefs)
	if err != nil {
		return ferry.E("replica.Chunks", "", err)
	}
	cfs, indexed := ferry.As[chunkFS](f.FS)
	buf := make([]byte, chunk.Default.Max)
	for i, h := range hashes {
		m := &proto.ChunksData{Missing: true}
		if indexed {
			if b, err := cfs.ReadChunk(st.Context(), h, "", buf); err == nil && len(b) == sizes[i] {
				m = &proto.ChunksData{Data: b}
				if q.Zstd {
					m.Data, m.Zstd = r.set.zip.Compress(nil, b)
				}
			}
		}
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// join copies the tree for this member, which the set added as a learner,
// and then makes it a voter.
func (s *Set) join(ctx context.Context) error {
	f := s.fs.Load()
	if f == nil {
		return errors.New("no replica layer yet")
	}
	// Every member applied the addition once it applied this log: from
	// then on each keeps its updates for this member.
	if err := f.eachMember(ctx, nil, func(ctx context.Context, c proto.ReplicaClient) error {
		_, err := c.Applied(ctx, &proto.AppliedReq{Index: s.node.Status().Applied})
		return err
	}); err != nil {
		return err
	}
	if !isClosed(s.copied) {
		from, err := s.copySource()
		if err != nil {
			return err
		}
		start := time.Now()
		n, fetched, err := f.copyFrom(ctx, from)
		if err != nil {
			return fmt.Errorf("copying the tree from %s: %w", from.m.Name, err)
		}
		s.log.Info("replica: copied the tree to join the set", "from", from.m.Name, "entries", n, "fetched_bytes", fetched, "took", time.Since(start))
		s.copiedOnce.Do(func() { close(s.copied) })
	}
	self := s.self.ID
	err := s.node.ChangeConf(ctx, raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: self},
		func(cs raftpb.ConfState) bool { return slices.Contains(cs.Voters, self) || s.removed() })
	if err == nil && s.removed() {
		return errRemoved
	}
	return err
}

// errRemoved says that the set removed this member.
var errRemoved = errors.New("this member was removed from the set")

// removed reports whether the set removed this member, as far as it
// applied the log.
func (s *Set) removed() bool { return s.gone(s.self.ID) }

// gone reports whether the set removed member id, as far as this member
// applied the log.
func (s *Set) gone(id uint64) (gone bool) {
	s.machine.read(func(t *control.Table) { gone = !t.Admits(id) })
	return gone
}

// copySource picks the member to copy from: the leader, which is most
// likely current and near.
func (s *Set) copySource() (*link, error) {
	if l := s.link(s.node.Status().Leader); l != nil {
		return l, nil
	}
	ls := s.linkList()
	if len(ls) == 0 {
		return nil, errors.New("no other member to copy from")
	}
	return ls[0], nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// copyFrom makes this copy the one l's member lists, fetching the chunks
// this copy lacks, and sets the inbox to the listing's cut. It returns the
// entries listed and the bytes fetched.
func (f *FS) copyFrom(ctx context.Context, l *link) (int, int64, error) {
	st, err := proto.NewReplicaClient(l.bulk).Copy(ctx, &proto.CopyReq{})
	if err != nil {
		return 0, 0, err
	}
	var cut []*proto.CutSeq
	var entries []*proto.CopyEntry
	for {
		b, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, err
		}
		cut = append(cut, b.Cut...)
		entries = append(entries, b.Entries...)
	}
	want := map[string]ferry.Dir{}
	for _, e := range entries {
		p, err := ferry.CleanPath(e.Path)
		if err != nil || p != e.Path || p == "/" {
			return 0, 0, ferry.E("replica.Copy", e.Path, ferry.KindInvalid, "a listed path is not clean")
		}
		want[p] = proto.ToDir(e.Dir)
	}
	// What this copy has that the listing lacks, or has as another
	// type, goes first (the highest such path of each subtree).
	have := map[string]ferry.Dir{}
	s := f.FS.Find(ctx, "/", "")
	for e := range s.All() {
		if e.Err == nil && e.Dir.Path() != "/" {
			have[e.Dir.Path()] = e.Dir
		}
	}
	if err := s.Err(); err != nil {
		return 0, 0, err
	}
	var gone []string
	for p, d := range have {
		if w, ok := want[p]; !ok || w.Type() != d.Type() {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for i, p := range gone {
		if i > 0 && ferry.HasPrefix(p, gone[i-1]) {
			gone[i] = gone[i-1] // removed with its ancestor
			continue
		}
		if err := wait0(f.FS.RemoveAll(ctx, p)); err != nil {
			return 0, 0, err
		}
	}
	// Then directories and the like, parents first; files in batches,
	// each batch's missing chunks in one stream; and last the
	// directories' attributes, which their new entries changed.
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	var files []*proto.CopyEntry
	var dirs []string
	for _, e := range entries {
		d := want[e.Path]
		switch d.Type() {
		case ferry.TypeFile:
			files = append(files, e)
			continue
		case ferry.TypeDir:
			dirs = append(dirs, e.Path)
			if h, ok := have[e.Path]; ok && h.Type() == ferry.TypeDir {
				continue
			}
			// Writable by this server until its entries are made; its
			// own mode comes with its attributes, last.
			d = d.Clone()
			d.SetMode(d.Mode() | 0o700)
		}
		if _, err := f.FS.Put(ctx, e.Path, d, ferry.Whole, nil).Wait(); err != nil {
			return 0, 0, err
		}
	}
	var fetched int64
	for len(files) > 0 {
		// A batch's chunks are asked for in one call: at most copyBatch
		// files, of at most maxRefs chunks together.
		n, refs := 0, 0
		for n < len(files) && n < copyBatch && (n == 0 || refs+len(files[n].GetRefs().GetSizes()) <= maxRefs) {
			refs += len(files[n].GetRefs().GetSizes())
			n++
		}
		got, err := f.copyFiles(ctx, l, files[:n], have)
		fetched += got
		if err != nil {
			return 0, 0, err
		}
		files = files[n:]
	}
	for _, p := range slices.Backward(dirs) {
		if _, err := f.FS.Wstat(ctx, p, want[p]).Wait(); err != nil {
			return 0, 0, err
		}
	}
	seqs := map[uint64]uint64{}
	for _, c := range cut {
		seqs[c.Member] = c.Seq
	}
	if err := f.set.inbox.cut(seqs); err != nil {
		return 0, 0, err
	}
	return len(entries), fetched, nil
}

// copyFiles puts the files es as listed: a file whose chunk list this
// copy has already is only given its attributes; the chunks no file of this
// copy holds are fetched from l's member in one stream.
func (f *FS) copyFiles(ctx context.Context, l *link, es []*proto.CopyEntry, have map[string]ferry.Dir) (int64, error) {
	cfs, ok := ferry.As[chunkFS](f.FS)
	if !ok {
		return 0, ferry.E("replica.Copy", "", ferry.KindInvalid, "a member that joins keeps its copy in a chunk store")
	}
	type file struct {
		e   *proto.CopyEntry
		put *chunkstore.Put
	}
	var puts []*file
	defer func() {
		for _, p := range puts {
			p.put.Abort()
		}
	}()
	need := map[chunk.Hash][]*file{}
	var ask []chunk.Ref
	for _, e := range es {
		hashes, szs, err := proto.UnpackRefsMax(e.Refs, maxRefs)
		if err != nil {
			return 0, ferry.E("replica.Copy", e.Path, err)
		}
		d := proto.ToDir(e.Dir)
		if h, ok := have[e.Path]; ok && h.Type() == ferry.TypeFile && slices.Equal(f.hashes(ctx, e.Path), hashes) {
			if _, err := f.FS.Wstat(ctx, e.Path, d).Wait(); err != nil {
				return 0, err
			}
			continue
		}
		var size int64
		for _, n := range szs {
			size += int64(n)
		}
		put, err := cfs.BeginPut(ctx, e.Path, d, size)
		if err != nil {
			return 0, err
		}
		fl := &file{e: e, put: put}
		puts = append(puts, fl)
		if err := put.AddRefs(hashes, szs); err != nil {
			return 0, err
		}
		idx, err := put.EndList()
		if err != nil {
			return 0, err
		}
		for _, i := range idx {
			h := hashes[i]
			if need[h] == nil {
				ask = append(ask, chunk.Ref{Hash: h, Len: szs[i]})
			}
			need[h] = append(need[h], fl)
		}
	}
	var fetched int64
	if len(ask) > 0 {
		c, err := proto.NewReplicaClient(l.bulk).Chunks(ctx, &proto.ChunksReq{Refs: proto.PackRefs(ask), Zstd: true})
		if err != nil {
			return 0, err
		}
		in := &chunksIn{st: c, set: f.set}
		for _, r := range ask {
			h := r.Hash
			b, missing, err := in.nextOrMissing()
			if err != nil {
				return fetched, err
			}
			if missing {
				// Changed at l's member since it listed it: an
				// update after the cut brings its new content.
				continue
			}
			fetched += int64(len(b))
			for _, fl := range need[h] {
				if err := fl.put.Write(h, b); err != nil {
					return fetched, err
				}
			}
		}
		f.set.stats.fetchedBytes.Add(fetched)
	}
	for _, fl := range puts {
		if !fl.put.Complete() {
			f.set.log.Info("replica: a file changed while the tree was copied; its update brings it", "path", fl.e.Path)
			continue
		}
		if _, err := fl.put.Commit(f.FS); err != nil {
			return fetched, err
		}
	}
	return fetched, nil
}

// addCommand adds the member named by args (NAME ADDR FINGERPRINT) to the
// set as a learner, once it checked that nothing names it already.
func (s *Set) addCommand(ctx context.Context, args []string) error {
	const op = "replica.add"
	ms, err := ParseMembers(strings.NewReader(strings.Join(args, " ")))
	if err != nil {
		return ferry.E(op, "", ferry.KindInvalid, err)
	}
	m := ms[0]
	for _, o := range s.memberList() {
		if o.Name == m.Name || o.Addr == m.Addr || o.Fingerprint == m.Fingerprint || o.ID == m.ID {
			if o == m {
				return nil // added already
			}
			return ferry.E(op, m.Name, ferry.KindExist, "member "+o.Name+" has that name, address or key")
		}
	}
	if s.gone(m.ID) {
		return ferry.E(op, m.Name, ferry.KindExist, "a member of that name was removed from the set; add it under a new name")
	}
	if len(s.memberList()) >= MaxMembers {
		return ferry.E(op, m.Name, ferry.KindInvalid, fmt.Sprintf("a set has at most %d members", MaxMembers))
	}
	cc := raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: m.ID, Context: control.EncodeMember(m)}
	return s.node.ChangeConf(ctx, cc, func(cs raftpb.ConfState) bool {
		return slices.Contains(cs.Learners, m.ID) || slices.Contains(cs.Voters, m.ID)
	})
}

// removeCommand removes member name from the set: raft no longer counts
// it, the others stop sending it anything and waiting for it, and the
// controls it held are dropped with whatever of their changes it had not
// sent. For a member that is gone for good (its site lost, or added but
// never started); a member removed cannot join again under its name.
func (s *Set) removeCommand(ctx context.Context, name string) error {
	const op = "replica.remove"
	m, ok := s.member(name)
	if !ok {
		return ferry.E(op, name, ferry.KindNotExist, "no such member")
	}
	if m.ID == s.self.ID {
		return ferry.E(op, name, ferry.KindInvalid, "a member is removed from another member")
	}
	cs := s.node.Conf()
	if slices.Contains(cs.Voters, m.ID) && len(cs.Voters) <= 2 {
		// Raft changes the configuration when a member applies the
		// change: the one left might never learn that the removal
		// committed, and then waits for the removed member's vote.
		return ferry.E(op, name, ferry.KindInvalid, "a set of two cannot lose a member safely: add one first")
	}
	// A leader that removes itself steps down, maybe before the others
	// learned that its removal committed: the leadership moves first.
	to := s.self.ID
	if !slices.Contains(cs.Voters, to) {
		for _, v := range cs.Voters {
			if v != m.ID {
				to = v
			}
		}
	}
	for s.node.Status().Leader == m.ID {
		s.node.TransferLeader(to)
		select {
		case <-ctx.Done():
			return ferry.E(op, name, ferry.KindUnavailable, "the leadership did not move from the member: "+ctx.Err().Error())
		case <-time.After(100 * time.Millisecond):
		}
	}
	cc := raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: m.ID, Context: control.EncodeMember(m)}
	return s.node.ChangeConf(ctx, cc, func(cs raftpb.ConfState) bool {
		return !slices.Contains(cs.Learners, m.ID) && !slices.Contains(cs.Voters, m.ID)
	})
}
