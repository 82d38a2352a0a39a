package cli

import (
	"net"
	"strings"

	"github.com/ferryfs/ferry"
)

// DefaultPort is the port ferry serve listens on and clients dial when a
// target names none.
const DefaultPort = "7077"

// Target is a remote path as the commands spell it: HOST[:PORT]:PATH, with
// IPv6 hosts in brackets ([::1]:7077:/a). PATH defaults to "/".
type Target struct {
	Addr string // host:port
	Path string // clean, rooted
}

// IsRemote reports whether s names a remote path rather than a local one: it
// has a colon before any slash.
func IsRemote(s string) bool {
	c := strings.IndexByte(s, ':')
	sl := strings.IndexByte(s, '/')
	return c > 0 && (sl < 0 || c < sl) || strings.HasPrefix(s, "[")
}

// ParseTarget parses HOST[:PORT][:PATH].
func ParseTarget(s string) (Target, error) {
	const op = "cli.ParseTarget"
	bad := func(msg string) (Target, error) {
		return Target{}, ferry.E(op, s, ferry.KindInvalid, msg+" (want HOST[:PORT]:PATH)")
	}
	var host, rest string
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("unclosed [ in host")
		}
		host, rest = s[1:end], s[end+1:]
		if rest != "" && rest[0] != ':' {
			return bad("text after ]")
		}
	} else {
		i := strings.IndexByte(s, ':')
		if i < 0 {
			host = s
		} else {
			host, rest = s[:i], s[i:]
		}
	}
	if host == "" {
		return bad("no host")
	}
	if strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune("[]/\\@", r) }) {
		return bad("bad character in host")
	}
	rest = strings.TrimPrefix(rest, ":")
	port := DefaultPort
	// A leading all-digits field before another colon or the end is a port.
	if i := strings.IndexByte(rest, ':'); i >= 0 && isDigits(rest[:i]) {
		port, rest = rest[:i], rest[i+1:]
	} else if isDigits(rest) && rest != "" {
		port, rest = rest, ""
	}
	p, err := ferry.CleanPath(rest)
	if err != nil {
		return Target{}, err
	}
	return Target{Addr: net.JoinHostPort(host, port), Path: p}, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
