package chunk

import (
	"bytes"
	"testing"
)

// BenchmarkCut measures boundary finding alone.
func BenchmarkCut(b *testing.B) {
	data := random(1, 64<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		for rest := data; len(rest) > 0; {
			rest = rest[Default.Cut(rest):]
		}
	}
}

// BenchmarkSum measures hashing of average-sized chunks.
func BenchmarkSum(b *testing.B) {
	data := random(1, Default.Avg)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		Sum(data)
	}
}

// BenchmarkRefs measures chunking and hashing a stream, as a server does
// when it indexes a file.
func BenchmarkRefs(b *testing.B) {
	data := random(1, 64<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := Refs(bytes.NewReader(data), Default, func(Ref, []byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
