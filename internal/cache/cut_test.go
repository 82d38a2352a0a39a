package cache

import (
	"bytes"
	"context"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// TestCutTakesRewrites: a backlog over one group's limits is cut into
// groups that each leave a state the holder was in, though a file's store
// rewritten in place (stored again) after a later op was issued holds the
// later content: the cut takes the ops up to that rewrite too.
func TestCutTakesRewrites(t *testing.T) {
	g := &fakeGrouper{tree: map[string]byte{}}
	w := newWriteback(time.Minute, nil, g)
	w.aging = time.Hour // Cut only when hastened, below.
	defer w.close()
	// Three files of 3 MiB: two fill a group (groupBytes).
	file := func(tag byte) *fileStore {
		return &fileStore{d: ferry.Dir{}, buf: bytes.Repeat([]byte{tag}, 3<<20)}
	}
	store := func(p string, f *fileStore) {
		w.startFile(p, f, func(ctx context.Context, t changer, f *fileStore) error {
			_, err := t.Put(ctx, p, f.d, ferry.Whole, bytes.NewReader(f.buf)).Wait()
			return err
		})
	}
	store("/a", file('1'))
	store("/b", file('b'))
	store("/c", file('c'))
	if _, ok := w.rewrite("/a", func(*fileStore) *fileStore { return file('2') }); !ok {
		t.Fatal("the store of /a was not rewritten in place")
	}
	holder := []map[string]byte{
		{"/a": '1'},
		{"/a": '1', "/b": 'b'},
		{"/a": '1', "/b": 'b', "/c": 'c'},
		{"/a": '2', "/b": 'b', "/c": 'c'},
	}
	w.mu.Lock()
	for _, op := range w.queue {
		op.hasten()
	}
	w.mu.Unlock()
	w.nudge()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.sync(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.states) == 0 {
		t.Fatal("no group was committed")
	}
	for i, st := range g.states {
		if !slices.ContainsFunc(holder, func(h map[string]byte) bool { return maps.Equal(h, st) }) {
			t.Errorf("after group %d of %d the tree below is %q, a state the holder never had", i+1, len(g.states), st)
		}
	}
}

// fakeGrouper applies groups of whole-file puts to a tree of one byte a
// file, and records the tree after each.
type fakeGrouper struct {
	mu     sync.Mutex
	tree   map[string]byte
	states []map[string]byte
}

func (g *fakeGrouper) Group() ferry.Group {
	return &fakeGroup{g: g, done: make(chan struct{})}
}

type fakeGroup struct {
	g    *fakeGrouper
	mu   sync.Mutex
	puts map[string]byte
	done chan struct{}
}

func (fg *fakeGroup) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	b, err := io.ReadAll(data)
	if err != nil || len(b) == 0 {
		return ferry.Resolved[ferry.Dir](nil, ferry.E("fake.Put", p, ferry.KindInvalid, "no data"))
	}
	fg.mu.Lock()
	if fg.puts == nil {
		fg.puts = map[string]byte{}
	}
	fg.puts[p] = b[0]
	fg.mu.Unlock()
	return ferry.Go(func() (ferry.Dir, error) {
		<-fg.done
		return ferry.Dir{ferry.AttrName: p}, nil
	})
}

func (fg *fakeGroup) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	return ferry.Resolved[ferry.Dir](nil, ferry.E("fake.Move", from, ferry.KindInvalid, "not in this test"))
}

func (fg *fakeGroup) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	return ferry.Resolved(struct{}{}, ferry.E("fake.Remove", p, ferry.KindInvalid, "not in this test"))
}

func (fg *fakeGroup) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	return ferry.Resolved[ferry.Dir](nil, ferry.E("fake.Wstat", p, ferry.KindInvalid, "not in this test"))
}

func (fg *fakeGroup) Commit(ctx context.Context) error {
	fg.g.mu.Lock()
	fg.mu.Lock()
	maps.Copy(fg.g.tree, fg.puts)
	fg.mu.Unlock()
	fg.g.states = append(fg.g.states, maps.Clone(fg.g.tree))
	fg.g.mu.Unlock()
	close(fg.done)
	return nil
}
