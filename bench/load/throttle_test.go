package main

import (
	"net"
	"testing"
	"time"
)

// TestPacer reads through a pacer on a simulated clock and checks the
// long-run rate and the first read's wait.
func TestPacer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bits  int64
		burst int
		read  int // bytes each read returns
		total int
	}{
		{"1 Mbit/s in bursts", 1_000_000, 16 << 10, 16 << 10, 1 << 20},
		{"1 Mbit/s, short reads", 1_000_000, 16 << 10, 1500, 1 << 20},
		{"10 Mbit/s", 10_000_000, 16 << 10, 16 << 10, 4 << 20},
		{"burst larger than the total", 8_000_000, 1 << 20, 64 << 10, 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacer(tc.bits, tc.burst)
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := start
			if d := p.wait(now); d != 0 {
				t.Fatalf("first wait = %v, want 0", d)
			}
			for got := 0; got < tc.total; {
				now = now.Add(p.wait(now))
				n := min(tc.read, tc.burst, tc.total-got)
				p.took(now, n)
				got += n
			}
			// The last read starts one burst before the bytes would have
			// arrived at exactly the rate.
			ideal := time.Duration(float64(tc.total) * 8 / float64(tc.bits) * float64(time.Second))
			slack := time.Duration(float64(tc.burst) * 8 / float64(tc.bits) * float64(time.Second))
			want := max(ideal-slack-time.Duration(float64(tc.read)*8/float64(tc.bits)*float64(time.Second)), 0)
			if el := now.Sub(start); el < want-time.Millisecond || el > ideal {
				t.Errorf("reading %d bytes took %v, want %v to %v", tc.total, el, want, ideal)
			}
		})
	}
}

// TestPacerIdle checks that idle time is not saved up beyond one burst.
func TestPacerIdle(t *testing.T) {
	p := newPacer(1_000_000, 16<<10)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.took(now, 16<<10)
	now = now.Add(time.Hour)
	p.took(now, 16<<10)
	if d := p.wait(now); d != 0 {
		t.Errorf("wait after one burst following an idle hour = %v, want 0", d)
	}
	p.took(now, 16<<10)
	if d, want := p.wait(now), 131072*time.Microsecond; d != want {
		t.Errorf("wait after two bursts = %v, want %v", d, want)
	}
}

// TestThrottledConn checks that a throttled connection paces its reads,
// caps them at one burst, and that Close ends a wait.
func TestThrottledConn(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := newThrottledConn(a, 8_000_000, 4<<10) // 1 MB/s, 4 KiB bursts
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := b.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	start := time.Now()
	total := 0
	for total < 40<<10 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if n > 4<<10 {
			t.Fatalf("read %d bytes, more than a burst", n)
		}
		total += n
	}
	// 40 KiB at 1 MB/s, less a burst and the last read: at least 32 ms.
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Errorf("reading %d bytes took %v, want at least 30 ms", total, el)
	}
	// A read that must wait a long time ends when the conn closes.
	c.p.took(time.Now(), 1<<30)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("read after Close succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting Read")
	}
}
