// Command ferry is Ferry's server and native client. Run "ferry help" for
// the commands; see the README for a walk-through. Installed (or linked)
// as mount.ferry, it is the helper mount(8) runs for fstab lines and
// mount -t ferry.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryfs/ferry/internal/cli"
)

func main() {
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "mount.ferry" {
		var home string
		var run bool
		var err error
		if args, home, run, err = cli.MountHelper(args); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			os.Exit(1) // mount(8): incorrect invocation.
		}
		if !run {
			return
		}
		if home != "" {
			os.Setenv("FERRY_HOME", home)
		}
		// The background mount starts the binary again with os.Args.
		os.Args = append([]string{os.Args[0]}, args...)
		if cli.Main(args) != 0 {
			os.Exit(32) // mount(8): mount failure.
		}
		return
	}
	os.Exit(cli.Main(args))
}
