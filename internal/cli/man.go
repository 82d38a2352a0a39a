package cli

import (
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// manCmd writes the man pages of every command (ferry.1, ferry-mount.1,
// ...) into a directory; make install puts them where man finds them.
func manCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "Write the man pages of every command into DIR",
		Args:   cobra.ExactArgs(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			return doc.GenManTree(cmd.Root(), &doc.GenManHeader{Title: "FERRY", Section: "1", Source: "Ferry " + Version}, args[0])
		},
	}
}
