package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry/internal/cli"
)

// A workload is one task timed for every system that can do it.
type workload struct {
	name  string
	title string // the report's heading
	desc  string // what each system runs, for the report
}

// workloads are run in this order. "ceiling" (iperf3) is measured apart.
var workloads = []workload{
	{"get-file", "Copy the big file from the server", "Downloads the big file into an empty local directory: `scp`, `rsync -a`, `cp` out of a fresh sshfs or Ferry mount, `ferry get`."},
	{"put-file", "Copy the big file to the server", "Uploads the big file into an empty server directory: `scp`, `rsync -a`, `cp` into a fresh sshfs or Ferry mount, `ferry put`."},
	{"read-file", "Read the big file sequentially", "Reads the big file to /dev/null: `cat` through a fresh sshfs or Ferry mount, `ssh host cat`, `ferry cat`."},
	{"get-tree", "Copy the source tree from the server", "Downloads the tree into an empty local directory: `scp -r`, `rsync -a`, `cp -r` out of a fresh sshfs or Ferry mount, `ferry get`."},
	{"put-tree", "Copy the source tree to the server", "Uploads the tree into an empty server directory: `scp -r`, `rsync -a`, `cp -r` into a fresh sshfs or Ferry mount, `ferry put`."},
	{"find", "Walk the tree: find", "Lists every name in the tree: `find` on a fresh sshfs or Ferry mount, `rsync -r --list-only`, `ssh host find`, `ferry find`."},
	{"ls-lR", "Walk the tree with attributes: ls -lR", "Lists every entry with its attributes: `ls -lR` on a fresh sshfs or Ferry mount, `rsync -r --list-only` (mode, size and time of each entry), `ssh host ls -lR`, `ferry find -l`."},
	{"grep-r", "Search the tree: grep -r, cold", "Reads every file of the tree looking for a string that is not there: `grep -r` on a fresh sshfs or Ferry mount, and `ssh host grep -r`, which runs on the server and so moves no file data."},
	{"missing-name", "Look up a name that does not exist", "Looks up a name that is not there in the tree's deepest directory and checks the answer is \"no such file\": `stat` on a fresh sshfs or Ferry mount, `rsync --list-only`, `ssh host test -e`, `ferry stat`."},
	{"grep-warm", "Search the tree: grep -r, warm", "The same search as grep-r, timed the second time on the same mount (the first, cold one is not timed): `grep -r` on sshfs or a Ferry mount; `ssh host grep -r` runs on the server, where nothing is cold, and is there for reference."},
	{"diff-r", "Compare the tree with a local copy: diff -r", "Compares the server's tree with an identical local copy, file by file, and checks they are found equal: `diff -r` between a fresh sshfs or Ferry mount and the local copy; `rsync -rn --checksum -i` from the local copy, which checksums on both ends and so moves no file data (its itemized output must be empty)."},
	{"rm-tree", "Remove a tree", "Removes a copy of the tree made on the server before the run (untimed) and checks it is gone: `rm -r` on a fresh sshfs or Ferry mount, `ssh host rm -rf`, `ferry rm -r`."},
	{"make-j2", "Compile a C project: make -j2", "Builds a C project of small modules (how many: see Other data above; a .c file and a header each, generated deterministically, plus main.c and a Makefile), copied to the server before the run (untimed), and checks the program it builds prints the right sum: `make -j2` on a fresh sshfs or Ferry mount (the compiler runs on the client), and `ssh host make -j2`, which builds on the server and moves no file data."},
	{"recompile", "Recompile after touching one header: make -j2", "The C project of make-j2 is on the server, built once (untimed: on a Ferry mount through the mount, for the others on the server's disk, since sshfs keeps nothing a later build could use); then, also untimed, the header of the middle module, which that module and main.c include, is replaced two seconds later (SFTP's times are whole seconds) by one with a different constant, through the path the build uses (the mount, or the server's disk for ssh and the local disk). The timed run is `make -j2` again, which compiles those two files and links the program anew; the program must then print the new sum, and both objects be newer than the header. `make -j2` on sshfs or a Ferry mount (the compiler runs on the client), `ssh host make -j2` on the server, and on the local disk, for reference. Upstream bytes are the point: the new objects and program share most of their bytes with the old ones (LBFS)."},
	{"edit-save", "Save a one-line edit of a large document", "A text file of a few MB (license texts and Go sources; its size is in Other data above) is on the server; the client has a copy with one line in the middle changed and saves it over the server's, which is then checked byte for byte. On sshfs and a Ferry mount, as an editor saves: the file is read first (untimed, the editor opening it), then the timed save writes a temporary file beside it and renames it over the original. `rsync -a` of the edited file (its delta transfer sends only what changed), `scp`, `ferry put`. Upstream bytes are the point."},
	{"git-status", "git status in a repository, warm", "`git status` in a git repository of the profile's directory (see Other data; made and committed on the server before the runs), timed the second time on the same mount (the first, cold one is not timed): on sshfs or a Ferry mount; `ssh host git status`, where nothing is cold; and on the local disk, for reference."},
	{"upgrade", "Upgrade a source tree to the next version", "Version A of a real Go module (from the local module cache), or of one directory of it, is on the server; the client holds version B and updates the server's copy to it, which is then checked: every file of B must be there with B's content, and for rsync and ferry nothing else. `rsync -a --delete` (sends only differences, removes what B dropped), `scp -r` and `cp -r` on a fresh sshfs or Ferry mount (copy every file, leave what B dropped), `ferry sync --delete` from B to A (copies the files whose size or modification time differ, by chunks the server lacks, and removes what B dropped)."},
}

// grepFor is a string no source file contains, so grep reads everything.
const grepFor = "ferry-bench-no-such-string-7f3a"

func workloadNames() []string {
	n := []string{"ceiling"}
	for _, w := range workloads {
		n = append(n, w.name)
	}
	return n
}

// errUnavailable marks a system or workload that cannot run yet; the
// report says "not yet available" in its cells.
var errUnavailable = errors.New("not yet available")

// errNotApplicable marks a system that has no sensible way to do a
// workload; the report says "not applicable" in its row, with the reason.
var errNotApplicable = errors.New("not applicable")

// notApplicable returns an error wrapping errNotApplicable with the reason.
func notApplicable(why string) error { return fmt.Errorf("%w: %s", errNotApplicable, why) }

// errNotMeasured marks a system that could do a workload but that the
// harness cannot run on this machine yet; the report says "not measured"
// in its row, with the reason.
var errNotMeasured = errors.New("not measured")

// A system is one way to move or reach files over the link: a peer tool or
// Ferry. The harness calls setup once per condition, then for each workload
// script, and before every timed run reset; teardown last, also after a
// failed setup.
type system interface {
	name() string
	// setup prepares the system on e's fresh bed (start a server, check
	// the binary). An error wrapping errUnavailable marks the system's
	// rows "not yet available"; any other error marks them failed.
	setup(ctx context.Context, e *env) error
	// script returns the shell script that performs w once in the client
	// namespace, or an error that the report shows in w's row instead of a
	// time: one wrapping errNotApplicable if the system has no way to do
	// w, errNotMeasured or errUnavailable if it cannot run here or yet.
	// It never returns "" and no error: every system has a row in every
	// workload's table (TestEverySystemHasEveryRow).
	script(w workload, e *env) (string, error)
	// reset makes the next run cold (for example a fresh mount). It runs
	// untimed before every run.
	reset(ctx context.Context, e *env) error
	// teardown undoes setup and reset; it must be safe after a failed
	// setup and when called twice.
	teardown(e *env)
}

func allSystems(h *harness, b *ferryBuild) []system {
	return []system{sshSystem{"scp"}, sshSystem{"rsync"}, sshSystem{"ssh"}, &sshfs{}, &ferry{b: b}, &ferryMount{b: b}, &ferryMount{b: b, writeBack: true}, nfs{}, localDisk{}, &tcpSystem{}}
}

// systemNames are the systems in the order of the report's rows. Every
// system whose name starts with "ferry" is Ferry; the others are peers.
func systemNames() []string {
	return []string{"scp", "rsync", "ssh", "sshfs", "ferry", "ferry-mount", "ferry-mount-wb", "nfs", "local-disk", "tcp"}
}

func isFerry(system string) bool { return strings.HasPrefix(system, "ferry") }

// isPeer reports whether system is a tool Ferry is compared with: not
// Ferry, and not a reference (the local disk, one bare TCP stream).
func isPeer(system string) bool { return !isFerry(system) && system != "local-disk" && system != "tcp" }

// sshSystem is scp, rsync or plain ssh commands, all through the harness's
// sshd and client configuration. They keep no state between runs.
type sshSystem struct{ tool string }

func (s sshSystem) name() string                            { return s.tool }
func (s sshSystem) setup(ctx context.Context, e *env) error { return nil }
func (s sshSystem) reset(ctx context.Context, e *env) error { return nil }
func (s sshSystem) teardown(e *env)                         {}

func (s sshSystem) script(w workload, e *env) (string, error) {
	F := "-F " + q(e.sshConfig)
	rsh := "-e " + q("ssh "+F)
	remote := func(p string) string { return "bench:" + q(p) }
	big, tree := filepath.Join(e.srv, bigName), filepath.Join(e.srv, treeName)
	stree := filepath.Join(e.src, treeName)
	x := &e.h.data.extra
	switch s.tool + " " + w.name {
	case "scp get-file":
		return fmt.Sprintf("scp -q %s %s %s", F, remote(big), q(e.out+"/")), nil
	case "scp put-file":
		return fmt.Sprintf("scp -q %s %s %s", F, q(e.h.data.putBig), remote(e.in+"/")), nil
	case "scp get-tree":
		return fmt.Sprintf("scp -q -r %s %s %s", F, remote(tree), q(e.out+"/")), nil
	case "scp put-tree":
		return fmt.Sprintf("scp -q -r %s %s %s", F, q(stree), remote(e.in+"/")), nil
	case "rsync get-file":
		return fmt.Sprintf("rsync -a %s %s %s", rsh, remote(big), q(e.out+"/")), nil
	case "rsync put-file":
		return fmt.Sprintf("rsync -a %s %s %s", rsh, q(e.h.data.putBig), remote(e.in+"/")), nil
	case "rsync get-tree":
		return fmt.Sprintf("rsync -a %s %s %s", rsh, remote(tree), q(e.out+"/")), nil
	case "rsync put-tree":
		return fmt.Sprintf("rsync -a %s %s %s", rsh, q(stree), remote(e.in+"/")), nil
	case "rsync find", "rsync ls-lR":
		// --list-only prints each entry's mode, size and mtime: rsync's
		// listing with attributes.
		return fmt.Sprintf("rsync -r --list-only %s %s >/dev/null", rsh, remote(tree+"/")), nil
	case "ssh read-file":
		return fmt.Sprintf("ssh %s bench cat %s >/dev/null", F, q(q(big))), nil
	case "ssh find":
		return fmt.Sprintf("ssh %s bench find %s >/dev/null", F, q(q(tree))), nil
	case "ssh ls-lR":
		return fmt.Sprintf("ssh %s bench ls -lR %s >/dev/null", F, q(q(tree))), nil
	case "scp read-file", "rsync read-file":
		return "", notApplicable(s.tool + " copies into files; `ssh host cat` is the ssh row")
	case "ssh get-file", "ssh put-file", "ssh get-tree", "ssh put-tree":
		return "", notApplicable("copying over ssh is what the scp and rsync rows measure")
	case "scp find", "scp ls-lR":
		return "", notApplicable("scp only copies; `ssh host find` and `ssh host ls -lR` are the ssh rows")
	case "ssh grep-r", "ssh grep-warm":
		return fmt.Sprintf("ssh %s bench grep -r %s %s >/dev/null; test $? -le 1", F, grepFor, q(q(tree))), nil

	case "rsync missing-name":
		// rsync fails with "No such file or directory" (exit 23); any
		// other failure is not the answer.
		return fmt.Sprintf("rsync --list-only %s %s 2>&1 | grep -q 'No such file or directory'", rsh, remote(filepath.Join(e.srv, x.missing))), nil
	case "ssh missing-name":
		// test -e exits 1 for a missing name; ssh's own failures are 255.
		return fmt.Sprintf("ssh %s bench test -e %s; test $? -eq 1", F, q(q(filepath.Join(e.srv, x.missing)))), nil
	case "scp missing-name":
		return "", notApplicable("scp only copies; `ssh host test -e` is the ssh row")

	case "scp grep-r", "rsync grep-r", "scp grep-warm", "rsync grep-warm":
		return "", notApplicable(s.tool + " only copies; `ssh host grep -r` is the ssh row")

	case "rsync diff-r":
		return fmt.Sprintf("out=$(rsync -rn --checksum -i %s %s %s) && test -z \"$out\"", rsh, q(stree+"/"), remote(tree+"/")), nil
	case "scp diff-r":
		return "", notApplicable("scp only copies")
	case "ssh diff-r":
		return "", notApplicable("the local copy is on the client, and ssh alone cannot compare with it")

	case "ssh rm-tree":
		return fmt.Sprintf("ssh %s bench rm -rf %s", F, q(q(filepath.Join(e.in, treeName)))), nil
	case "scp rm-tree":
		return "", notApplicable("scp only copies")
	case "rsync rm-tree":
		return "", notApplicable("rsync removes only while syncing (--delete); `ssh host rm -rf` is the ssh row")

	case "ssh git-status":
		return fmt.Sprintf("ssh %s bench git -C %s status >/dev/null", F, q(q(filepath.Join(e.srv, repoName)))), nil
	case "scp git-status", "rsync git-status":
		return "", notApplicable(s.tool + " only copies; `ssh host git status` is the ssh row")

	case "ssh make-j2":
		return fmt.Sprintf("ssh %s bench make -j2 -C %s", F, q(q(filepath.Join(e.in, cprojName)))), nil
	case "ssh recompile":
		return fmt.Sprintf("ssh %s bench make -j2 -C %s", F, q(q(filepath.Join(e.in, cprojName)))), nil
	case "scp make-j2", "rsync make-j2", "scp recompile", "rsync recompile":
		return "", notApplicable(s.tool + " only copies; `ssh host make` is the ssh row")

	case "scp edit-save":
		return fmt.Sprintf("scp -q %s %s %s", F, q(x.docEdited), remote(filepath.Join(e.in, docName))), nil
	case "rsync edit-save":
		return fmt.Sprintf("rsync -a %s %s %s", rsh, q(x.docEdited), remote(filepath.Join(e.in, docName))), nil
	case "ssh edit-save":
		return "", notApplicable("ssh runs commands; saving a local file over it is what scp does")

	case "scp upgrade":
		return fmt.Sprintf("scp -q -r %s %s %s", F, q(x.modB), remote(e.in+"/")), nil
	case "rsync upgrade":
		return fmt.Sprintf("rsync -a --delete %s %s %s", rsh, q(x.modB+"/"), remote(filepath.Join(e.in, modName)+"/")), nil
	case "ssh upgrade":
		return "", notApplicable("ssh runs commands; copying over it is what scp and rsync do")
	}
	return "", fmt.Errorf("%w: the harness has no %s command for %s", errUnavailable, s.tool, w.name)
}

// sshfs mounts the server's tree over SFTP with default options, afresh
// before every run so that its caches are cold.
type sshfs struct{ mounted bool }

func (s *sshfs) name() string                            { return "sshfs" }
func (s *sshfs) setup(ctx context.Context, e *env) error { return nil }

func (s *sshfs) reset(ctx context.Context, e *env) error {
	s.teardown(e)
	// sshfs forks into the background once the mount is up; the daemon
	// stays in the client namespace, where netem.Bed.Close would kill it
	// if teardown did not unmount it first.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := e.command(ctx, e.bed.ClientNS, "sshfs", "-F", e.sshConfig, "bench:"+e.srv, e.mnt)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	s.mounted = true
	return nil
}

func (s *sshfs) teardown(e *env) {
	if s.mounted || isMounted(e.mnt) {
		unmount(e.mnt)
		s.mounted = false
	}
}

func (s *sshfs) script(w workload, e *env) (string, error) { return mountScript(w, e) }

// mountScript returns the commands of workload w on a file system mounted
// at e.mnt, the server's tree.
func mountScript(w workload, e *env) (string, error) {
	m := e.mnt
	x := &e.h.data.extra
	switch w.name {
	case "get-file":
		return fmt.Sprintf("cp %s %s", q(m+"/"+bigName), q(e.out+"/")), nil
	case "put-file":
		return fmt.Sprintf("cp %s %s", q(e.h.data.putBig), q(m+"/in/")), nil
	case "read-file":
		return fmt.Sprintf("cat %s >/dev/null", q(m+"/"+bigName)), nil
	case "get-tree":
		return fmt.Sprintf("cp -r %s %s", q(m+"/"+treeName), q(e.out+"/")), nil
	case "put-tree":
		return fmt.Sprintf("cp -r %s %s", q(filepath.Join(e.src, treeName)), q(m+"/in/")), nil
	case "find":
		return fmt.Sprintf("find %s >/dev/null", q(m+"/"+treeName)), nil
	case "ls-lR":
		return fmt.Sprintf("ls -lR %s >/dev/null", q(m+"/"+treeName)), nil
	case "grep-r", "grep-warm":
		return fmt.Sprintf("grep -r %s %s >/dev/null; test $? -le 1", grepFor, q(m+"/"+treeName)), nil
	case "missing-name":
		return fmt.Sprintf("stat %s 2>&1 | grep -q 'No such file or directory'", q(m+"/"+x.missing)), nil
	case "diff-r":
		return fmt.Sprintf("diff -r %s %s >/dev/null", q(m+"/"+treeName), q(filepath.Join(e.src, treeName))), nil
	case "rm-tree":
		return fmt.Sprintf("rm -r %s", q(m+"/in/"+treeName)), nil
	case "make-j2", "recompile":
		return fmt.Sprintf("make -j2 -C %s", q(m+"/in/"+cprojName)), nil
	case "git-status":
		return fmt.Sprintf("git -C %s status >/dev/null", q(m+"/"+repoName)), nil
	case "edit-save":
		// As an editor saves: a temporary file beside the original,
		// renamed over it.
		tmp := m + "/in/." + docName + ".tmp"
		return fmt.Sprintf("cp %s %s && mv -f %s %s", q(x.docEdited), q(tmp), q(tmp), q(m+"/in/"+docName)), nil
	case "upgrade":
		return fmt.Sprintf("cp -r %s %s", q(x.modB), q(m+"/in/")), nil
	}
	return "", fmt.Errorf("%w: the harness has no mount command for %s", errUnavailable, w.name)
}

// mountWarmup returns the untimed script run on a mount after reset and
// before the timed run of w, or "".
func mountWarmup(w workload, e *env) string {
	switch w.name {
	case "grep-warm", "git-status":
		sc, _ := mountScript(w, e)
		return sc
	case "edit-save":
		// The editor opens the file before it saves it.
		return fmt.Sprintf("cat %s >/dev/null", q(e.mnt+"/in/"+docName))
	}
	return ""
}

// isMounted reports whether dir is a mount point, from /proc/self/mountinfo.
func isMounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && fs[4] == dir {
			return true
		}
	}
	return false
}

// unmount unmounts a FUSE file system, lazily if it is busy or dead.
func unmount(dir string) {
	if exec.Command("fusermount3", "-u", dir).Run() != nil {
		exec.Command("fusermount3", "-u", "-z", dir).Run()
	}
}

// ferryPort is the port ferry serve listens on in the server namespace.
const ferryPort = 7077

// ferryBuild is the ferry binary, built once per run from ./cmd/ferry, and
// the subcommands it has.
type ferryBuild struct {
	h    *harness
	once sync.Once
	bin  string
	cmds map[string]bool
	err  error // why Ferry cannot run at all
}

// get builds the binary the first time and reads its subcommands from its
// help.
func (b *ferryBuild) get(ctx context.Context) error {
	b.once.Do(func() {
		b.bin = filepath.Join(b.h.work, "bin", "ferry")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.bin, "./cmd/ferry")
		cmd.Dir = b.h.o.root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("%w: go build ./cmd/ferry failed: %s", errUnavailable, firstLine(string(out)))
			return
		}
		help, _ := exec.CommandContext(ctx, b.bin, "--help").CombinedOutput()
		b.cmds = subcommands(string(help))
		if !b.cmds["serve"] {
			b.err = fmt.Errorf("%w: the ferry binary has no serve subcommand", errUnavailable)
		}
	})
	return b.err
}

// need returns an error wrapping errUnavailable if the binary lacks cmd.
func (b *ferryBuild) need(cmd string) error {
	if b.err != nil {
		return b.err
	}
	if b.cmds != nil && !b.cmds[cmd] {
		return fmt.Errorf("%w: needs `ferry %s`", errUnavailable, cmd)
	}
	return nil
}

// subcommands parses the "Available Commands:" section of a cobra help text.
func subcommands(help string) map[string]bool {
	m := map[string]bool{}
	in := false
	word := regexp.MustCompile(`^\s+([a-z][a-z0-9-]*)\s`)
	for _, l := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(l, "Available Commands:"):
			in = true
		case in && strings.TrimSpace(l) == "":
			in = false
		case in:
			if s := word.FindStringSubmatch(l); s != nil {
				m[s[1]] = true
			}
		}
	}
	return m
}

// ferryServer runs `ferry serve` over the server's tree in the server
// namespace; both Ferry systems use one.
type ferryServer struct{ cmd *exec.Cmd }

func (s *ferryServer) start(ctx context.Context, e *env, bin string) (err error) {
	addr := netip.AddrPortFrom(e.srvAddr, ferryPort)
	s.cmd, err = startServer(ctx, e, "ferry serve", addr, bin, "serve", e.srv, "--listen", addr.String())
	return err
}

// startServer starts bin in the server namespace, logging its output, and
// waits until it listens on addr. The command it returns, not nil when it
// started even if it never listened, is the caller's to end.
func startServer(ctx context.Context, e *env, what string, addr netip.AddrPort, bin string, args ...string) (*exec.Cmd, error) {
	cmd := e.command(context.Background(), e.bed.ServerNS, bin, args...)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := waitPort(ctx, e, addr); err != nil {
		return cmd, fmt.Errorf("%s: %w", what, err)
	}
	return cmd, nil
}

// stop stops the server gracefully, or kills it after 15 seconds.
func (s *ferryServer) stop() {
	stopServer(s.cmd)
	s.cmd = nil
}

// stopServer stops a command startServer started, if not nil, gracefully
// or after 15 seconds by force.
func stopServer(cmd *exec.Cmd) {
	if cmd == nil {
		return
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Cancel()
		<-done
	}
}

// remote returns the quoted remote path HOST:PORT:p of e's server.
func remote(e *env, p string) string {
	return q(fmt.Sprintf("%v:%d:%s", e.srvAddr, ferryPort, p))
}

// ferry is Ferry's native client against `ferry serve`: each workload maps
// to one command (get, put, cat, find). A workload whose subcommand the
// binary lacks is "not yet available".
type ferry struct {
	b   *ferryBuild
	srv ferryServer
}

func (f *ferry) name() string { return "ferry" }

// ferryNeeds is the subcommand each workload of the native client uses.
var ferryNeeds = map[string]string{
	"get-file": "get", "put-file": "put", "read-file": "cat",
	"get-tree": "get", "put-tree": "put",
	"find": "find", "ls-lR": "find",
	"missing-name": "stat", "rm-tree": "rm", "edit-save": "put", "upgrade": "sync",
}

// ferryNotApplicable says why the native client has no row for a workload
// that the mount has.
var ferryNotApplicable = map[string]string{
	"grep-r":     "the native client has no search; the ferry-mount row is Ferry's",
	"grep-warm":  "the native client has no search and no cache; the ferry-mount row is Ferry's",
	"diff-r":     "the native client has no compare command; the ferry-mount row is Ferry's",
	"make-j2":    "the native client runs no commands on the server; the ferry-mount row is Ferry's",
	"recompile":  "the native client runs no commands on the server; the ferry-mount row is Ferry's",
	"git-status": "the native client runs no commands; the ferry-mount row is Ferry's",
}

func (f *ferry) setup(ctx context.Context, e *env) error {
	if err := f.b.get(ctx); err != nil {
		return err
	}
	return f.srv.start(ctx, e, f.b.bin)
}

func (f *ferry) reset(ctx context.Context, e *env) error { return e.coldFerryCache() }
func (f *ferry) teardown(e *env)                         { f.srv.stop() }

func (f *ferry) script(w workload, e *env) (string, error) {
	if why, ok := ferryNotApplicable[w.name]; ok {
		return "", notApplicable(why)
	}
	need, ok := ferryNeeds[w.name]
	if !ok {
		return "", fmt.Errorf("%w: the harness has no ferry command for %s", errUnavailable, w.name)
	}
	if err := f.b.need(need); err != nil {
		return "", err
	}
	bin := q(f.b.bin)
	switch w.name {
	case "get-file":
		return fmt.Sprintf("%s get %s %s", bin, remote(e, "/"+bigName), q(e.out)), nil
	case "put-file":
		return fmt.Sprintf("%s put %s %s", bin, q(e.h.data.putBig), remote(e, "/in")), nil
	case "read-file":
		return fmt.Sprintf("%s cat %s >/dev/null", bin, remote(e, "/"+bigName)), nil
	case "get-tree":
		return fmt.Sprintf("%s get %s %s", bin, remote(e, "/"+treeName), q(e.out)), nil
	case "put-tree":
		return fmt.Sprintf("%s put %s %s", bin, q(filepath.Join(e.src, treeName)), remote(e, "/in")), nil
	case "find":
		return fmt.Sprintf("%s find %s >/dev/null", bin, remote(e, "/"+treeName)), nil
	case "ls-lR":
		return fmt.Sprintf("%s find -l %s >/dev/null", bin, remote(e, "/"+treeName)), nil
	case "missing-name":
		return fmt.Sprintf("%s stat %s 2>&1 | grep -q 'does not exist'", bin, remote(e, "/"+e.h.data.extra.missing)), nil
	case "rm-tree":
		return fmt.Sprintf("%s rm -r %s", bin, remote(e, "/in/"+treeName)), nil
	case "edit-save":
		return fmt.Sprintf("%s put %s %s", bin, q(e.h.data.extra.docEdited), remote(e, "/in/"+docName)), nil
	case "upgrade":
		return fmt.Sprintf("%s sync --delete %s %s", bin, q(e.h.data.extra.modB), remote(e, "/in/"+modName)), nil
	}
	return "", fmt.Errorf("%w: the harness has no ferry command for %s", errUnavailable, w.name)
}

// ferryMount is Ferry through its FUSE adaptor: `ferry mount` of the
// server's tree, afresh before every run, and the same commands as on the
// sshfs mount. Until the binary has a mount subcommand its rows are "not
// yet available". With writeBack it is `ferry mount --writeback`
// (ferry-mount-wb); it runs only the workloads that write. Write-back is
// the mount's default now, so both rows keep changes back under write
// leases; the second names the flag, as older reports do.
type ferryMount struct {
	b         *ferryBuild
	srv       ferryServer
	mounted   bool
	writeBack bool
}

func (f *ferryMount) name() string {
	if f.writeBack {
		return "ferry-mount-wb"
	}
	return "ferry-mount"
}

// writes are the workloads that write through the mount: the only ones
// write-back changes. git status writes too: it takes the index's lock
// (index.lock, created, then removed or renamed over the index).
var writes = map[string]bool{"put-file": true, "put-tree": true, "rm-tree": true, "make-j2": true, "recompile": true, "edit-save": true, "upgrade": true, "git-status": true}

func (f *ferryMount) setup(ctx context.Context, e *env) error {
	if err := f.b.get(ctx); err != nil {
		return err
	}
	if err := f.b.need("mount"); err != nil {
		return err
	}
	return f.srv.start(ctx, e, f.b.bin)
}

func (f *ferryMount) reset(ctx context.Context, e *env) error {
	f.unmount(e)
	if err := e.coldFerryCache(); err != nil {
		return err
	}
	// ferry mount starts itself again in the background and returns once
	// the file system is up; the daemon stays in the client namespace.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := []string{"mount", fmt.Sprintf("%v:%d:/", e.srvAddr, ferryPort), e.mnt}
	if f.writeBack {
		args = append(args, "--writeback")
	}
	args = append(args, f.b.h.o.mountArgs...)
	cmd := e.command(ctx, e.bed.ClientNS, f.b.bin, args...)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ferry mount: %w", err)
	}
	f.mounted = true
	return nil
}

// settle waits for the stores write-back has in the background: fsync of
// the mount's root waits for everything below it. The default mount
// writes behind too (under write leases), so both rows settle.
func (f *ferryMount) settle(ctx context.Context, e *env) error {
	return e.client(ctx, f.b.h.o.timeout, fmt.Sprintf("python3 -c %s", q(fmt.Sprintf("import os; os.fsync(os.open(%q, os.O_RDONLY))", e.mnt))))
}

// peakRSS returns the most memory the mount's process has held since it
// started (VmHWM), found as ferry umount finds it.
func (f *ferryMount) peakRSS(e *env) (int64, bool) {
	for _, pid := range cli.MountProcesses(f.b.bin, e.mnt) {
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
				return n << 10, err == nil
			}
		}
	}
	return 0, false
}

func (f *ferryMount) unmount(e *env) {
	if f.mounted || isMounted(e.mnt) {
		unmount(e.mnt)
		f.mounted = false
	}
}

func (f *ferryMount) teardown(e *env) {
	f.unmount(e)
	f.srv.stop()
}

func (f *ferryMount) script(w workload, e *env) (string, error) {
	if err := f.b.need("mount"); err != nil {
		return "", err
	}
	if f.writeBack && !writes[w.name] {
		return "", fmt.Errorf("%w: it reads as ferry-mount does; write-back changes only writes", errNotApplicable)
	}
	return mountScript(w, e)
}

// localDisk is the reference the targets name: the command run on
// the server's own disk (the same file system the servers serve), with no
// link in between. It has rows for make-j2, recompile and git-status
// only, and is not a peer: ratios are to the best peer, never to it.
type localDisk struct{}

func (localDisk) name() string                            { return "local-disk" }
func (localDisk) setup(ctx context.Context, e *env) error { return nil }
func (localDisk) reset(ctx context.Context, e *env) error { return nil }
func (localDisk) teardown(e *env)                         {}

func (localDisk) script(w workload, e *env) (string, error) {
	switch w.name {
	case "make-j2", "recompile":
		return fmt.Sprintf("make -j2 -C %s", q(filepath.Join(e.in, cprojName))), nil
	case "git-status":
		return fmt.Sprintf("git -C %s status >/dev/null", q(filepath.Join(e.srv, repoName))), nil
	case "grep-r", "grep-warm":
		// The server's copy, in the page cache: what a mount's warm
		// search is measured against.
		return fmt.Sprintf("grep -r %s %s >/dev/null; test $? -le 1", grepFor, q(filepath.Join(e.srv, treeName))), nil
	}
	return "", notApplicable("the local disk is a reference for make-j2, recompile, git-status and grep only")
}

// nfs is the row of NFS (issue 3 names NFSv4 through nfs-ganesha). The
// harness cannot run it yet, so every cell says why rather than the row
// being left out.
type nfs struct{}

func (nfs) name() string                            { return "nfs" }
func (nfs) setup(ctx context.Context, e *env) error { return nil }
func (nfs) reset(ctx context.Context, e *env) error { return nil }
func (nfs) teardown(e *env)                         {}

func (nfs) script(w workload, e *env) (string, error) {
	return "", fmt.Errorf("%w: %s", errNotMeasured, nfsWhy(kernelHasNFS()))
}

// nfsWhy says why NFS is not measured, given whether the kernel can mount
// it: a user-space server alone would not do, since the mounts are the
// client's.
func nfsWhy(kernelNFS bool) string {
	if !kernelNFS {
		return "this kernel cannot mount NFS (no nfs in /proc/filesystems, no nfs module), and the harness has no user-space NFS client yet"
	}
	return "the harness does not start an NFS server (nfs-ganesha) yet"
}

// kernelHasNFS reports whether the kernel has an NFS client: listed in
// /proc/filesystems, or as a module it can load.
func kernelHasNFS() bool {
	if b, err := os.ReadFile("/proc/filesystems"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[len(f)-1], "nfs") {
				return true
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	_, err := os.Stat(filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]), "kernel/fs/nfs"))
	return err == nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}
