package history

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// DirOp is one operation on the names in a directory, by any client at
// any site: Add puts a file under Name; Remove removes Name, and Rename
// renames it to To in the same directory, each reporting in OK whether
// Name was there; List returns the names the directory holds, in Names.
// The model is the directory's set of names, so a listing that began
// after a change returned must show it or a later state.
type DirOp struct {
	Client   int
	Dir      string
	Kind     DirKind
	Name, To string
	OK       bool
	Names    []string
	Call     time.Time
	Return   time.Time
}

// DirKind is what a DirOp does.
type DirKind string

// The kinds of DirOp.
const (
	Add    DirKind = "add"
	Remove DirKind = "remove"
	Rename DirKind = "rename"
	List   DirKind = "list"
)

// DirRecorder collects the directory operations of concurrent clients.
type DirRecorder struct{ ops[DirOp] }

// names is a set of names as the model keeps it: sorted, joined by "/"
// (which no name holds), so that states compare as strings.
func names(ns []string) string {
	ns = slices.Clone(ns)
	slices.Sort(ns)
	return strings.Join(slices.Compact(ns), "/")
}

func split(state string) []string {
	if state == "" {
		return nil
	}
	return strings.Split(state, "/")
}

// directories is the sequential model: each directory a set of names,
// empty first.
var directories = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		return partition(h, func(op porcupine.Operation) string { return op.Input.(DirOp).Dir })
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in, have := input.(DirOp), split(state.(string))
		there := slices.Contains(have, in.Name)
		switch in.Kind {
		case Add:
			return true, names(append(have, in.Name))
		case Remove:
			if output.(bool) != there {
				return false, state
			}
			return true, names(slices.DeleteFunc(have, func(n string) bool { return n == in.Name }))
		case Rename:
			if output.(bool) != there {
				return false, state
			}
			if !there {
				return true, state
			}
			have = slices.DeleteFunc(have, func(n string) bool { return n == in.Name })
			return true, names(append(have, in.To))
		case List:
			return output.(string) == state.(string), state
		}
		return false, state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(DirOp)
		switch in.Kind {
		case List:
			return fmt.Sprintf("list %s -> %q", in.Dir, output)
		case Rename:
			return fmt.Sprintf("rename %s/%s %s -> %v", in.Dir, in.Name, in.To, output)
		case Remove:
			return fmt.Sprintf("remove %s/%s -> %v", in.Dir, in.Name, output)
		}
		return fmt.Sprintf("add %s/%s", in.Dir, in.Name)
	},
}

// Check checks the recorded history within timeout. On a violation the
// error names a visualization written to dir.
func (r *DirRecorder) Check(timeout time.Duration, dir string) error {
	var h []porcupine.Operation
	for _, op := range r.all() {
		var out any
		switch op.Kind {
		case Remove, Rename:
			out = op.OK
		case List:
			out = names(op.Names)
		}
		h = append(h, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call.UnixNano(), Output: out, Return: op.Return.UnixNano()})
	}
	return check(directories, h, timeout, dir)
}
