// Package history checks recorded histories of whole-file operations,
// and of operations on the names in a directory (dir.go), made by clients
// of any front end at any site, with Porcupine
// (github.com/anishathalye/porcupine): each file is a register, so an open
// and read after another client's write and close returned must see that
// write or a later one; each directory a set of names.
package history

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one operation: a whole-file write of Value, or a read that
// returned Value ("" for no file).
type Op struct {
	Client int
	File   string
	Write  bool
	Value  string
	Call   time.Time
	Return time.Time
}

// Recorder collects the whole-file operations of concurrent clients.
type Recorder struct{ ops[Op] }

// ops collects operations of concurrent clients.
type ops[T any] struct {
	mu   sync.Mutex
	list []T
}

// Add records op.
func (r *ops[T]) Add(op T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, op)
}

// Len returns how many operations were recorded.
func (r *ops[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.list)
}

// all returns the operations recorded so far.
func (r *ops[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// registers is the sequential model: each file a register, absent first.
var registers = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		return partition(h, func(op porcupine.Operation) string { return op.Input.(Op).File })
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(Op)
		if in.Write {
			return true, in.Value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(Op)
		if in.Write {
			return fmt.Sprintf("write %s %q", in.File, in.Value)
		}
		return fmt.Sprintf("read %s -> %q", in.File, output)
	},
}

// Check checks the recorded history within timeout. On a violation the
// error names a visualization written to dir.
func (r *Recorder) Check(timeout time.Duration, dir string) error {
	var h []porcupine.Operation
	for _, op := range r.all() {
		var out any = ""
		if !op.Write {
			out = op.Value
		}
		h = append(h, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call.UnixNano(), Output: out, Return: op.Return.UnixNano()})
	}
	return check(registers, h, timeout, dir)
}

// partition splits a history by the object each operation is on (key),
// in the order the objects first appear.
func partition(h []porcupine.Operation, key func(porcupine.Operation) string) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range h {
		k := key(op)
		if by[k] == nil {
			keys = append(keys, k)
		}
		by[k] = append(by[k], op)
	}
	var out [][]porcupine.Operation
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}

// check checks h against model within timeout; on a violation the error
// names a visualization written to dir.
func check(model porcupine.Model, h []porcupine.Operation, timeout time.Duration, dir string) error {
	res, info := porcupine.CheckOperationsVerbose(model, h, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("history: no verdict on %d operations within %v", len(h), timeout)
	}
	path := filepath.Join(dir, "history.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		path = err.Error()
	}
	where := ""
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		where = " (see " + path + ")"
	}
	return fmt.Errorf("history: %d operations are not linearizable%s; the objects that are not:\n%s", len(h), where, illegal(model, h, timeout))
}

// illegal describes, one per line in the order called, the operations on
// each object whose history alone is not linearizable, with their call
// and return times in milliseconds from the first call: a test's temporary
// directory, and the visualization in it, go when the test ends.
func illegal(model porcupine.Model, h []porcupine.Operation, timeout time.Duration) string {
	if len(h) == 0 {
		return ""
	}
	start := h[0].Call
	for _, op := range h {
		start = min(start, op.Call)
	}
	var b strings.Builder
	for _, part := range model.Partition(h) {
		if porcupine.CheckOperationsTimeout(model, part, timeout) != porcupine.Illegal {
			continue
		}
		part = slices.Clone(part)
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		for _, op := range part {
			fmt.Fprintf(&b, "  client %d [%.1f, %.1f] %s\n", op.ClientId, float64(op.Call-start)/1e6, float64(op.Return-start)/1e6, model.DescribeOperation(op.Input, op.Output))
		}
		b.WriteString("\n")
	}
	return b.String()
}
