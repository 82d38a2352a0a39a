package cache_test

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/servertest"
)

// treeState is a tree's files, each as its mode and content, in a form
// two states compare by.
type treeState map[string]string

func (s treeState) String() string {
	keys := slices.Sorted(maps.Keys(s))
	var b strings.Builder
	for _, k := range keys {
		v := s[k]
		if len(v) > 24 {
			v = fmt.Sprintf("%s... (%d bytes)", v[:24], len(v))
		}
		fmt.Fprintf(&b, "%s=%q ", k, v)
	}
	return b.String()
}

// diskState reads the files below dir on the server's disk.
func diskState(t *testing.T, dir string) treeState {
	t.Helper()
	st := treeState{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st[rel] = fmt.Sprintf("%o:%s", fi.Mode().Perm(), b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestHolderKilledLeavesPrefix: a write-lease holder whose connections are
// cut (a killed client) with changes kept back leaves the server's tree in
// a state the holder's own tree was in after some prefix of the changes
// it made, in order: never a later change without an earlier one, never a
// half-written file. Each round makes a random run of puts (some large
// enough to be staged by chunks), renames, removals and mode changes, and
// cuts the link at a random moment; the tree on the server's disk, once
// quiet, must be one of the states the run went through.
func TestHolderKilledLeavesPrefix(t *testing.T) {
	const rounds = 12
	var partial atomic.Int32
	t.Run("rounds", func(t *testing.T) {
		for round := range rounds {
			t.Run(fmt.Sprint(round), func(t *testing.T) {
				t.Parallel()
				if killedRound(t, round, cache.Options{WriteBehind: true, CallTimeout: 5 * time.Second}) {
					partial.Add(1)
				}
			})
		}
	})
	// A round whose cut fell between two groups shows the test can tell
	// a prefix from a jumble; one cut before the first or after the last
	// store proves less.
	if partial.Load() == 0 && !t.Failed() {
		t.Errorf("no round of %d left the server between its first and last change: the cuts prove nothing", rounds)
	}
	t.Logf("%d of %d rounds left the server part of the way through", partial.Load(), rounds)
}

// killedRound runs one round of TestHolderKilledLeavesPrefix and reports
// whether the server was left strictly between the first and last state.
func killedRound(t *testing.T, round int, opt cache.Options) bool {
	rng := rand.New(rand.NewPCG(uint64(round), 17))
	s := servertest.StartChunked(t, "")
	sw := servertest.SwitchProxy(t, s.Addr)
	c := open(t, s.ClientVia(t, "a", servertest.DelayProxy(t, sw.Addr, 3*time.Millisecond)), opt)
	ctx := context.Background()
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	// The model: each file's mode and content after each change.
	type file struct {
		mode string
		data string
	}
	model := map[string]file{}
	snapshot := func() treeState {
		st := treeState{}
		for p, f := range model {
			st[p] = f.mode + ":" + f.data
		}
		return st
	}
	states := []treeState{snapshot()}
	var killed atomic.Bool
	cutAt := time.Duration(300+rng.IntN(2700)) * time.Millisecond
	time.AfterFunc(cutAt, func() {
		killed.Store(true)
		sw.Down()
	})
	const files = 16
	names := func() []string { return slices.Sorted(maps.Keys(model)) }
	began := time.Now()
	for i := 0; time.Since(began) < 3500*time.Millisecond && !killed.Load(); i++ {
		ns := names()
		var err error
		switch k := rng.IntN(20); {
		case k < 12 || len(ns) == 0:
			name := fmt.Sprintf("f%d", rng.IntN(files))
			data := fmt.Sprintf("round %d change %d", round, i)
			if rng.IntN(6) == 0 {
				// Large enough to go by chunks: staged before its group.
				big := make([]byte, 100<<10+rng.IntN(100<<10))
				for j := range big {
					big[j] = byte(rng.Uint32())
				}
				data += string(big)
			}
			mode := "644"
			if old, ok := model[name]; ok {
				mode = old.mode
			}
			_, err = c.Put(ctx, "/d/"+name, ferry.Dir{}, ferry.Whole, strings.NewReader(data)).Wait()
			model[name] = file{mode, data}
		case k < 15:
			from, to := ns[rng.IntN(len(ns))], fmt.Sprintf("f%d", rng.IntN(files))
			if from == to {
				continue
			}
			_, err = c.Move(ctx, "/d/"+from, "/d/"+to).Wait()
			model[to] = model[from]
			delete(model, from)
		case k < 17:
			p := ns[rng.IntN(len(ns))]
			_, err = c.Remove(ctx, "/d/"+p).Wait()
			delete(model, p)
		default:
			p := ns[rng.IntN(len(ns))]
			mode := []string{"600", "640", "644", "755"}[rng.IntN(4)]
			_, err = c.Wstat(ctx, "/d/"+p, ferry.Dir{ferry.AttrMode: "0" + mode}).Wait()
			model[p] = file{mode, model[p].data}
		}
		if err != nil && !killed.Load() {
			t.Fatalf("change %d: %v", i, err)
		}
		states = append(states, snapshot())
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	// What the server took before the cut lands; then the tree is quiet.
	killed.Store(true)
	sw.Down()
	var got treeState
	for prev := (treeState)(nil); ; prev = got {
		time.Sleep(300 * time.Millisecond)
		got = diskState(t, filepath.Join(s.Dir, "d"))
		if prev != nil && got.String() == prev.String() {
			break
		}
	}
	for i, st := range states {
		if st.String() == got.String() {
			t.Logf("cut at %s: the server shows the state after %d of %d changes", cutAt, i, len(states)-1)
			return i > 0 && i < len(states)-1
		}
	}
	var b strings.Builder
	for i, st := range states {
		fmt.Fprintf(&b, "  after %d: %s\n", i, st)
	}
	t.Errorf("cut at %s: the server shows a state the holder never had:\n  %s\nthe holder's states:\n%s", cutAt, got, b.String())
	return false
}

// TestListingAfterKeptBackRename: a listing fetched while a rename is kept
// back does not bring back the old name from the server, which still has
// it: git and editors write a temporary file and rename it into place,
// then make the temporary name again, and a stale entry there made the
// kernel open the server's old file instead of creating one.
func TestListingAfterKeptBackRename(t *testing.T) {
	s := servertest.Start(t, "")
	ctx := context.Background()
	c := open(t, s.ClientVia(t, "a", servertest.DelayProxy(t, s.Addr, 5*time.Millisecond)), cache.Options{WriteBehind: true, LeaseIdle: time.Hour})
	if _, err := c.Make(ctx, "/d", ferry.Dir{ferry.AttrType: ferry.TypeDir}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := c.Put(ctx, "/d/tmp", ferry.Dir{}, ferry.Whole, strings.NewReader(fmt.Sprint(i))).Wait(); err != nil {
			t.Fatal(err)
		}
		// The server has the temporary file.
		if err := c.Sync(ctx, "/"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(s.Dir, "d", "tmp")); err != nil {
			t.Fatal(err)
		}
		// Its rename is kept back, and the listing fetched again.
		if _, err := c.Move(ctx, "/d/tmp", fmt.Sprintf("/d/f%d", i)).Wait(); err != nil {
			t.Fatal(err)
		}
		c.Drop()
		if d, err := c.Lookup(ctx, "/d", "tmp"); !ferry.IsKind(err, ferry.KindNotExist) {
			t.Fatalf("round %d: the renamed temporary file is looked up as %v, %v; want not found", i, d, err)
		}
		if _, err := c.Lookup(ctx, "/d", fmt.Sprintf("f%d", i)); err != nil {
			t.Fatalf("round %d: the rename's target: %v", i, err)
		}
	}
}
