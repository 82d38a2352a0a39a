package netem

import (
	"math/rand/v2"
	"time"
)

// verdict is what the shaper decided for one packet.
type verdict int

const (
	pass      verdict = iota // forward at the returned time
	dropLoss                 // dropped by random loss
	dropQueue                // dropped because the queue was full (drop-tail)
)

// DefaultMinQueue is the smallest default queue, in bytes, of a
// rate-limited direction: about 100 full-size packets. It matters at short
// round trips, where 1.5 times the bandwidth-delay product would be too small
// for a single TCP flow's bursts.
const DefaultMinQueue = 150_000

// params is one direction's link as the forwarding loop sees it: the user's
// Link with its default queue resolved.
type params struct {
	Link
	queue int // bytes; only meaningful when Rate > 0
}

// resolve returns the effective parameters of each direction of cfg. The
// default queue of a rate-limited direction is 1.5 times the bandwidth-delay
// product of the whole round trip (both delays), but at least
// DefaultMinQueue.
func resolve(cfg Config) (up, down params) {
	rtt := cfg.Up.Delay + cfg.Down.Delay
	one := func(l Link) params {
		p := params{Link: l, queue: l.Queue}
		if p.queue <= 0 && l.Rate > 0 {
			bdp := float64(l.Rate) / 8 * rtt.Seconds()
			p.queue = max(int(1.5*bdp), DefaultMinQueue)
		}
		return p
	}
	return one(cfg.Up), one(cfg.Down)
}

// shaper models one direction of the link: random loss, then a serialiser
// of the given rate fed by a drop-tail queue, then a delay line. It keeps no
// packets itself: for each arriving packet it computes when the packet leaves
// the far end of the wire, and the caller holds the packet until then.
//
// The serialiser is a virtual clock: busy is the time at which the last
// admitted packet finishes transmission. The bytes still queued at time now
// are therefore (busy-now)*rate, which is what the drop-tail test compares
// with the queue limit. This is exact for a FIFO link and needs no timer per
// packet, so the rate holds on average even though the Go runtime's timers
// wake the writer up to a millisecond late.
//
// A shaper is used by one goroutine only.
type shaper struct {
	busy time.Duration // serialiser free at this time (since the bed's start)
	last time.Duration // delivery time of the last admitted packet
	rnd  func() float64
}

func newShaper() *shaper {
	return &shaper{rnd: rand.Float64}
}

// admit decides the fate of a packet of size bytes that arrives at time now
// (a duration since an arbitrary fixed origin) and, if it passes, returns the
// time at which it is to be delivered. Delivery times never decrease, so
// jitter does not reorder packets.
func (s *shaper) admit(now time.Duration, size int, p *params) (time.Duration, verdict) {
	if p.Loss > 0 && s.rnd() < p.Loss {
		return 0, dropLoss
	}
	depart := now
	if p.Rate > 0 {
		if s.busy < now {
			s.busy = now
		}
		backlog := float64(s.busy-now) * float64(p.Rate) / 8 / float64(time.Second)
		// An empty queue always takes a packet, whatever the limit.
		if s.busy > now && backlog+float64(size) > float64(p.queue) {
			return 0, dropQueue
		}
		tx := time.Duration(float64(size) * 8 * float64(time.Second) / float64(p.Rate))
		s.busy += tx
		depart = s.busy
	}
	at := depart + p.Delay
	if p.Jitter > 0 {
		at += time.Duration((s.rnd()*2 - 1) * float64(p.Jitter))
		if at < depart {
			at = depart
		}
	}
	if at < s.last {
		at = s.last
	}
	s.last = at
	return at, pass
}
