package chunkstore

import (
	"context"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry/internal/chunk"
)

// Sweep salvages and removes the temporary files that puts of a server
// killed before it could Abort left in the tree's temporary directory
// (local.TempDir), last written
// before before (local.Tree.SweepTemp with Salvage). Puts that ask for
// chunks meanwhile wait for it, up to sweepWait, so that a put tried again
// at once finds what it keeps.
func (t *Tree) Sweep(ctx context.Context, before time.Time) (files int, bytes int64, err error) {
	done := make(chan struct{})
	t.swept.Store(&done)
	defer func() {
		close(done)
		t.swept.CompareAndSwap(&done, nil)
	}()
	return t.Tree.SweepTemp(ctx, before, t.Salvage)
}

// sweepWait bounds how long a put waits for a Sweep: salvaging many large
// temporary files takes long, and puts should not wait for all of it.
const sweepWait = 10 * time.Second

// awaitSweep waits for a Sweep in progress, up to sweepWait.
func (t *Tree) awaitSweep(ctx context.Context) {
	ch := t.swept.Load()
	if ch == nil {
		return
	}
	select {
	case <-*ch:
	case <-ctx.Done():
	case <-time.After(sweepWait):
	}
}

// Salvage keeps, in the trash, the chunks in the temporary file tmp (a
// tree path) that the put of a server killed before it could Abort left
// behind, so that the put tried again does not send them again. Which
// chunks had arrived was in that server's memory only: the file's data
// regions (a put's file is sparse until its chunks arrive) are cut again
// with the chunking scheme, which finds the same boundaries inside each
// run of arrived chunks; a chunk cut at a region's edge, across a hole,
// finds no match and is simply not used, since every chunk read from the
// index is checked against its hash. The caller removes tmp afterwards.
func (t *Tree) Salvage(tmp string) {
	f, err := t.root.Open(tmp[1:])
	if err != nil {
		return
	}
	refs, err := dataRefs(f)
	f.Close()
	if err != nil || len(refs) == 0 {
		return
	}
	t.trash.keepPartial(tmp, refs)
}

// dataRefs cuts the data regions of f into chunks.
func dataRefs(f *os.File) ([]chunk.Ref, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	var refs []chunk.Ref
	for off := int64(0); off < size; {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off.
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		err = chunk.Refs(io.NewSectionReader(f, start, end-start), chunk.Default, func(r chunk.Ref, _ []byte) error {
			r.Off += start
			refs = append(refs, r)
			return nil
		})
		if err != nil {
			return nil, err
		}
		off = end
	}
	return refs, nil
}
