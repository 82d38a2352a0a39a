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

// queueLen is how many messages wait for one member before more are
// dropped (raft sends them again).
const queueLen = 4096

// sender keeps one stream to one member and sends it raft's messages in
// order, making the connection again after a failure.
type sender struct {
	to  Member
	q   chan raftpb.Message
	rep reporter
	key ed25519.PrivateKey
	log *slog.Logger
}

// lost tells raft that m did not reach its member.
func (s *sender) lost(m raftpb.Message) {
	s.rep.ReportUnreachable(m.To)
	if m.Type == raftpb.MsgSnap {
		s.rep.ReportSnapshot(m.To, false)
	}
}

func (s *sender) run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Debug("replica: connection to member lost", "member", s.to.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// stream connects and sends until a send fails or ctx ends.
func (s *sender) stream(ctx context.Context) error {
	tlsCfg, err := auth.PeerTLS(s.key, false, func(fp string) error {
		if fp != s.to.Fingerprint {
			return ferry.E("replica", s.to.Addr, ferry.KindAuth, "member "+s.to.Name+" presented key "+fp)
		}
		return nil
	})
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(s.to.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 2 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := proto.NewReplicaClient(conn).Raft(sctx)
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
	for _, m := range s.members {
		if m.Fingerprint == fp && m.ID != s.self.ID {
			return m, nil
		}
	}
	return Member{}, ferry.E("replica", "", ferry.KindAuth, "key "+fp+" is not another member's")
}
