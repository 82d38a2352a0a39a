package cli

import (
	"context"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/remote"
)

// completeTimeout bounds how long completing a remote path waits for the
// server: a shell's completion must not hang on a dead link.
const completeTimeout = 3 * time.Second

// remoteCompletion gives c's arguments completion of remote paths, as scp
// users have it: HOST:/sr<TAB> lists what /'s directory on the server
// holds that begins with "sr" (one Find, one level deep), for a server
// whose key is already pinned. A local path completes as a file.
func remoteCompletion(c *cobra.Command) *cobra.Command {
	c.ValidArgsFunction = completeRemote
	return c
}

func completeRemote(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if !IsRemote(toComplete) {
		return nil, cobra.ShellCompDirectiveDefault
	}
	j := strings.Index(toComplete, ":/")
	if j < 0 {
		// HOST or HOST:PORT so far: the path starts at the root.
		return []string{strings.TrimSuffix(toComplete, ":") + ":/"}, cobra.ShellCompDirectiveNoSpace
	}
	prefix, p := toComplete[:j+1], toComplete[j+1:]
	dir, base := path.Dir(p), path.Base(p)
	if strings.HasSuffix(p, "/") {
		dir, base = p, ""
	}
	t, err := ParseTarget(prefix + dir)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	// A server is trusted on first contact (its key pinned): not while
	// completing, which should not decide that behind the user's back.
	hosts := auth.KnownHosts{File: filepath.Join(auth.Home(), auth.KnownHostsFile)}
	if !hosts.Known(t.Addr) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := dial(cmd, t.Addr, func(c *remote.Config) {
		// Completing needs no chunk cache.
		if c.Cache != nil {
			c.Cache.Close()
			c.Cache = nil
		}
		c.ResumeFor = completeTimeout
	})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
	defer cancel()
	var out []string
	s := c.Find(ctx, t.Path, "depth<=1")
	for e := range s.All() {
		if e.Dir == nil || e.Dir.Path() == t.Path || !strings.HasPrefix(e.Dir.Name(), base) {
			continue
		}
		name := prefix + e.Dir.Path()
		if e.Dir.IsDir() {
			name += "/"
		}
		out = append(out, name)
	}
	return out, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
}
