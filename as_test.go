package ferry_test

import (
	"context"
	"testing"

	"github.com/ferryfs/ferry"
)

// over is a layer over another that adds nothing.
type over struct{ ferry.FS }

func (o over) Unwrap() ferry.FS { return o.FS }

// hiding is a layer that does not say what is below it.
type hiding struct{ ferry.FS }

// watching is an FS that can watch.
type watching struct{ ferry.FS }

func (watching) Watch(context.Context, string) *ferry.Stream[ferry.Event] { return nil }

func TestAs(t *testing.T) {
	w := watching{}
	tests := []struct {
		name  string
		stack ferry.FS
		found bool
	}{
		{"the top", w, true},
		{"one layer down", over{w}, true},
		{"two layers down", over{over{w}}, true},
		{"behind a layer that hides it", over{hiding{w}}, false},
		{"nowhere", over{hiding{}}, false},
		{"no stack", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ferry.As[ferry.Watcher](tt.stack)
			if ok != tt.found || ok && got != ferry.Watcher(w) {
				t.Errorf("As = %v, %v; want found %v", got, ok, tt.found)
			}
		})
	}
}
