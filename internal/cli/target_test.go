package cli

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

func TestParseTarget(t *testing.T) {
	cases := []struct {
		in, addr, path string
		bad            bool
	}{
		{in: "host", addr: "host:7077", path: "/"},
		{in: "host:/a/b", addr: "host:7077", path: "/a/b"},
		{in: "host:9000:/a", addr: "host:9000", path: "/a"},
		{in: "host:9000", addr: "host:9000", path: "/"},
		{in: "host:a/../b", addr: "host:7077", path: "/b"},
		{in: "[::1]:9000:/x", addr: "[::1]:9000", path: "/x"},
		{in: "[::1]:/x", addr: "[::1]:7077", path: "/x"},
		{in: ":/x", bad: true},
		{in: "[::1", bad: true},
		{in: "[::1]x", bad: true},
		{in: "h:/a\x00", bad: true},
	}
	for _, tc := range cases {
		got, err := ParseTarget(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseTarget(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got.Addr != tc.addr || got.Path != tc.path {
			t.Errorf("ParseTarget(%q) = %+v, %v; want {%s %s}", tc.in, got, err, tc.addr, tc.path)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"h", "h:/a", "h:1:/a", "[::1]:2:/x", ":", "[", "h:9:9:9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseTarget(in)
		if err != nil {
			if ferry.KindOf(err) != ferry.KindInvalid {
				t.Fatalf("ParseTarget(%q): error of kind %v", in, ferry.KindOf(err))
			}
			return
		}
		if _, _, err := net.SplitHostPort(got.Addr); err != nil {
			t.Fatalf("ParseTarget(%q).Addr = %q: %v", in, got.Addr, err)
		}
		if p, err := ferry.CleanPath(got.Path); err != nil || p != got.Path || !strings.HasPrefix(p, "/") {
			t.Fatalf("ParseTarget(%q).Path = %q is not clean", in, got.Path)
		}
	})
}

func TestProgressReaderSeeks(t *testing.T) {
	p := newProgress(io.Discard, "", -1, progressOpts{})
	defer p.Finish()
	r := p.Reader(strings.NewReader("0123456789"))
	rs, ok := r.(io.ReadSeeker)
	if !ok {
		t.Fatal("the progress reader of a seeker cannot seek")
	}
	io.ReadFull(rs, make([]byte, 6))
	rs.Seek(2, io.SeekStart)
	rest, _ := io.ReadAll(rs)
	if string(rest) != "23456789" || p.n.Load() != 10 {
		t.Errorf("after a seek back: read %q, counted %d; want 23456789 and 10", rest, p.n.Load())
	}
	if _, ok := p.Reader(struct{ io.Reader }{strings.NewReader("x")}).(io.Seeker); ok {
		t.Error("the progress reader of a plain reader claims to seek")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/tab\011x`: "/tab\tx", `/plain`: "/plain", `/back\134slash`: `/back\slash`, `/short\04`: `/short\04`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountLog(t *testing.T) {
	for in, want := range map[string]string{"/home/a/src": "mount-home-a-src.log", "/": "mount-root.log", "/a b/c": "mount-a-b-c.log"} {
		if got := mountLog(in); got != want {
			t.Errorf("mountLog(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestProgressExpect: a transfer of unknown size learns its total as the
// walk finds files; one of known size adds to it.
func TestProgressExpect(t *testing.T) {
	for _, tc := range []struct {
		start  int64
		expect []int64
		want   int64
	}{
		{-1, nil, -1},
		{-1, []int64{10, 5}, 15},
		{-1, []int64{0}, 0},
		{7, []int64{3}, 10},
	} {
		p := newProgress(io.Discard, "", tc.start, progressOpts{})
		for _, n := range tc.expect {
			p.Expect(n)
		}
		if got := p.total.Load(); got != tc.want {
			t.Errorf("total from %d after %v = %d, want %d", tc.start, tc.expect, got, tc.want)
		}
		p.Finish()
	}
}

// TestProgressStats: --stats writes a line of progress every interval,
// with the bytes, the share of the total, the rate and the time left.
func TestProgressStats(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, "put", 1000, progressOpts{every: 10 * time.Millisecond})
	p.Add(500)
	time.Sleep(50 * time.Millisecond)
	p.Finish()
	out := buf.String()
	if !strings.Contains(out, "ferry: put: 500 B of 1000 B (50%), ") || !strings.Contains(out, "/s, ") || !strings.Contains(out, " left") {
		t.Errorf("stats lines: %q", out)
	}
}

// TestProgressCurrent: the bar names the file being moved, its tail if
// the name is long.
func TestProgressCurrent(t *testing.T) {
	p := newProgress(io.Discard, "", -1, progressOpts{})
	defer p.Finish()
	if got := p.current(); got != "" {
		t.Errorf("before any file: %q", got)
	}
	p.Current("/src/a.c")
	if got := p.current(); got != "/src/a.c" {
		t.Errorf("current = %q", got)
	}
	long := "/" + strings.Repeat("d/", 30) + "file.go"
	p.Current(long)
	if got := p.current(); len(got) != 40 || !strings.HasSuffix(got, "file.go") || !strings.HasPrefix(got, "...") {
		t.Errorf("a long name shows as %q", got)
	}
}
