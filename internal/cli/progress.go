package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
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
	cur   atomic.Pointer[string] // The file being moved, for the bar.
	total atomic.Int64           // < 0 while unknown; grows as a walk finds files (Expect).
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// progressOpts are the --progress and --stats flags: draw the bar even
// when standard error is no terminal, and write a line of statistics
// every interval (for logs).
type progressOpts struct {
	force bool
	every time.Duration
}

// progressFlags gives a transfer command --progress and --stats.
func progressFlags(c *cobra.Command) *cobra.Command {
	c.Flags().Bool("progress", false, "draw the progress bar even when standard error is not a terminal")
	c.Flags().Duration("stats", 0, "write a line of progress (bytes, percentage, rate, time left) every `interval`, for logs")
	return c
}

// progressOptsOf reads a command's progress flags.
func progressOptsOf(cmd *cobra.Command) progressOpts {
	var o progressOpts
	if cmd.Flags().Lookup("progress") != nil {
		o.force, _ = cmd.Flags().GetBool("progress")
		o.every, _ = cmd.Flags().GetDuration("stats")
	}
	return o
}

// newProgress returns the progress of a transfer of total bytes, or of a
// size still unknown (total < 0) that Expect makes known as it goes.
func newProgress(w io.Writer, name string, total int64, o progressOpts) *progress {
	p := &progress{done: make(chan struct{})}
	p.total.Store(total)
	if o.every > 0 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.stats(w, name, o.every)
		}()
	}
	f, ok := w.(*os.File)
	if !o.force && (!ok || !term.IsTerminal(int(f.Fd()))) {
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
			mpb.AppendDecorators(decor.AverageSpeed(decor.SizeB1024(0), "% .1f"), decor.Name(" "), decor.AverageETA(decor.ET_STYLE_GO),
				decor.Any(func(decor.Statistics) string { return " " + p.current() })),
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

// stats writes a line of progress every interval until the transfer ends.
func (p *progress) stats(w io.Writer, name string, every time.Duration) {
	start := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
		fmt.Fprintln(w, p.line(name, time.Since(start)))
	}
}

// line says how far the transfer is after elapsed.
func (p *progress) line(name string, elapsed time.Duration) string {
	n, total := p.n.Load(), p.total.Load()
	rate := float64(n) / max(elapsed.Seconds(), 1e-3)
	s := fmt.Sprintf("ferry: %s: %s", name, sizeString(n))
	if total > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", sizeString(total), n*100/total)
	}
	s += fmt.Sprintf(", %s/s", sizeString(int64(rate)))
	if total > n && rate > 0 {
		s += fmt.Sprintf(", %v left", time.Duration(float64(total-n)/rate*float64(time.Second)).Round(time.Second))
	}
	return s
}

// Current names the file being moved now.
func (p *progress) Current(name string) { p.cur.Store(&name) }

// current is the file being moved, shortened for the bar.
func (p *progress) current() string {
	c := p.cur.Load()
	if c == nil {
		return ""
	}
	if s := *c; len(s) > 40 {
		return "..." + s[len(s)-37:]
	}
	return *c
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
