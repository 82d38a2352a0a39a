package netem

import (
	"math"
	"testing"
)

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"100mbit", 100_000_000},
		{"5Mbit/s", 5_000_000},
		{"1.5g", 1_500_000_000},
		{"1.5gbit", 1_500_000_000},
		{"800k", 800_000},
		{"800kbit", 800_000},
		{"64000", 64000},
		{"64000bit", 64000},
		{" 20 mbit ", 20_000_000},
		{"0", 0},
		{"unlimited", 0},
	} {
		got, err := ParseRate(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "fast", "10mbps", "10MB/s", "10kb", "-1mbit", "1e30", "0x10", "NaN", "inf", "0.1bit", "mbit"} {
		if got, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatRate(t *testing.T) {
	for _, c := range []struct {
		in   int64
		want string
	}{
		{100_000_000, "100mbit"}, {1_500_000_000, "1.5gbit"}, {64000, "64kbit"},
		{1234, "1.234kbit"}, {999, "999bit"}, {0, "unlimited"}, {1_234_567, "1234.567kbit"},
	} {
		if got := FormatRate(c.in); got != c.want {
			t.Errorf("FormatRate(%d) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseLoss(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
	}{
		{"1%", 0.01}, {"0.5%", 0.005}, {"0.01", 0.01}, {"0", 0}, {"100%", 1}, {"1", 1}, {" 20 % ", 0.2},
	} {
		got, err := ParseLoss(c.in)
		if err != nil || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("ParseLoss(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "%", "lots", "101%", "1.5", "-1%", "NaN", "0x1p-2"} {
		if got, err := ParseLoss(in); err == nil {
			t.Errorf("ParseLoss(%q) = %v, want an error", in, got)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100mbit", "5Mbit/s", "1.5g", "800k", "64000", "0", "unlimited", "10mbps", "1e3kbit"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r < 0 {
			t.Fatalf("ParseRate(%q) = %d < 0", s, r)
		}
		back, err := ParseRate(FormatRate(r))
		if err != nil || back != r {
			t.Fatalf("ParseRate(FormatRate(%d)) = %d, %v (formatted %q)", r, back, err, FormatRate(r))
		}
	})
}

func FuzzParseLoss(f *testing.F) {
	for _, s := range []string{"1%", "0.01", "0", "100%", "1e-3", "50 %"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseLoss(s)
		if err != nil {
			return
		}
		if !(v >= 0 && v <= 1) {
			t.Fatalf("ParseLoss(%q) = %v, outside [0, 1]", s, v)
		}
	})
}
