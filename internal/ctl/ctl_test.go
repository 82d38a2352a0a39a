package ctl_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/local"
)

// recorder is a layer's Controller that records the commands it ran.
type recorder struct {
	name string
	log  *[]string
	fail string // A command it fails.
}

func (r recorder) Status(context.Context) string { return "name: " + r.name + "\n" }

func (r recorder) Command(_ context.Context, args []string) error {
	cmd := strings.Join(args, " ")
	if cmd == r.fail {
		return ferry.E("test", "", ferry.KindInvalid, "refused "+cmd)
	}
	*r.log = append(*r.log, r.name+": "+cmd)
	return nil
}

// stack returns three control layers, top first, over a local tree, each
// recording into log; the middle one fails the command fail.
func stack(t *testing.T, log *[]string, fail string) *ctl.Tree {
	lt, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lt.Close() })
	bottom := ctl.New("bottom", lt, recorder{"bottom", log, ""})
	middle := ctl.New("middle", bottom, recorder{"middle", log, fail})
	return ctl.New("top", middle, recorder{"top", log, ""})
}

func write(t *testing.T, top *ctl.Tree, cmds string) error {
	_, err := top.Put(context.Background(), ferry.CtlPath, nil, 0, strings.NewReader(cmds)).Wait()
	return err
}

func TestCommands(t *testing.T) {
	tests := []struct {
		name, cmds, fail string
		want             []string
		ok               bool
	}{
		{"own", "debug on", "", []string{"top: debug on"}, true},
		{"pass", "pass debug on", "", []string{"middle: debug on"}, true},
		{"pass twice", "pass pass x", "", []string{"bottom: x"}, true},
		{"sync reaches every layer, top first", "sync", "", []string{"top: sync", "middle: sync", "bottom: sync"}, true},
		{"a failing sync stops there", "sync", "sync", []string{"top: sync"}, false},
		{"lines in order, up to a failure", "a\npass b\nc", "b", []string{"top: a"}, false},
		{"pass below the bottom", "pass pass pass x", "", nil, false},
		{"by name, below", "bottom add c", "", []string{"bottom: add c"}, true},
		{"by name, this one", "top leader b", "", []string{"top: leader b"}, true},
		{"by name, then pass", "middle pass x", "", []string{"bottom: x"}, true},
		{"a name alone is a command", "bottom", "", []string{"top: bottom"}, true},
		{"no such layer: this one's command", "nowhere x", "", []string{"top: nowhere x"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log []string
			err := write(t, stack(t, &log, tt.fail), tt.cmds)
			if (err == nil) != tt.ok {
				t.Errorf("writing %q: %v, want ok %v", tt.cmds, err, tt.ok)
			}
			if strings.Join(log, "|") != strings.Join(tt.want, "|") {
				t.Errorf("ran %q, want %q", log, tt.want)
			}
		})
	}
}

// TestStatus: reading the file shows each layer, top first.
func TestStatus(t *testing.T) {
	var log []string
	r := stack(t, &log, "").Get(context.Background(), ferry.CtlPath, 0, -1)
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := "[top]\nname: top\n[middle]\nname: middle\n[bottom]\nname: bottom\n"
	if string(b) != want {
		t.Errorf("status %q, want %q", b, want)
	}
}
