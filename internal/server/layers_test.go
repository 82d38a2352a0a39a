package server_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestEveryChangeThroughLayers: a layer stacked between the server and the
// chunk store sees every change clients make, whatever way the bytes took:
// plain puts, chunked puts, batched puts, and the other calls. Chunked
// puts still go by chunks through it.
func TestEveryChangeThroughLayers(t *testing.T) {
	s, rec := servertest.StartRecording(t)
	c := s.Client(t, "u")
	cx := ctx(t)
	big := bytes.Repeat([]byte("a chunked file\n"), 200<<10)
	before := s.Srv.Calls()
	steps := []struct {
		want string
		do   func() error
	}{
		{"put /small", func() error {
			_, err := c.Put(cx, "/small", nil, ferry.Whole, bytes.NewReader([]byte("x"))).Wait()
			return err
		}},
		{"put /big", func() error {
			_, err := c.Put(cx, "/big", nil, ferry.Whole, bytes.NewReader(big)).Wait()
			return err
		}},
		{"put /batched", func() error {
			b := c.PutBatch(cx)
			defer b.Close()
			data := bytes.Repeat([]byte("batched\n"), 20<<10)
			_, err := b.Put(cx, "/batched", nil, io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data)))).Wait()
			return err
		}},
		{"put /dir", func() error {
			_, err := c.Put(cx, "/dir", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait()
			return err
		}},
		{"move /small /dir/small", func() error { _, err := c.Move(cx, "/small", "/dir/small").Wait(); return err }},
		{"link /big /dir/big", func() error { _, err := c.Link(cx, "/big", "/dir/big").Wait(); return err }},
		{"wstat /big", func() error {
			_, err := c.Wstat(cx, "/big", ferry.Dir{ferry.AttrMode: "0600"}).Wait()
			return err
		}},
		{"remove /batched", func() error { _, err := c.Remove(cx, "/batched").Wait(); return err }},
		{"removeall /dir", func() error { _, err := c.RemoveAll(cx, "/dir").Wait(); return err }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.want, err)
		}
		if !rec.Saw(st.want) {
			t.Errorf("the layer did not see %q; it saw %q", st.want, rec.Ops())
		}
	}
	if got := servertest.CallsSince(s.Srv, before, "putchunked", 2); got < 2 {
		t.Errorf("%d chunked puts through the layer, want the big and the batched file's", got)
	}
}
