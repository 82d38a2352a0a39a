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

	"github.com/anishathalye/porcupine"

	"github.com/ferryfs/ferry"
)

// regOp is one whole-file operation on a file: a write of value, or a read
// that returned value ("" for no file).
type regOp struct {
	file  string
	write bool
	value string
}

// registers is the sequential model of files written and read whole: each
// file a register, absent at first.
var registers = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			f := op.Input.(regOp).file
			if by[f] == nil {
				keys = append(keys, f)
			}
			by[f] = append(by[f], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.write {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(regOp)
		if in.write {
			return fmt.Sprintf("write %s %q", in.file, in.value)
		}
		return fmt.Sprintf("read %s -> %q", in.file, output)
	},
}

// TestHistoryAcrossSites records whole-file writes and reads by clients at
// three sites 60 ms apart, on the same few files, and checks the history
// with Porcupine: every read sees the latest write that finished before it
// began, or one concurrent with it. Then the copies must be identical.
func TestHistoryAcrossSites(t *testing.T) {
	s := newDelayedSites(t, 50*time.Millisecond, 30*time.Millisecond)
	files := []string{"/k0", "/k1"}
	var mu sync.Mutex
	var history []porcupine.Operation
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
					op := regOp{file: files[rng.IntN(len(files))], write: rng.IntN(2) == 0}
					call := time.Now().UnixNano()
					var out string
					if op.write {
						op.value = fmt.Sprintf("client %d write %d", id, i)
						if _, err := f.Put(ctx, op.file, nil, ferry.Whole, strings.NewReader(op.value)).Wait(); err != nil {
							t.Errorf("client %d at %s: write %s: %v", id, site, op.file, err)
							return
						}
					} else {
						r := f.Get(ctx, op.file, 0, -1)
						b, err := io.ReadAll(r)
						r.Close()
						if err != nil && ferry.KindOf(err) != ferry.KindNotExist {
							t.Errorf("client %d at %s: read %s: %v", id, site, op.file, err)
							return
						}
						out = string(b)
					}
					ret := time.Now().UnixNano()
					mu.Lock()
					history = append(history, porcupine.Operation{ClientId: id, Input: op, Call: call, Output: out, Return: ret})
					mu.Unlock()
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
	res, info := porcupine.CheckOperationsVerbose(registers, history, 30*time.Second)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		porcupine.VisualizePath(registers, info, path)
		t.Fatalf("history of %d operations is %s (visualized in %s)", len(history), res, path)
	}
	s.same(t)
}
