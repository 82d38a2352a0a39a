package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
)

// The latency worker is the latency benchmark's client: the same binary,
// run in the client namespace as `load latency-worker FLAGS`. It makes one
// remote.Client, checks that the server admits it, says {"ev":"ready"} and
// obeys commands on standard input, one per line, answering each with an
// event on standard output:
//
//	calls     times -n Stats of -small and -n Gets of it, alternating:
//	          {"ev":"calls","stat":[...],"get":[...],...}
//	download  starts downloading -big over and over; {"ev":"bulk"} once
//	          the first bytes have arrived
//	upload    starts putting -up-size random bytes to -up over and over;
//	          {"ev":"bulk"} once the first bytes are handed over
//	idle      stops the transfer and waits for it: {"ev":"idle","errors":N}
//	stop      {"ev":"done"}, and the worker exits
//
// End of input is stop.

// latCallTimeout bounds each timed call: a call that takes longer has
// failed for this benchmark's purpose.
const latCallTimeout = 20 * time.Second

// latWorkerOpts are the latency worker's flags.
type latWorkerOpts struct {
	addr, home    string
	small, big    string // paths on the server
	up            string // the path uploads replace
	upSize        int64
	calls         int
	gap           time.Duration
	firstBytesMax time.Duration
}

func parseLatWorkerFlags(args []string) (*latWorkerOpts, error) {
	fs := flag.NewFlagSet("latency-worker", flag.ContinueOnError)
	o := &latWorkerOpts{firstBytesMax: 30 * time.Second}
	fs.StringVar(&o.addr, "addr", "", "the server's host:port")
	fs.StringVar(&o.home, "home", "", "FERRY_HOME holding the client key and known hosts")
	fs.StringVar(&o.small, "small", "", "the small file's path on the server")
	fs.StringVar(&o.big, "big", "", "the path on the server of the file downloads fetch")
	fs.StringVar(&o.up, "up", "", "the path on the server uploads replace")
	fs.Int64Var(&o.upSize, "up-size", 0, "bytes of each upload")
	fs.IntVar(&o.calls, "n", 30, "calls of each kind per calls command")
	fs.DurationVar(&o.gap, "gap", 10*time.Millisecond, "pause before each call")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.addr == "" || o.home == "" || o.small == "" || o.big == "" || o.up == "" || o.upSize <= 0 || o.calls <= 0 || o.gap < 0 {
		return nil, errors.New("latency-worker: -addr, -home, -small, -big, -up, -up-size and -n are required")
	}
	return o, nil
}

// bulkRun is a bulk transfer running in the background.
type bulkRun struct {
	bytes  *atomic.Int64 // file bytes moved so far
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the transfer and waits for it to end. A nil run is stopped.
func (b *bulkRun) stop() {
	if b == nil {
		return
	}
	b.cancel()
	<-b.done
}

// startBulk starts a download or an upload loop on c, and returns once
// its first bytes have moved. If they do not within o.firstBytesMax, it
// stops the loop and fails. Failed transfers are counted in c.errs.
func (c *client) startBulk(ctx context.Context, kind string, o *latWorkerOpts) (*bulkRun, error) {
	bctx, cancel := context.WithCancel(ctx)
	b := &bulkRun{cancel: cancel, done: make(chan struct{})}
	var base int64
	switch kind {
	case bulkDownload:
		b.bytes = &c.bytes
		base = c.bytes.Load()
		go func() { defer close(b.done); c.run(bctx, []string{o.big}) }()
	case bulkUpload:
		b.bytes = new(atomic.Int64)
		go func() { defer close(b.done); c.upload(bctx, o.up, o.upSize, b.bytes) }()
	default:
		cancel()
		return nil, fmt.Errorf("unknown bulk transfer %q", kind)
	}
	if err := b.awaitBytes(ctx, base, o.firstBytesMax); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// awaitBytes waits until the transfer has moved more than base bytes.
func (b *bulkRun) awaitBytes(ctx context.Context, base int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for b.bytes.Load() <= base {
		if time.Now().After(deadline) {
			return fmt.Errorf("the bulk transfer moved nothing within %v", limit)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// upload puts size random bytes to p over and over until ctx ends,
// counting the bytes handed to the client in n. The data is a plain
// reader (not a ReadSeeker), so each Put is one plain stream: no chunks,
// no resumable upload staged on the server.
func (c *client) upload(ctx context.Context, p string, size int64, n *atomic.Int64) {
	for i := uint64(0); ctx.Err() == nil; i++ {
		rng := rand.NewChaCha8([32]byte{byte(i), 'u', 'p'})
		data := countingReader{io.LimitReader(rng, size), n}
		if _, err := c.rc.Put(ctx, p, nil, ferry.Whole, data).Wait(); err != nil && ctx.Err() == nil {
			c.errs.add(fmt.Errorf("put %s: %w", p, err))
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (r countingReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.n.Add(int64(n))
	return n, err
}

// timeCalls times o.calls Stats and o.calls Gets of o.small of want
// bytes, alternating, each after a pause of o.gap, and reports what bulk
// (nil if none) moved meanwhile.
func (c *client) timeCalls(ctx context.Context, o *latWorkerOpts, want int64, bulk *bulkRun) event {
	e := event{Ev: "calls"}
	var fails errCount
	moved := func() int64 {
		if bulk == nil {
			return 0
		}
		return bulk.bytes.Load()
	}
	buf := make([]byte, want+1)
	e.T0, e.Bulk0 = time.Now().UnixNano(), moved()
	for range o.calls {
		if sleep(ctx, o.gap) != nil {
			break
		}
		if d, err := timeCall(ctx, func(ctx context.Context) error {
			_, err := c.rc.Stat(ctx, o.small).Wait()
			return err
		}); err != nil {
			e.StatFailed++
			fails.add(fmt.Errorf("stat %s: %w", o.small, err))
		} else {
			e.StatNs = append(e.StatNs, int64(d))
		}
		if sleep(ctx, o.gap) != nil {
			break
		}
		if d, err := timeCall(ctx, func(ctx context.Context) error {
			// By its size: the client then sends it on the call
			// connection (SmallGet).
			rd := c.rc.Get(ctx, o.small, 0, want)
			defer rd.Close()
			n, err := io.ReadFull(rd, buf)
			if err == io.ErrUnexpectedEOF && int64(n) == want {
				err = nil
			} else if err == nil {
				err = fmt.Errorf("more than the %d bytes the file holds", want)
			} else if err == io.EOF || err == io.ErrUnexpectedEOF {
				err = fmt.Errorf("read %d bytes of %d", n, want)
			}
			return err
		}); err != nil {
			e.GetFailed++
			fails.add(fmt.Errorf("get %s: %w", o.small, err))
		} else {
			e.GetNs = append(e.GetNs, int64(d))
		}
	}
	e.T, e.Bulk1 = time.Now().UnixNano(), moved()
	if fails.first != nil {
		e.Msg = fails.first.Error()
	}
	return e
}

// timeCall runs call under latCallTimeout and returns how long it took.
func timeCall(ctx context.Context, call func(context.Context) error) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, latCallTimeout)
	defer cancel()
	t := time.Now()
	err := call(cctx)
	return time.Since(t), err
}

// runLatencyWorker is the latency worker's main.
func runLatencyWorker(args []string) error {
	o, err := parseLatWorkerFlags(args)
	if err != nil {
		return err
	}
	ctx, env, stop, err := startWorker(o.home)
	if err != nil {
		return err
	}
	defer stop()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &client{ctx: cctx, stop: cancel, errs: &errCount{}, emit: env.emit}
	if c.rc, err = env.dialClient(o.addr, c); err != nil {
		return fmt.Errorf("latency-worker: %w", err)
	}
	defer c.rc.Close()
	// The first Stat pins the server's key, proves that the server admits
	// this key, and sets up both connections (remote.Dial starts them
	// together), so that no timed call pays for a handshake.
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	d, err := c.rc.Stat(sctx, o.small).Wait()
	scancel()
	if err != nil {
		return fmt.Errorf("latency-worker: first stat of %s: %w", o.small, err)
	}
	small := d.Size()
	env.emit(event{Ev: "ready", T: time.Now().UnixNano()})

	var bulk *bulkRun
	defer func() { bulk.stop() }()
	errorsNow := func(ev string) event {
		c.errs.mu.Lock()
		defer c.errs.mu.Unlock()
		e := event{Ev: ev, Errors: c.errs.n}
		if c.errs.first != nil {
			e.Msg = c.errs.first.Error()
		}
		return e
	}
	for {
		var cmd string
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case cmd, ok = <-env.cmds:
		}
		switch {
		case !ok || cmd == "stop":
			bulk.stop()
			bulk = nil
			env.emit(errorsNow("done"))
			return nil
		case cmd == "calls":
			env.emit(c.timeCalls(ctx, o, small, bulk))
		case cmd == bulkDownload || cmd == bulkUpload:
			if bulk != nil {
				env.emit(event{Ev: "error", Msg: "a bulk transfer is already running"})
				continue
			}
			b, err := c.startBulk(ctx, cmd, o)
			if err != nil {
				env.emit(event{Ev: "error", Msg: err.Error()})
				continue
			}
			bulk = b
			env.emit(event{Ev: "bulk", T: time.Now().UnixNano()})
		case cmd == "idle":
			bulk.stop()
			bulk = nil
			env.emit(errorsNow("idle"))
		default:
			env.emit(event{Ev: "error", Msg: fmt.Sprintf("unknown command %q", cmd)})
		}
	}
}
