package replica

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	gbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/proto"
)

// reporter is what the transport tells raft of messages it lost.
type reporter interface {
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, ok bool)
}

// maxRefs is the most chunks of one file the members' calls list: files
// of up to about 8 GiB (chunk.Default's average) by chunks, in messages
// of up to maxMsg.
const (
	maxRefs = 1 << 20
	maxMsg  = 64 << 20
)

// queueLen is how many messages wait for one member before more are
// dropped (raft sends them again).
const queueLen = 4096

// sender keeps one stream to one member and sends it raft's messages in
// order, opening the stream again after a failure.
type sender struct {
	to   Member
	conn *grpc.ClientConn
	q    chan raftpb.Message
	rep  reporter
	log  *slog.Logger
	stop context.CancelFunc // ends run, once started
}

// link is this member's pair of connections to another: one for raft and
// the small calls, one for updates, so that a heartbeat never waits behind
// a file's content.
type link struct {
	m         Member
	ctl, bulk *grpc.ClientConn
}

// dial makes a connection to m that admits only m's key. It connects
// lazily and again after failures.
func dial(m Member, key ed25519.PrivateKey) (*grpc.ClientConn, error) {
	tlsCfg, err := auth.PeerTLS(key, false, func(fp string) error {
		if fp != m.Fingerprint {
			return ferry.E("replica", m.Addr, ferry.KindAuth, "member "+m.Name+" presented key "+fp)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Calls wait for the connection (bounded by their contexts), and a
	// member that was down is tried again within a second, not after
	// gRPC's default backoff of up to two minutes.
	return grpc.NewClient(m.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 2 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second,
			Backoff: gbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)))
}

// backoff runs fn until ctx ends, waiting longer after each failure.
func backoff(ctx context.Context, fn func(context.Context) error, failed func(error)) {
	wait := 50 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := fn(ctx)
		if ctx.Err() != nil {
			return
		}
		failed(err)
		if time.Since(start) > 5*time.Second {
			wait = 50 * time.Millisecond // it ran a while: a new failure
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// lost tells raft that m did not reach its member.
func (s *sender) lost(m raftpb.Message) {
	s.rep.ReportUnreachable(m.To)
	if m.Type == raftpb.MsgSnap {
		s.rep.ReportSnapshot(m.To, false)
	}
}

func (s *sender) run(ctx context.Context) {
	backoff(ctx, s.stream, func(err error) {
		s.log.Debug("replica: raft stream to member lost", "member", s.to.Name, "err", err)
	})
}

// stream sends until a send fails or ctx ends.
func (s *sender) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := proto.NewReplicaClient(s.conn).Raft(sctx)
	if err != nil {
		return err
	}
	for {
		var batch []raftpb.Message
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-s.q:
			batch = append(batch, m)
		}
	more:
		for len(batch) < 64 {
			select {
			case m := <-s.q:
				batch = append(batch, m)
			default:
				break more
			}
		}
		msg := &proto.RaftBatch{}
		for _, m := range batch {
			b, err := m.Marshal()
			if err != nil {
				return err
			}
			msg.Msgs = append(msg.Msgs, b)
		}
		if err := st.Send(msg); err != nil {
			for _, m := range batch {
				s.lost(m)
			}
			return err
		}
		for _, m := range batch {
			if m.Type == raftpb.MsgSnap {
				s.rep.ReportSnapshot(m.To, true)
			}
		}
	}
}

// receiver serves the Replica calls of the other members.
type receiver struct {
	proto.UnimplementedReplicaServer
	set *Set
}

// Raft steps each message another member sends, after checking that the
// member whose key opened the connection is the one the message is from.
func (r receiver) Raft(st grpc.ClientStreamingServer[proto.RaftBatch, proto.RaftAck]) error {
	from, err := r.set.caller(st.Context())
	if err != nil {
		return err
	}
	for {
		b, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return st.SendAndClose(&proto.RaftAck{})
		}
		if err != nil {
			return err
		}
		for _, raw := range b.Msgs {
			var m raftpb.Message
			if err := m.Unmarshal(raw); err != nil {
				return ferry.E("replica.Raft", "", ferry.KindInvalid, "malformed raft message from "+from.Name)
			}
			if m.From != from.ID {
				return ferry.E("replica.Raft", "", ferry.KindAuth, "member "+from.Name+" sent a message as another")
			}
			if err := r.set.node.Step(m); err != nil {
				return err
			}
		}
	}
}

// caller returns the member whose key the call's connection presented.
func (s *Set) caller(ctx context.Context) (Member, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Member{}, ferry.E("replica", "", ferry.KindAuth, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Member{}, ferry.E("replica", "", ferry.KindAuth, "not a TLS connection")
	}
	fp, err := auth.PeerFingerprint(ti.State)
	if err != nil {
		return Member{}, err
	}
	if m, ok := s.byKey(fp); ok {
		return m, nil
	}
	return Member{}, ferry.E("replica", "", ferry.KindAuth, "key "+fp+" is not another member's")
}
