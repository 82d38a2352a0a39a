package chunked_test

import (
	"bytes"
	"testing"

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
