package replica

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/consensus"
	"github.com/ferryfs/ferry/internal/control"
	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/zwire"
)

// Config is what a member needs to join its set.
type Config struct {
	Members []Member
	// Join starts a member that the set adds while it runs: see Open.
	Join   bool
	Key    ed25519.PrivateKey // the server's key; its fingerprint names this member
	LogDir string             // where the raft log lives
	// Listen is where to listen for the other members, if not this
	// member's address in Members (behind a proxy or a NAT).
	Listen string
	// Tick is raft's clock (default 100 ms): a heartbeat each tick, an
	// election after 10 to 20 without one.
	Tick time.Duration
	// LeaderEvery is how often the leader looks whether another member
	// asks for most grants and hands it the leadership (default 5 s;
	// negative: never).
	LeaderEvery time.Duration
	Log         *slog.Logger
}

// Set is this member's part of a replica set.
type Set struct {
	self       Member
	key        ed25519.PrivateKey
	log        *slog.Logger
	disk       *consensus.Disk
	machine    *counting // the control table
	stats      stats
	node       *consensus.Node
	zip        *zwire.Codec // Of the chunks members fetch from each other.
	fs         atomic.Pointer[FS]
	ready      chan struct{} // closed once this member caught up with the log (and copied the tree, if it joined)
	copied     chan struct{} // closed once this member's copy of the tree may take updates
	copiedOnce sync.Once
	// unacked, for tests, has this member apply updates without
	// acknowledging them, as one that stops between the two.
	unacked atomic.Bool
	inbox   *inbox
	lis     net.Listener
	srv     *grpc.Server
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// mu guards the members, which grow when the set adds one, and the
	// connections to them.
	mu      sync.RWMutex
	members []Member
	links   map[uint64]*link
	senders map[uint64]*sender
	started bool // the senders run
}

// Open joins the set: it finds this member in cfg.Members by its key,
// opens the log, listens on its address for the other members and starts
// raft. It returns once the listener is up, not once a leader is elected.
//
// With cfg.Join, a member not in the log yet starts with an empty one and
// waits until a member of the set adds it ("add" in Command); it then
// copies the tree from a member (join.go) before it serves.
func Open(cfg Config) (*Set, error) {
	const op = "replica.Open"
	fp := auth.Fingerprint(cfg.Key.Public().(ed25519.PublicKey))
	s := &Set{key: cfg.Key, log: cfg.Log, senders: map[uint64]*sender{},
		links: map[uint64]*link{}, ready: make(chan struct{}), copied: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	found := false
	for _, m := range cfg.Members {
		if m.Fingerprint == fp {
			s.self, found = m, true
		}
	}
	if !found {
		return nil, ferry.E(op, "", ferry.KindInvalid, "this server's key "+fp+" is not in the members file")
	}
	if cfg.Tick == 0 {
		cfg.Tick = 100 * time.Millisecond
	}
	listen := cfg.Listen
	if listen == "" {
		listen = s.self.Addr
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, ferry.E(op, listen, ferry.KindUnavailable, err)
	}
	s.lis = lis
	if s.disk, err = consensus.OpenDisk(cfg.LogDir); err != nil {
		lis.Close()
		return nil, ferry.E(op, cfg.LogDir, ferry.KindIO, err)
	}
	if s.inbox, err = openInbox(filepath.Join(cfg.LogDir, "inbox")); err != nil {
		lis.Close()
		s.disk.Close()
		return nil, ferry.E(op, cfg.LogDir, ferry.KindIO, err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// unwind closes what Open made before it failed.
	unwind := func(err error) (*Set, error) {
		s.cancel()
		s.closeLinks()
		lis.Close()
		s.inbox.close()
		s.disk.Close()
		return nil, err
	}
	var ids []uint64
	for _, m := range cfg.Members {
		ids = append(ids, m.ID)
		if err := s.addMember(m); err != nil {
			return unwind(err)
		}
	}
	// Members added while the set ran come from the log: the table names
	// them as it is restored and as it applies their addition.
	s.machine = &counting{Table: control.New(), grants: map[string]int{}, applied: make(chan struct{}), joined: func(m Member) {
		if err := s.addMember(m); err != nil {
			s.log.Error("replica: a member added to the set cannot be reached", "member", m.Name, "err", err)
		}
	}, left: s.removeMember}
	s.node, err = consensus.Start(consensus.Config{ID: s.self.ID, Peers: ids, Join: cfg.Join}, s.disk, s.machine, s, cfg.Tick)
	if err != nil {
		return unwind(ferry.E(op, cfg.LogDir, err))
	}
	if slices.Contains(s.node.Conf().Voters, s.self.ID) {
		s.copiedOnce.Do(func() { close(s.copied) }) // a member from the start, or one that joined
	}
	s.zip = zwire.New(chunk.Default.Max)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.catchUp(s.ctx, cfg.Tick)
	}()
	if cfg.LeaderEvery == 0 {
		cfg.LeaderEvery = 5 * time.Second
	}
	if cfg.LeaderEvery > 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.follow(s.ctx, cfg.LeaderEvery)
		}()
	}
	s.mu.Lock()
	s.started = true
	for _, snd := range s.senders {
		s.run(snd)
	}
	s.mu.Unlock()
	tlsCfg, err := auth.PeerTLS(cfg.Key, true, func(fp string) error {
		if _, ok := s.byKey(fp); ok {
			return nil
		}
		return ferry.E(op, "", ferry.KindAuth, "key "+fp+" is not another member's")
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.srv = grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)), grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Second, Timeout: 2 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}))
	proto.RegisterReplicaServer(s.srv, receiver{set: s})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.srv.Serve(lis)
	}()
	return s, nil
}

// addMember makes m a member: this one, or another to connect to, whose
// raft messages and (once the replica layer runs) updates go out from now
// on. A member known already changes nothing.
func (s *Set) addMember(m Member) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.members {
		if o.ID == m.ID {
			return nil
		}
	}
	if m.ID == s.self.ID {
		s.members = append(s.members, m)
		return nil
	}
	l := &link{m: m}
	var err error
	if l.ctl, err = dial(m, s.key); err == nil {
		if l.bulk, err = dial(m, s.key); err != nil {
			l.ctl.Close()
		}
	}
	if err != nil {
		return err
	}
	s.members = append(s.members, m)
	s.links[m.ID] = l
	snd := &sender{to: m, conn: l.ctl, q: make(chan raftpb.Message, queueLen), log: s.log}
	s.senders[m.ID] = snd
	if s.started {
		s.run(snd)
	}
	if f := s.fs.Load(); f != nil {
		f.addPeer(l)
	}
	return nil
}

// removeMember drops member m, which the set removed: no message,
// update or call goes to it from now on, and none is taken from it. A
// member not known changes nothing.
func (s *Set) removeMember(m Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = slices.DeleteFunc(s.members, func(o Member) bool { return o.ID == m.ID })
	if snd := s.senders[m.ID]; snd != nil && snd.stop != nil {
		snd.stop()
	}
	delete(s.senders, m.ID)
	if l := s.links[m.ID]; l != nil {
		if f := s.fs.Load(); f != nil {
			f.dropPeer(m.ID)
		}
		l.ctl.Close()
		l.bulk.Close()
	}
	delete(s.links, m.ID)
	if m.ID != s.self.ID {
		s.log.Info("replica: a member left the set", "member", m.Name)
	}
}

// run starts snd; called under s.mu once raft runs.
func (s *Set) run(snd *sender) {
	snd.rep = s.node
	ctx, stop := context.WithCancel(s.ctx)
	snd.stop = stop
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		snd.run(ctx)
	}()
}

// memberList returns the members, this one included.
func (s *Set) memberList() []Member {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.members)
}

// link returns the connections to member id, or nil.
func (s *Set) link(id uint64) *link {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.links[id]
}

// linkList returns the connections to every other member.
func (s *Set) linkList() []*link {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ls := make([]*link, 0, len(s.links))
	for _, l := range s.links {
		ls = append(ls, l)
	}
	return ls
}

// byKey returns the other member whose key has fingerprint fp.
func (s *Set) byKey(fp string) (Member, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, m := range s.members {
		if m.Fingerprint == fp && m.ID != s.self.ID {
			return m, true
		}
	}
	return Member{}, false
}

// Send implements consensus.Transport: each message joins its member's
// queue; one for a member whose queue is full is lost, and raft told.
func (s *Set) Send(msgs []raftpb.Message) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, m := range msgs {
		snd := s.senders[m.To]
		if snd == nil {
			continue
		}
		select {
		case snd.q <- m:
		default:
			snd.lost(m) // the node calls Send outside its lock
		}
	}
}

// Self returns this member.
func (s *Set) Self() Member { return s.self }

// Grant asks for control of paths (one object, or both sides of a rename)
// for this member.
func (s *Set) Grant(ctx context.Context, deep bool, paths ...string) (control.Result, error) {
	r, err := s.propose(ctx, control.GrantCmd(s.self.Name, deep, paths...))
	if err == nil && r.OK {
		s.stats.grants.Add(1)
	} else if err == nil {
		s.stats.refused.Add(1)
	}
	return r, err
}

// Release gives up a control this member holds.
func (s *Set) Release(ctx context.Context, c control.Control) (control.Result, error) {
	return s.propose(ctx, control.ReleaseCmd(c))
}

func (s *Set) propose(ctx context.Context, cmd []byte) (control.Result, error) {
	res, err := s.node.Propose(ctx, cmd)
	if err != nil {
		return control.Result{}, ferry.E("replica", "", ferry.KindUnavailable, err)
	}
	return control.DecodeResult(res)
}

// Controller returns the control covering p, as this member last applied.
func (s *Set) Controller(p string) (c control.Control, ok bool) {
	s.machine.read(func(t *control.Table) { c, ok = t.Controller(p) })
	return c, ok
}

// held returns the controls this member holds, as last applied here.
func (s *Set) held() (cs []control.Control) {
	s.machine.read(func(t *control.Table) { cs = t.Held(s.self.Name) })
	return cs
}

// rows returns every control, as last applied here.
func (s *Set) rows() (cs []control.Control) {
	s.machine.read(func(t *control.Table) { cs = t.Rows() })
	return cs
}

// Status implements ctl.Controller: the set, its leader, the controls.
func (s *Set) Status(ctx context.Context) string {
	st := s.node.Status()
	var b strings.Builder
	fmt.Fprintf(&b, "self: %s\n", s.self.Name)
	if !isClosed(s.ready) {
		b.WriteString("joining: not serving until it copied the tree and the log\n")
	}
	cs := s.node.Conf()
	for _, m := range s.memberList() {
		role := ""
		switch {
		case slices.Contains(cs.Learners, m.ID):
			role = " learner"
		case !slices.Contains(cs.Voters, m.ID):
			role = " not in the log yet"
		}
		if m.ID == st.Leader {
			role += " leader"
		}
		fmt.Fprintf(&b, "member: %s %s %s%s\n", m.Name, m.Addr, m.Fingerprint, role)
	}
	fmt.Fprintf(&b, "raft: %s term %d commit %d applied %d\n", strings.TrimPrefix(st.State, "State"), st.Term, st.Commit, st.Applied)
	if st.Err != nil {
		fmt.Fprintf(&b, "error: %v\n", st.Err)
	}
	rows, here := s.rows(), s.held()
	fmt.Fprintf(&b, "controls: %d (%d here)\n", len(rows), len(here))
	fmt.Fprintf(&b, "grants: %d refused=%d released=%d revokes_sent=%d revokes_served=%d leader_transfers=%d\n",
		s.stats.grants.Load(), s.stats.refused.Load(), s.stats.released.Load(), s.stats.revokesSent.Load(), s.stats.revokesServed.Load(), s.stats.transfers.Load())
	fmt.Fprintf(&b, "forwards: sent=%d served=%d\n", s.stats.forwarded.Load(), s.stats.forwardsServed.Load())
	fmt.Fprintf(&b, "updates.applied: %d fenced=%d\n", s.stats.applied.Load(), s.stats.fenced.Load())
	fmt.Fprintf(&b, "updates.received: %d bytes of content, %d on the wire\n", s.stats.contentBytes.Load(), s.stats.wireBytes.Load())
	if f := s.fs.Load(); f != nil {
		for _, m := range s.memberList() {
			if lag, ok := f.out.lag(m.ID); ok {
				fmt.Fprintf(&b, "updates.lag: %s %d\n", m.Name, lag)
			}
		}
	}
	for i, c := range here {
		if i == 20 {
			fmt.Fprintf(&b, "held: ... %d more\n", len(here)-i)
			break
		}
		kind := "shallow"
		if c.Deep {
			kind = "deep"
		}
		fmt.Fprintf(&b, "held: %s %s epoch %d\n", c.Path, kind, c.Epoch)
	}
	return b.String()
}

// Command implements ctl.Controller: "grant PATH [deep]" and "release
// PATH" act for this member (for administrators and tests; the replica
// layer asks for its own), "leader NAME" hands raft's leadership over,
// "add NAME ADDR FINGERPRINT" adds a member to the running set (see
// join.go), "remove NAME" removes one.
func (s *Set) Command(ctx context.Context, args []string) error {
	const op = "replica.Command"
	switch {
	case args[0] == "sync":
		return nil
	case args[0] == "grant" && (len(args) == 2 || len(args) == 3 && args[2] == "deep"):
		p, err := ferry.CleanPath(args[1])
		if err != nil {
			return err
		}
		r, err := s.Grant(ctx, len(args) == 3, p)
		if err != nil {
			return err
		}
		if !r.OK {
			return ferry.E(op, p, ferry.KindUnavailable, r.Reason)
		}
		if f := s.fs.Load(); f != nil {
			f.pin(r.Controls[0], true) // the replica layer would release it idle
		}
		return nil
	case args[0] == "release" && len(args) == 2:
		p, err := ferry.CleanPath(args[1])
		if err != nil {
			return err
		}
		c, ok := s.Controller(p)
		if !ok || c.Holder != s.self.Name || c.Path != p {
			return ferry.E(op, p, ferry.KindNotExist, "not controlled here")
		}
		if f := s.fs.Load(); f != nil {
			f.pin(c, false) // released when its updates are everywhere
			return nil
		}
		_, err = s.Release(ctx, c)
		return err
	case args[0] == "add" && len(args) == 4:
		return s.addCommand(ctx, args[1:])
	case args[0] == "remove" && len(args) == 2:
		return s.removeCommand(ctx, args[1])
	case args[0] == "leader" && len(args) == 2:
		for _, m := range s.memberList() {
			if m.Name == args[1] {
				s.node.TransferLeader(m.ID)
				return nil
			}
		}
		return ferry.E(op, args[1], ferry.KindNotExist, "no such member")
	}
	return ferry.E(op, "", ferry.KindInvalid, fmt.Sprintf("unknown command %q (replica commands: grant PATH [deep], release PATH, leader NAME, add NAME ADDR FINGERPRINT, remove NAME)", strings.Join(args, " ")))
}

// Close leaves the set: it stops serving the other members, stops raft and
// closes the log.
func (s *Set) Close() error {
	if s.srv != nil {
		s.srv.Stop()
	}
	s.cancel()
	s.lis.Close()
	s.node.Stop()
	s.wg.Wait()
	s.closeLinks()
	s.zip.Close()
	s.inbox.close()
	return s.disk.Close()
}

func (s *Set) closeLinks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.links {
		if l.ctl != nil {
			l.ctl.Close()
		}
		if l.bulk != nil {
			l.bulk.Close()
		}
	}
}

// member returns the member named name.
func (s *Set) member(name string) (Member, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, m := range s.memberList() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// catchUp closes s.ready once this member has heard from a leader and
// applied what it knows committed: a member that starts (or restarts)
// serves by the table only once the table is current. A member the set
// added (a learner) first copies the tree and becomes a voter (join).
func (s *Set) catchUp(ctx context.Context, tick time.Duration) {
	wait := tick / 4
	for {
		if st := s.node.Status(); st.Leader != 0 && st.Applied >= st.Commit {
			cs := s.node.Conf()
			if slices.Contains(cs.Voters, s.self.ID) {
				s.copiedOnce.Do(func() { close(s.copied) }) // promoted by a change this member applied after it started
				close(s.ready)
				return
			}
			if slices.Contains(cs.Learners, s.self.ID) {
				err := s.join(ctx)
				if err == nil {
					close(s.ready)
					return
				}
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, errRemoved) {
					s.log.Error("replica: this member was removed from the set while it joined; it will not serve")
					return
				}
				s.log.Warn("replica: joining the set failed; trying again", "err", err)
				wait = min(2*max(wait, 100*time.Millisecond), 5*time.Second)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// waitReady waits until this member caught up with the set's log.
func (s *Set) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ferry.E("replica", "", ferry.KindUnavailable, fmt.Sprintf("this member has not caught up with its set: %v", ctx.Err()))
	}
}

// waitApplied waits until this member's table applied the command at
// index (a grant's epoch) or a later one.
func (s *Set) waitApplied(ctx context.Context, index uint64) error {
	for {
		at, next := s.machine.index()
		if at >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			return ferry.E("replica", "", ferry.KindUnavailable, fmt.Sprintf("raft log not applied up to %d: %v", index, ctx.Err()))
		case <-next:
		}
	}
}
