package chunkstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/store"
)

// TestGetChunkedCold fetches by chunks a big file the server has never
// indexed: the client asks for chunks while the server is still chunking
// the file for the list, and must get them.
func TestGetChunkedCold(t *testing.T) {
	e := start(t, 0)
	doc := document(16 << 20)
	e.write(t, "big", doc)
	cache, err := store.OpenCache("", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	var buf bytes.Buffer
	_, st, err := e.c.GetChunked(ctxT(t), "/big", cache, &buf, nil)
	if err != nil {
		t.Fatalf("GetChunked of a file the server has not indexed: %v", err)
	}
	if !bytes.Equal(buf.Bytes(), doc) {
		t.Fatalf("got %d bytes, want the file's %d", buf.Len(), len(doc))
	}
	if st.SentChunks != st.Chunks {
		t.Errorf("fetched %d of %d chunks, want all", st.SentChunks, st.Chunks)
	}
}

// TestGetChunkedSpread: a large chunked Get spreads the chunks it fetches
// over the bulk connections and still delivers the file in order, with the
// chunks the cache holds in their places; with one bulk connection it
// uses one.
func TestGetChunkedSpread(t *testing.T) {
	for _, tc := range []struct {
		conns, wantBusy int
	}{
		{conns: 4, wantBusy: 4},
		{conns: 1, wantBusy: 1},
		{conns: 0, wantBusy: remote.DefaultBulkConns},
	} {
		t.Run(fmt.Sprint(tc.conns), func(t *testing.T) {
			var mu sync.Mutex
			var downs []*atomic.Int64 // Bytes received on each connection.
			e := startWith(t, 0, setup{client: func(cfg *remote.Config) {
				cfg.BulkConns = tc.conns
				cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
					if err != nil {
						return nil, err
					}
					var down atomic.Int64
					mu.Lock()
					downs = append(downs, &down)
					mu.Unlock()
					return countConn{c, new(atomic.Int64), &down}, nil
				}
			}})
			doc := randomDoc(16 << 20)
			e.write(t, "big", doc)
			e.write(t, "part", doc[6<<20:9<<20])
			cache, err := store.OpenCache("", 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer cache.Close()
			if _, _, err := e.c.GetChunked(ctxT(t), "/part", cache, io.Discard, nil); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			before := make([]int64, len(downs))
			for i, d := range downs {
				before[i] = d.Load()
			}
			mu.Unlock()
			var buf bytes.Buffer
			_, st, err := e.c.GetChunked(ctxT(t), "/big", cache, &buf, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), doc) {
				t.Fatalf("got %d bytes, want the file's %d in order", buf.Len(), len(doc))
			}
			if st.SentChunks == st.Chunks || st.SentChunks == 0 {
				t.Errorf("fetched %d of %d chunks, want all but the cached part's", st.SentChunks, st.Chunks)
			}
			busy := 0
			mu.Lock()
			for i, d := range downs {
				if d.Load()-before[i] > 1<<20 {
					busy++
				}
			}
			mu.Unlock()
			if busy != tc.wantBusy {
				t.Errorf("%d connections carried over 1 MiB of the file, want %d", busy, tc.wantBusy)
			}
		})
	}
}
