package replica

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/history"
)

// TestHistoryAcrossSites records whole-file writes and reads by clients at
// three sites 60 ms apart, on the same few files, and checks the history
// with Porcupine: every read sees the latest write that finished before it
// began, or one concurrent with it. Then the copies must be identical.
// With a short idle time the controls move between the sites; with a
// long one, most changes are forwarded to the member that holds them.
func TestHistoryAcrossSites(t *testing.T) {
	for _, idle := range []time.Duration{50 * time.Millisecond, time.Second} {
		t.Run(fmt.Sprint("idle ", idle), func(t *testing.T) { historyAcrossSites(t, idle) })
	}
}

func historyAcrossSites(t *testing.T, idle time.Duration) {
	s := newDelayedSites(t, idle, 30*time.Millisecond)
	files := []string{"/k0", "/k1"}
	var rec history.Recorder
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := 0
	for _, site := range []string{"a", "b", "c"} {
		for range 2 {
			id := client
			client++
			f := s.fs[site]
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(id), 7))
				for i := range 25 {
					op := history.Op{Client: id, File: files[rng.IntN(len(files))], Write: rng.IntN(2) == 0, Call: time.Now()}
					if op.Write {
						op.Value = fmt.Sprintf("client %d write %d", id, i)
						if _, err := f.Put(ctx, op.File, nil, ferry.Whole, strings.NewReader(op.Value)).Wait(); err != nil {
							t.Errorf("client %d at %s: write %s: %v", id, site, op.File, err)
							return
						}
					} else {
						r := f.Get(ctx, op.File, 0, -1)
						b, err := io.ReadAll(r)
						r.Close()
						if err != nil && ferry.KindOf(err) != ferry.KindNotExist {
							t.Errorf("client %d at %s: read %s: %v", id, site, op.File, err)
							return
						}
						op.Value = string(b)
					}
					op.Return = time.Now()
					rec.Add(op)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		for n, f := range s.fs {
			f.mu.Lock()
			held := fmt.Sprint(len(f.held))
			for p, u := range f.held {
				held += fmt.Sprintf(" %s%+v", p, *u)
			}
			f.mu.Unlock()
			t.Logf("%s: %s pending %d acked %v held %s", n, s.sets[n].Status(ctx), f.out.pending(), f.out.acked, held)
		}
		return
	}
	if err := rec.Check(30*time.Second, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var forwarded, grants int64
	for _, set := range s.sets {
		forwarded += set.stats.forwarded.Load()
		grants += set.stats.grants.Load()
	}
	t.Logf("%d changes forwarded to their holder, %d grants", forwarded, grants)
	s.same(t)
}
