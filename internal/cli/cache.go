package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/store"
)

// defaultCacheMax bounds the client chunk cache by default.
const defaultCacheMax = 1 << 30

// cacheFlags gives a command that moves whole files the chunk cache flags
// and returns it; dial opens the cache of commands that have them.
func cacheFlags(c *cobra.Command) *cobra.Command {
	c.Flags().String("cache", "", "directory of the chunk cache (default $XDG_CACHE_HOME/ferry/HOST_PORT, ~/.cache/ferry/HOST_PORT, or $FERRY_HOME/cache/HOST_PORT if FERRY_HOME is set)")
	c.Flags().Bool("no-cache", false, "use no chunk cache: fetch whole files every time")
	c.Flags().Int64("cache-max", defaultCacheMax, "the most bytes of chunks the cache holds")
	if c.Long == "" {
		c.Long = c.Short + "."
	}
	c.Long += `

Whole files above ` + fmt.Sprint(remote.DefaultChunkMin>>10) + ` KiB move by content-defined chunks: only
the chunks the other side lacks cross the wire. Chunks fetched and sent are
kept in a cache (--cache, one per server by default, at most --cache-max
bytes, least recently used dropped first); every cached chunk is hashed
again before use. A mount shares its cache with the commands run beside
it; two other commands using the same cache at once, the second goes on
without one.`
	return c
}

// cacheDir returns the default chunk cache of the server at addr: one per
// server, since what the cache holds is also what the client believes that
// server holds.
func cacheDir(addr string) string {
	name := strings.Map(func(r rune) rune {
		if r == ':' || r == '[' || r == ']' || r == '/' || r == '%' {
			return '_'
		}
		return r
	}, addr)
	return filepath.Join(cacheHome(), name)
}

// cacheHome is where the chunk caches live: a cache is not configuration,
// so under $XDG_CACHE_HOME/ferry (~/.cache/ferry), where people and their
// cleaners look for caches, unless $FERRY_HOME is set, which then holds all
// of Ferry's state (a test's, or a user's who asked for one place).
func cacheHome() string {
	if os.Getenv("FERRY_HOME") != "" {
		return filepath.Join(auth.Home(), "cache")
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "ferry")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "ferry")
	}
	return filepath.Join(auth.Home(), "cache")
}

// openCache opens the chunk cache cmd's flags name for the server at addr,
// or returns nil if the command has none or it is turned off. pebble locks
// a cache for one process: a command that finds it held uses it through
// the process holding it, if that process shares it (a mount does:
// shareCache), and goes on without a cache, saying so, if not.
//
// made is the directory if this call made it (it did not exist), so that a
// command that never reached the server can leave nothing behind.
func openCache(cmd *cobra.Command, addr string) (c store.ChunkCache, made string) {
	if cmd.Flags().Lookup("cache") == nil {
		return nil, ""
	}
	if off, _ := cmd.Flags().GetBool("no-cache"); off {
		return nil, ""
	}
	dir, _ := cmd.Flags().GetString("cache")
	if dir == "" {
		dir = cacheDir(addr)
	}
	max, _ := cmd.Flags().GetInt64("cache-max")
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		made = dir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "ferry: no chunk cache: %v\n", err)
		return nil, ""
	}
	memtable := int64(store.DefaultCacheMemTable)
	if f := cmd.Flags().Lookup("memory"); f != nil {
		if m, ok := f.Value.(*sizeFlag); ok {
			_, memtable = mountShares(int64(*m))
		}
	}
	sock := filepath.Join(dir, store.ShareSocket)
	own, err := store.OpenCacheMem(dir, max, memtable)
	if err != nil {
		if s, serr := store.DialShared(cmd.Context(), sock); serr == nil {
			return s, made
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "ferry: no chunk cache (%v); going on without\n", err)
		return nil, ""
	}
	if _, ok := cmd.Annotations[shareCache]; ok {
		if err := own.Share(sock); err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "ferry: the chunk cache is not shared with other commands: %v\n", err)
		}
	}
	return own, made
}

// shareCache, as a key of a command's Annotations, marks a command that
// serves its chunk cache to the user's other commands while it runs
// (store.Cache.Share): a mount, which holds its cache for long.
const shareCache = "ferry-share-cache"
