package remote

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/zwire"
)

// levels chooses how hard a batch stream compresses. zstd's Better level
// finds a quarter fewer bytes than Default in a build's outputs but takes
// two to three times the CPU: worth it where the link, not the CPU, is
// what holds the stream back, and a loss on a fast link, where Better
// would leave it idle. The server says how many of the stream's bytes it
// has received (proto.ChunkPutBatch.received); from that, levels knows
// how long the bytes sent wait before they arrive: a queue in the link.
// It goes to Better while a queue of over queueHigh builds and Better
// would still keep the link as full (at the link's rate, measured while
// the queue lasts); it goes back when the queue has gone and compressing
// keeps the sender busy over half the time. Each change begins a new zstd
// frame, which starts without history, so after its first change it
// changes at most once each levelHold. A stream begins at the level its
// client's last stream ended at: the link is most often the same.
type levels struct {
	now func() time.Time
	// last is the client's record of the level its streams chose last.
	last *atomic.Int32

	mu       sync.Mutex
	level    zwire.Level
	began    time.Time // the stream's
	switched time.Time // the last change, if any
	// sends marks each batch sent that the server has not said it
	// received: the stream's byte count after it, and when it was sent.
	sends []mark
	total int64
	// base is the least delay seen from a batch's sending to the
	// server's saying it arrived (a round trip and the server's own
	// time); queue is the last delay beyond it.
	base, queue time.Duration
	// acks are what the server said it received, and when, over the
	// last rateOver: the link's rate while a queue lasts.
	acks []mark
	// Of the batches compressed at this level since it was chosen: their
	// bytes before and after, and the time compressing them took.
	raw, wire int64
	busy      time.Duration
}

// mark is a count of a stream's bytes at a time.
type mark struct {
	n int64
	t time.Time
}

const (
	// maxSends bounds the batches levels remembers unacknowledged (a
	// server that never says what it received leaves them all).
	maxSends  = 1 << 16
	queueHigh = time.Second
	queueLow  = 200 * time.Millisecond
	levelHold = 5 * time.Second
	rateOver  = 3 * time.Second
	// betterCost and betterGain are Better's CPU and bytes against
	// Default's, as measured on a build's outputs in a wide window.
	betterCost = 3.0
	betterGain = 1.4
)

func newLevels(now func() time.Time, last *atomic.Int32) *levels {
	return &levels{now: now, last: last, level: zwire.Level(last.Load()), began: now()}
}

// choose returns the level to compress the next batch at, changing it if
// the stream calls for it.
func (l *levels) choose() zwire.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	from := l.switched // what busy and the counts measure since
	if from.IsZero() {
		from = l.began
	} else if now.Sub(from) < levelHold {
		return l.level
	}
	if l.busy <= 0 {
		return l.level
	}
	since := now.Sub(from)
	speed := float64(l.raw) / l.busy.Seconds()
	ratio := float64(l.raw) / float64(max(l.wire, 1))
	switch l.level {
	case zwire.Default:
		rate := l.rateLocked()
		if l.queue > queueHigh && rate > 0 && speed/betterCost > rate*ratio*betterGain {
			l.change(zwire.Better, now)
		}
	case zwire.Better:
		// The queue is known once the server has said what it received
		// over long enough.
		if l.rateLocked() > 0 && l.queue < queueLow && l.busy > since/2 {
			l.change(zwire.Default, now)
		}
	}
	return l.level
}

func (l *levels) change(to zwire.Level, now time.Time) {
	l.level, l.switched = to, now
	l.raw, l.wire, l.busy = 0, 0, 0
	l.last.Store(int32(to))
}

// rateLocked returns the rate, in bytes a second, at which the server
// received the stream's bytes over the last rateOver, or 0 if it did not
// say so over long enough.
func (l *levels) rateLocked() float64 {
	if len(l.acks) < 2 {
		return 0
	}
	first, last := l.acks[0], l.acks[len(l.acks)-1]
	d := last.t.Sub(first.t)
	if d < rateOver/3 {
		return 0
	}
	return float64(last.n-first.n) / d.Seconds()
}

// sent records batch m, packed (and compressed, if it is, at the
// current level) in took, as sent.
func (l *levels) sent(m *proto.ChunkPutBatch, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m.Zstd {
		l.raw += int64(m.Size)
		l.wire += int64(len(m.Batch))
		l.busy += took
	}
	l.total += int64(len(m.Batch))
	if len(l.sends) == maxSends {
		l.sends = slices.Delete(l.sends, 0, maxSends/2)
	}
	l.sends = append(l.sends, mark{l.total, l.now()})
}

// received records that the server said it received n bytes of the
// stream.
func (l *levels) received(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	// The batch that brought the count to n is the last one it covers.
	var at time.Time
	for len(l.sends) > 0 && l.sends[0].n <= n {
		at = l.sends[0].t
		l.sends = l.sends[1:]
	}
	if at.IsZero() {
		return
	}
	delay := now.Sub(at)
	if l.base == 0 || delay < l.base {
		l.base = delay
	}
	l.queue = delay - l.base
	l.acks = append(l.acks, mark{n, now})
	for len(l.acks) > 1 && now.Sub(l.acks[1].t) >= rateOver {
		l.acks = l.acks[1:]
	}
}
