package netem

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// rateUnits are the multipliers ParseRate accepts, longest first so that
// "mbit" is not read as "m" followed by "bit". All are decimal, as in tc.
var rateUnits = []struct {
	suffix string
	mult   float64
}{
	{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
	{"t", 1e12}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3},
}

// ParseRate parses a link rate in bits per second: a decimal number with an
// optional unit k, m, g or t (powers of 1000), optionally followed by "bit"
// and optionally by "/s", in any case: "100mbit", "5Mbit/s", "1.5g",
// "800k", "64000". Zero, "0" or "unlimited" mean no limit.
//
// Byte units ("bps", "MB/s") are rejected, since tc reads "mbps" as
// megabytes per second and people usually mean megabits.
func ParseRate(s string) (int64, error) {
	orig := s
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "unlimited" || s == "none" {
		return 0, nil
	}
	s = strings.TrimSuffix(s, "/s")
	if strings.HasSuffix(s, "bps") || strings.HasSuffix(s, "b") && !strings.HasSuffix(s, "bit") {
		return 0, fmt.Errorf("netem: rate %q: use bits (e.g. 100mbit), not bytes or bps", orig)
	}
	mult := 1.0
	for _, u := range rateUnits {
		if strings.HasSuffix(s, u.suffix) {
			s = strings.TrimSuffix(s, u.suffix)
			mult = u.mult
			break
		}
	}
	s = strings.TrimSpace(s)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || s == "" || strings.ContainsAny(s, "xXpP_") || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("netem: rate %q: want a number of bits per second such as 100mbit", orig)
	}
	v *= mult
	if v < 0 {
		return 0, fmt.Errorf("netem: rate %q is negative", orig)
	}
	if v > 1e15 {
		return 0, fmt.Errorf("netem: rate %q is too large", orig)
	}
	r := int64(math.Round(v))
	if r == 0 && v > 0 {
		return 0, fmt.Errorf("netem: rate %q is below 1 bit/s", orig)
	}
	return r, nil
}

// FormatRate formats a rate in bits per second the way ParseRate reads it,
// exactly: "100mbit", "1.5gbit", "64000bit"; 0 is "unlimited".
func FormatRate(r int64) string {
	if r == 0 {
		return "unlimited"
	}
	for _, u := range []struct {
		suffix string
		div    int64
	}{{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if r >= u.div && r%(u.div/1000) == 0 {
			return strconv.FormatFloat(float64(r)/float64(u.div), 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(r, 10) + "bit"
}

// ParseLoss parses a loss probability: a percentage such as "1%" or
// "0.5%", or a fraction from 0 to 1 such as "0.01".
func ParseLoss(s string) (float64, error) {
	orig := s
	s = strings.TrimSpace(s)
	pct := strings.HasSuffix(s, "%")
	s = strings.TrimSpace(strings.TrimSuffix(s, "%"))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || strings.ContainsAny(s, "xXpP_") || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("netem: loss %q: want a percentage such as 1%% or a fraction such as 0.01", orig)
	}
	if pct {
		v /= 100
	}
	if v < 0 || v > 1 {
		return 0, fmt.Errorf("netem: loss %q is outside 0..100%%", orig)
	}
	return v, nil
}
