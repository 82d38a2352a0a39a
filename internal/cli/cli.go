// Package cli implements the ferry command: the server, the native client
// commands and the administrative ones. cmd/ferry only calls Main.
package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/chunkstore"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/netem/netemcmd"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/replica"
	"github.com/ferryfs/ferry/internal/server"
	"github.com/ferryfs/ferry/internal/transport"
)

// Version is the version the server reports in its control file.
const Version = "0.1.0-dev"

// Main runs the ferry command with args and returns the exit status.
func Main(args []string) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var got atomic.Value // The signal that stopped the command, if one did.
	go func() {
		select {
		case s := <-sigs:
			got.Store(s)
			cancel()
		case <-ctx.Done():
		}
	}()
	root := Command()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		// A command cut short by a signal exits as the shell expects
		// (130 for Ctrl-C), saying only that it was interrupted.
		if s, ok := got.Load().(syscall.Signal); ok {
			fmt.Fprintf(os.Stderr, "ferry: interrupted (%v)\n", s)
			return 128 + int(s)
		}
		var rep errReported
		if !errors.As(err, &rep) || rep.n > 1 {
			fmt.Fprintf(os.Stderr, "ferry: %v\n", err)
		}
		return 1
	}
	return 0
}

// commit is the commit the binary was built from, set by make build
// (-ldflags -X), where the Go toolchain does not stamp it.
var commit string

// version is Version with the commit the binary was built from, if known.
func version() string {
	v := Version
	if commit != "" {
		return v + " (" + commit + ")"
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return v
}

// Command returns the root command with all subcommands wired.
func Command() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "A network file system for slow, lossy, far-away links",
		Long: `Ferry serves a directory tree to clients over high-latency links, streaming
whole walks and transfers in single requests instead of paying a round trip
for each file.

Remote paths are written HOST[:PORT]:PATH (port ` + DefaultPort + ` by default).
Keys and lists live in $FERRY_HOME (default ~/.config/ferry).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.PersistentFlags().String("token", "", "bearer token to present instead of the client key (or $FERRY_TOKEN)")
	root.PersistentFlags().Int("bulk-conns", remote.DefaultBulkConns, "`connections` that carry file data; a large download spreads its chunks over them; with BBR one was fastest on every link measured")
	// Each command with the flags and completion of its kind: commands on
	// remote paths wait --timeout and complete HOST:PATH; transfers have
	// the chunk cache, --exclude and --include, and (get, put) progress
	// flags.
	remoteCmd := func(c *cobra.Command) *cobra.Command { return remoteCompletion(timeoutFlag(c)) }
	transfer := func(c *cobra.Command) *cobra.Command { return filterFlags(remoteCmd(cacheFlags(c))) }
	root.AddCommand(
		serveCmd(),
		remoteCmd(findCmd()), remoteCmd(lsCmd()), remoteCmd(statCmd()), remoteCmd(cacheFlags(catCmd())),
		progressFlags(transfer(getCmd())), progressFlags(transfer(putCmd())), transfer(syncCmd()),
		remoteCmd(rmCmd()), remoteCmd(mvCmd()), timeoutFlag(cacheFlags(ctlCmd())),
		remoteCompletion(cacheFlags(mountCmd())), umountCmd(),
		keyCmd(), authorizeCmd(), tokenCmd(), manCmd(),
		netemcmd.Command(),
	)
	return root
}

// timeoutFlag gives a native command --timeout, as the mount has one.
func timeoutFlag(c *cobra.Command) *cobra.Command {
	c.Flags().Duration("timeout", remote.DefaultResumeFor, "how long the command waits for the server (a broken or silent connection, a restart) before it fails")
	return c
}

func serveCmd() *cobra.Command {
	var listen, metrics string
	var grace time.Duration
	var noSelf bool
	var ix indexOpts
	var raFixed int64
	var metricsPerConn, debug bool
	var cpuProfile string
	memory := sizeFlag(server.DefaultMemory)
	var rs replicaOpts
	c := &cobra.Command{
		Use:   "serve DIR",
		Short: "Serve the directory DIR",
		Long: `Serve the directory DIR to Ferry clients.

On first start the server makes its key pair in $FERRY_HOME and prints the
key's fingerprint, which clients pin on first connection. It admits clients
whose key fingerprints are in $FERRY_HOME/authorized_keys or whose tokens are
in $FERRY_HOME/tokens (see ferry authorize and ferry token); it also admits
the client key of the user running it, so that a server and clients on one
machine work together out of the box (--no-self turns that off).

It stops gracefully on SIGINT or SIGTERM: calls in flight get --grace to end.

--memory bounds what the server's calls hold in memory for their clients: a
quarter of it for files read ahead of downloads, the rest for what uploads
may send ahead of the disk (each upload reserves up to 32 MiB, less for a
smaller file). An upload that finds it taken is refused at once and its
client waits and tries again, for up to its --timeout.

With --metrics ADDR it also serves Prometheus metrics over plain HTTP at
ADDR/metrics: calls, bytes, read-ahead, the chunk index, compression, and
each connection's round trip, delivery rate, congestion controller and
retransmissions.

Files are served and accepted by content-defined chunks, so that a client
sends and fetches only the chunks the other side lacks. The chunk index
lives in --index (default $FERRY_HOME/index/NAME-HASH, one per served
directory) and holds at most --index-max chunks (about 100 bytes each), the
least recently used files dropped first. It is never trusted: every chunk
is hashed again before it is used, so files changed directly in DIR are
served correctly, and a lost or stale index costs bandwidth only. --reindex
(or writing "reindex" to the control file) rebuilds it in the background.
Files replaced, truncated or removed are kept a while outside DIR (beside
the index; --trash-max bytes, --trash-age long) with their chunks indexed,
because the next version of a file usually shares most of its chunks.

With --members FILE the server joins a replica set: FILE names each member
server, one "NAME ADDR FINGERPRINT" a line (ADDR where that member listens
for the other members, FINGERPRINT its server key's, as "ferry key --server"
prints it), the same file at every member. The server finds itself in it by
its key, listens on its ADDR for the other members only (both sides' keys
checked against FILE), and agrees with them, on a raft log kept in
--replica-log, which member controls which part of the tree. The control
file's [replica] section shows the set, its leader and the controls held;
"replica grant PATH [deep]", "replica release PATH" and "replica leader
NAME" act on them (ferry ctl HOST replica ...). Each member keeps a full
copy in its DIR: a change is made under a control this member holds (asked of the set, or of the member holding it),
then copied to the others in order; a read of what another member controls
waits for that member's updates, so an open after a close at another site
sees the close. A member that was down gets the changes made meanwhile
from the others, which keep them on disk for it.

To add a member to a running set, start it with --replica-join and a
members file that names the set's members and itself, then write
"replica add NAME ADDR FINGERPRINT" to any member's control file (ferry
ctl HOST replica add ...). The new member copies the tree from the set,
fetching only the chunks its directory lacks and removing what the set
does not have, then goes on with the changes made meanwhile, and serves
once it is current; the control file shows it as a learner until then.
The others learn it from the log; once it has joined, add its line to
their members files too, so that the files stay a true list of the set.
"replica remove NAME" removes a member that is gone for good (its site
lost, or added but never started): the others stop waiting for it, and
the controls it held are dropped with whatever of their changes it had
not sent. Stop its server first; a member removed does not join again
under its name.

Limitations: all admitted users have the server process's rights on DIR;
a real file named Ctl at the top of DIR is shadowed by the control file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cpuProfile != "" {
				stop, err := profileCPU(strings.ReplaceAll(cpuProfile, "%p", strconv.Itoa(os.Getpid())))
				if err != nil {
					return err
				}
				defer stop()
			}
			return serve(cmd.Context(), args[0], listen, metrics, grace, !noSelf, ix, rs, serverTuning{int64(memory), raFixed, metricsPerConn, debug}, cmd.ErrOrStderr())
		},
	}
	c.Flags().StringVar(&rs.members, "members", "", "join the replica set this members `file` names")
	c.Flags().StringVar(&rs.logDir, "replica-log", "", "directory of the replica set's raft log (default $FERRY_HOME/replica/NAME-HASH)")
	c.Flags().StringVar(&rs.listen, "replica-listen", "", "listen for the other members on this `address` instead of this member's ADDR in the members file (behind a proxy or a NAT)")
	c.Flags().BoolVar(&rs.join, "replica-join", false, "this member is new to a running set: wait until a member adds it, then copy the tree before serving")
	c.Flags().DurationVar(&rs.idle, "replica-idle", replica.DefaultIdle, "how long this member keeps control of a part of the tree it no longer changes")
	// The flag replica-shallow is hidden: it makes the set worse on
	// purpose, for the SSH-build measurement to compare against.
	c.Flags().BoolVar(&rs.shallow, "replica-shallow", false, "take control of each changed path alone, never of a subtree (for benchmarks)")
	c.Flags().MarkHidden("replica-shallow")
	c.Flags().StringVar(&ix.dir, "index", "", "directory of the chunk index (default $FERRY_HOME/index/NAME-HASH)")
	c.Flags().Int64Var(&ix.max, "index-max", defaultIndexMax, "the most chunks the index holds")
	c.Flags().BoolVar(&ix.rebuild, "reindex", false, "rebuild the chunk index in the background on start")
	c.Flags().Int64Var(&ix.trashMax, "trash-max", chunkstore.DefaultTrashMax, "the most bytes of replaced and removed files kept for their chunks (negative: none)")
	c.Flags().DurationVar(&ix.trashAge, "trash-age", chunkstore.DefaultTrashAge, "how long a replaced or removed file is kept for its chunks")
	c.Flags().StringVar(&listen, "listen", ":"+DefaultPort, "address to listen on")
	c.Flags().Var(&memory, "memory", "the memory calls may hold for their clients: a quarter for read-ahead, the rest for uploads in progress (256M, 1G, 4G)")
	c.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long calls in flight may take to finish on stop")
	c.Flags().BoolVar(&noSelf, "no-self", false, "do not admit the client key of the user running the server")
	c.Flags().StringVar(&metrics, "metrics", "", "serve Prometheus metrics over HTTP on this address (off if empty)")
	// The flag readahead-fixed is hidden: it makes the server worse on
	// purpose, for the load benchmark (bench/load) to compare against
	// (see server.Config.ReadAheadFixed).
	c.Flags().Int64Var(&raFixed, "readahead-fixed", 0, "read this many `bytes` ahead of every download whatever its connection carries, instead of sizing read-ahead by the connection (for benchmarks; 0: adaptive)")
	c.Flags().MarkHidden("readahead-fixed")
	c.Flags().BoolVar(&metricsPerConn, "metrics-per-connection", false, "label the connection metrics with each connection's address (for benchmarks: the series grow with the connections)")
	c.Flags().MarkHidden("metrics-per-connection")
	// The flag cpuprofile is hidden: it is for developers finding where a
	// server's time goes in a measurement.
	c.Flags().BoolVar(&debug, "debug", false, "log at debug level: calls refused, write leases refused, replica streams lost")
	c.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile to this `file` when the server stops (%p: the process id)")
	c.Flags().MarkHidden("cpuprofile")
	return c
}

// profileCPU profiles this process's CPU into file until stop is called.
func profileCPU(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, ferry.E("serve", file, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, ferry.E("serve", file, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// canChown reports whether this process may give files to other owners:
// it has CAP_CHOWN (bit 0 of CapEff in /proc/self/status), as root has.
func canChown() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return os.Geteuid() == 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&1 != 0
		}
	}
	return os.Geteuid() == 0
}

// serverTuning are serve's resource flags: its memory budget, and hidden
// ones for benchmarks, a fixed read-ahead and metrics per connection.
type serverTuning struct {
	memory         int64
	readAheadFixed int64
	metricsPerConn bool
	debug          bool // log at debug level
}

// replicaOpts are serve's replica set flags.
type replicaOpts struct {
	members string
	logDir  string
	listen  string
	idle    time.Duration
	shallow bool
	join    bool
}

// indexOpts are serve's chunk index flags.
type indexOpts struct {
	dir      string
	max      int64
	rebuild  bool
	trashMax int64
	trashAge time.Duration
}

// defaultIndexMax bounds the chunk index by default: 4 Mi chunks cover
// about 32 GiB of files at the average chunk of 8 KiB, in a few hundred MB
// of index.
const defaultIndexMax = 4 << 20

// indexDir returns the default index directory of the served directory
// dir: one per absolute path, so two served trees never share one.
func indexDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", ferry.E("serve", dir, ferry.KindInvalid, err)
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(auth.Home(), "index", filepath.Base(abs)+"-"+hex.EncodeToString(sum[:8])), nil
}

func serve(ctx context.Context, dir, listen, metrics string, grace time.Duration, self bool, ix indexOpts, rs replicaOpts, tune serverTuning, stderr io.Writer) error {
	home := auth.Home()
	key, created, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ServerKeyFile))
	if err != nil {
		return err
	}
	az := &auth.Authorizer{
		KeysFile:   filepath.Join(home, auth.AuthorizedKeysFile),
		TokensFile: filepath.Join(home, auth.TokensFile),
	}
	if self {
		ck, _, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ClientKeyFile))
		if err != nil {
			return err
		}
		if err := az.Authorize(auth.Fingerprint(ck.Public().(ed25519.PublicKey)), userName()); err != nil {
			return err
		}
	}
	lt, err := local.NewServed(dir)
	if err != nil {
		return err
	}
	if ix.dir == "" {
		if ix.dir, err = indexDir(dir); err != nil {
			lt.Close()
			return err
		}
	}
	if err := os.MkdirAll(ix.dir, 0o700); err != nil {
		lt.Close()
		return ferry.E("serve", ix.dir, err)
	}
	tree, err := chunkstore.Open(lt, chunkstore.Options{IndexDir: ix.dir, MaxChunks: ix.max, TrashMax: ix.trashMax, TrashAge: ix.trashAge})
	if err != nil {
		lt.Close()
		return ferry.E("serve", ix.dir, ferry.KindOf(err), fmt.Errorf("chunk index: %w (is another server using it? see --index)", err))
	}
	defer tree.Close()
	level := new(slog.LevelVar)
	if tune.debug {
		level.Set(slog.LevelDebug)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// Resumable uploads are staged beside the index, one directory per
	// served tree; what a killed server left there is resumed by its
	// clients (the server drops what waited longer than an hour).
	staging := filepath.Join(home, "staging", filepath.Base(ix.dir))
	var served ferry.FS = tree
	var set *replica.Set
	var rfs *replica.FS
	if rs.members != "" {
		if set, err = joinSet(&rs, key, home, ix.dir, log); err != nil {
			return err
		}
		defer set.Close()
		if rfs, err = replica.NewFS(tree, set, replica.Options{Spool: filepath.Join(rs.logDir, "spool"), Idle: rs.idle, ShallowOnly: rs.shallow}); err != nil {
			return err
		}
		defer rfs.Close()
		served = ctl.New("replica", rfs, set)
		fmt.Fprintf(stderr, "ferry: member %s of the replica set in %s, listening for members on %s\n", set.Self().Name, rs.members, set.Self().Addr)
	}
	srv, err := server.New(server.Config{FS: served, Key: key, Auth: az, Version: Version, Log: log, Level: level, Memory: tune.memory, Owners: canChown(), ReadAheadFixed: tune.readAheadFixed, MetricsPerConn: tune.metricsPerConn, StagingDir: staging})
	if err != nil {
		return err
	}
	if rfs != nil {
		rfs.SetLeases(srv.Leases())
	}
	if ix.rebuild {
		if err := srv.Reindex(); err != nil {
			return err
		}
	}
	l, err := transport.Listen(ctx, listen)
	if err != nil {
		return ferry.E("serve", listen, ferry.KindUnavailable, err)
	}
	what := "server key"
	if created {
		what = "new server key"
	}
	if metrics != "" {
		ml, err := net.Listen("tcp", metrics)
		if err != nil {
			l.Close()
			return ferry.E("serve", metrics, ferry.KindUnavailable, err)
		}
		reg := prometheus.NewRegistry()
		if set != nil {
			reg.MustRegister(set.Collector())
		}
		reg.MustRegister(srv.Collector(),
			// The runtime's and the process's own: memory, threads,
			// descriptors, CPU.
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_build_info", Help: "Always 1; the version is a label.",
				ConstLabels: prometheus.Labels{"version": version()}}, func() float64 { return 1 }))
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ml)
		defer hs.Close()
		fmt.Fprintf(stderr, "ferry: metrics on http://%s/metrics\n", ml.Addr())
	}
	fmt.Fprintf(stderr, "ferry: serving %s on %s (chunk index in %s)\nferry: %s %s\n", dir, l.Addr(), ix.dir, what, auth.Fingerprint(key.Public().(ed25519.PublicKey)))
	sctx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go sweep(sctx, tree, time.Now(), log)
	err = srv.Serve(ctx, l, grace)
	fmt.Fprintln(stderr, "ferry: stopped")
	return err
}

// joinSet opens this server's part of the replica set rs names.
func joinSet(rs *replicaOpts, key ed25519.PrivateKey, home, indexDir string, log *slog.Logger) (*replica.Set, error) {
	ms, err := replica.LoadMembers(rs.members)
	if err != nil {
		return nil, err
	}
	if rs.logDir == "" {
		rs.logDir = filepath.Join(home, "replica", filepath.Base(indexDir))
	}
	if err := os.MkdirAll(rs.logDir, 0o700); err != nil {
		return nil, ferry.E("serve", rs.logDir, err)
	}
	return replica.Open(replica.Config{Members: ms, Key: key, LogDir: rs.logDir, Listen: rs.listen, Log: log, Join: rs.join})
}

// sweep removes, in the background, the temporary files that Puts of an
// earlier server left in the tree when it was killed, keeping the chunks
// that arrived for the Puts tried again.
func sweep(ctx context.Context, tree *chunkstore.Tree, start time.Time, log *slog.Logger) {
	n, bytes, err := tree.Sweep(ctx, start)
	if n > 0 || err != nil {
		log.Info("removed the temporary files of interrupted uploads, keeping what arrived", "files", n, "bytes", bytes, "err", err)
	}
}

func userName() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return fmt.Sprint(os.Getuid())
}

// dial connects to the server of t as this user.
func dial(cmd *cobra.Command, addr string, tune ...func(*remote.Config)) (*remote.Client, error) {
	home := auth.Home()
	tok, _ := cmd.Flags().GetString("token")
	if tok == "" {
		tok = os.Getenv("FERRY_TOKEN")
	}
	cfg := remote.Config{
		Addr:  addr,
		Token: tok,
		Hosts: &auth.KnownHosts{
			File: filepath.Join(home, auth.KnownHostsFile),
			Pinned: func(addr, fp string) {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferry: pinned the key of %s: %s\n", addr, fp)
			},
		},
	}
	if tok == "" {
		key, _, err := auth.LoadOrCreateKey(filepath.Join(home, auth.ClientKeyFile))
		if err != nil {
			return nil, err
		}
		cfg.Key = key
	}
	cfg.BulkConns, _ = cmd.Flags().GetInt("bulk-conns")
	if cmd.Flags().Lookup("timeout") != nil {
		// A transfer rides out a broken connection no longer than a
		// call may wait.
		cfg.ResumeFor, _ = cmd.Flags().GetDuration("timeout")
	}
	if _, ok := cmd.Annotations[briefFinds]; ok {
		cfg.FindOmit = remote.BriefAttrs
	}
	var made string
	cfg.Cache, made = openCache(cmd, addr)
	cfg.CloseCache = true
	if made != "" {
		// A cache made for a server never reached (a typo, a refusal)
		// is not left behind.
		cfg.AfterClose = func(reached bool) {
			if !reached {
				os.RemoveAll(made)
			}
		}
	}
	for _, f := range tune {
		f(&cfg)
	}
	c, err := remote.Dial(cfg)
	if err != nil && cfg.Cache != nil {
		cfg.Cache.Close()
		if made != "" {
			os.RemoveAll(made)
		}
	}
	return c, err
}

// briefFinds, as a key of a command's Annotations, marks a command whose
// walks look only at types, sizes, mtimes and modes: its client asks the
// server to leave remote.BriefAttrs out of Find results.
const briefFinds = "ferry-brief-finds"

// withRemote parses a target, opens the stack to its server and runs fn.
func withRemote(cmd *cobra.Command, target string, fn func(ctx context.Context, c *stack, t Target) error) error {
	t, err := ParseTarget(target)
	if err != nil {
		return err
	}
	c, err := openStack(cmd, t.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(cmd.Context(), c, t)
}

func keyCmd() *cobra.Command {
	var srv bool
	c := &cobra.Command{
		Use:   "key",
		Short: "Print this user's client key fingerprint, making the key if needed",
		Long: `Key prints this user's client key fingerprint, making the key if needed;
a server admits it with "ferry authorize". With --server it prints the
server key's instead, as a replica set's members file names it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file := auth.ClientKeyFile
			if srv {
				file = auth.ServerKeyFile
			}
			key, _, err := auth.LoadOrCreateKey(filepath.Join(auth.Home(), file))
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), auth.Fingerprint(key.Public().(ed25519.PublicKey)))
			return nil
		},
	}
	c.Flags().BoolVar(&srv, "server", false, "print the server key's fingerprint")
	return c
}

func authorizeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "authorize FINGERPRINT USER",
		Short: "Admit a client key to this machine's server (see ferry key)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !strings.HasPrefix(args[0], "SHA256:") {
				return ferry.E("authorize", args[0], ferry.KindInvalid, "a fingerprint starts with SHA256:")
			}
			az := &auth.Authorizer{KeysFile: filepath.Join(auth.Home(), auth.AuthorizedKeysFile)}
			return az.Authorize(args[0], args[1])
		},
	}
}

func tokenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "token USER",
		Short: "Make a bearer token that this machine's server admits as USER, and print it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok := auth.NewToken()
			f, err := os.OpenFile(filepath.Join(auth.Home(), auth.TokensFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(f, "%s %s\n", tok, args[0]); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
}

// errorList gathers the errors of calls issued without waiting for each.
type errorList struct {
	errs []error
	w    io.Writer
}

func (l *errorList) add(err error) {
	if err == nil {
		return
	}
	l.errs = append(l.errs, err)
	fmt.Fprintf(l.w, "ferry: %v\n", err)
}

func (l *errorList) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	return errReported{l.errs[0], len(l.errs)}
}

// errReported stands for errors already printed as they happened; Main
// prints only a count when there were several.
type errReported struct {
	first error
	n     int
}

func (e errReported) Error() string {
	if e.n == 1 {
		return e.first.Error()
	}
	return fmt.Sprintf("%d errors, the first: %v", e.n, e.first)
}

func (e errReported) Unwrap() error { return e.first }
