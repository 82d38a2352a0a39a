package cli

import (
	"path"
	"strings"

	"github.com/spf13/cobra"
)

// excludeFlag gives a transfer command --exclude.
func excludeFlag(c *cobra.Command) *cobra.Command {
	c.Flags().StringArray("exclude", nil, "skip what matches this `glob`, a directory with all below it: a name (*.o, .git) or, with a /, a path under the copied tree (build/gen); repeatable")
	return c
}

// excludes returns the command's --exclude patterns.
func excludes(cmd *cobra.Command) []string {
	ps, _ := cmd.Flags().GetStringArray("exclude")
	return ps
}

// excludePred returns the predicate that keeps what pred keeps (every
// entry if pred is "") of the tree at root, less what the patterns
// exclude: a matching entry is left out and, being pruned, so is all
// below it. A pattern without a slash matches names, one with a slash
// paths under root. The same predicate serves the server's walk (get,
// sync) and the local one (put, through pred.Eval), so both sides skip
// the same entries.
func excludePred(root, pred string, patterns []string) string {
	if len(patterns) == 0 {
		return pred
	}
	var ms []string
	for _, p := range patterns {
		if strings.Contains(strings.TrimSuffix(p, "/"), "/") {
			ms = append(ms, "path~"+quotePred(path.Join(root, strings.TrimPrefix(p, "/"))))
		} else {
			ms = append(ms, "name~"+quotePred(strings.TrimSuffix(p, "/")))
		}
	}
	m := "(" + strings.Join(ms, " | ") + ")"
	if pred == "" {
		pred = "true"
	}
	return "(" + m + " & prune) | (!" + m + " & (" + pred + "))"
}

// quotePred quotes s as a value of the predicate language.
func quotePred(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
