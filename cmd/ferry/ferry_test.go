package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/servertest"
)

// ferryBin is the ferry binary built once for the end-to-end tests.
var ferryBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ferry-e2e-")
	if err != nil {
		panic(err)
	}
	ferryBin = filepath.Join(dir, "ferry")
	build := []string{"build", "-race", "-o", ferryBin, "."}
	if os.Getenv("FERRY_MEASURE") != "" {
		// Measurements time the binary users run, not the race detector.
		build = []string{"build", "-o", ferryBin, "."}
	}
	out, err := exec.Command("go", build...).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		panic("building ferry: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one user's ferry world: a FERRY_HOME and a running server.
type env struct {
	t       *testing.T
	home    string
	dir     string   // The served directory.
	host    string   // HOST:PORT of the server.
	metrics string   // HOST:PORT of its metrics, if it serves them.
	via     []string // what client commands run through (a namespace's nsenter)
	members string   // the members file of its replica set, if it is in one
}

// start runs ferry serve on a new temporary tree, with extra flags, and
// waits for its address.
func start(t *testing.T, flags ...string) *env {
	return startVia(t, nil, flags...)
}

// startVia is start with the server run by the command via, which runs
// the command line that follows it (as prlimit does).
func startVia(t *testing.T, via []string, flags ...string) *env {
	return startIn(t, t.TempDir(), via, flags...)
}

// startIn is startVia with the server's FERRY_HOME given.
func startIn(t *testing.T, home string, via []string, flags ...string) *env {
	e := &env{t: t, home: home, dir: t.TempDir()}
	// FERRY_SERVE_ARGS adds flags to every server a measurement starts
	// (say, --cpuprofile /tmp/serve-%p.pprof).
	flags = append(flags, strings.Fields(os.Getenv("FERRY_SERVE_ARGS"))...)
	args := append(append(via, ferryBin, "serve", e.dir, "--listen", "127.0.0.1:0", "--grace", "2s"), flags...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = e.environ()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	// The server's log is kept in home too, for a test that fails.
	logFile, err := os.OpenFile(filepath.Join(home, "serve.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(logFile, sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("ferry serve did not stop on SIGTERM")
		}
	})
	re := regexp.MustCompile(`serving .* on (\S+)`)
	reMetrics := regexp.MustCompile(`metrics on http://(\S+)/metrics`)
	timeout := time.After(20 * time.Second)
	for e.host == "" {
		select {
		case l := <-lines:
			if m := re.FindStringSubmatch(l); m != nil {
				e.host = m[1]
			}
			if m := reMetrics.FindStringSubmatch(l); m != nil {
				e.metrics = m[1]
			}
		case <-timeout:
			t.Fatal("ferry serve printed no address")
		}
	}
	return e
}

// run runs a ferry client command and returns its output; it fails the test
// if the command's success differs from ok.
func (e *env) run(ok bool, args ...string) (stdout, stderr string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := e.command(ctx, args...)
	var o, er bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &er
	err := cmd.Run()
	if (err == nil) != ok {
		e.e2eFail(args, err, o.String(), er.String())
	}
	return o.String(), er.String()
}

func (e *env) e2eFail(args []string, err error, o, er string) {
	e.t.Helper()
	e.t.Fatalf("ferry %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, o, er)
}

// command returns a ferry client command of e, run through e.via.
func (e *env) command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, e.via...), ferryBin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = e.environ()
	return cmd
}

// environ is the environment of e's commands. The race detector's runtime
// sleeps a second before a successful exit unless told not to.
func (e *env) environ() []string {
	return append(os.Environ(), "FERRY_HOME="+e.home, "GORACE=atexit_sleep_ms=0")
}

func (e *env) at(p string) string { return e.host + ":" + p }

func writeTree(t *testing.T, dir string, files map[string]string) {
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sameTree fails unless a and b hold the same names, types, modes and bytes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	list := func(root string) map[string]string {
		m := map[string]string{}
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, p)
			if rel == local.TempDir {
				return filepath.SkipDir // The server's, never served.
			}
			v := fi.Mode().String()
			switch {
			case fi.Mode().IsRegular():
				b, _ := os.ReadFile(p)
				v += " " + string(b)
			case fi.Mode()&os.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				v += " -> " + l
			}
			m[rel] = v
			return nil
		})
		return m
	}
	ma, mb := list(a), list(b)
	for k, v := range ma {
		if mb[k] != v {
			t.Errorf("%s: %q in %s, %q in %s", k, trunc(v), a, trunc(mb[k]), b)
		}
	}
	for k := range mb {
		if _, ok := ma[k]; !ok {
			t.Errorf("%s is in %s only", k, b)
		}
	}
}

func trunc(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func TestEndToEnd(t *testing.T) {
	e := start(t)
	big := strings.Repeat("big file line\n", 300_000)
	writeTree(t, e.dir, map[string]string{
		"a.txt":        "alpha\n",
		"src/main.go":  "package main\n",
		"src/util.go":  "package util\n",
		"src/deep/x.c": "int x;\n",
		"big":          big,
	})
	os.Symlink("a.txt", filepath.Join(e.dir, "link"))

	// find: one request, entries as they stream.
	out, errOut := e.run(true, "find", e.at("/"), "name~*.go")
	if got, want := out, "/src/main.go\n/src/util.go\n"; got != want {
		t.Errorf("find = %q, want %q", got, want)
	}
	if !strings.Contains(errOut, "pinned the key of") {
		t.Errorf("first contact did not report pinning the server key: %q", errOut)
	}
	out, _ = e.run(true, "find", "-l", e.at("/src/deep"))
	if !strings.Contains(out, "path=/src/deep/x.c") || !strings.Contains(out, "size=7") {
		t.Errorf("find -l = %q", out)
	}
	_, errOut = e.run(false, "find", e.at("/"), "name=(")
	if !strings.Contains(errOut, "column") {
		t.Errorf("a malformed predicate's error does not give the position: %q", errOut)
	}
	// A typo is an error, not a search that finds nothing.
	for pred, want := range map[string]string{"nmae~*.go": "did you mean name?", "type=file": `no type "file"`, "foo=bar": `no attribute "foo"`} {
		if _, errOut = e.run(false, "find", e.at("/"), pred); !strings.Contains(errOut, want) {
			t.Errorf("ferry find %q: %q, want it to say %q", pred, errOut, want)
		}
	}
	// **/ is zero or more directories.
	if out, _ := e.run(true, "find", e.at("/"), "path~/src/**/*.go"); !strings.Contains(out, "/src/main.go") {
		t.Errorf("find path~/src/**/*.go = %q, want /src/main.go among them", out)
	}

	// ls and stat.
	out, _ = e.run(true, "ls", e.at("/"))
	if got, want := out, "a.txt\nbig\nlink\nsrc\n"; got != want {
		t.Errorf("ls = %q, want %q", got, want)
	}
	out, _ = e.run(true, "ls", "-l", e.at("/"))
	if !strings.Contains(out, "link -> a.txt") || !strings.HasPrefix(out, "-rw-r--r--") {
		t.Errorf("ls -l = %q", out)
	}
	out, _ = e.run(true, "stat", e.at("/a.txt"), e.at("/src"))
	if !strings.Contains(out, "path=/a.txt") || !strings.Contains(out, "path=/src size=4096 type=d") {
		t.Errorf("stat = %q", out)
	}
	// Times as dates, not the wire's nanoseconds.
	if !regexp.MustCompile(`mtime=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`).MatchString(out) {
		t.Errorf("stat shows no date for mtime: %q", out)
	}
	_, errOut = e.run(false, "stat", e.at("/nope"))
	if !strings.Contains(errOut, "does not exist") {
		t.Errorf("stat of a missing file: %q", errOut)
	}

	// cat, several files in one go.
	out, _ = e.run(true, "cat", e.at("/a.txt"), e.at("/src/main.go"))
	if want := "alpha\npackage main\n"; out != want {
		t.Errorf("cat = %q, want %q", out, want)
	}

	// get of a tree and of a file, byte for byte.
	dl := t.TempDir()
	e.run(true, "get", e.at("/"), filepath.Join(dl, "all"))
	sameTree(t, e.dir, filepath.Join(dl, "all"))
	e.run(true, "get", e.at("/big"), dl)
	if b, _ := os.ReadFile(filepath.Join(dl, "big")); string(b) != big {
		t.Errorf("get of a file: %d bytes, want %d", len(b), len(big))
	}

	// put of a tree into an existing directory, and of a file.
	up := t.TempDir()
	writeTree(t, up, map[string]string{"p/one": "1", "p/two/three": "3", "p/two/four": strings.Repeat("4", 1<<20)})
	os.Chmod(filepath.Join(up, "p/one"), 0o755)
	e.run(true, "put", filepath.Join(up, "p"), e.at("/src"))
	sameTree(t, filepath.Join(up, "p"), filepath.Join(e.dir, "src/p"))
	e.run(true, "put", filepath.Join(up, "p/one"), e.at("/one-copy"))
	if b, _ := os.ReadFile(filepath.Join(e.dir, "one-copy")); string(b) != "1" {
		t.Errorf("put of a file: %q", b)
	}

	// mv.
	e.run(true, "mv", e.at("/one-copy"), "/moved")
	if _, err := os.Stat(filepath.Join(e.dir, "moved")); err != nil {
		t.Errorf("mv: %v", err)
	}
	e.run(true, "mv", e.at("/moved"), e.at("/moved2"))
	// Into a directory, as mv(1): named by its path, or ending in /.
	e.run(true, "mv", e.at("/moved2"), e.at("/src"))
	e.run(true, "mv", e.at("/src/moved2"), "/src/deep/")
	if _, err := os.Stat(filepath.Join(e.dir, "src/deep/moved2")); err != nil {
		t.Errorf("mv into a directory: %v", err)
	}
	if _, errOut := e.run(false, "mv", e.at("/src/deep/moved2"), "/nodir/"); !strings.Contains(errOut, "no such directory") {
		t.Errorf("mv into a missing directory: %q", errOut)
	}
	// A local-looking TO is refused, not taken as a server path.
	if _, errOut := e.run(false, "mv", e.at("/src/deep/moved2"), "./local.txt"); !strings.Contains(errOut, "HOST:PATH or /PATH") {
		t.Errorf("mv to a local path: %q", errOut)
	}
	e.run(true, "mv", e.at("/src/deep/moved2"), "/moved2")

	// rm: a file, matching entries of a tree, a whole tree.
	e.run(true, "rm", e.at("/moved2"))
	e.run(false, "rm", e.at("/src"))
	e.run(true, "rm", "-r", e.at("/src"), "name~*.go")
	out, _ = e.run(true, "find", e.at("/src"), "type=f")
	if want := "/src/deep/x.c\n/src/p/one\n/src/p/two/four\n/src/p/two/three\n"; out != want {
		t.Errorf("after rm -r of *.go, find = %q, want %q", out, want)
	}
	e.run(true, "rm", "-r", e.at("/src"))
	if _, err := os.Stat(filepath.Join(e.dir, "src")); !os.IsNotExist(err) {
		t.Errorf("rm -r left src: %v", err)
	}

	// ctl: read, and a command. A native command works through the
	// cache layer over the client, as a mount does below its own layer.
	out, _ = e.run(true, "ctl", e.host)
	for _, want := range []string{"[cache]", "lease:", "[client]", "cache.chunks:", "[server]", "version:", "connections:", "calls.find:"} {
		if !strings.Contains(out, want) {
			t.Errorf("ctl lacks %q: %q", want, out)
		}
	}
	var sections []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[") {
			sections = append(sections, l)
		}
	}
	if len(sections) < 3 || !slices.Equal(sections[:3], []string{"[cache]", "[client]", "[server]"}) {
		t.Errorf("ctl's sections are %v, want [cache] [client] [server] first", sections)
	}
	e.run(true, "ctl", e.host, "debug", "on")
	out, _ = e.run(true, "ctl", e.host)
	if !strings.Contains(out, "debug: true") {
		t.Errorf("after debug on, ctl = %q", out)
	}
	e.run(false, "ctl", e.host, "no-such-command")

	// Nothing half-written or temporary was left in the served tree.
	filepath.Walk(e.dir, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(filepath.Base(p), ".ferry-") && p != filepath.Join(e.dir, local.TempDir) {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}

func TestEndToEndKeysAndTokens(t *testing.T) {
	e := start(t)
	// Another user, with a home of its own, is a stranger until authorized.
	other := &env{t: t, home: t.TempDir(), host: e.host}
	_, errOut := other.run(false, "ls", other.at("/"))
	if !strings.Contains(errOut, "unknown client key") {
		t.Errorf("a stranger's error: %q", errOut)
	}
	fp, _ := other.run(true, "key")
	e.run(true, "authorize", strings.TrimSpace(fp), "bob")
	other.run(true, "ls", other.at("/"))

	// A token user.
	tok, _ := e.run(true, "token", "carol")
	third := &env{t: t, home: t.TempDir(), host: e.host}
	third.run(true, "--token", strings.TrimSpace(tok), "ls", third.at("/"))
	third.run(false, "--token", "not-a-token", "ls", third.at("/"))

	// A server whose key changed is refused.
	hosts := filepath.Join(other.home, "known_hosts")
	b, _ := os.ReadFile(hosts)
	f := strings.Fields(string(b))
	os.WriteFile(hosts, []byte(f[0]+" SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"), 0o600)
	_, errOut = other.run(false, "ls", other.at("/"))
	if !strings.Contains(errOut, "key changed") {
		t.Errorf("a changed server key: %q", errOut)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	e := start(t, "--metrics", "127.0.0.1:0")
	if e.metrics == "" {
		t.Fatal("ferry serve --metrics printed no metrics address")
	}
	e.run(true, "ls", e.at("/"))
	resp, err := http.Get("http://" + e.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`ferry_calls_total{op="find"} 1`, "ferry_readahead_bytes",
		`ferry_call_seconds_count{method="Find"} 1`, "go_goroutines", "process_resident_memory_bytes", `ferry_build_info{version="`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

// TestErrorsSayWhy: a refused connection and a port that is not a
// Ferry server are reported in a person's words, with what to try.
func TestErrorsSayWhy(t *testing.T) {
	e := &env{t: t, home: t.TempDir()}
	refused := servertest.FreeAddr(t)
	_, errOut := e.run(false, "ls", refused+":/")
	if want := "cannot reach " + refused + ": connection refused (is ferry serve running there"; !strings.Contains(errOut, want) {
		t.Errorf("ferry ls of a refused port says %q, want %q", errOut, want)
	}
	// A port that answers in plain text, as a web server would.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	_, errOut = e.run(false, "ls", l.Addr().String()+":/")
	if want := l.Addr().String() + " does not speak Ferry"; !strings.Contains(errOut, want) {
		t.Errorf("ferry ls of a web server says %q, want %q", errOut, want)
	}
	if strings.Contains(errOut, "desc =") || strings.Contains(errOut, "remote.") {
		t.Errorf("the error shows gRPC's internals: %q", errOut)
	}
}

// TestFileTooLarge: a server whose files may be no larger than a limit
// (RLIMIT_FSIZE, as a quota on file size would) refuses a larger put with
// "file too large" and keeps nothing of it, and takes a smaller one.
func TestFileTooLarge(t *testing.T) {
	const limit = 4 << 20
	e := startVia(t, []string{"prlimit", fmt.Sprintf("--fsize=%d", limit), "--"})
	local := t.TempDir()
	big := filepath.Join(local, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("0123456789abcdef"), 2*limit/16), 0o644); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(local, "small")
	if err := os.WriteFile(small, []byte("fits\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut := e.run(false, "put", big, e.host+":/big")
	if !strings.Contains(errOut, "file too large") || strings.Contains(errOut, e.dir) {
		t.Errorf("putting %d bytes on a server limited to %d says %q, want file too large and no server path", 2*limit, limit, errOut)
	}
	t.Logf("ferry put says: %s", errOut)
	e.run(true, "put", small, e.host+":/small")
	if got, err := os.ReadFile(filepath.Join(e.dir, "small")); err != nil || string(got) != "fits\n" {
		t.Errorf("the small file on the server: %q, %v", got, err)
	}
	if left := fstest.Leftovers(e.dir); len(left) != 1 {
		t.Errorf("the served tree holds %v, want small alone", left)
	}
}

// TestNoCacheForUnreachedServer: a command that never reaches its server
// (nothing listens there) leaves no chunk cache made for it; one that
// reached it keeps its cache.
func TestNoCacheForUnreachedServer(t *testing.T) {
	e := &env{t: t, home: t.TempDir()}
	refused := servertest.FreeAddr(t)
	e.run(false, "get", refused+":/x", t.TempDir())
	if ents, _ := os.ReadDir(filepath.Join(e.home, "cache")); len(ents) != 0 {
		t.Errorf("a get from %s, never reached, left caches: %v", refused, ents)
	}
	s := start(t)
	s.run(false, "get", s.at("/no-such-file"), t.TempDir())
	if ents, _ := os.ReadDir(filepath.Join(s.home, "cache")); len(ents) != 1 {
		t.Errorf("a get from a server reached left %d caches, want its own", len(ents))
	}
}

// TestHelp: every command's help says what it does, once.
func TestHelp(t *testing.T) {
	e := &env{t: t, home: t.TempDir()}
	for _, c := range []string{"cat", "get", "put", "mount", "umount", "find", "ls", "mv", "rm", "sync", "ctl", "serve"} {
		out, _ := e.run(true, c, "--help")
		if strings.HasPrefix(out, "\n") || strings.Count(out, "Usage:") != 1 || strings.Contains(out, "internal/") {
			t.Errorf("ferry %s --help: it must begin with a description, say Usage once and point at no source folder:\n%s", c, out)
		}
	}
}

// TestVersionAndInterrupt: ferry --version says the version; a command
// stopped by Ctrl-C exits 130, as the shell expects.
func TestVersionAndInterrupt(t *testing.T) {
	e := &env{t: t, home: t.TempDir()}
	out, _ := e.run(true, "--version")
	if !strings.HasPrefix(out, "ferry version ") {
		t.Errorf("ferry --version = %q", out)
	}
	// A put to a server that never answers waits; SIGINT stops it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("x"), 0o644)
	cmd := exec.Command(ferryBin, "put", src, l.Addr().String()+":/f")
	cmd.Env = e.environ()
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := l.Accept() // The put is connecting: it waits for a handshake.
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("ferry put did not stop on SIGINT")
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("ferry put stopped by SIGINT exited %d, want 130 (stderr %q)", code, errOut.String())
	}
}

func TestBadTargets(t *testing.T) {
	e := &env{t: t, home: t.TempDir()}
	for _, args := range [][]string{
		{"ls", ":/x"},
		{"ls", "[::1:/x"},
		{"cat", "127.0.0.1:1:/" + strings.Repeat("n", 300)},
	} {
		_, errOut := e.run(false, args...)
		if errOut == "" {
			t.Errorf("ferry %q failed without saying why", args)
		}
	}
}

// TestInstall: scripts/install.sh (make install) stages the binary,
// mount.ferry, man pages for every command, shell completion and the
// server's systemd unit under DESTDIR.
func TestInstall(t *testing.T) {
	dest := t.TempDir()
	cmd := exec.Command("../../scripts/install.sh", ferryBin)
	cmd.Env = append(os.Environ(), "DESTDIR="+dest, "PREFIX=/opt/ferry")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	for _, f := range []string{
		"opt/ferry/bin/ferry",
		"opt/ferry/share/man/man1/ferry.1",
		"opt/ferry/share/man/man1/ferry-mount.1",
		"opt/ferry/share/man/man1/ferry-serve.1",
		"opt/ferry/share/bash-completion/completions/ferry",
		"opt/ferry/share/zsh/site-functions/_ferry",
		"opt/ferry/share/fish/vendor_completions.d/ferry.fish",
		"opt/ferry/share/doc/ferry/examples/mnt-src.mount",
	} {
		if fi, err := os.Stat(filepath.Join(dest, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(dest, "sbin/mount.ferry")); err != nil || l != "/opt/ferry/bin/ferry" {
		t.Errorf("sbin/mount.ferry links to %q (%v), want /opt/ferry/bin/ferry", l, err)
	}
	man, _ := os.ReadFile(filepath.Join(dest, "opt/ferry/share/man/man1/ferry-mount.1"))
	if !strings.Contains(string(man), "fstab") {
		t.Errorf("ferry-mount.1 does not say how to mount from /etc/fstab")
	}
	unit, _ := os.ReadFile(filepath.Join(dest, "etc/systemd/system/ferry-serve@.service"))
	if !strings.Contains(string(unit), "ExecStart=/opt/ferry/bin/ferry serve") {
		t.Errorf("the unit does not run the installed binary:\n%s", unit)
	}
	if out, err := exec.Command("bash", "-n", filepath.Join(dest, "opt/ferry/share/bash-completion/completions/ferry")).CombinedOutput(); err != nil {
		t.Errorf("the bash completion does not parse: %v %s", err, out)
	}
}

// TestTrailingSlash: a put or get of DIR/ copies DIR's contents into the
// destination, as rsync does, so that running it again (after an
// interruption, say) lands in the same place; without the slash the copy
// goes inside an existing destination under DIR's name, as cp does.
func TestTrailingSlash(t *testing.T) {
	e := start(t)
	src := filepath.Join(t.TempDir(), "proj")
	writeTree(t, src, map[string]string{"a.txt": "a\n", "sub/b.txt": "b\n"})
	e.run(true, "put", src, e.at("/dest"))     // /dest did not exist: it becomes the copy.
	e.run(true, "put", src+"/", e.at("/dest")) // Again, with the slash: the same place.
	sameTree(t, src, filepath.Join(e.dir, "dest"))
	e.run(true, "put", src, e.at("/dest")) // Without: nested, as cp -r does.
	sameTree(t, src, filepath.Join(e.dir, "dest", "proj"))

	local := t.TempDir()
	e.run(true, "get", e.at("/dest/sub/"), local)
	e.run(true, "get", e.at("/dest/sub/"), local)
	if b, err := os.ReadFile(filepath.Join(local, "b.txt")); err != nil || string(b) != "b\n" {
		t.Errorf("get of sub/ into %s: b.txt is %q, %v", local, b, err)
	}
	if _, err := os.Stat(filepath.Join(local, "sub")); !os.IsNotExist(err) {
		t.Errorf("get of sub/ made a sub directory: %v", err)
	}
	e.run(true, "get", e.at("/dest/sub"), local)
	if b, err := os.ReadFile(filepath.Join(local, "sub", "b.txt")); err != nil || string(b) != "b\n" {
		t.Errorf("get of sub into %s: sub/b.txt is %q, %v", local, b, err)
	}
}

// TestExclude: --exclude leaves out what matches, a directory with all
// below it, by name or by path under the copied tree, the same way in
// put, get and sync; sync --delete deletes nothing it excludes.
func TestExclude(t *testing.T) {
	e := start(t)
	src := filepath.Join(t.TempDir(), "proj")
	writeTree(t, src, map[string]string{
		"main.c": "int main;\n", "main.o": "obj", ".git/HEAD": "ref\n", "sub/x.c": "x\n",
		"sub/x.o": "obj", "gen/out.c": "gen\n", "sub/gen/keep.c": "keep\n",
	})
	want := map[string]string{"main.c": "int main;\n", "sub/x.c": "x\n", "sub/gen/keep.c": "keep\n"}
	check := func(what, dir string) {
		t.Helper()
		got := filesUnder(dir)
		for _, rel := range got {
			if b, _ := os.ReadFile(filepath.Join(dir, rel)); want[rel] != string(b) {
				t.Errorf("%s: %s holds %q, want it absent or %q", what, rel, b, want[rel])
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %v, want %d files", what, got, len(want))
		}
	}
	ex := []string{"--exclude", "*.o", "--exclude", ".git", "--exclude", "/gen"}
	e.run(true, append([]string{"put"}, append(ex, src, e.at("/p"))...)...)
	check("put", filepath.Join(e.dir, "p"))

	// Everything up, then get back without what is excluded.
	e.run(true, "put", src, e.at("/all"))
	local := filepath.Join(t.TempDir(), "g")
	e.run(true, append([]string{"get"}, append(ex, e.at("/all"), local)...)...)
	check("get", local)

	// sync --delete keeps what it excludes on the destination.
	dst := filepath.Join(t.TempDir(), "s")
	writeTree(t, dst, map[string]string{".git/HEAD": "mine\n", "stale.c": "old\n"})
	e.run(true, append([]string{"sync", "--delete"}, append(ex, e.at("/all"), dst)...)...)
	if b, _ := os.ReadFile(filepath.Join(dst, ".git/HEAD")); string(b) != "mine\n" {
		t.Errorf("sync --delete touched the excluded .git: %q", b)
	}
	os.RemoveAll(filepath.Join(dst, ".git"))
	check("sync", dst)
}

// TestRemoteCompletion: the shell's completion of HOST:PATH lists the
// server's names in PATH's directory that begin with what was typed,
// directories with a slash; a local path is left to the shell.
func TestRemoteCompletion(t *testing.T) {
	e := start(t)
	writeTree(t, e.dir, map[string]string{"src/a.c": "a", "sub.txt": "s", "other": "o"})
	// A server not yet trusted is not contacted to complete.
	if out, _ := e.run(true, "__complete", "get", e.at("/s")); strings.Contains(out, ":/s") {
		t.Errorf("completion contacted a server whose key is not pinned: %q", out)
	}
	e.run(true, "ls", e.at("/"))
	out, _ := e.run(true, "__complete", "get", e.at("/s"))
	for _, want := range []string{e.at("/src/"), e.at("/sub.txt")} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("completing %s: %q lacks %s", e.at("/s"), out, want)
		}
	}
	if strings.Contains(out, "other") {
		t.Errorf("completing %s offers other: %q", e.at("/s"), out)
	}
	out, _ = e.run(true, "__complete", "ls", e.at("/src/"))
	if !strings.Contains(out, e.at("/src/a.c")+"\n") {
		t.Errorf("completing %s: %q", e.at("/src/"), out)
	}
	out, _ = e.run(true, "__complete", "put", "./lo")
	if strings.Contains(out, ":/") {
		t.Errorf("completing a local path asked the server: %q", out)
	}
}

// TestInclude: --include keeps only the files that match (directories
// are walked for them), --exclude still wins, and a pattern ending in a
// slash matches directories only, as in .gitignore.
func TestInclude(t *testing.T) {
	e := start(t)
	src := filepath.Join(t.TempDir(), "proj")
	writeTree(t, src, map[string]string{
		"main.c": "m", "main.o": "o", "sub/x.c": "x", "sub/README": "r",
		"gen/g.c": "g", "sub/gen/h.c": "h", "doc/gen": "a file named gen",
	})
	e.run(true, "put", "--include", "*.c", "--include", "gen", "--exclude", "gen/", src, e.at("/p"))
	got := filesUnder(filepath.Join(e.dir, "p"))
	if want := []string{"doc/gen", "main.c", "sub/x.c"}; !slices.Equal(got, want) {
		t.Errorf("put --include '*.c' --include gen --exclude gen/ copied %v, want %v", got, want)
	}
}

// filesUnder returns the files below dir, relative to it, sorted.
func filesUnder(dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}
