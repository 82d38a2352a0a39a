package replica

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestInboxKept: what an inbox records is there when it is opened again,
// the latest of records made at once is the one kept, a cut sets exactly
// what it names, and a damaged record is an error, not a zero.
func TestInboxKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "inbox")
	in, err := openInbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for seq := uint64(1); seq <= 50; seq++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := in.done(7, seq); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	must(t, in.done(9, 3))
	in.close()
	if err := in.done(7, 51); err == nil {
		t.Fatal("a closed inbox recorded")
	}

	in, err = openInbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := in.last(7); got != 50 {
		t.Fatalf("member 7's last applied update after reopening is %d, want 50", got)
	}
	must(t, in.done(9, 2)) // an older update applied again lowers nothing
	if got := in.last(9); got != 3 {
		t.Fatalf("member 9's last is %d, want 3", got)
	}
	must(t, in.cut(map[uint64]uint64{9: 1, 11: 4}))
	in.close()

	in, err = openInbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint64]uint64{7: 0, 9: 1, 11: 4} {
		if got := in.last(id); got != want {
			t.Errorf("after the cut, member %d's last is %d, want %d", id, got, want)
		}
	}
	in.close()

	must(t, os.WriteFile(filepath.Join(dir, "11"), []byte("damaged"), 0o600))
	if _, err := openInbox(dir); err == nil {
		t.Fatal("a damaged record opened")
	}
}

// FuzzRecord: decoding takes any input without panicking, and what decodes is
// what the sequence encodes to.
func FuzzRecord(f *testing.F) {
	f.Add(encodeRecord(0))
	f.Add(encodeRecord(1 << 40))
	f.Add([]byte("damaged"))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, ok := decodeRecord(b)
		if ok && !bytes.Equal(encodeRecord(seq), b) {
			t.Fatalf("%x decodes to %d, which encodes to %x", b, seq, encodeRecord(seq))
		}
	})
}
