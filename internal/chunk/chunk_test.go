package chunk

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func random(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// cuts returns the chunk lengths of b, cut with the streaming Chunker over r.
func cuts(t testing.TB, r io.Reader, p Params) []Ref {
	t.Helper()
	refs, err := List(r, p)
	if err != nil {
		t.Fatal(err)
	}
	return refs
}

// checkRefs checks that refs tile b exactly, every chunk but the last lies
// within [Min, Max], and the last within [1, Max].
func checkRefs(t testing.TB, b []byte, refs []Ref, p Params) {
	t.Helper()
	var off int64
	for i, r := range refs {
		if r.Off != off {
			t.Fatalf("chunk %d at %d, want %d", i, r.Off, off)
		}
		if r.Len > p.Max || r.Len < 1 || (i < len(refs)-1 && r.Len < p.Min) {
			t.Fatalf("chunk %d of %d: length %d outside [%d, %d]", i, len(refs), r.Len, p.Min, p.Max)
		}
		if got := Sum(b[off : off+int64(r.Len)]); got != r.Hash {
			t.Fatalf("chunk %d: hash %v, want %v", i, r.Hash, got)
		}
		off += int64(r.Len)
	}
	if off != int64(len(b)) {
		t.Fatalf("chunks cover %d bytes, want %d", off, len(b))
	}
}

func TestBounds(t *testing.T) {
	for _, p := range []Params{Default, Fine, {Min: 64, Avg: 256, Max: 1024}, {Min: 4096, Avg: 4096, Max: 4096}, {Min: 1 << 10, Avg: 16 << 10, Max: MaxSize}} {
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, p.Min - 1, p.Min, p.Max, p.Max + 1, 3 << 20} {
			b := random(uint64(n), n)
			checkRefs(t, b, cuts(t, bytes.NewReader(b), p), p)
		}
	}
}

func TestAverage(t *testing.T) {
	b := random(1, 16<<20)
	refs := cuts(t, bytes.NewReader(b), Default)
	avg := len(b) / len(refs)
	// Normalized chunking centres sizes near Avg; Min adds to the mean.
	if avg < Default.Avg || avg > 2*Default.Avg {
		t.Errorf("mean chunk %d bytes over %d chunks, want within [%d, %d]", avg, len(refs), Default.Avg, 2*Default.Avg)
	}
	t.Logf("mean chunk %d bytes", avg)
}

// TestStreaming checks that the boundaries do not depend on how the reader
// splits its data.
func TestStreaming(t *testing.T) {
	b := random(2, 1<<20+12345)
	want := cuts(t, bytes.NewReader(b), Default)
	for name, r := range map[string]io.Reader{
		"onebyte": iotest.OneByteReader(bytes.NewReader(b)),
		"half":    iotest.HalfReader(bytes.NewReader(b)),
		"dataerr": iotest.DataErrReader(bytes.NewReader(b)),
	} {
		got := cuts(t, r, Default)
		if len(got) != len(want) {
			t.Fatalf("%s: %d chunks, want %d", name, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: chunk %d is %+v, want %+v", name, i, got[i], want[i])
			}
		}
	}
}

func TestReadError(t *testing.T) {
	b := random(3, 300<<10)
	r := io.MultiReader(bytes.NewReader(b), iotest.ErrReader(io.ErrClosedPipe))
	_, err := List(r, Default)
	if err != io.ErrClosedPipe {
		t.Fatalf("got %v, want %v", err, io.ErrClosedPipe)
	}
}

// changed counts the chunks of b that a does not have, and their bytes.
func changed(t *testing.T, a, b []byte) (n int, size int) {
	have := map[Hash]bool{}
	for _, r := range cuts(t, bytes.NewReader(a), Default) {
		have[r.Hash] = true
	}
	for _, r := range cuts(t, bytes.NewReader(b), Default) {
		if !have[r.Hash] {
			n++
			size += r.Len
		}
	}
	return n, size
}

// TestLocality checks that an insertion, a deletion or an overwrite changes
// only the chunks near it: chunks before the edit are untouched, and on
// average the boundaries resynchronise within a chunk or two after it.
func TestLocality(t *testing.T) {
	a := random(4, 1<<20)
	have := map[Hash]bool{}
	for _, r := range cuts(t, bytes.NewReader(a), Default) {
		have[r.Hash] = true
	}
	edits := []struct {
		name    string
		edit    func(b []byte, at int) []byte
		maxMean float64
	}{
		{"insert1", func(b []byte, at int) []byte { return append(b[:at:at], append([]byte{'x'}, b[at:]...)...) }, 1.5},
		{"insert100", func(b []byte, at int) []byte { return append(b[:at:at], append(random(9, 100), b[at:]...)...) }, 1.5},
		{"delete1", func(b []byte, at int) []byte { return append(b[:at:at], b[at+1:]...) }, 1.5},
		{"delete5000", func(b []byte, at int) []byte { return append(b[:at:at], b[at+5000:]...) }, 4},
		{"overwrite", func(b []byte, at int) []byte { c := bytes.Clone(b); c[at] ^= 0xff; return c }, 1.5},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, e := range edits {
		const tries = 30
		total := 0
		for k := 0; k < tries; k++ {
			at := rng.IntN(len(a) - 6000)
			if k == 0 {
				at = 0
			}
			n := 0
			for _, r := range cuts(t, bytes.NewReader(e.edit(a, at)), Default) {
				if have[r.Hash] {
					continue
				}
				n++
				if r.Off+int64(r.Len) <= int64(at) {
					t.Fatalf("%s at %d: chunk at %d before the edit changed", e.name, at, r.Off)
				}
			}
			if n > 16 {
				t.Errorf("%s at %d: %d new chunks", e.name, at, n)
			}
			total += n
		}
		if mean := float64(total) / tries; mean > e.maxMean {
			t.Errorf("%s: %.2f new chunks per edit, want at most %.1f", e.name, mean, e.maxMean)
		}
	}
}

// TestPathological checks inputs with no content to anchor boundaries.
func TestPathological(t *testing.T) {
	pattern := func(unit string, n int) []byte { return bytes.Repeat([]byte(unit), n/len(unit)) }
	for name, b := range map[string][]byte{
		"zeros":   make([]byte, 5<<20),
		"ones":    bytes.Repeat([]byte{0xff}, 1<<20),
		"abc":     pattern("abc", 1<<20),
		"period":  pattern(string(random(5, 4099)), 2<<20),
		"zerorun": append(append(random(6, 100<<10), make([]byte, 1<<20)...), random(7, 100<<10)...),
	} {
		refs := cuts(t, bytes.NewReader(b), Default)
		checkRefs(t, b, refs, Default)
		if min := (len(b) + Default.Max - 1) / Default.Max; len(refs) < min {
			t.Errorf("%s: %d chunks, fewer than %d", name, len(refs), min)
		}
		// Identical runs make identical chunks: a file of zeros has very
		// few distinct ones.
		distinct := map[Hash]bool{}
		for _, r := range refs {
			distinct[r.Hash] = true
		}
		t.Logf("%s: %d chunks, %d distinct", name, len(refs), len(distinct))
	}
	zeros := cuts(t, bytes.NewReader(make([]byte, 5<<20)), Default)
	for i, r := range zeros {
		if r.Len != Default.Max {
			t.Fatalf("zeros: chunk %d of %d bytes, want %d", i, r.Len, Default.Max)
		}
	}
}

// TestGolden pins the scheme: if this fails, boundaries changed and peers of
// different builds no longer share chunks. Bump Version instead.
func TestGolden(t *testing.T) {
	var g bytes.Buffer
	for _, v := range gear {
		for j := 0; j < 8; j++ {
			g.WriteByte(byte(v >> (8 * j)))
		}
	}
	if got, want := Sum(g.Bytes()).String(), "blake3:"+goldenGear; got != want {
		t.Errorf("gear table %s, want %s", got, want)
	}
	var lens []int
	for _, r := range cuts(t, bytes.NewReader(random(42, 200<<10)), Default) {
		lens = append(lens, r.Len)
	}
	if got := fmtInts(lens); got != goldenLens {
		t.Errorf("chunk lengths %s, want %s", got, goldenLens)
	}
}

const (
	goldenGear = "f5add9364e89780823f42422493c4f716f9a6fa48dfc91bce374e8179983907e"
	goldenLens = "8703,8640,10514,15589,8756,8228,9346,6489,10484,6776,3924,9031,9608,8253,8644,8673,10218,17107,10160,12550,10446,2661"
)

func fmtInts(v []int) string {
	var b bytes.Buffer
	for i, n := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(itoa(n))
	}
	return b.String()
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

func TestCheck(t *testing.T) {
	for _, p := range []Params{{}, {Min: 10, Avg: 16, Max: 32}, {Min: 100, Avg: 300, Max: 1000}, {Min: 4096, Avg: 2048, Max: 8192}, {Min: 1024, Avg: 4096, Max: 2048}, {Min: 1024, Avg: 4096, Max: 2 * MaxSize}} {
		if p.Check() == nil {
			t.Errorf("%+v passes Check", p)
		}
	}
	if _, err := List(bytes.NewReader(nil), Params{}); err == nil {
		t.Error("List with zero Params succeeded")
	}
}

func TestHashString(t *testing.T) {
	h := Sum([]byte("hello"))
	got, err := ParseHash(h.String())
	if err != nil || got != h {
		t.Fatalf("ParseHash(%s) = %v, %v", h, got, err)
	}
	for _, s := range []string{"", "blake3:", "sha256:" + h.String()[7:], h.String()[:70], h.String() + "00", "blake3:" + string(bytes.Repeat([]byte("g"), 64))} {
		if _, err := ParseHash(s); err == nil {
			t.Errorf("ParseHash(%q) succeeded", s)
		}
	}
	if _, err := FromBytes(h[:5]); err == nil {
		t.Error("FromBytes of 5 bytes succeeded")
	}
}

func FuzzChunker(f *testing.F) {
	f.Add([]byte("hello"), uint16(64), uint8(8), uint16(512))
	f.Add(make([]byte, 10000), uint16(100), uint8(8), uint16(1000))
	f.Add(random(1, 50000), uint16(256), uint8(10), uint16(4096))
	f.Fuzz(func(t *testing.T, b []byte, min uint16, avgBits uint8, max uint16) {
		p := Params{Min: int(min), Avg: 1 << (avgBits % 21), Max: int(max) * 16}
		if p.Check() != nil {
			if _, err := List(bytes.NewReader(b), p); err == nil {
				t.Fatalf("List with bad params %+v succeeded", p)
			}
			return
		}
		refs := cuts(t, bytes.NewReader(b), p)
		checkRefs(t, b, refs, p)
		one := cuts(t, iotest.OneByteReader(bytes.NewReader(b)), p)
		if len(one) != len(refs) {
			t.Fatalf("one-byte reader: %d chunks, want %d", len(one), len(refs))
		}
		for i := range one {
			if one[i] != refs[i] {
				t.Fatalf("one-byte reader: chunk %d is %+v, want %+v", i, one[i], refs[i])
			}
		}
	})
}

func FuzzParseHash(f *testing.F) {
	f.Add(Sum(nil).String())
	f.Add("blake3:zz")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHash(s)
		if err != nil {
			return
		}
		if h2, err := ParseHash(h.String()); err != nil || h2 != h {
			t.Fatalf("round trip of %q: %v, %v", s, h2, err)
		}
	})
}

// cutSlow is cut one byte at a time, the definition.
func cutSlow(b []byte, p Params) int {
	strict, loose := p.masks()
	n := min(len(b), p.Max)
	if len(b) <= p.Min {
		return len(b)
	}
	var h uint64
	for i := p.Min; i < n; i++ {
		h = h<<1 + gear[b[i]]
		m := loose
		if i < p.Avg {
			m = strict
		}
		if h&m == 0 {
			return i + 1
		}
	}
	return n
}

func FuzzCutMatchesDefinition(f *testing.F) {
	f.Add(random(1, 70000), uint16(64), uint8(8))
	f.Add(random(2, 3000), uint16(65), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, min uint16, avgBits uint8) {
		p := Params{Min: int(min), Avg: 1 << (avgBits % 17), Max: 1 << 16}
		if p.Check() != nil {
			return
		}
		for len(b) > 0 {
			got, want := p.Cut(b), cutSlow(b, p)
			if got != want {
				t.Fatalf("Cut = %d, definition says %d (params %+v, %d bytes)", got, want, p, len(b))
			}
			b = b[got:]
		}
	})
}
