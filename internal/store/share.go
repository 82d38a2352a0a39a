package store

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/proto"
)

// ChunkCache is what a client keeps chunks in: a Cache it opened, or a
// Shared one another process holds.
type ChunkCache interface {
	// HasMany reports whether the cache holds each of hs, in order.
	HasMany(hs []chunk.Hash) []bool
	// GetMany returns what reads the chunks hs, one a call, in order,
	// each checked against its hash; a chunk missing ends it, and so
	// does ctx. A Shared cache streams them in one call.
	GetMany(ctx context.Context, hs []chunk.Hash) func() ([]byte, bool)
	Add(h chunk.Hash, data []byte)
	// AddFixed is Add of data the caller never changes, which a cache
	// may then keep without copying it.
	AddFixed(h chunk.Hash, data []byte)
	Stats() CacheStats
	Close() error
}

var (
	_ ChunkCache = (*Cache)(nil)
	_ ChunkCache = (*Shared)(nil)
)

// ShareSocket is the name of the unix socket, in a cache's directory, on
// which the process holding the cache shares it.
const ShareSocket = "shared.sock"

// Share serves c on a unix socket at sock to the same user's other
// processes, which pebble's lock keeps from opening it (a ferry get beside
// a mount), until c is closed. The socket is accessible to its owner only;
// a socket left by a process that died is replaced, since the caller holds
// the cache and so no one else serves it. Chunks added through it are
// checked against their hash before they are kept (Put), and those read
// are checked by Get.
func (c *Cache) Share(sock string) error {
	const op = "store.Share"
	os.Remove(sock)
	// The socket is made with no access for others from the start.
	old := syscall.Umask(0o077)
	l, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		return ferry.E(op, sock, ferry.KindIO, err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxShared), grpc.MaxSendMsgSize(maxShared))
	proto.RegisterChunkCacheServer(srv, &sharer{c: c})
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.closed {
		srv.Stop()
		os.Remove(sock)
		return ferry.E(op, sock, ferry.KindIO, "the cache is closed")
	}
	c.unshare = append(c.unshare, func() {
		srv.Stop()
		<-done
		os.Remove(sock)
	})
	return nil
}

// maxShared bounds a message on the socket: the largest chunk there can
// be, and its framing.
const maxShared = 2*chunk.MaxSize + 4096

// sharer serves a Cache on the socket.
type sharer struct {
	proto.UnimplementedChunkCacheServer
	c *Cache
}

func (s *sharer) HasMany(_ context.Context, k *proto.CacheKeys) (*proto.CacheHasMany, error) {
	hs, err := proto.UnpackHashes(k.GetHashes())
	if err != nil {
		return nil, err
	}
	return &proto.CacheHasMany{Has: s.c.HasMany(hs)}, nil
}

func (s *sharer) GetMany(k *proto.CacheKeys, st grpc.ServerStreamingServer[proto.CacheChunk]) error {
	hs, err := proto.UnpackHashes(k.GetHashes())
	if err != nil {
		return err
	}
	for _, h := range hs {
		data, ok := s.c.Get(h)
		if err := st.Send(&proto.CacheChunk{Hash: h[:], Data: data, Found: ok}); err != nil {
			return err
		}
	}
	return nil
}

func (s *sharer) Add(_ context.Context, m *proto.CacheChunk) (*proto.CacheAdded, error) {
	h, err := chunk.FromBytes(m.GetHash())
	if err != nil {
		return nil, ferry.E("store.Shared", "", ferry.KindInvalid, err)
	}
	// Another process's bytes are checked before they are queued, where
	// they are served unchecked until written.
	if chunk.Sum(m.GetData()) != h {
		return nil, ferry.E("store.Shared", h.String(), ferry.KindInvalid, "bytes do not match the hash")
	}
	s.c.Add(h, m.GetData())
	return &proto.CacheAdded{}, nil
}

func (s *sharer) Stats(context.Context, *proto.CacheStatsReq) (*proto.CacheStatsReply, error) {
	st := s.c.Stats()
	return &proto.CacheStatsReply{Bytes: st.Bytes, Chunks: st.Chunks, MaxBytes: st.MaxBytes,
		Hits: st.Hits, Misses: st.Misses, Corrupt: st.Corrupt, Dropped: st.Dropped}, nil
}

// Shared is a cache another process holds and shares on a unix socket
// (Share). A call that fails (the process ended) is a miss, or a chunk not
// kept: the transfer goes on without the cache, as it would without one.
type Shared struct {
	conn *grpc.ClientConn
	cc   proto.ChunkCacheClient
	// ctx ends at Close, cancelling calls under way.
	ctx    context.Context
	cancel context.CancelFunc
}

// sharedTimeout bounds a call on the socket, so that a process that hangs
// costs a transfer a moment, not the transfer.
const sharedTimeout = 5 * time.Second

// DialShared connects to the cache shared at sock, checking that a process
// serves it there.
func DialShared(ctx context.Context, sock string) (*Shared, error) {
	const op = "store.DialShared"
	if _, err := os.Stat(sock); err != nil {
		return nil, ferry.E(op, sock, ferry.KindNotExist, err)
	}
	conn, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxShared), grpc.MaxCallSendMsgSize(maxShared)))
	if err != nil {
		return nil, ferry.E(op, sock, ferry.KindIO, err)
	}
	s := &Shared{conn: conn, cc: proto.NewChunkCacheClient(conn)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	cctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	if _, err := s.cc.Stats(cctx, &proto.CacheStatsReq{}, grpc.WaitForReady(true)); err != nil {
		s.Close()
		return nil, ferry.E(op, sock, ferry.KindIO, err)
	}
	return s, nil
}

func (s *Shared) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, sharedTimeout)
}

// packHashes writes hs one after another, as proto.UnpackHashes reads
// them.
func packHashes(hs []chunk.Hash) []byte {
	b := make([]byte, 0, len(hs)*len(chunk.Hash{}))
	for _, h := range hs {
		b = append(b, h[:]...)
	}
	return b
}

// HasMany implements ChunkCache in one call.
func (s *Shared) HasMany(hs []chunk.Hash) []bool {
	ctx, cancel := s.call()
	defer cancel()
	has := make([]bool, len(hs))
	if r, err := s.cc.HasMany(ctx, &proto.CacheKeys{Hashes: packHashes(hs)}); err == nil && len(r.GetHas()) == len(hs) {
		copy(has, r.GetHas())
	}
	return has
}

// GetMany implements ChunkCache with one stream, opened at the first read,
// so that a transfer holds one stream's window of chunks at a time. The
// stream ends with its last chunk, a miss, the caller's ctx, Close, or its
// deadline, which allows 10 ms a chunk beyond a call's.
func (s *Shared) GetMany(ctx context.Context, hs []chunk.Hash) func() ([]byte, bool) {
	var st grpc.ServerStreamingClient[proto.CacheChunk]
	end := func() {}
	got, failed := 0, false
	return func() ([]byte, bool) {
		if failed || got == len(hs) {
			return nil, false
		}
		if st == nil {
			sctx, cancel := context.WithTimeout(ctx, sharedTimeout+time.Duration(len(hs))*10*time.Millisecond)
			stop := context.AfterFunc(s.ctx, cancel)
			end = func() { stop(); cancel() }
			var err error
			if st, err = s.cc.GetMany(sctx, &proto.CacheKeys{Hashes: packHashes(hs)}); err != nil {
				end()
				failed = true
				return nil, false
			}
		}
		m, err := st.Recv()
		if err != nil || !m.GetFound() || !bytes.Equal(m.GetHash(), hs[got][:]) {
			end()
			failed = true
			return nil, false
		}
		if got++; got == len(hs) {
			end()
		}
		return m.GetData(), true
	}
}

// Add implements ChunkCache. It waits for the holder to take the chunk,
// which it then keeps in the background, as Cache.Add does.
func (s *Shared) Add(h chunk.Hash, data []byte) {
	ctx, cancel := s.call()
	defer cancel()
	s.cc.Add(ctx, &proto.CacheChunk{Hash: h[:], Data: data})
}

// AddFixed implements ChunkCache: the call copies data anyway.
func (s *Shared) AddFixed(h chunk.Hash, data []byte) { s.Add(h, data) }

// Stats implements ChunkCache: the holder's figures, or none if it cannot
// be reached.
func (s *Shared) Stats() CacheStats {
	ctx, cancel := s.call()
	defer cancel()
	r, err := s.cc.Stats(ctx, &proto.CacheStatsReq{})
	if err != nil {
		return CacheStats{}
	}
	return CacheStats{Bytes: r.GetBytes(), Chunks: r.GetChunks(), MaxBytes: r.GetMaxBytes(),
		Hits: r.GetHits(), Misses: r.GetMisses(), Corrupt: r.GetCorrupt(), Dropped: r.GetDropped()}
}

// Close implements ChunkCache: it ends the connection, not the cache.
func (s *Shared) Close() error {
	s.cancel()
	err := s.conn.Close()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
