package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/transport"
)

// The worker is the load generator: the same binary, run by the benchmark
// in the client namespace (`load worker FLAGS`). It starts its clients,
// reports each connection it makes and then obeys commands, one per line
// on standard input, answering each with an event, one JSON object per
// line on standard output:
//
//	(start)  {"ev":"conn",...} for every connection, then {"ev":"ready"}
//	mark     {"ev":"mark","t":...,"bytes":[...]}: each client's bytes so far
//	kill     {"ev":"killed","t":...,"clients":[...],"active":N}
//	stop     {"ev":"done"}, and the worker exits
//
// End of input is stop: a worker whose benchmark died does not linger.

// event is one line of the worker's output.
type event struct {
	Ev string `json:"ev"`
	// T is when it happened, in Unix nanoseconds: both processes read the
	// same clock.
	T int64 `json:"t,omitempty"`
	// Client and Slow say whose connection Addr (the client's end, as the
	// server names it) is, for "conn".
	Client int    `json:"client,omitempty"`
	Slow   bool   `json:"slow,omitempty"`
	Addr   string `json:"addr,omitempty"`
	// Bytes are each client's bytes received so far, for "mark".
	Bytes []int64 `json:"bytes,omitempty"`
	// Clients are the clients killed, and Active how many of them had a
	// download in flight, for "killed".
	Clients []int `json:"clients,omitempty"`
	Active  int   `json:"active,omitempty"`
	// Ready is how many clients had received data, for "ready".
	Ready int `json:"ready,omitempty"`
	// Errors counts failed downloads of clients not killed, for "done";
	// Msg says what the first was. The latency worker counts its failed
	// bulk transfers so far in Errors, for "idle" and "done".
	Errors int64  `json:"errors,omitempty"`
	Msg    string `json:"msg,omitempty"`
	// StatNs and GetNs are the latencies of the timed calls that
	// succeeded, in nanoseconds, in the order made, and StatFailed and
	// GetFailed count those that failed (Msg says how the first did), for
	// the latency worker's "calls". T0 and T are when the calls began and
	// ended, Bulk0 and Bulk1 the bulk transfer's bytes so far then.
	StatNs     []int64 `json:"stat,omitempty"`
	GetNs      []int64 `json:"get,omitempty"`
	StatFailed int     `json:"stat_failed,omitempty"`
	GetFailed  int     `json:"get_failed,omitempty"`
	T0         int64   `json:"t0,omitempty"`
	Bulk0      int64   `json:"bulk0,omitempty"`
	Bulk1      int64   `json:"bulk1,omitempty"`
}

// workerOpts are the worker's flags.
type workerOpts struct {
	addr     string
	home     string
	clients  int
	slow     int   // clients 0..slow-1 are throttled
	slowRate int64 // bits per second
	files    []string
	killFrac float64
}

func parseWorkerFlags(args []string) (*workerOpts, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	o := &workerOpts{}
	var files string
	fs.StringVar(&o.addr, "addr", "", "the server's host:port")
	fs.StringVar(&o.home, "home", "", "FERRY_HOME holding the client key and known hosts")
	fs.IntVar(&o.clients, "clients", 0, "clients to run")
	fs.IntVar(&o.slow, "slow", 0, "how many of them are throttled")
	fs.Int64Var(&o.slowRate, "slow-rate", 1_000_000, "the throttled clients' rate in bits per second")
	fs.StringVar(&files, "files", "", "comma-separated paths on the server to download")
	fs.Float64Var(&o.killFrac, "kill-frac", 0.15, "the fraction of each class of clients that kill kills")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.addr == "" || o.home == "" || o.clients <= 0 || o.slow < 0 || o.slow > o.clients || files == "" || o.slowRate <= 0 {
		return nil, errors.New("worker: -addr, -home, -clients, -files, and -slow within -clients are required")
	}
	o.files = strings.Split(files, ",")
	return o, nil
}

// slowBurst is the most a throttled client reads at once: 16 KiB is
// 131 ms at 1 Mbit/s, so the pacing is smooth at a round trip's scale.
const slowBurst = 16 << 10

// client is one simulated user: a remote.Client downloading the files in
// turn until it is stopped or killed.
type client struct {
	id    int
	slow  bool
	rate  int64
	rc    *remote.Client
	ctx   context.Context
	stop  context.CancelFunc
	bytes atomic.Int64
	inGet atomic.Bool
	errs  *errCount
	emit  func(event)

	mu     sync.Mutex
	killed bool
	conns  []killable
}

// killable is a connection and its TCP socket, which kill resets.
type killable struct {
	conn net.Conn
	tcp  *net.TCPConn
}

var errKilled = errors.New("the client was killed")

// dial is the client's remote.Config.Dial: a tuned TCP connection,
// throttled for a slow client, remembered so that kill can reset it.
func (c *client) dial(ctx context.Context, addr string) (net.Conn, error) {
	c.mu.Lock()
	killed := c.killed
	c.mu.Unlock()
	if killed {
		return nil, errKilled
	}
	nc, err := transport.Dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("client %d: dial %s: %w", c.id, addr, err)
	}
	tcp, _ := nc.(*net.TCPConn)
	conn := nc
	if c.slow {
		conn = newThrottledConn(nc, c.rate, slowBurst)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed {
		nc.Close()
		return nil, errKilled
	}
	c.conns = append(c.conns, killable{conn, tcp})
	c.emit(event{Ev: "conn", Client: c.id, Slow: c.slow, Addr: nc.LocalAddr().String()})
	return conn, nil
}

// kill resets the client's connections, as the kernel does for a process
// killed with unread data in its sockets, before its context ends: the
// server learns of the death from the network, not from a cancelled call.
func (c *client) kill() {
	c.mu.Lock()
	c.killed = true
	for _, k := range c.conns {
		if k.tcp != nil {
			k.tcp.SetLinger(0) // Close sends a reset.
		}
		k.conn.Close()
	}
	c.mu.Unlock()
	c.stop()
}

// run downloads the files in turn until ctx ends.
func (c *client) run(ctx context.Context, files []string) {
	buf := make([]byte, 256<<10)
	for i := 0; ctx.Err() == nil; i++ {
		p := files[(c.id+i)%len(files)]
		c.inGet.Store(true)
		rd := c.rc.Get(ctx, p, 0, -1)
		_, err := io.CopyBuffer(counter{&c.bytes}, rd, buf)
		rd.Close()
		c.inGet.Store(false)
		if err != nil && ctx.Err() == nil {
			c.errs.add(fmt.Errorf("client %d: get %s: %w", c.id, p, err))
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

// counter is a Writer that counts and discards.
type counter struct{ n *atomic.Int64 }

func (w counter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// errCount counts errors and keeps the first.
type errCount struct {
	mu    sync.Mutex
	n     int64
	first error
}

func (e *errCount) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		e.first = err
	}
	e.n++
}

// pickKilled returns the clients kill kills: frac of the slow ones
// (0..slow-1) and frac of the fast ones (slow..clients-1), rounded, at
// least one of a class if frac > 0 and the class is not empty, spread
// evenly over each class.
func pickKilled(clients, slow int, frac float64) []int {
	var out []int
	pick := func(first, n int) {
		if n == 0 || frac <= 0 {
			return
		}
		k := min(max(int(float64(n)*frac+0.5), 1), n)
		for j := range k {
			out = append(out, first+j*n/k)
		}
	}
	pick(0, slow)
	pick(slow, clients-slow)
	return out
}

// workerEnv is what both workers share: the client key and the pinned
// server keys in -home, events out and commands in.
type workerEnv struct {
	key   ed25519.PrivateKey
	hosts *auth.KnownHosts
	// emit writes an event; it is safe for concurrent use.
	emit func(event)
	// cmds delivers the lines of standard input, trimmed, and is closed
	// at its end.
	cmds <-chan string
}

// startWorker is what both workers do first: a context that SIGINT and
// SIGTERM cancel, and the environment in home. stop releases the signals.
func startWorker(home string) (ctx context.Context, env *workerEnv, stop func(), err error) {
	ctx, stop = signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	if env, err = newWorkerEnv(home); err != nil {
		stop()
		return nil, nil, nil, err
	}
	return ctx, env, stop, nil
}

func newWorkerEnv(home string) (*workerEnv, error) {
	key, _, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ClientKeyFile))
	if err != nil {
		return nil, fmt.Errorf("worker: client key: %w", err)
	}
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	cmds := make(chan string)
	go func() {
		defer close(cmds)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- strings.TrimSpace(sc.Text())
		}
	}()
	return &workerEnv{
		key:   key,
		hosts: &auth.KnownHosts{File: filepath.Join(home, auth.KnownHostsFile)},
		emit: func(e event) {
			outMu.Lock()
			defer outMu.Unlock()
			enc.Encode(e)
		},
		cmds: cmds,
	}, nil
}

// dialClient returns a remote.Client of the server at addr whose
// connections c.dial makes.
func (env *workerEnv) dialClient(addr string, c *client) (*remote.Client, error) {
	return remote.Dial(remote.Config{
		Addr: addr, Key: env.key, Hosts: env.hosts, Dial: c.dial,
		// Plain streamed Gets and Puts of incompressible files: no chunk
		// cache, no compression, nothing but the read-ahead and the link
		// between the file and the client.
		ChunkMin: -1, NoZstd: true, BulkConns: 1,
		ResumeFor: time.Second,
	})
}

// runWorker is the load worker's main.
func runWorker(args []string) error {
	o, err := parseWorkerFlags(args)
	if err != nil {
		return err
	}
	ctx, env, stop, err := startWorker(o.home)
	if err != nil {
		return err
	}
	defer stop()
	emit := env.emit
	errs := &errCount{}
	clients := make([]*client, o.clients)
	var wg sync.WaitGroup
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.stop()
			}
		}
		wg.Wait()
		for _, c := range clients {
			if c != nil {
				c.rc.Close()
			}
		}
	}()
	for i := range clients {
		cctx, cancel := context.WithCancel(ctx)
		c := &client{id: i, slow: i < o.slow, rate: o.slowRate, ctx: cctx, stop: cancel, errs: errs, emit: emit}
		c.rc, err = env.dialClient(o.addr, c)
		if err != nil {
			cancel()
			return fmt.Errorf("worker: client %d: %w", i, err)
		}
		clients[i] = c
		if i == 0 {
			// The first client pins the server's key and proves the
			// server admits this key before the others pile in.
			sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := c.rc.Stat(sctx, o.files[0]).Wait()
			scancel()
			if err != nil {
				return fmt.Errorf("worker: first stat of %s: %w", o.files[0], err)
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.run(c.ctx, o.files) }()
	}
	// Ready once every client has data, or after a minute with those
	// that have.
	deadline := time.Now().Add(time.Minute)
	ready := 0
	for ctx.Err() == nil && time.Now().Before(deadline) {
		ready = 0
		for _, c := range clients {
			if c.bytes.Load() > 0 {
				ready++
			}
		}
		if ready == len(clients) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	emit(event{Ev: "ready", T: time.Now().UnixNano(), Ready: ready})

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
			for _, c := range clients {
				c.stop()
			}
			wg.Wait()
			errs.mu.Lock()
			e := event{Ev: "done", Errors: errs.n}
			if errs.first != nil {
				e.Msg = errs.first.Error()
			}
			errs.mu.Unlock()
			emit(e)
			return nil
		case cmd == "mark":
			e := event{Ev: "mark", T: time.Now().UnixNano(), Bytes: make([]int64, len(clients))}
			for i, c := range clients {
				e.Bytes[i] = c.bytes.Load()
			}
			emit(e)
		case cmd == "kill":
			ids := pickKilled(len(clients), o.slow, o.killFrac)
			e := event{Ev: "killed", Clients: ids}
			for _, id := range ids {
				if clients[id].inGet.Load() {
					e.Active++
				}
			}
			e.T = time.Now().UnixNano()
			for _, id := range ids {
				clients[id].kill()
			}
			emit(e)
		default:
			emit(event{Ev: "error", Msg: fmt.Sprintf("unknown command %q", cmd)})
		}
	}
}
