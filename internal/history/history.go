// Package history checks recorded histories of whole-file operations,
// made by clients of any front end at any site, with Porcupine
// (github.com/anishathalye/porcupine): each file is a register, so an open
// and read after another client's write and close returned must see that
// write or a later one.
package history

import (
	"fmt"
	"os"
	"path/filepath"
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

// Recorder collects the operations of concurrent clients.
type Recorder struct {
	mu  sync.Mutex
	ops []Op
}

// Add records op.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// Len returns how many operations were recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

// registers is the sequential model: each file a register, absent first.
var registers = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var files []string
		for _, op := range h {
			f := op.Input.(Op).File
			if by[f] == nil {
				files = append(files, f)
			}
			by[f] = append(by[f], op)
		}
		var out [][]porcupine.Operation
		for _, f := range files {
			out = append(out, by[f])
		}
		return out
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
	r.mu.Lock()
	var h []porcupine.Operation
	for _, op := range r.ops {
		var out any = ""
		if !op.Write {
			out = op.Value
		}
		h = append(h, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call.UnixNano(), Output: out, Return: op.Return.UnixNano()})
	}
	r.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(registers, h, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("history: no verdict on %d operations within %v", len(h), timeout)
	}
	path := filepath.Join(dir, "history.html")
	if err := porcupine.VisualizePath(registers, info, path); err != nil {
		path = err.Error()
	}
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		return fmt.Errorf("history: %d operations are not linearizable (see %s)", len(h), path)
	}
	return fmt.Errorf("history: %d operations are not linearizable", len(h))
}
