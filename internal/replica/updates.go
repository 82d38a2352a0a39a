package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/zwire"
	pb "google.golang.org/protobuf/proto"
)

// piece is how much of a file's content one Update carries.
const piece = proto.SendData

// update is one change this member made, kept until every other member
// applied it.
type update struct {
	// h is the update; a small put's content is in its Data, unless hdr
	// names the header file to read it from (past inlineMax).
	h     *proto.Update
	hdr   string
	spool string // the content of a larger put, "" for none

	once sync.Once // cuts the content into chunks, for the first member sent it
	refs []chunk.Ref
	err  error

	// zmu guards zc: its chunks compressed for the first member that
	// fetched them, kept for the others (within zipMax over the outbox).
	zmu sync.Mutex
	zc  map[int][]byte
}

// zipMax bounds the compressed chunks an outbox keeps for the members
// that fetch them next.
const zipMax = 64 << 20

// zipped returns chunk i of u compressed, or false if it does not
// compress, compressing b (its bytes) with zip unless an earlier fetch
// did; it keeps what it compresses while kept (the outbox's count) stays
// within zipMax.
func (u *update) zipped(i int, b []byte, zip *zwire.Codec, kept *atomic.Int64) ([]byte, bool) {
	u.zmu.Lock()
	defer u.zmu.Unlock()
	if c, ok := u.zc[i]; ok {
		return c, c != nil
	}
	c, ok := zip.Compress(nil, b)
	if !ok {
		c = nil // b itself: the caller's buffer
	}
	if kept.Add(int64(len(c))+1) <= zipMax {
		if u.zc == nil {
			u.zc = map[int][]byte{}
		}
		u.zc[i] = c
	} else {
		kept.Add(-int64(len(c)) - 1)
	}
	return c, ok
}

// unzip gives back what u kept of its compressed chunks.
func (u *update) unzip(kept *atomic.Int64) {
	u.zmu.Lock()
	defer u.zmu.Unlock()
	for _, c := range u.zc {
		kept.Add(-int64(len(c)) - 1)
	}
	u.zc = nil
}

// byChunks is the least content sent as a chunk list rather than whole:
// below it one round trip more costs more than the bytes it saves. Less
// content goes in the update's header (Data), one file per update and
// nothing to open again for each member.
const byChunks = 64 << 10

// inlineMax bounds the small puts' content an outbox holds in memory;
// past it, content is read again from the update's header when sent.
const inlineMax = 64 << 20

// keepLocked keeps u's inline content in memory, or drops it there if the
// outbox holds inlineMax already.
func (o *outbox) keepLocked(u *update, hdr string) {
	if n := len(u.h.Data); n > 0 {
		if o.inline+n > o.inlineMax {
			u.h.Data, u.hdr = nil, hdr
		} else {
			o.inline += n
		}
	}
}

// header returns u's update with its content, reading it again from its
// header file if it is not held.
func (u *update) header() (*proto.Update, error) {
	if u.hdr == "" {
		return u.h, nil
	}
	h, whole, err := readHead(u.hdr)
	if err == nil && !whole {
		err = fmt.Errorf("replica: update %s torn", u.hdr)
	}
	return h, err
}

// readHead reads the update in header file name, and whether the file is
// whole (nil if torn by a crash).
func readHead(name string) (*proto.Update, bool, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, false, err
	}
	b, whole := decodeHead(b)
	if !whole {
		return nil, false, nil
	}
	h := &proto.Update{}
	if err := pb.Unmarshal(b, h); err != nil {
		return nil, true, fmt.Errorf("replica: update %s: %w", name, err)
	}
	return h, true, nil
}

// chunks returns the chunk list of u's content.
func (u *update) chunks() ([]chunk.Ref, error) {
	u.once.Do(func() {
		f, err := os.Open(u.spool)
		if err != nil {
			u.err = err
			return
		}
		defer f.Close()
		u.refs, u.err = chunk.List(f, chunk.Default)
	})
	return u.refs, u.err
}

// outbox holds the updates this member made under its controls, in the
// order it made them, until every other member acknowledged them. It
// keeps them in its directory, each header synced before the change is
// answered, so a member that crashes sends them again when it restarts:
// a change it answered is never lost to the other members. Their numbers
// (seq) go on from the highest it kept.
type outbox struct {
	dir    string
	mu     sync.Mutex
	seq    uint64
	log    []*update
	inline int          // bytes of small puts' content held in memory
	zipped atomic.Int64 // bytes of compressed chunks the updates keep
	// inlineMax bounds inline (inlineMax, but for tests).
	inlineMax int
	acked     map[uint64]uint64 // member id -> last seq it applied
	changed   chan struct{}     // closed and replaced on each add and ack
}

// openOutbox loads the updates left in dir.
func openOutbox(dir string, peers []uint64) (*outbox, error) {
	o := &outbox{dir: dir, acked: map[uint64]uint64{}, changed: make(chan struct{}), inlineMax: inlineMax}
	for _, id := range peers {
		o.acked[id] = 0
	}
	// A put's content that never became an update (a crash before it
	// was kept) is dropped.
	tmps, _ := filepath.Glob(filepath.Join(dir, "put-*"))
	for _, t := range tmps {
		os.Remove(t)
	}
	names, err := filepath.Glob(filepath.Join(dir, "u-*.hdr"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names) // zero-padded: the order made
	for _, n := range names {
		h, whole, err := readHead(n)
		if err != nil {
			return nil, err
		}
		dat := strings.TrimSuffix(n, ".hdr") + ".dat"
		if !whole {
			// Torn by a crash while it was kept: its change was
			// never answered.
			os.Remove(n)
			os.Remove(dat)
			continue
		}
		u := &update{h: h}
		if fileExists(dat) {
			u.spool = dat
		}
		o.keepLocked(u, n)
		o.log = append(o.log, u)
		o.seq = max(o.seq, h.Seq)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "seq")); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			o.seq = max(o.seq, v)
		}
	}
	if len(o.acked) == 0 {
		o.trimLocked(o.seq) // a set of one: nobody to send them to
	}
	return o, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (o *outbox) notifyLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// add numbers an update, keeps it (and spool, its content, which it then
// owns) on disk, and queues it for every other member.
func (o *outbox) add(h *proto.Update, spool string) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	h.Seq = o.seq
	base := filepath.Join(o.dir, fmt.Sprintf("u-%020d", h.Seq))
	u := &update{h: h}
	if spool != "" {
		u.spool = base + ".dat"
		if err := os.Rename(spool, u.spool); err != nil {
			return 0, err
		}
	}
	b, err := pb.Marshal(h)
	if err == nil {
		err = writeHead(base+".hdr", b)
	}
	if err != nil {
		os.Remove(u.spool)
		return 0, fmt.Errorf("replica: keeping an update: %w", err)
	}
	o.keepLocked(u, base+".hdr")
	o.log = append(o.log, u)
	if len(o.acked) == 0 {
		o.trimLocked(h.Seq)
	}
	o.notifyLocked()
	return h.Seq, nil
}

// An update's header file is headMagic, the marshalled Update and the
// CRC-32C of both, written and synced in place: one file made per update,
// where a temporary file and a rename made two (ext4 then spent more of
// the member's time finding inodes than anything else). A header torn by
// a crash fails its check and is dropped. Headers without the magic were
// written whole by a rename (earlier versions).
const headMagic = "FU1\n"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeHead writes the header data to file durably.
func writeHead(file string, data []byte) error {
	b := make([]byte, 0, len(headMagic)+len(data)+4)
	b = append(append(b, headMagic...), data...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return writeDurably(file, b)
}

// decodeHead returns the marshalled Update in a header file's bytes b, and
// whether b is whole.
func decodeHead(b []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(headMagic))
	if !ok {
		return b, true // written by a rename
	}
	if len(rest) < 4 {
		return nil, false
	}
	n := len(b) - 4
	if crc32.Checksum(b[:n], castagnoli) != binary.BigEndian.Uint32(b[n:]) {
		return nil, false
	}
	return rest[:len(rest)-4], true
}

// writeSynced writes data to file atomically and durably.
func writeSynced(file string, data []byte) error {
	tmp := file + ".tmp"
	err := writeDurably(tmp, data)
	if err == nil {
		if err = os.Rename(tmp, file); err != nil {
			os.Remove(tmp)
		}
	}
	return err
}

// writeDurably writes data to file and syncs it; it leaves no file if it
// fails.
func writeDurably(file string, data []byte) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(file)
	}
	return err
}

// addPeer sends every update still kept, and those to come, to member id
// too, which the set just added.
func (o *outbox) addPeer(id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.acked[id]; !ok {
		o.acked[id] = 0
		o.notifyLocked()
	}
}

// removePeer waits for member id, which left the set, no more: what only
// it had not applied is dropped.
func (o *outbox) removePeer(id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.acked[id]; !ok {
		return
	}
	delete(o.acked, id)
	low := o.seq
	for _, a := range o.acked {
		low = min(low, a)
	}
	o.trimLocked(low)
	o.notifyLocked()
}

// last returns the seq of the last update queued.
func (o *outbox) last() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seq
}

// owed returns the update member id must apply before it reads what this
// member controls: the last one, or 0 if it applied them all.
func (o *outbox) owed(id uint64) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.acked[id] >= o.seq {
		return 0
	}
	return o.seq
}

// applied reports whether every other member applied seq.
func (o *outbox) applied(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.acked {
		if a < seq {
			return false
		}
	}
	return true
}

// waitAcked waits until every member of ids applied seq.
func (o *outbox) waitAcked(ctx context.Context, ids map[uint64]bool, seq uint64) error {
	for {
		o.mu.Lock()
		done := true
		for id := range ids {
			if a, ok := o.acked[id]; ok && a < seq {
				done = false
			}
		}
		ch := o.changed
		o.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// ack records that member id applied up to seq, and drops what every
// member has.
func (o *outbox) ack(id, seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq <= o.acked[id] {
		return
	}
	o.acked[id] = seq
	low := seq
	for _, a := range o.acked {
		low = min(low, a)
	}
	o.trimLocked(low)
	o.notifyLocked()
}

// trimLocked removes the updates up to seq. When that leaves none, their
// number is kept first, so that numbers go on from it after a restart;
// while any is left, its header carries a higher one.
func (o *outbox) trimLocked(seq uint64) {
	if len(o.log) == 0 || o.log[0].h.Seq > seq {
		return
	}
	if o.log[len(o.log)-1].h.Seq <= seq {
		if err := writeSynced(filepath.Join(o.dir, "seq"), []byte(strconv.FormatUint(seq, 10))); err != nil {
			return // kept: sent again after a restart, which is harmless
		}
	}
	n := 0
	for n < len(o.log) && o.log[n].h.Seq <= seq {
		u := o.log[n]
		o.inline -= len(u.h.Data)
		u.unzip(&o.zipped)
		os.Remove(filepath.Join(o.dir, fmt.Sprintf("u-%020d.hdr", u.h.Seq)))
		if u.spool != "" {
			os.Remove(u.spool)
		}
		n++
	}
	o.log = o.log[n:]
}

// next waits for the first update after seq.
func (o *outbox) next(ctx context.Context, after uint64) (*update, error) {
	for {
		o.mu.Lock()
		for _, u := range o.log {
			if u.h.Seq > after {
				o.mu.Unlock()
				return u, nil
			}
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// find returns the update seq, if still kept.
func (o *outbox) find(seq uint64) *update {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, u := range o.log {
		if u.h.Seq == seq {
			return u
		}
	}
	return nil
}

// lag returns how many of this member's updates member id has not
// applied, and whether id is another member.
func (o *outbox) lag(id uint64) (uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a, ok := o.acked[id]
	return o.seq - a, ok
}

// pending returns how many updates wait for some member.
func (o *outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.log)
}

// streamUpdates sends this member's updates to l's member, from the first
// it has not acknowledged, until the stream fails or ctx ends.
func (f *FS) streamUpdates(ctx context.Context, l *link) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := proto.NewReplicaClient(l.bulk).Updates(sctx)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	// zok is set once the receiver says it takes compressed data: the
	// updates after that go compressed, as one zstd stream.
	var zok atomic.Bool
	go func() {
		for {
			a, err := st.Recv()
			if err != nil {
				errc <- err
				cancel()
				return
			}
			if a.ZstdOk {
				zok.Store(true)
			}
			f.out.ack(l.m.ID, a.Seq)
		}
	}()
	var z *zwire.Encoder
	defer func() {
		if z != nil {
			z.Close()
		}
	}()
	f.out.mu.Lock()
	after := f.out.acked[l.m.ID]
	f.out.mu.Unlock()
	for {
		u, err := f.out.next(sctx, after)
		if err != nil {
			select {
			case err = <-errc:
			default:
			}
			return err
		}
		if z == nil && zok.Load() {
			z = zwire.NewEncoder()
		}
		if err := sendUpdate(st, u, z); err != nil {
			return err
		}
		after = u.h.Seq
	}
}

// sendUpdate sends u's header and then its content, if any: in pieces,
// compressed with z if it is not nil, or, for a large file, as its chunk
// list.
func sendUpdate(st grpc.BidiStreamingClient[proto.Update, proto.UpdateAck], u *update, z *zwire.Encoder) error {
	if u.spool == "" {
		h, err := u.header()
		if err != nil {
			return err
		}
		if z == nil || len(h.Data) < zwire.MinSize {
			return st.Send(h)
		}
		m := pb.Clone(h).(*proto.Update) // h stays as kept
		if err := compress(m, z); err != nil {
			return err
		}
		return st.Send(m)
	}
	f, err := os.Open(u.spool)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() >= byChunks {
		refs, err := u.chunks()
		if err != nil {
			return err
		}
		m := pb.Clone(u.h).(*proto.Update)
		m.Refs = proto.PackRefs(refs)
		return st.Send(m)
	}
	return eachPiece(f, func(data []byte, first, last bool) error {
		m := &proto.Update{Seq: u.h.Seq}
		if first {
			m = pb.Clone(u.h).(*proto.Update)
		}
		m.More, m.Data = !last, data
		if err := compress(m, z); err != nil {
			return err
		}
		return st.Send(m)
	})
}

// compress replaces m's data by its compression with z, where z is set
// and the data is long enough to gain.
func compress(m *proto.Update, z *zwire.Encoder) error {
	n := len(m.Data)
	if z == nil || n < zwire.MinSize {
		return nil
	}
	c, err := z.Compress(m.Data)
	if err != nil {
		return err
	}
	m.Data, m.Zstd, m.Size = bytes.Clone(c), true, uint32(n)
	return nil
}

// eachPiece reads r to its end in pieces of at most piece bytes and calls
// fn with each, marking the first and the last (which may be empty).
func eachPiece(r io.Reader, fn func(data []byte, first, last bool) error) error {
	buf := make([]byte, piece)
	for first := true; ; first = false {
		n, err := io.ReadFull(r, buf)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return err
		}
		last := err != nil
		if err := fn(buf[:n], first, last); err != nil || last {
			return err
		}
	}
}

// Updates applies another member's updates in the order it made them.
func (r receiver) Updates(st grpc.BidiStreamingServer[proto.Update, proto.UpdateAck]) error {
	from, err := r.set.caller(st.Context())
	if err != nil {
		return err
	}
	f := r.set.fs.Load()
	if f == nil {
		return ferry.E("replica.Updates", "", ferry.KindUnavailable, "this member serves no tree yet")
	}
	// A member that joins takes updates once its copy is made: those the
	// copy holds are then skipped, and the others' controls stay until
	// it applied the rest.
	select {
	case <-r.set.copied:
	case <-st.Context().Done():
		return st.Context().Err()
	}
	in := &updateIn{st: st, dec: zwire.NewDecoder(piece), stats: &r.set.stats}
	defer in.dec.Close()
	for {
		h, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := f.applyUpdate(st.Context(), from, h, in); err != nil {
			return err
		}
		if r.set.unacked.Load() {
			continue
		}
		if err := st.Send(&proto.UpdateAck{Seq: h.Seq, ZstdOk: true}); err != nil {
			return err
		}
	}
}

// updateIn is the receiving end of an Updates stream: it decompresses
// each message's data as it comes, in the order sent, whether the update
// is applied or skipped.
type updateIn struct {
	st    grpc.BidiStreamingServer[proto.Update, proto.UpdateAck]
	dec   *zwire.Decoder
	stats *stats
}

// Recv returns the stream's next message, its data as the sender had it.
func (u *updateIn) Recv() (*proto.Update, error) {
	m, err := u.st.Recv()
	if err != nil {
		return nil, err
	}
	wire := len(m.Data)
	if m.Zstd {
		if m.Data, err = u.dec.Decompress(m.Data, int(m.Size)); err != nil {
			return nil, ferry.E("replica.Updates", m.Path, err)
		}
		m.Zstd = false
	}
	u.stats.received(len(m.Data), wire)
	return m, nil
}

// Applied answers once this member applied the log up to the index asked.
func (r receiver) Applied(ctx context.Context, q *proto.AppliedReq) (*proto.AppliedReply, error) {
	if _, err := r.set.caller(ctx); err != nil {
		return nil, err
	}
	if err := r.set.waitApplied(ctx, q.Index); err != nil {
		return nil, err
	}
	if f := r.set.fs.Load(); f != nil {
		var changes []callback.Change
		for _, p := range q.Paths {
			changes = append(changes, callback.Change{Path: p, Tree: true})
		}
		f.drop(ctx, changes...)
	}
	return &proto.AppliedReply{}, nil
}

// Sync returns the last update this member queued.
func (r receiver) Sync(ctx context.Context, q *proto.SyncReq) (*proto.SyncReply, error) {
	from, err := r.set.caller(ctx)
	if err != nil {
		return nil, err
	}
	f := r.set.fs.Load()
	if f == nil {
		return &proto.SyncReply{}, nil
	}
	if p, err := ferry.CleanPath(q.Path); err == nil {
		// From now on changes there wait for the caller, and a write
		// lease given there has its clients drop what they read
		// (Leased); what this member's clients keep back there comes
		// first. In that order: a lease given after the recall finds
		// the caller's interest.
		f.noteInterest(from.ID, p, q.Tree)
		if err := f.recall(ctx, q.Tree, p); err != nil {
			return nil, err
		}
	}
	return &proto.SyncReply{Seq: f.out.owed(from.ID)}, nil
}

// Chunks sends the chunks of one of this member's updates that the
// caller asks for, read from the update's kept content.
func (r receiver) Chunks(q *proto.ChunksReq, st grpc.ServerStreamingServer[proto.ChunksData]) error {
	const op = "replica.Chunks"
	if _, err := r.set.caller(st.Context()); err != nil {
		return err
	}
	f := r.set.fs.Load()
	if f == nil {
		return ferry.E(op, "", ferry.KindUnavailable, "this member serves no tree")
	}
	if q.Refs != nil {
		return r.chunksByRefs(f, q, st)
	}
	u := f.out.find(q.Seq)
	if u == nil || u.spool == "" {
		return ferry.E(op, "", ferry.KindNotExist, fmt.Sprintf("no content kept for update %d", q.Seq))
	}
	refs, err := u.chunks()
	if err != nil {
		return err
	}
	file, err := os.Open(u.spool)
	if err != nil {
		return err
	}
	defer file.Close()
	index, err := proto.UnpackIndexes(q.Index, len(refs))
	if err != nil {
		return ferry.E(op, "", err)
	}
	buf := make([]byte, chunk.Default.Max)
	for _, i := range index {
		ref := refs[i]
		b := buf[:ref.Len]
		if _, err := file.ReadAt(b, ref.Off); err != nil {
			return err
		}
		m := &proto.ChunksData{Data: b}
		if q.Zstd {
			// Each chunk alone, at the fastest level: a Chunks call
			// carries the chunks of one file, and a stream's encoder
			// made for each cost the members more than it saved. The
			// other members fetch the same chunks: compressed once.
			m.Data, m.Zstd = u.zipped(i, b, r.set.zip, &f.out.zipped)
			if !m.Zstd {
				m.Data = b
			}
		}
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// chunksIn is the receiving end of a Chunks call, which it asked for
// compressed.
type chunksIn struct {
	st  grpc.ServerStreamingClient[proto.ChunksData]
	set *Set
}

// fetchChunks asks the member at l for the chunks index of its update seq.
func (s *Set) fetchChunks(ctx context.Context, l *link, seq uint64, index []int) (*chunksIn, error) {
	c, err := proto.NewReplicaClient(l.bulk).Chunks(ctx, &proto.ChunksReq{Seq: seq, Index: proto.PackIndexes(index), Zstd: true})
	if err != nil {
		return nil, err
	}
	return &chunksIn{st: c, set: s}, nil
}

// next returns the next chunk.
func (c *chunksIn) next() ([]byte, error) {
	b, missing, err := c.nextOrMissing()
	if err == nil && missing {
		err = ferry.E("replica.Chunks", "", ferry.KindNotExist, "a chunk asked for is not held")
	}
	return b, err
}

// nextOrMissing returns the next chunk, or whether the member no longer
// held it.
func (c *chunksIn) nextOrMissing() ([]byte, bool, error) {
	m, err := c.st.Recv()
	if err != nil {
		return nil, false, err
	}
	if m.Missing {
		return nil, true, nil
	}
	b := m.Data
	if m.Zstd {
		if b, err = c.set.zip.Decompress(nil, m.Data); err != nil {
			return nil, false, ferry.E("replica.Chunks", "", err)
		}
	}
	c.set.stats.received(len(b), len(m.Data))
	return b, false, nil
}

// Revoke marks this member's control over a path to be given up as soon
// as the other members have its updates.
func (r receiver) Revoke(ctx context.Context, q *proto.RevokeReq) (*proto.RevokeReply, error) {
	if _, err := r.set.caller(ctx); err != nil {
		return nil, err
	}
	if f := r.set.fs.Load(); f != nil {
		r.set.stats.revokesServed.Add(1)
		f.revoke(q.Path)
	}
	return &proto.RevokeReply{}, nil
}
