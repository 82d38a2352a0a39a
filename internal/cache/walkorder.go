package cache

import (
	"path"
	"strings"

	"github.com/ferryfs/ferry/internal/pred"
)

// The server walks a tree depth first with each directory's entries sorted
// by name (local.Tree's Find), and so do grep -r, git status and find on a
// mount, whose listings come sorted too. walkLess orders paths that way,
// which lets the prefetch of a walk know what a program has passed, what is
// still to come, and where to resume a stream that stopped.

// walkLess reports whether the walk reaches a before b: at the first
// component where they differ the smaller name comes first, and a
// directory comes before everything below it.
func walkLess(a, b string) bool {
	for {
		if a == b {
			return false
		}
		if a == "" {
			return true
		}
		if b == "" {
			return false
		}
		ca, ra, _ := strings.Cut(strings.TrimPrefix(a, "/"), "/")
		cb, rb, _ := strings.Cut(strings.TrimPrefix(b, "/"), "/")
		if ca != cb {
			return ca < cb
		}
		a, b = ra, rb
	}
}

// walkFrom returns a predicate that holds, in a walk of root, for the
// entries that have want and that the walk reaches at from or after it:
// each directory on the way from root to from prunes its entries named
// before the next step, so the server neither sends nor descends into what
// a program has passed. from is root or below it.
func walkFrom(root, from, want string) string {
	var before []string
	dir := root
	rest := strings.TrimPrefix(strings.TrimPrefix(from, root), "/")
	for rest != "" {
		name, r, _ := strings.Cut(rest, "/")
		// "(prune | true)" holds and stops the descent; under the "!"
		// the entry does not match either.
		before = append(before, "path~"+pred.Quote(childrenOf(dir))+" & name<"+pred.Quote(name)+" & (prune | true)")
		dir, rest = path.Join(dir, name), r
	}
	if len(before) == 0 {
		return want
	}
	return "!(" + strings.Join(before, " | ") + ") & " + want
}

// childrenOf returns the glob of the entries directly in dir. A name is
// never empty, and "/*" would match the root itself.
func childrenOf(dir string) string {
	return path.Join(pred.EscapeGlob(dir), "?*")
}
