package zwire

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/ferryfs/ferry"
)

// TestStream sends payloads of every kind through a stream: each comes
// back whole as it arrives, and repeated text costs little the second time.
func TestStream(t *testing.T) {
	e, d := NewEncoder(), NewDecoder(1<<20)
	t.Cleanup(e.Close)
	t.Cleanup(d.Close)
	noise := make([]byte, 300<<10)
	rand.Read(noise)
	text := []byte{}
	for i := range 40 {
		text = fmt.Appendf(text, "/src/prometheus/promhttp/file%d.go mode 0%o mtime %d\n", i*7919%1000, i*37%512, 1688126400000000000+int64(i)*104729*104723)
	}
	payloads := [][]byte{text, {}, []byte("x"), noise, text, noise[:1000], bytes.Repeat([]byte{0}, 200<<10), text}
	var sizes []int
	for i, p := range payloads {
		z, err := e.Compress(p)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(z))
		got, err := d.Decompress(bytes.Clone(z), len(p))
		if err != nil {
			t.Fatalf("payload %d: %v", i, err)
		}
		if !bytes.Equal(got, p) {
			t.Fatalf("payload %d came back different", i)
		}
	}
	if sizes[4] > sizes[0]/4 {
		t.Errorf("text sent again took %d bytes, the first time %d: want it to build on the history", sizes[4], sizes[0])
	}
}

// TestStreamRefuses: a payload larger than the bound, one cut short, one
// with bytes beyond it, and garbage are refused, and the stream stays
// broken. (A size smaller than the content is not seen: the rest comes
// first in the next payload, garbling the sender's own stream from there
// on, as any wrong content it sends would.)
func TestStreamRefuses(t *testing.T) {
	text := bytes.Repeat([]byte("ferry "), 1000)
	for _, tc := range []struct {
		name string
		mess func(z []byte, size int) ([]byte, int)
	}{
		{"too large", func(z []byte, size int) ([]byte, int) { return z, 1 << 30 }},
		{"cut short", func(z []byte, size int) ([]byte, int) { return z[:len(z)/2], size }},
		{"trailing bytes", func(z []byte, size int) ([]byte, int) { return append(z, 1, 2, 3), size }},
		{"garbage", func(z []byte, size int) ([]byte, int) { return bytes.Repeat([]byte{0x55}, len(z)), size }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, d := NewEncoder(), NewDecoder(64<<10)
			t.Cleanup(e.Close)
			t.Cleanup(d.Close)
			z, _ := e.Compress(text)
			p, size := tc.mess(bytes.Clone(z), len(text))
			if _, err := d.Decompress(p, size); ferry.KindOf(err) != ferry.KindInvalid {
				t.Fatalf("Decompress = %v, want KindInvalid", err)
			}
			z, _ = e.Compress(text)
			if _, err := d.Decompress(z, len(text)); ferry.KindOf(err) != ferry.KindInvalid {
				t.Errorf("after a refusal Decompress = %v, want KindInvalid", err)
			}
		})
	}
}

func FuzzDecoder(f *testing.F) {
	e := NewEncoder()
	defer e.Close()
	z, _ := e.Compress([]byte("a batch of a stream, a batch of a stream"))
	f.Add(bytes.Clone(z), 40, []byte{}, 0)
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd}, 10, []byte{1}, 1)
	f.Fuzz(func(t *testing.T, a []byte, na int, b []byte, nb int) {
		d := NewDecoder(64 << 10)
		defer d.Close()
		for _, x := range []struct {
			p []byte
			n int
		}{{a, na}, {b, nb}} {
			out, err := d.Decompress(x.p, x.n)
			if err != nil && ferry.KindOf(err) != ferry.KindInvalid {
				t.Fatalf("Decompress failed with kind %v: %v", ferry.KindOf(err), err)
			}
			if err == nil && len(out) != x.n {
				t.Fatalf("Decompress gave %d bytes, want %d", len(out), x.n)
			}
		}
	})
}

// TestWideWindow: a stream with WideWindow of history finds a payload sent
// 3 MiB earlier again, where one with StreamWindow cannot, and a decoder
// of StreamWindow refuses the wide stream rather than misreading it.
func TestWideWindow(t *testing.T) {
	noise := make([]byte, 3<<20)
	rand.Read(noise)
	for _, tc := range []struct {
		name   string
		window int
		small  bool // whether the repeat compresses to a small part of it
	}{
		{"stream window", StreamWindow, false},
		{"wide window", WideWindow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, d := NewEncoderLevel(tc.window, Default), NewDecoderWindow(1<<20, tc.window)
			t.Cleanup(e.Close)
			t.Cleanup(d.Close)
			var repeat int
			for round := range 2 {
				for off := 0; off < len(noise); off += 1 << 20 {
					p := noise[off : off+1<<20]
					z, err := e.Compress(p)
					if err != nil {
						t.Fatal(err)
					}
					if round == 1 {
						repeat += len(z)
					}
					got, err := d.Decompress(bytes.Clone(z), len(p))
					if err != nil {
						t.Fatalf("round %d, offset %d: %v", round, off, err)
					}
					if !bytes.Equal(got, p) {
						t.Fatalf("round %d, offset %d came back different", round, off)
					}
				}
			}
			if small := repeat < len(noise)/10; small != tc.small {
				t.Errorf("3 MiB sent again took %d bytes; want it small: %v", repeat, tc.small)
			}
		})
	}
	e, d := NewEncoderLevel(WideWindow, Default), NewDecoder(1<<20)
	t.Cleanup(e.Close)
	t.Cleanup(d.Close)
	z, err := e.Compress(noise[:1<<20])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decompress(bytes.Clone(z), 1<<20); ferry.KindOf(err) != ferry.KindInvalid {
		t.Errorf("a stream-window decoder given a wide stream: %v, want KindInvalid", err)
	}
}
