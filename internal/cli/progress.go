package cli

import (
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// progressDelay is how long a transfer runs before it gets a progress bar:
// quick ones should not flash one.
const progressDelay = time.Second

// progress counts the bytes of a transfer and, if it lasts more than
// progressDelay and standard error is a terminal, draws a bar.
type progress struct {
	n     atomic.Int64
	total atomic.Int64 // < 0 while unknown; grows as a walk finds files (Expect).
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// newProgress returns the progress of a transfer of total bytes, or of a
// size still unknown (total < 0) that Expect makes known as it goes.
func newProgress(w io.Writer, name string, total int64) *progress {
	p := &progress{done: make(chan struct{})}
	p.total.Store(total)
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		select {
		case <-p.done:
			return
		case <-time.After(progressDelay):
		}
		pb := mpb.New(mpb.WithOutput(w), mpb.WithRefreshRate(200*time.Millisecond))
		bar := pb.AddBar(max(p.total.Load(), 0),
			mpb.PrependDecorators(decor.Name(name+" "), decor.Counters(decor.SizeB1024(0), "% .1f / % .1f"), decor.Percentage(decor.WC{W: 5})),
			mpb.AppendDecorators(decor.AverageSpeed(decor.SizeB1024(0), "% .1f"), decor.Name(" "), decor.AverageETA(decor.ET_STYLE_GO)),
		)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			n := p.n.Load()
			if t := p.total.Load(); t < 0 {
				bar.SetTotal(n+1, false)
			} else {
				bar.SetTotal(max(t, n), false)
			}
			bar.SetCurrent(n)
			select {
			case <-p.done:
				bar.SetTotal(p.n.Load(), true)
				pb.Wait()
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// Add counts n more bytes.
func (p *progress) Add(n int64) { p.n.Add(n) }

// Expect adds n bytes to the total: a download learns its size file by
// file as the walk finds them.
func (p *progress) Expect(n int64) {
	for {
		t := p.total.Load()
		if p.total.CompareAndSwap(t, max(t, 0)+n) {
			return
		}
	}
}

// Reader counts what is read through r. If r can seek, so can the result,
// so that a transfer can resume; a seek moves the count with it.
func (p *progress) Reader(r io.Reader) io.Reader {
	if rs, ok := r.(io.ReadSeeker); ok {
		return &seekCountReader{countReader{r, p}, rs}
	}
	return &countReader{r, p}
}

type seekCountReader struct {
	countReader
	rs io.ReadSeeker
}

func (c *seekCountReader) Seek(off int64, whence int) (int64, error) {
	from, err := c.rs.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	to, err := c.rs.Seek(off, whence)
	if err == nil {
		c.p.Add(to - from)
	}
	return to, err
}

// Finish removes the bar; it may be called more than once.
func (p *progress) Finish() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

type countReader struct {
	r io.Reader
	p *progress
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.Add(int64(n))
	return n, err
}
