package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
)

// harness holds what lives for the whole invocation: the work directory
// with the served files, the ferry binary, and the bed of the moment. Both
// benchmarks use it: the load benchmark keeps one bed for all its runs,
// the latency benchmark makes a fresh one for each link (openBed,
// closeBed).
type harness struct {
	keep  bool // keep the work directory
	bed   *netem.Bed
	work  string
	srv   string   // the served directory
	home  string   // FERRY_HOME of the server and the clients
	ferry string   // the ferry binary built from the working tree
	self  string   // this binary, run again as the worker
	files []string // the served files' paths on the server, in the order asked for
	logf  *os.File // the server's and the worker's output
}

// servedFile is a file of random bytes the harness writes into the served
// directory.
type servedFile struct {
	name string // relative to the served directory
	size int64
}

// serverPort and metricsAddr are where ferry serve listens: the first on
// the bed's server address, the second on loopback inside the server
// namespace, which only this process reaches (through Bed.Dial).
const (
	serverPort  = 7077
	metricsAddr = "127.0.0.1:9177"
)

// newHarness makes the work directory and the files and builds ferry. On
// error it leaves nothing behind.
func newHarness(ctx context.Context, root string, keep bool, files []servedFile) (_ *harness, err error) {
	h := &harness{keep: keep}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	if h.self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("finding this binary: %w", err)
	}
	if h.work, err = os.MkdirTemp("", "ferry-load-"); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	h.srv, h.home = filepath.Join(h.work, "srv"), filepath.Join(h.work, "home")
	for _, d := range []string{h.srv, h.home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if h.logf, err = os.Create(filepath.Join(h.work, "load.log")); err != nil {
		return nil, err
	}
	log.Printf("work directory %s; building ferry", h.work)
	h.ferry = filepath.Join(h.work, "ferry")
	build := exec.CommandContext(ctx, "go", "build", "-o", h.ferry, "./cmd/ferry")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building ferry: %w: %s", err, strings.TrimSpace(string(out)))
	}
	for i, f := range files {
		log.Printf("writing %s: %s of random bytes", f.name, fmtSize(f.size))
		if err := writeRandom(filepath.Join(h.srv, f.name), f.size, uint64(i)); err != nil {
			return nil, err
		}
		h.files = append(h.files, "/"+f.name)
	}
	return h, nil
}

// openBed starts a bed with link cfg; closeBed removes it.
func (h *harness) openBed(ctx context.Context, cfg netem.Config) error {
	if h.bed != nil {
		return errors.New("openBed: a bed is already up")
	}
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bed, err := netem.New(setup, cfg)
	if err != nil {
		return err
	}
	h.bed = bed
	loss := ""
	if cfg.Down.Loss > 0 {
		loss = fmt.Sprintf(", %g%% loss", cfg.Down.Loss*100)
	}
	log.Printf("bed up: %s round trip, %s each way%s, %s", cfg.Up.Delay+cfg.Down.Delay, netem.FormatRate(cfg.Down.Rate), loss, bed.CongestionControl)
	return nil
}

// closeBed removes the bed, killing whatever still runs in it.
func (h *harness) closeBed() {
	if h.bed == nil {
		return
	}
	if err := h.bed.Close(); err != nil {
		log.Printf("removing the bed: %v", err)
	}
	h.bed = nil
}

// close removes the bed (killing whatever still runs in it) and, unless
// -keep, the work directory.
func (h *harness) close() {
	h.closeBed()
	if h.logf != nil {
		h.logf.Close()
	}
	if h.work == "" {
		return
	}
	if h.keep {
		log.Printf("kept %s", h.work)
		return
	}
	os.RemoveAll(h.work)
}

// writeRandom writes size random bytes to path: the data is
// incompressible, so that the wire carries exactly the file.
func writeRandom(path string, size int64, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{byte(seed), 'f', 'e', 'r', 'r', 'y'})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		rng.Read(buf)
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return f.Close()
}

// serverAddr is where ferry serve listens in the bed, as host:port.
func (h *harness) serverAddr() string {
	return net.JoinHostPort(h.bed.ServerAddr.String(), strconv.Itoa(serverPort))
}

// command returns a command that runs in namespace ns in its own process
// group, so that cancelling ctx kills it and all it started.
func (h *harness) command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	cmd := h.bed.Command(ctx, ns, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "FERRY_HOME="+h.home)
	cmd.Stderr = h.logf
	return cmd
}

// ferryServer is a running `ferry serve`.
type ferryServer struct {
	cmd    *exec.Cmd
	pid    int // of ferry itself: nsenter execs it
	done   chan struct{}
	client *http.Client
}

// startServer starts ferry serve in the server namespace, with read-ahead
// of mode m and the extra flags, and waits until its metrics answer.
func (h *harness) startServer(ctx context.Context, m mode, extra ...string) (*ferryServer, error) {
	args := []string{"serve", h.srv,
		"--listen", h.serverAddr(),
		"--metrics", metricsAddr, "--metrics-per-connection",
		"--index", filepath.Join(h.work, "index"),
		"--grace", "2s"}
	if m.fixed > 0 {
		args = append(args, "--readahead-fixed", strconv.FormatInt(m.fixed, 10))
	}
	args = append(args, extra...)
	fmt.Fprintf(h.logf, "### %s %s\n", h.ferry, strings.Join(args, " "))
	cmd := h.command(ctx, h.bed.ServerNS, h.ferry, args...)
	cmd.Stdout = h.logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting ferry serve: %w", err)
	}
	s := &ferryServer{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()
	bed := h.bed
	s.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return bed.Dial(ctx, bed.ServerNS, network, addr)
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 1,
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := s.scrape(sctx)
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("ferry serve exited at start (see its log): %v", cmd.ProcessState)
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("ferry serve's metrics did not answer within 30 s: %w", err)
		}
	}
}

// scrape reads the server's metrics.
func (s *ferryServer) scrape(ctx context.Context) (snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return snapshot{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return snapshot{}, fmt.Errorf("scraping the server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snapshot{}, fmt.Errorf("scraping the server: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// stop stops the server gracefully, or kills it after 5 s.
func (s *ferryServer) stop() {
	s.client.CloseIdleConnections()
	syscall.Kill(s.pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-s.pid, syscall.SIGKILL)
		<-s.done
	}
}

// connOwner is the client a connection belongs to.
type connOwner struct {
	client int
	slow   bool
}

// workerProc is a running load generator.
type workerProc struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	events chan event // every event but "conn"
	done   chan struct{}

	mu     sync.Mutex
	owners map[string]connOwner // by the client's address
}

// startWorker runs this binary again in the client namespace with args
// (the first names the worker: "worker" or "latency-worker") and reads its
// events.
func (h *harness) startWorker(ctx context.Context, args ...string) (*workerProc, error) {
	cmd := h.command(ctx, h.bed.ClientNS, h.self, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the worker: %w", err)
	}
	w := &workerProc{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, events: make(chan event, 16),
		done: make(chan struct{}), owners: map[string]connOwner{}}
	go func() {
		defer close(w.done)
		defer close(w.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				fmt.Fprintf(h.logf, "worker: bad line %q: %v\n", sc.Text(), err)
				continue
			}
			if e.Ev == "conn" {
				w.mu.Lock()
				w.owners[e.Addr] = connOwner{e.Client, e.Slow}
				w.mu.Unlock()
				continue
			}
			w.events <- e
		}
		cmd.Wait()
	}()
	return w, nil
}

// await returns the next event, which must be of kind ev, within limit.
func (w *workerProc) await(ctx context.Context, ev string, limit time.Duration) (event, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case e, ok := <-w.events:
		if !ok {
			return event{}, fmt.Errorf("the worker exited (see its log) waiting for %q", ev)
		}
		if e.Ev != ev {
			return e, fmt.Errorf("the worker said %q (%s), want %q", e.Ev, e.Msg, ev)
		}
		return e, nil
	case <-t.C:
		return event{}, fmt.Errorf("no %q from the worker within %v", ev, limit)
	case <-ctx.Done():
		return event{}, ctx.Err()
	}
}

// send sends the worker a command.
func (w *workerProc) send(cmd string) error {
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("telling the worker %q: %w", cmd, err)
	}
	return nil
}

// ownersNow returns a copy of the connections' owners so far.
func (w *workerProc) ownersNow() map[string]connOwner {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := make(map[string]connOwner, len(w.owners))
	for k, v := range w.owners {
		m[k] = v
	}
	return m
}

// stop asks the worker to stop and waits for it, killing it after 10 s.
// It returns the worker's final event, if it said one.
func (w *workerProc) stop() (event, error) {
	w.send("stop")
	w.stdin.Close()
	var last event
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.events:
			if !ok {
				<-w.done
				if last.Ev != "done" {
					return last, errors.New("the worker ended without saying done (see its log)")
				}
				return last, nil
			}
			last = e
		case <-t.C:
			syscall.Kill(-w.pid, syscall.SIGKILL)
			<-w.done
			return last, errors.New("the worker did not stop within 10 s: killed")
		}
	}
}

// ferryCommit returns the commit the working tree is at, with -dirty when
// files outside bench/ differ from it. The status runs without optional
// locks, so it never writes the index.
func ferryCommit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "--no-optional-locks", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench").Output()
	if err == nil && len(strings.TrimSpace(string(st))) > 0 {
		commit += "-dirty"
	}
	return commit
}
