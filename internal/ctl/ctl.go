// Package ctl is the layer that serves a stack's control file, ferry.CtlPath.
//
// Reading the file returns the state of this layer followed by that of the
// layers below it. Writing lines to it runs commands: "pass CMD" hands CMD to
// the layer below; "NAME CMD" hands CMD to the layer of that name, this
// one or one below it in the same process (the name of its "[NAME]"
// heading); "sync" goes to this layer's Controller and then to every
// layer below; anything else goes to this layer's Controller, which must
// know "sync". All other
// paths go to the layer below unchanged. The file is not listed by Find, so a
// tree download never picks it up; a real file named Ctl at the top of the
// tree below is shadowed.
package ctl

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ferryfs/ferry"
)

// maxCommand bounds what a write to the control file may carry.
const maxCommand = 64 << 10

// Controller is what a layer reports and obeys through the control file.
type Controller = ferry.Controller

// Server is implemented by layers that serve a control file, so a layer
// above knows whether to include theirs.
type Server interface {
	ServesCtl() bool
}

// Tree serves the control file of the layer named name over below.
type Tree struct {
	ferry.FS
	name string
	c    Controller
}

var (
	_ ferry.FS        = (*Tree)(nil)
	_ ferry.Unwrapper = (*Tree)(nil)
	_ Server          = (*Tree)(nil)
)

// New returns below with a control file for the layer name run by c.
func New(name string, below ferry.FS, c Controller) *Tree {
	return &Tree{FS: below, name: name, c: c}
}

// ServesCtl implements Server.
func (t *Tree) ServesCtl() bool { return true }

// Namer is implemented by control layers that know their names and
// those of the control layers below them in the same process.
type Namer interface {
	CtlNames() []string
}

// CtlNames implements Namer.
func (t *Tree) CtlNames() []string {
	names := []string{t.name}
	if n, ok := ferry.As[Namer](t.FS); ok && t.belowServes() {
		names = append(names, n.CtlNames()...)
	}
	return names
}

// Unwrap implements ferry.Unwrapper.
func (t *Tree) Unwrap() ferry.FS { return t.FS }

func (t *Tree) belowServes() bool {
	// A layer between (the client's cache) passes the file through.
	s, ok := ferry.As[Server](t.FS)
	return ok && s.ServesCtl()
}

// Status returns the text of the control file: this layer's state and then
// that of each layer below, each under a "[name]" heading.
func (t *Tree) Status(ctx context.Context) (string, error) {
	var b strings.Builder
	b.WriteString("[" + t.name + "]\n")
	b.WriteString(t.c.Status(ctx))
	if t.belowServes() {
		r := t.FS.Get(ctx, ferry.CtlPath, 0, -1)
		below, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return "", err
		}
		b.Write(below)
	}
	return b.String(), nil
}

func (t *Tree) ctlDir(size int) ferry.Dir {
	d := ferry.Dir{
		ferry.AttrName: "Ctl",
		ferry.AttrPath: ferry.CtlPath,
		ferry.AttrType: ferry.TypeFile,
		ferry.AttrMode: "0644",
	}
	d.SetInt(ferry.AttrSize, int64(size))
	d.SetMtime(time.Now())
	return d
}

// Stat implements ferry.Tree.
func (t *Tree) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	if !ferry.IsCtl(p) {
		return t.FS.Stat(ctx, p)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		s, err := t.Status(ctx)
		if err != nil {
			return nil, err
		}
		return t.ctlDir(len(s)), nil
	})
}

// Get implements ferry.Tree.
func (t *Tree) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	if !ferry.IsCtl(p) {
		return t.FS.Get(ctx, p, off, count)
	}
	s, err := t.Status(ctx)
	if err != nil {
		return ferry.ErrReader(err)
	}
	if off < 0 || off > int64(len(s)) {
		off = int64(len(s))
	}
	s = s[off:]
	if count >= 0 && count < int64(len(s)) {
		s = s[:count]
	}
	return io.NopCloser(strings.NewReader(s))
}

// Put implements ferry.Tree: data put to the control file is run as
// commands, one a line, stopping at the first that fails.
func (t *Tree) Put(ctx context.Context, p string, d ferry.Dir, off int64, data io.Reader) *ferry.Future[ferry.Dir] {
	if !ferry.IsCtl(p) {
		return t.FS.Put(ctx, p, d, off, data)
	}
	const op = "ctl.Put"
	return ferry.Go(func() (ferry.Dir, error) {
		var buf bytes.Buffer
		if data != nil {
			n, err := io.Copy(&buf, io.LimitReader(data, maxCommand+1))
			if err != nil {
				return nil, ferry.E(op, p, err)
			}
			if n > maxCommand {
				return nil, ferry.E(op, p, ferry.KindInvalid, "command too long")
			}
		}
		for _, line := range strings.Split(buf.String(), "\n") {
			if err := t.Command(ctx, line); err != nil {
				return nil, err
			}
		}
		return t.ctlDir(0), nil
	})
}

// Command runs one command line: "pass CMD" forwards CMD to the layer
// below, "NAME CMD" to the layer named NAME.
func (t *Tree) Command(ctx context.Context, line string) error {
	const op = "ctl.Command"
	args := strings.Fields(line)
	if len(args) == 0 {
		return nil
	}
	if args[0] == "sync" && len(args) == 1 {
		// sync reaches every layer, this one first: what a layer above
		// holds back is written through the layers below it.
		if err := t.c.Command(ctx, args); err != nil {
			return err
		}
		if t.belowServes() {
			_, err := t.FS.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader("sync")).Wait()
			return err
		}
		return nil
	}
	if len(args) > 1 && args[0] == t.name {
		return t.Command(ctx, strings.Join(args[1:], " "))
	}
	if n, ok := ferry.As[Namer](t.FS); ok && len(args) > 1 && t.belowServes() && slices.Contains(n.CtlNames(), args[0]) {
		_, err := t.FS.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader(strings.Join(args, " "))).Wait()
		return err
	}
	if args[0] == "pass" {
		if !t.belowServes() {
			return ferry.E(op, ferry.CtlPath, ferry.KindInvalid, "no layer below "+t.name+" to pass to")
		}
		rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "pass"))
		_, err := t.FS.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader(rest)).Wait()
		return err
	}
	return t.c.Command(ctx, args)
}

// The control file cannot be moved, removed or changed.

func denied(op string) error {
	return ferry.E(op, ferry.CtlPath, ferry.KindPermission, "the control file cannot be changed this way")
}

// Move implements ferry.Tree.
func (t *Tree) Move(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	if ferry.IsCtl(from) || ferry.IsCtl(to) {
		return ferry.Resolved[ferry.Dir](nil, denied("ctl.Move"))
	}
	return t.FS.Move(ctx, from, to)
}

// Link implements ferry.Tree.
func (t *Tree) Link(ctx context.Context, from, to string) *ferry.Future[ferry.Dir] {
	if ferry.IsCtl(from) || ferry.IsCtl(to) {
		return ferry.Resolved[ferry.Dir](nil, denied("ctl.Link"))
	}
	return t.FS.Link(ctx, from, to)
}

// Remove implements ferry.Tree.
func (t *Tree) Remove(ctx context.Context, p string) *ferry.Future[struct{}] {
	if ferry.IsCtl(p) {
		return ferry.Resolved(struct{}{}, denied("ctl.Remove"))
	}
	return t.FS.Remove(ctx, p)
}

// RemoveAll implements ferry.Tree.
func (t *Tree) RemoveAll(ctx context.Context, p string) *ferry.Future[struct{}] {
	if ferry.IsCtl(p) {
		return ferry.Resolved(struct{}{}, denied("ctl.RemoveAll"))
	}
	return t.FS.RemoveAll(ctx, p)
}

// Wstat implements ferry.Tree.
func (t *Tree) Wstat(ctx context.Context, p string, d ferry.Dir) *ferry.Future[ferry.Dir] {
	if ferry.IsCtl(p) {
		return ferry.Resolved[ferry.Dir](nil, denied("ctl.Wstat"))
	}
	return t.FS.Wstat(ctx, p, d)
}
