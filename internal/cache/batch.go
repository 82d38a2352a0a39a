package cache

import (
	"context"
	"io"

	"github.com/ferryfs/ferry"
)

// Batch implements ferry.Batcher: the files go on a batch of the tree
// below where it has one, else each by a Put, once the changes of their
// paths kept back are done, and the cache records each as it records a
// Put made at once.
func (c *FS) Batch(ctx context.Context) ferry.Batch {
	b := &batch{c: c}
	if bb, ok := ferry.As[ferry.Batcher](c.below); ok {
		b.below = bb.Batch(ctx)
	}
	return b
}

// batch is the cache's side of a ferry.Batch.
type batch struct {
	c     *FS
	below ferry.Batch // Nil if the tree below has no batches.
}

var _ ferry.Batcher = (*FS)(nil)

// Replace implements ferry.Batch.
func (b *batch) Replace(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return b.put(ctx, p, d, src, false)
}

// Put implements ferry.Batch.
func (b *batch) Put(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader) *ferry.Future[ferry.Dir] {
	return b.put(ctx, p, d, src, true)
}

func (b *batch) put(ctx context.Context, p string, d ferry.Dir, src *io.SectionReader, fresh bool) *ferry.Future[ferry.Dir] {
	if b.below == nil {
		return b.c.Put(ctx, p, d, ferry.Whole, src)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		p, err := ferry.CleanPath(p)
		if err != nil {
			return nil, err
		}
		if err := b.c.wback.follow(ctx, p); err != nil {
			return nil, err
		}
		put := b.below.Replace
		if fresh {
			put = b.below.Put
		}
		got, err := put(ctx, p, d, src).Wait()
		return b.c.recordPut(p, got, ferry.Whole, nil, err)
	})
}

// Close implements ferry.Batch.
func (b *batch) Close() error {
	if b.below == nil {
		return nil
	}
	return b.below.Close()
}
