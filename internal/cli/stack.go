package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/remote"
)

// stack is the tree a native command works on: the cache layer over the
// client, as a mount has it below its FUSE adaptor, each with its section
// of the control file. The cache writes through: a command that returns
// has stored what it changed. The client stays beside it for what only
// the connection knows (its traffic, whether it has a chunk cache).
type stack struct {
	ferry.FS // The top of the stack.
	client   *remote.Client
	cache    *cache.FS
}

var _ ferry.Unwrapper = (*stack)(nil)

// openStack dials the server at addr and stacks the cache over the
// client.
func openStack(cmd *cobra.Command, addr string) (*stack, error) {
	c, err := dial(cmd, addr)
	if err != nil {
		return nil, err
	}
	opt := cache.Options{}
	if cmd.Flags().Lookup("timeout") != nil {
		// A change the cache tries again after a broken connection is
		// tried no longer than the command waits for the server.
		opt.CallTimeout, _ = cmd.Flags().GetDuration("timeout")
	}
	return newStack(c, opt), nil
}

// newStack stacks a cache with opt over c.
func newStack(c *remote.Client, opt cache.Options) *stack {
	cf := cache.New(ctl.New("client", c, c), opt)
	return &stack{FS: ctl.New("cache", cf, cf), client: c, cache: cf}
}

// Unwrap implements ferry.Unwrapper.
func (s *stack) Unwrap() ferry.FS { return s.FS }

// Traffic is what the stack's client moved.
func (s *stack) Traffic() remote.Traffic { return s.client.Traffic() }

// HasCache reports whether the stack's client has a chunk cache.
func (s *stack) HasCache() bool { return s.client.HasCache() }

// Close closes the cache, then the client.
func (s *stack) Close() error {
	s.cache.Close()
	return s.client.Close()
}

// batchOf returns a batch of the tree fs, if it stores files in batches
// (ferry.Batcher), or nil.
func batchOf(ctx context.Context, fs ferry.FS) ferry.Batch {
	if b, ok := ferry.As[ferry.Batcher](fs); ok {
		return b.Batch(ctx)
	}
	return nil
}
