package cli

import (
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
)

func findCmd() *cobra.Command {
	var long bool
	c := &cobra.Command{
		Use:   "find HOST:PATH [PREDICATE...]",
		Short: "List the entries below PATH that match PREDICATE, in one request",
		Long: `Find walks the subtree at PATH on the server and prints the entries that
match PREDICATE as they stream in: the whole walk is one request.

Predicates (the README's Predicates section has them all): name~'*.go', path~'/src/**', type=f|d|l,
size>1M, age<2h, depth<=2, and/or/not (& | !), parentheses, and prune (do
not descend), e.g.  ferry find host:/src 'name=.git & prune | name~*.go'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[0], func(ctx context.Context, c *stack, t Target) error {
				return find(ctx, c, t.Path, strings.Join(args[1:], " "), long, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})
		},
	}
	c.Flags().BoolVarP(&long, "long", "l", false, "print all attributes of each entry")
	return c
}

func find(ctx context.Context, fs ferry.Finder, p, pred string, long bool, out, errOut io.Writer) error {
	errs := errorList{w: errOut}
	s := fs.Find(ctx, p, pred)
	for e := range s.All() {
		switch {
		case e.Err != nil:
			errs.add(e.Err)
		case long:
			fmt.Fprintln(out, readable(e.Dir))
		default:
			fmt.Fprintln(out, e.Dir.Path())
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	return errs.err()
}

func lsCmd() *cobra.Command {
	var long bool
	c := &cobra.Command{
		Use:   "ls HOST:PATH...",
		Short: "List directories (one request each)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				err := withRemote(cmd, a, func(ctx context.Context, c *stack, t Target) error {
					return ls(ctx, c, t.Path, long, cmd.OutOrStdout(), cmd.ErrOrStderr())
				})
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&long, "long", "l", false, "long format: mode, size, time, name")
	return c
}

func ls(ctx context.Context, fs ferry.Finder, p string, long bool, out, errOut io.Writer) error {
	errs := errorList{w: errOut}
	s := fs.Find(ctx, p, "depth<=1")
	first := true
	for e := range s.All() {
		if e.Err != nil {
			errs.add(e.Err)
			continue
		}
		root := first
		first = false
		if root && e.Dir.IsDir() {
			continue // List a directory's children, not the directory.
		}
		if !long {
			fmt.Fprintln(out, e.Dir.Name())
			continue
		}
		fmt.Fprintln(out, longLine(e.Dir))
	}
	if err := s.Err(); err != nil {
		return err
	}
	return errs.err()
}

// longLine formats an entry as ls -l does, roughly.
func longLine(d ferry.Dir) string {
	name := d.Name()
	if d.Type() == ferry.TypeSymlink {
		name += " -> " + d[ferry.AttrTarget]
	}
	t := d.Type()
	if t == ferry.TypeFile {
		t = "-"
	}
	return fmt.Sprintf("%s%s %4s %4s %10d %s %s", t, d.Mode().Perm().String()[1:],
		d[ferry.AttrUid], d[ferry.AttrGid], d.Size(), d.Mtime().Format(time.DateTime), name)
}

func statCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stat HOST:PATH...",
		Short: "Print the attributes of entries; all requests are in flight at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return forEachHost(cmd, args, func(ctx context.Context, c *stack, paths []string) error {
				futs := make([]*ferry.Future[ferry.Dir], len(paths))
				for i, p := range paths {
					futs[i] = c.Stat(ctx, p)
				}
				errs := errorList{w: cmd.ErrOrStderr()}
				for _, f := range futs {
					d, err := f.Wait()
					if err != nil {
						errs.add(err)
						continue
					}
					fmt.Fprintln(cmd.OutOrStdout(), readable(d))
				}
				return errs.err()
			})
		},
	}
}

// forEachHost groups targets by server and runs fn once per server with
// its paths in argument order, over one connection.
func forEachHost(cmd *cobra.Command, args []string, fn func(ctx context.Context, c *stack, paths []string) error) error {
	var order []string
	byAddr := map[string][]string{}
	for _, a := range args {
		t, err := ParseTarget(a)
		if err != nil {
			return err
		}
		if _, ok := byAddr[t.Addr]; !ok {
			order = append(order, t.Addr)
		}
		byAddr[t.Addr] = append(byAddr[t.Addr], t.Path)
	}
	for _, addr := range order {
		c, err := openStack(cmd, addr)
		if err != nil {
			return err
		}
		err = fn(cmd.Context(), c, byAddr[addr])
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func catCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat HOST:PATH...",
		Short: "Write files to standard output; all requests start at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return forEachHost(cmd, args, func(ctx context.Context, c *stack, paths []string) error {
				rs := make([]io.ReadCloser, len(paths))
				for i, p := range paths {
					rs[i] = c.Get(ctx, p, 0, -1)
				}
				defer func() {
					for _, r := range rs {
						r.Close()
					}
				}()
				for _, r := range rs {
					if _, err := io.Copy(cmd.OutOrStdout(), r); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

func rmCmd() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm [-r] HOST:PATH [PREDICATE...]",
		Short: "Remove files, or with -r whole trees",
		Long: `Rm removes the entry at PATH. With -r and no predicate it removes the whole
subtree in one request. With -r and a predicate it removes the entries below
PATH that match it: the removes are issued while the find's entries stream
in, without waiting for each, and their errors are reported at the end;
directories go last, deepest first, and only if they are then empty.

A server that keeps chunks keeps what rm removes in its trash for a while
(up to 1 GiB, for 24 h, outside the tree), so that a file put again costs
only what changed: the space comes back then, not at once. "ferry ctl
HOST trash empty" frees it now.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[0], func(ctx context.Context, c *stack, t Target) error {
				pred := strings.Join(args[1:], " ")
				switch {
				case !recursive && pred != "":
					return ferry.E("rm", t.Path, ferry.KindInvalid, "a predicate needs -r")
				case !recursive:
					_, err := c.Remove(ctx, t.Path).Wait()
					return err
				case pred == "":
					_, err := c.RemoveAll(ctx, t.Path).Wait()
					return err
				}
				return removeMatching(ctx, c, t.Path, pred, cmd.ErrOrStderr())
			})
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove trees")
	return c
}

// removeMatching removes what a find yields: files at once, pipelined, and
// directories afterwards, deepest first, one level of depth at a time.
func removeMatching(ctx context.Context, fs ferry.FS, p, pred string, errOut io.Writer) error {
	errs := errorList{w: errOut}
	var pending []*ferry.Future[struct{}]
	var dirs []string
	s := fs.Find(ctx, p, pred)
	for e := range s.All() {
		switch {
		case e.Err != nil:
			errs.add(e.Err)
		case e.Dir.IsDir():
			dirs = append(dirs, e.Dir.Path())
		default:
			pending = append(pending, fs.Remove(ctx, e.Dir.Path()))
		}
	}
	if err := s.Err(); err != nil {
		errs.add(err)
	}
	for _, f := range pending {
		_, err := f.Wait()
		errs.add(err)
	}
	byLevels(dirs, func(p string) string { return p }, true, false, &errs,
		func(p string) *ferry.Future[struct{}] { return fs.Remove(ctx, p) })
	return errs.err()
}

// byLevels calls call on each item, one level of depth (of path(item)) at a
// time, shallowest first or deepest first, with all the calls of a level in
// flight at once, adding their errors to errs. With stop it returns after
// the first level that had an error.
func byLevels[E, T any](items []E, path func(E) string, deepestFirst, stop bool, errs *errorList, call func(E) *ferry.Future[T]) {
	depth := func(i int) int { return ferry.Depth(path(items[i])) }
	sort.SliceStable(items, func(i, j int) bool {
		if deepestFirst {
			return depth(i) > depth(j)
		}
		return depth(i) < depth(j)
	})
	for i := 0; i < len(items); {
		j := i
		var level []*ferry.Future[T]
		for ; j < len(items) && depth(j) == depth(i); j++ {
			level = append(level, call(items[j]))
		}
		for _, f := range level {
			_, err := f.Wait()
			errs.add(err)
		}
		if stop && len(errs.errs) > 0 {
			return
		}
		i = j
	}
}

func mvCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mv HOST:FROM [HOST:]TO",
		Short: "Rename an entry on a server",
		Long: `Mv renames FROM on the server, as mv(1) does: a TO that is an existing
directory, or ends in /, receives FROM under its own name. TO is a path on
the same server, written HOST:PATH or /PATH; mv never copies to or from
this machine (ferry get and put do).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[0], func(ctx context.Context, c *stack, t Target) error {
				to := args[1]
				if IsRemote(to) {
					tt, err := ParseTarget(to)
					if err != nil {
						return err
					}
					if tt.Addr != t.Addr {
						return ferry.E("mv", to, ferry.KindInvalid, "mv works within one server; use get and put between servers")
					}
					to = tt.Path
				} else if !strings.HasPrefix(to, "/") {
					return ferry.E("mv", to, ferry.KindInvalid, "mv renames on the server: write TO as HOST:PATH or /PATH (ferry get copies to this machine)")
				}
				into := strings.HasSuffix(to, "/")
				if d, err := c.Stat(ctx, to).Wait(); err == nil && d.IsDir() {
					into = true
				} else if into {
					return ferry.E("mv", to, ferry.KindNotDir, "no such directory to move into")
				}
				if into {
					to = path.Join(to, path.Base(t.Path))
				}
				_, err := c.Move(ctx, t.Path, to).Wait()
				return err
			})
		},
	}
}

func ctlCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ctl HOST[:PORT] [COMMAND...]",
		Short: "Read a server's control file, or write a command to it",
		Long: `Ctl prints the control file of the stack a native command works through,
as a mount's /Ctl shows it below the mount's own section: a [cache]
section (the client's cache layer), a [client] section (the connection and
its chunk cache), then the server's (version, uptime, counters, the
connections with their users and the kernel's measurements) and the
layers below it. With a COMMAND it writes the command to the server
instead, e.g. "ferry ctl host debug on"; "LAYER CMD" sends CMD to the
server's layer of that name (the heading of its section), e.g. "ferry ctl
host replica add NAME ADDR FINGERPRINT"; "pass CMD" forwards CMD to the
layer below the server.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRemote(cmd, args[0], func(ctx context.Context, c *stack, t Target) error {
				if len(args) == 1 {
					// The client's layers (the cache, the connection
					// and its chunk cache) come above the server's.
					r := c.Get(ctx, ferry.CtlPath, 0, -1)
					defer r.Close()
					_, err := io.Copy(cmd.OutOrStdout(), r)
					return err
				}
				_, err := c.client.Put(ctx, ferry.CtlPath, nil, 0, strings.NewReader(strings.Join(args[1:], " "))).Wait()
				return err
			})
		},
	}
}

// readable is d with its times as dates (RFC 3339, to the nanosecond, in
// local time) instead of the wire's nanoseconds since 1970, for people.
func readable(d ferry.Dir) ferry.Dir {
	d = d.Clone()
	for _, k := range []string{ferry.AttrAtime, ferry.AttrMtime, ferry.AttrCtime} {
		if v, ok := d[k]; ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				d[k] = time.Unix(0, n).Format(time.RFC3339Nano)
			}
		}
	}
	return d
}
