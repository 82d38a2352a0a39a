package main

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// snapshot is what one scrape of the server's Prometheus metrics says of
// its read-ahead.
type snapshot struct {
	held      int64 // ferry_readahead_bytes
	orphaned  int64 // ferry_readahead_orphaned_bytes
	cancelled int64 // ferry_readahead_cancelled_total
	streams   int64 // ferry_readahead_streams
	// conns are the connections listed, by the client's address.
	conns map[string]connRA
}

// connRA is one connection's read-ahead: bytes held and the sum of its
// streams' target depths.
type connRA struct {
	held, target int64
}

// parseMetrics reads the Prometheus text exposition format and keeps what
// snapshot holds; other metrics are skipped. A metric the server does not
// export stays 0, so that an older server still gives a partial answer.
func parseMetrics(r io.Reader) (snapshot, error) {
	s := snapshot{conns: map[string]connRA{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		// Only the read-ahead metrics are wanted: the rest (thousands
		// of lines with hundreds of connections) is skipped unparsed, to
		// keep fast sampling cheap.
		if !strings.HasPrefix(t, "ferry_readahead_") && !strings.HasPrefix(t, "ferry_conn_readahead_") {
			continue
		}
		name, labels, value, err := parseSample(t)
		if err != nil {
			return snapshot{}, fmt.Errorf("metrics line %d: %w", line, err)
		}
		v := int64(value)
		switch name {
		case "ferry_readahead_bytes":
			s.held = v
		case "ferry_readahead_orphaned_bytes":
			s.orphaned = v
		case "ferry_readahead_cancelled_total":
			s.cancelled = v
		case "ferry_readahead_streams":
			s.streams = v
		case "ferry_conn_readahead_bytes":
			c := s.conns[labels["addr"]]
			c.held = v
			s.conns[labels["addr"]] = c
		case "ferry_conn_readahead_target_bytes":
			c := s.conns[labels["addr"]]
			c.target = v
			s.conns[labels["addr"]] = c
		}
	}
	if err := sc.Err(); err != nil {
		return snapshot{}, fmt.Errorf("reading metrics: %w", err)
	}
	return s, nil
}

// parseSample splits one sample line, `name{a="x",b="y"} value [timestamp]`,
// into its parts. Label values may hold escaped quotes, backslashes and
// newlines.
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", nil, 0, fmt.Errorf("no value in %q", line)
	}
	name, rest := line[:i], line[i:]
	labels = map[string]string{}
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if rest == "" {
				return "", nil, 0, fmt.Errorf("unterminated labels in %q", line)
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, `="`)
			if eq <= 0 {
				return "", nil, 0, fmt.Errorf("bad label in %q", line)
			}
			key := strings.TrimSpace(rest[:eq])
			rest = rest[eq+2:]
			var b strings.Builder
			j := 0
			for ; j < len(rest) && rest[j] != '"'; j++ {
				if rest[j] == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						b.WriteByte('\n')
					default:
						b.WriteByte(rest[j])
					}
					continue
				}
				b.WriteByte(rest[j])
			}
			if j == len(rest) {
				return "", nil, 0, fmt.Errorf("unterminated label value in %q", line)
			}
			labels[key] = b.String()
			rest = rest[j+1:]
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 || len(f) > 2 {
		return "", nil, 0, fmt.Errorf("bad value in %q", line)
	}
	value, err = strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, fmt.Errorf("bad value in %q: %w", line, err)
	}
	return name, labels, value, nil
}

// parseSize parses a byte count such as 262144, 256KiB, 4MiB, 1GiB (or KB,
// MB, GB, K, M, G, all powers of 1024).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30},
	} {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q: want bytes, or a number with KiB, MiB or GiB", s)
	}
	return n * mult, nil
}

// fmtSize formats a byte count in the largest binary unit that keeps it
// whole, as parseSize reads it.
func fmtSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}
