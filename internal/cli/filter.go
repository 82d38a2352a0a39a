package cli

import (
	"path"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry/internal/cache"
)

// filter is what a transfer leaves out (--exclude) or keeps alone
// (--include).
type filter struct {
	exclude, include []string
}

// filterFlags gives a transfer command --exclude and --include.
func filterFlags(c *cobra.Command) *cobra.Command {
	c.Flags().StringArray("exclude", nil, "skip what matches this `glob`, a directory with all below it: a name (*.o, .git), a path under the copied tree if it holds a / (/build/gen), a directory alone if it ends with /; repeatable")
	c.Flags().StringArray("include", nil, "copy only the files that match this `glob` (as --exclude reads it; directories are walked for them); repeatable, and --exclude wins")
	return c
}

// filterOf returns the command's filter.
func filterOf(cmd *cobra.Command) filter {
	var f filter
	f.exclude, _ = cmd.Flags().GetStringArray("exclude")
	f.include, _ = cmd.Flags().GetStringArray("include")
	return f
}

// filterPred returns the predicate that keeps what pred keeps (every
// entry if pred is "") of the tree at root, less what f leaves out and
// the names a mount hides (cache.Hidden): an
// excluded entry is left out and, being pruned, so is all below it; with
// includes, only directories and the files that match one are kept. The
// same predicate serves the server's walk (get, sync) and the local one
// (put, through pred.Eval), so both sides skip the same entries.
func filterPred(root, pred string, f filter) string {
	// A mount's hidden files (a file removed while a program there may
	// hold it open) are its own: never copied, never deleted.
	f.exclude = append(slices.Clone(f.exclude), cache.HiddenPrefix+"*")
	keep := "true"
	if pred != "" {
		keep = "(" + pred + ")"
	}
	if len(f.include) > 0 {
		keep = "(type=d | " + matchAny(root, f.include) + ") & " + keep
	}
	if len(f.exclude) == 0 {
		return keep
	}
	m := matchAny(root, f.exclude)
	return "(" + m + " & prune) | (!" + m + " & " + keep + ")"
}

// matchAny returns the predicate that matches any of the patterns, read
// as .gitignore reads them: without a slash a name, with one a path under
// root, with a trailing slash a directory only.
func matchAny(root string, patterns []string) string {
	var ms []string
	for _, p := range patterns {
		dirOnly := strings.HasSuffix(p, "/")
		p = strings.TrimSuffix(p, "/")
		m := "name~" + quotePred(p)
		if strings.Contains(p, "/") {
			m = "path~" + quotePred(path.Join(root, strings.TrimPrefix(p, "/")))
		}
		if dirOnly {
			m = "(" + m + " & type=d)"
		}
		ms = append(ms, m)
	}
	return "(" + strings.Join(ms, " | ") + ")"
}

// quotePred quotes s as a value of the predicate language.
func quotePred(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
