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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.clients(7, func(id int, site string, f *FS, rng *rand.Rand) {
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
	})
	if t.Failed() {
		s.dump(t)
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

// TestDirHistoryAcrossSites records adds, removes, renames and listings
// of the names in one directory by clients at three sites 60 ms apart,
// and checks the history with Porcupine: a listing sees every change that
// returned before it began, and a remove or rename finds the name exactly
// when the changes before it left it there.
func TestDirHistoryAcrossSites(t *testing.T) {
	for _, idle := range []time.Duration{50 * time.Millisecond, time.Second} {
		t.Run(fmt.Sprint("idle ", idle), func(t *testing.T) { dirHistoryAcrossSites(t, idle) })
	}
}

func dirHistoryAcrossSites(t *testing.T, idle time.Duration) {
	s := newDelayedSites(t, idle, 30*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.fs["a"].Put(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}, ferry.Whole, nil).Wait(); err != nil {
		t.Fatal(err)
	}
	var rec history.DirRecorder
	s.clients(11, func(id int, site string, f *FS, rng *rand.Rand) {
		name := func() string { return fmt.Sprint("n", rng.IntN(4)) }
		for range 20 {
			op := history.DirOp{Client: id, Dir: "/d", Name: name(), Call: time.Now()}
			var err error
			switch rng.IntN(4) {
			case 0:
				op.Kind = history.Add
				_, err = f.Put(ctx, "/d/"+op.Name, nil, ferry.Whole, strings.NewReader(op.Name)).Wait()
			case 1:
				op.Kind = history.Remove
				err = wait0(f.Remove(ctx, "/d/"+op.Name))
			case 2:
				op.Kind = history.Rename
				for op.To = name(); op.To == op.Name; op.To = name() {
				}
				_, err = f.Move(ctx, "/d/"+op.Name, "/d/"+op.To).Wait()
			default:
				op.Kind = history.List
				st := f.Find(ctx, "/d", "depth=1")
				for e := range st.All() {
					if e.Dir != nil && e.Err == nil {
						op.Names = append(op.Names, e.Dir.Name())
					}
				}
				err = st.Err()
			}
			op.OK = err == nil
			if err != nil && !(ferry.KindOf(err) == ferry.KindNotExist && (op.Kind == history.Remove || op.Kind == history.Rename)) {
				t.Errorf("client %d at %s: %s %s: %v", id, site, op.Kind, op.Name, err)
				return
			}
			op.Return = time.Now()
			rec.Add(op)
		}
	})
	if t.Failed() {
		s.dump(t)
		return
	}
	if err := rec.Check(30*time.Second, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var forwarded int64
	for _, set := range s.sets {
		forwarded += set.stats.forwarded.Load()
	}
	t.Logf("%d changes forwarded to their holder", forwarded)
	s.same(t)
}

// dump logs each member's status and the controls it holds, for a test
// whose calls failed.
func (s *sites) dump(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for n, f := range s.fs {
		f.mu.Lock()
		held := fmt.Sprint(len(f.held))
		for p, u := range f.held {
			held += fmt.Sprintf(" %s%+v", p, *u)
		}
		f.mu.Unlock()
		t.Logf("%s: %s pending %d acked %v held %s", n, s.sets[n].Status(ctx), f.out.pending(), f.out.acked, held)
	}
}

// clients runs two clients at each site at once, each calling fn with its
// id, its site's member and a random source seeded by its id and seed,
// and returns once all have.
func (s *sites) clients(seed uint64, fn func(id int, site string, f *FS, rng *rand.Rand)) {
	var wg sync.WaitGroup
	id := 0
	for _, site := range []string{"a", "b", "c"} {
		for range 2 {
			wg.Add(1)
			go func(id int) {
				defer wg.Done()
				fn(id, site, s.fs[site], rand.New(rand.NewPCG(uint64(id), seed)))
			}(id)
			id++
		}
	}
	wg.Wait()
}

// TestCrossedRenames has clients at every site rename among a few names
// at once, with controls on single paths that go idle fast: a rename that
// holds one of its two paths while it waits for the other must not keep
// it from a rival waiting the other way round, or both wait for ever.
func TestCrossedRenames(t *testing.T) {
	s := newSitesWith(t, &sites{testSet: newDelayedSet(t, 10*time.Millisecond, "a", "b", "c"), shallow: true}, 30*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.clients(3, func(id int, site string, f *FS, rng *rand.Rand) {
		for range 30 {
			from, to := fmt.Sprint("/n", rng.IntN(3)), fmt.Sprint("/n", rng.IntN(3))
			if from == to {
				if _, err := f.Put(ctx, from, nil, ferry.Whole, strings.NewReader(from)).Wait(); err != nil {
					t.Errorf("client %d at %s: put %s: %v", id, site, from, err)
					return
				}
				continue
			}
			if _, err := f.Move(ctx, from, to).Wait(); err != nil && ferry.KindOf(err) != ferry.KindNotExist {
				t.Errorf("client %d at %s: move %s %s: %v", id, site, from, to, err)
				return
			}
		}
	})
	if t.Failed() {
		s.dump(t)
		return
	}
	s.same(t)
}
