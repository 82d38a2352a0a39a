// Command ferry is Ferry's server and native client. Run "ferry help" for
// the commands; see the README for a walk-through.
package main

import (
	"os"

	"github.com/ferryfs/ferry/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
