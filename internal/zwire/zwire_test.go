package zwire

import (
	"bytes"
	"crypto/rand"
	"sync"
	"testing"

	"github.com/ferryfs/ferry"
)

func TestRoundTrip(t *testing.T) {
	c := New(64 << 10)
	defer c.Close()
	random := make([]byte, 32<<10)
	rand.Read(random)
	tests := []struct {
		name string
		in   []byte
		want bool // want compressed
	}{
		{"text", bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 1000), true},
		{"zeros", make([]byte, 64<<10), true},
		{"random", random, false},
		{"short", []byte("tiny"), false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		out, ok := c.Compress(nil, tt.in)
		if ok != tt.want {
			t.Errorf("%s: compressed %v, want %v", tt.name, ok, tt.want)
		}
		if !ok {
			if !bytes.Equal(out, tt.in) {
				t.Errorf("%s: uncompressed result differs from the input", tt.name)
			}
			continue
		}
		back, err := c.Decompress(nil, out)
		if err != nil || !bytes.Equal(back, tt.in) {
			t.Errorf("%s: round trip: %d bytes, %v; want %d bytes", tt.name, len(back), err, len(tt.in))
		}
	}
	if st := c.Stats(); st.Skipped != 1 || st.In <= st.Out {
		t.Errorf("stats %+v: want one skipped payload and In > Out", st)
	}
}

func TestBound(t *testing.T) {
	big := New(1 << 20)
	defer big.Close()
	small := New(64 << 10)
	defer small.Close()
	frame, ok := big.Compress(nil, make([]byte, 1<<20))
	if !ok {
		t.Fatal("a MiB of zeros did not compress")
	}
	if _, err := small.Decompress(nil, frame); !ferry.IsKind(err, ferry.KindInvalid) {
		t.Fatalf("decompressing past the bound: %v, want KindInvalid", err)
	}
	if _, err := small.Decompress(nil, []byte("not zstd at all")); !ferry.IsKind(err, ferry.KindInvalid) {
		t.Fatalf("decompressing garbage: %v, want KindInvalid", err)
	}
}

func FuzzDecompress(f *testing.F) {
	c := New(64 << 10)
	f.Cleanup(c.Close)
	seed, _ := c.Compress(nil, bytes.Repeat([]byte("seed text "), 100))
	f.Add(seed)
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := c.Decompress(nil, b)
		if err == nil && len(out) > 64<<10 {
			t.Fatalf("decompressed %d bytes past the bound", len(out))
		}
	})
}

// TestCloseDuringUse: closing a Codec while other goroutines decompress
// (a client closed with streams in flight) neither races nor panics; the
// decompressions after it fail with KindCanceled.
func TestCloseDuringUse(t *testing.T) {
	c := New(1 << 20)
	frame, ok := c.Compress(nil, bytes.Repeat([]byte("ferry "), 1000))
	if !ok {
		t.Fatal("a repetitive payload did not compress")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if _, err := c.Decompress(nil, frame); err != nil {
					if !ferry.IsKind(err, ferry.KindCanceled) {
						t.Errorf("Decompress: %v, want kind canceled after Close", err)
					}
					return
				}
			}
		}()
	}
	c.Close()
	wg.Wait()
	if _, err := c.Decompress(nil, frame); !ferry.IsKind(err, ferry.KindCanceled) {
		t.Errorf("Decompress after Close: %v, want kind canceled", err)
	}
	c.Close() // A second Close does nothing.
}
