package netem

import (
	"testing"
	"time"
)

func TestShaperRateAndQueue(t *testing.T) {
	// 8 Mbit/s is one byte per microsecond: a 1000-byte packet takes 1 ms.
	p := &params{Link: Link{Delay: 10 * time.Millisecond, Rate: 8_000_000}, queue: 3000}
	s := newShaper()
	var got []time.Duration
	var drops int
	for i := 0; i < 6; i++ {
		at, v := s.admit(0, 1000, p)
		switch v {
		case pass:
			got = append(got, at)
		case dropQueue:
			drops++
		default:
			t.Fatalf("packet %d: verdict %v, want pass or dropQueue", i, v)
		}
	}
	// The first three fill the 3000-byte queue; the rest are dropped.
	want := []time.Duration{11 * time.Millisecond, 12 * time.Millisecond, 13 * time.Millisecond}
	if len(got) != len(want) || drops != 3 {
		t.Fatalf("passed %v, dropped %d; want %v and 3 drops", got, drops, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("packet %d delivered at %v, want %v", i, got[i], want[i])
		}
	}
	// After the queue drains, one packet goes straight through.
	at, v := s.admit(20*time.Millisecond, 1000, p)
	if v != pass || at != 31*time.Millisecond {
		t.Errorf("after idle: got %v %v, want pass at 31ms", at, v)
	}
}

func TestShaperEmptyQueueTakesBigPacket(t *testing.T) {
	p := &params{Link: Link{Rate: 8_000_000}, queue: 100}
	s := newShaper()
	if _, v := s.admit(0, 1500, p); v != pass {
		t.Fatalf("first packet larger than the queue: verdict %v, want pass", v)
	}
	if _, v := s.admit(0, 1500, p); v != dropQueue {
		t.Fatalf("second packet: verdict %v, want dropQueue", v)
	}
}

func TestShaperLoss(t *testing.T) {
	p := &params{Link: Link{Loss: 0.25}}
	s := newShaper()
	seq := []float64{0.1, 0.3, 0.24, 0.9}
	s.rnd = func() float64 { r := seq[0]; seq = seq[1:]; return r }
	var got []verdict
	for range 4 {
		_, v := s.admit(0, 100, p)
		got = append(got, v)
	}
	want := []verdict{dropLoss, pass, dropLoss, pass}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("packet %d: verdict %v, want %v", i, got[i], want[i])
		}
	}
}

func TestShaperJitterKeepsOrder(t *testing.T) {
	p := &params{Link: Link{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}}
	s := newShaper()
	var last time.Duration
	lo, hi := time.Hour, time.Duration(0)
	for i := range 1000 {
		now := time.Duration(i) * 11 * time.Millisecond // apart enough not to hold each other up
		at, v := s.admit(now, 100, p)
		if v != pass {
			t.Fatalf("verdict %v", v)
		}
		if at < last {
			t.Fatalf("packet %d delivered at %v before its predecessor at %v", i, at, last)
		}
		last = at
		d := at - now
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 5*time.Millisecond || hi > 15*time.Millisecond+100*time.Microsecond || hi-lo < 8*time.Millisecond {
		t.Errorf("delays span %v..%v, want about 5ms..15ms", lo, hi)
	}
}

func TestResolveQueue(t *testing.T) {
	cfg := Symmetric(100*time.Millisecond, 100_000_000, 0)
	up, down := resolve(cfg)
	// BDP of 100 Mbit/s over 100 ms is 1.25 MB.
	if want := 1_875_000; up.queue != want || down.queue != want {
		t.Errorf("default queues %d, %d; want %d", up.queue, down.queue, want)
	}
	up, _ = resolve(Symmetric(0, 100_000_000, 0))
	if up.queue != DefaultMinQueue {
		t.Errorf("default queue at zero delay %d, want %d", up.queue, DefaultMinQueue)
	}
	cfg.Up.Queue = 5000
	up, _ = resolve(cfg)
	if up.queue != 5000 {
		t.Errorf("explicit queue %d, want 5000", up.queue)
	}
}

func TestShaperJitterBackToBack(t *testing.T) {
	// Packets closer together than the jitter queue behind the slowest one
	// before them: order is kept, at the price of a delay biased upwards.
	p := &params{Link: Link{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}}
	s := newShaper()
	var last time.Duration
	for i := range 1000 {
		at, _ := s.admit(time.Duration(i)*10*time.Microsecond, 100, p)
		if at < last {
			t.Fatalf("packet %d delivered at %v before its predecessor at %v", i, at, last)
		}
		last = at
	}
}
