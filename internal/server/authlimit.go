package server

import (
	"net"
	"sync"
	"time"
)

// Limits of failed authentication per address: authBurst failures at
// once, then one more every authEvery. A token guessed from one address
// then takes years rather than hours, while a user who mistyped one waits
// a few seconds.
const (
	authBurst = 10
	authEvery = 6 * time.Second
)

// authLimit counts the failed authentications of each address and refuses
// an address over its limit before its credentials are even looked at.
type authLimit struct {
	now   func() time.Time
	mu    sync.Mutex
	addrs map[string]*authFailures
}

type authFailures struct {
	n  float64 // Failures not yet forgiven, as of at.
	at time.Time
}

func newAuthLimit(now func() time.Time) *authLimit {
	return &authLimit{now: now, addrs: map[string]*authFailures{}}
}

// host returns the address of a connection's remote end without its port.
func host(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// current returns the failures of addr not yet forgiven. l.mu is held.
func (l *authLimit) current(addr string, now time.Time) float64 {
	f := l.addrs[addr]
	if f == nil {
		return 0
	}
	return max(0, f.n-float64(now.Sub(f.at))/float64(authEvery))
}

// allowed reports whether addr may try to authenticate now.
func (l *authLimit) allowed(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current(addr, l.now()) < authBurst
}

// failed counts a failed authentication from addr.
func (l *authLimit) failed(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if len(l.addrs) >= 1<<16 {
		// Forget the addresses forgiven already, so that many
		// addresses cannot grow the map without bound.
		for a := range l.addrs {
			if l.current(a, now) == 0 {
				delete(l.addrs, a)
			}
		}
	}
	l.addrs[addr] = &authFailures{n: l.current(addr, now) + 1, at: now}
}
