package chunkstore_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/remote"
)

// TestFIFONeverBlocks: calls that meet a FIFO in the served tree (a
// removal or a rename over it that keeps the old file in the trash, a
// chunked put over it that looks there for pieces, a chunk list of it, a
// walk with data) answer at once. Opening a FIFO to read waits for a
// writer, and each of these once opened the file it met, which stopped
// the call, and with it the group of changes it came in, for good.
func TestFIFONeverBlocks(t *testing.T) {
	e := start(t, 0)
	doc := randomDoc(256 << 10)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *remote.Client, p string) error
		ok   bool // The call succeeds, as it does on a local disk.
	}{
		{"remove", func(ctx context.Context, c *remote.Client, p string) error {
			_, err := c.Remove(ctx, p).Wait()
			return err
		}, true},
		{"move over", func(ctx context.Context, c *remote.Client, p string) error {
			if _, err := c.Put(ctx, p+".new", nil, ferry.Whole, bytes.NewReader(doc)).Wait(); err != nil {
				return err
			}
			_, err := c.Move(ctx, p+".new", p).Wait()
			return err
		}, true},
		{"chunked put over", func(ctx context.Context, c *remote.Client, p string) error {
			_, _, err := c.PutChunked(ctx, p, nil, bytes.NewReader(doc), int64(len(doc)), nil)
			return err
		}, true},
		{"chunk list", func(ctx context.Context, c *remote.Client, p string) error {
			_, _, err := c.GetChunked(ctx, p, nil, io.Discard, nil)
			return err
		}, false},
		{"walk with data", func(ctx context.Context, c *remote.Client, p string) error {
			s := c.FindGet(ctx, "/", "")
			for range s.All() {
			}
			return s.Err()
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "fifo-" + tc.name
			fifo := filepath.Join(e.dir, name)
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.call(ctx, e.c, "/"+name) }()
			select {
			case err := <-done:
				if tc.ok && err != nil {
					t.Errorf("%s: %v", tc.name, err)
				}
				if !tc.ok && err == nil {
					t.Errorf("%s of a FIFO succeeded", tc.name)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("%s did not return in 15 s: the server waits on the FIFO", tc.name)
				// Writers let the server's opens of the FIFO return, so
				// that the test's server can stop.
				for {
					if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		})
	}
}
