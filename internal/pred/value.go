package pred

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// numAttr describes a numeric attribute: the base its stored value is
// written in and how a value in a predicate is read.
type numAttr struct {
	base  int
	parse func(string) (int64, error)
}

// numeric lists the attributes that compare as numbers. Depth and age are
// not stored: Eval derives them.
var numeric = map[string]numAttr{
	"size":  {10, ParseSize},
	"uid":   {10, parseInt},
	"gid":   {10, parseInt},
	"nlink": {10, parseInt},
	"mode":  {8, parseMode},
	"mtime": {10, parseTime},
	"depth": {10, parseInt},
	"age":   {10, parseAge},
}

// parseInt reads a decimal number.
func parseInt(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return n, nil
}

// parseMode reads octal permission bits.
func parseMode(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 8, 64)
	if err != nil {
		return 0, fmt.Errorf("bad mode %q: want octal, as 0644", s)
	}
	return n, nil
}

// ParseSize reads a number of bytes with an optional binary suffix, as
// predicates and command-line flags write sizes: 64k, 256M, 1G.
func ParseSize(s string) (int64, error) {
	bad := fmt.Errorf("bad size %q: want bytes, or a number ending in k, K, M, G or T", s)
	shift := 0
	if s != "" {
		switch s[len(s)-1] {
		case 'k', 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
	}
	if shift > 0 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, bad
	}
	if n > math.MaxInt64>>shift {
		return 0, errors.New("size too large")
	}
	return n << shift, nil
}

// minTime and maxTime bound the times that nanoseconds since the epoch can
// represent in an int64.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// parseTime reads a time as nanoseconds since the epoch, an RFC 3339 time or
// a date, which means its midnight UTC: UTC rather than local time because
// the predicate is evaluated on a server whose zone the user may not know.
func parseTime(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		t, err = time.Parse(time.RFC3339, s)
	}
	if err != nil {
		return 0, fmt.Errorf("bad time %q: want RFC 3339, 2006-01-02 or nanoseconds", s)
	}
	if t.Before(minTime) || t.After(maxTime) {
		return 0, fmt.Errorf("time %q out of range", s)
	}
	return t.UnixNano(), nil
}

// parseAge reads a duration: an optional number of days ending in "d", then
// a Go duration, which may be empty only after days ("7d", "1d12h", "90m").
func parseAge(s string) (int64, error) {
	bad := fmt.Errorf("bad age %q: want a duration, as 90s, 2h or 7d", s)
	const day = int64(24 * time.Hour)
	var days int64
	rest := s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.ParseUint(s[:i], 10, 63)
		if err != nil {
			return 0, bad
		}
		days, rest = int64(n), s[i+1:]
		if rest == "" {
			rest = "0"
		} else if rest[0] < '0' || rest[0] > '9' {
			// A sign or a second "d" after the days is a typo, not a duration.
			return 0, bad
		}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, bad
	}
	if days > 0 && days > (math.MaxInt64-int64(d))/day {
		return 0, fmt.Errorf("age %q too large", s)
	}
	return days*day + int64(d), nil
}

// sub returns a-b, saturated to the range of int64, so that an absurd mtime
// gives an absurd age rather than a wrapped one.
func sub(a, b int64) int64 {
	d := a - b
	switch {
	case b < 0 && d < a:
		return math.MaxInt64
	case b > 0 && d > a:
		return math.MinInt64
	}
	return d
}
