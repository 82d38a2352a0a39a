package remote

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/proto"
	"github.com/ferryfs/ferry/internal/zwire"
)

// TestLevels runs a batch stream's sender against a simulated link, in
// virtual time: the link carries the stream's bytes at its rate, one way
// in 60 ms, and the server says what it received as each batch arrives.
// Default compresses 256 KiB batches in 5 ms to a third, Better in three
// times as long to 1.4 times less. levels must choose Better only where
// the link holds the stream back and Better still fills it, and go back
// when the link no longer does.
func TestLevels(t *testing.T) {
	const batch = 256 << 10
	for _, tc := range []struct {
		name string
		// rates is the link's rate in bytes a second, each for 30 s.
		rates []float64
		// busy: the sender has batches ready at once, as a copy of a
		// large tree does, rather than one each 50 ms.
		busy bool
		// start is the level the client's last stream chose.
		start zwire.Level
		want  []zwire.Level // at the end of each rate's 30 s
	}{
		{"4 Mbit/s, a build's pace", []float64{500e3}, false, zwire.Default, []zwire.Level{zwire.Better}},
		{"4 Mbit/s, a copy", []float64{500e3}, true, zwire.Default, []zwire.Level{zwire.Better}},
		{"100 Mbit/s, a copy", []float64{12.5e6}, true, zwire.Default, []zwire.Level{zwire.Default}},
		{"100 Mbit/s, a build's pace", []float64{12.5e6}, false, zwire.Default, []zwire.Level{zwire.Default}},
		{"4 then 1000 Mbit/s, a copy", []float64{500e3, 125e6}, true, zwire.Default, []zwire.Level{zwire.Better, zwire.Default}},
		{"4 Mbit/s after a slow stream", []float64{500e3}, true, zwire.Better, []zwire.Level{zwire.Better}},
		{"1000 Mbit/s after a slow stream", []float64{125e6}, true, zwire.Better, []zwire.Level{zwire.Default}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const (
				step   = time.Millisecond
				oneWay = 60 * time.Millisecond
				window = 32 << 20 // gRPC's flow control: what may be sent and not received
			)
			now := time.Unix(0, 0)
			var chosen atomic.Int32
			chosen.Store(int32(tc.start))
			l := newLevels(func() time.Time { return now }, &chosen)
			type event struct {
				at time.Time
				n  int64
			}
			// Batches on their way to the link's queue, and the
			// server's acknowledgements on their way back.
			var going, acks []event
			var sent, queued, delivered float64
			var acked int64
			var ready time.Time // When the batch being compressed is sent.
			var wire, raw int
			var took time.Duration
			nextBatch := now
			var changes int
			last := l.level
			end := now
			for i, rate := range tc.rates {
				for end = end.Add(30 * time.Second); now.Before(end); now = now.Add(step) {
					for len(going) > 0 && !going[0].at.After(now) {
						queued = float64(going[0].n)
						going = going[1:]
					}
					before := delivered
					delivered = min(queued, delivered+rate*step.Seconds())
					if delivered > before {
						acks = append(acks, event{now.Add(oneWay), int64(delivered)})
					}
					for len(acks) > 0 && !acks[0].at.After(now) {
						acked = acks[0].n
						l.received(acked)
						acks = acks[1:]
					}
					if !ready.IsZero() && !ready.After(now) {
						l.sent(&proto.ChunkPutBatch{Batch: make([]byte, wire), Zstd: true, Size: uint32(raw)}, took)
						sent += float64(wire)
						going = append(going, event{now.Add(oneWay), int64(sent)})
						ready = time.Time{}
					}
					if ready.IsZero() && !now.Before(nextBatch) && int64(sent)-acked < window {
						level := l.choose()
						if level != last {
							changes++
							last = level
						}
						took, wire, raw = 5*time.Millisecond, batch/3, batch
						if level == zwire.Better {
							took, wire = 15*time.Millisecond, batch*10/42
						}
						ready = now.Add(took)
						if !tc.busy {
							nextBatch = now.Add(50 * time.Millisecond)
						}
					}
				}
				if got := l.choose(); got != tc.want[i] {
					t.Errorf("after %d s at %.1f Mbit/s: level %v, want %v (queue %v)", 30*(i+1), rate*8/1e6, got, tc.want[i], l.queue)
				}
			}
			if changes > len(tc.rates) {
				t.Errorf("the level changed %d times, want at most %d", changes, len(tc.rates))
			}
		})
	}
}
