package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/netem/netemtest"
	"github.com/ferryfs/ferry/internal/sshd"
)

// TestMeasureUnpackSites times the unpack of Go's src/net (415 files,
// 4.9 MB) with tar into a mount at site b, on the netem mesh of three
// sites 120 ms apart, each client 0 ms from its server: against one server
// at site b itself, one server at site a (120 ms away), and a replica set
// of a member at each site. Each run also times the walk that reads the
// whole tree back (tar cf /dev/null) at site c, through a mount there (of
// the one server, or of member c).
// It is a measurement, not a test: FERRY_MEASURE=1 runs it; FERRY_CELLS
// picks cells by name.
func TestMeasureUnpackSites(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" {
		t.Skip("a measurement: FERRY_MEASURE=1 runs it")
	}
	needMount(t)
	tarball := filepath.Join(t.TempDir(), "net.tar")
	if out, err := exec.Command("tar", "cf", tarball, "-C", "/usr/local/go/src", "net").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	m := netemtest.MeshForTest(t, 3, func(int, int) netem.Link { return netem.Link{Delay: 60 * time.Millisecond} })
	at := func(i int) []string { return netem.Enter(m.Sites[i].NS) }
	// mountAt mounts e's tree at a new mount point through a client at
	// site i and returns the mount point.
	mountAt := func(t *testing.T, e *env, i int) string {
		mnt := mountPoint(t)
		c := *e
		c.via = at(i)
		c.run(true, "mount", e.at("/"), mnt)
		t.Cleanup(func() { c.run(true, "umount", mnt) })
		return mnt
	}
	timed := func(t *testing.T, name string, args ...string) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return time.Since(start)
	}
	cells := []struct {
		name  string
		serve func(t *testing.T) (writer, reader *env)
	}{
		{"one server at the writer's site", func(t *testing.T) (*env, *env) {
			e := startIn(t, t.TempDir(), at(1), "--listen", m.Sites[1].Addr.String()+":0")
			return e, e
		}},
		{"one server 120 ms from the writer", func(t *testing.T) (*env, *env) {
			e := startIn(t, t.TempDir(), at(0), "--listen", m.Sites[0].Addr.String()+":0")
			return e, e
		}},
		{"three replicas 120 ms apart", func(t *testing.T) (*env, *env) {
			es := startSetOn(t, m, "a", "b", "c")
			return es["b"], es["c"]
		}},
	}
	only := regexp.MustCompile(os.Getenv("FERRY_CELLS"))
	for _, c := range cells {
		if !only.MatchString(c.name) {
			continue
		}
		var unpack, walk []time.Duration
		for range 3 {
			t.Run(c.name, func(t *testing.T) {
				w, r := c.serve(t)
				mw := mountAt(t, w, 1)
				unpack = append(unpack, timed(t, "tar", "xf", tarball, "-C", mw))
				mr := mountAt(t, r, 2)
				walk = append(walk, timed(t, "tar", "cf", "/dev/null", "-C", mr, "net"))
			})
		}
		med := func(d []time.Duration) time.Duration {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[len(d)/2]
		}
		t.Logf("%-36s unpack median %6.2fs %v  walk at another site median %6.2fs %v", c.name, med(unpack).Seconds(), unpack, med(walk).Seconds(), walk)
	}
}

// TestMeasureSSHBuild is the replication paper's SSH build: unpack,
// ./configure and make -j2 of OpenSSH (the tarball FERRY_SSH_TARBALL names,
// from Debian's source package), then a flush (fsync of the build's
// directory, which waits for what a write-back mount kept back), each
// phase timed, in a directory of site b of the netem mesh (three sites
// 120 ms apart): on the local disk, in a mount of one server at b, of one
// server at a (also with the link from b to a at 4 Mbit/s), of three
// members (also with idle timers of 0.5 and 0.1 s, and with shallow
// control only) and of two. For members it also reports the grants
// member b asked for in each phase. Each cell also reports the bytes that went from b to the other
// sites and the size of the tree the build leaves. A measurement:
// FERRY_MEASURE=1 runs it, FERRY_CELLS picks cells, FERRY_MOUNT_ARGS
// adds flags to every mount (--debug --log FILE, say), and FERRY_RESULTS
// names a file to which each cell appends its figures as a line of JSON
// (bench/sshbuild_plots.py draws them).
func TestMeasureSSHBuild(t *testing.T) {
	tarball := os.Getenv("FERRY_SSH_TARBALL")
	if os.Getenv("FERRY_MEASURE") == "" || tarball == "" {
		t.Skip("a measurement: FERRY_MEASURE=1 FERRY_SSH_TARBALL=openssh.tar.gz runs it")
	}
	needMount(t)
	link := netem.Link{Delay: 60 * time.Millisecond}
	m := netemtest.MeshForTest(t, 3, func(int, int) netem.Link { return link })
	at := func(i int) []string { return netem.Enter(m.Sites[i].NS) }
	// mounted serves through e a mount at site b, with the mount's
	// flags args, and returns its mount point.
	mounted := func(t *testing.T, e *env, args ...string) string {
		mnt := mountPoint(t)
		cl := *e
		cl.via = at(1)
		args = append(args, strings.Fields(os.Getenv("FERRY_MOUNT_ARGS"))...)
		cl.run(true, append(append([]string{"mount"}, args...), e.at("/"), mnt)...)
		t.Cleanup(func() { cl.run(true, "umount", mnt) })
		return mnt
	}
	cells := []struct {
		name string
		dir  func(t *testing.T) string // Where the build runs.
		// limit bounds each phase (30 minutes if 0); a phase that
		// does not finish within it ends the cell, reported as such.
		limit time.Duration
	}{
		{"local disk", func(t *testing.T) string { return t.TempDir() }, 0},
		{"one server at the builder's site", func(t *testing.T) string {
			return mounted(t, startIn(t, t.TempDir(), at(1), "--listen", m.Sites[1].Addr.String()+":0"))
		}, 0},
		{"one server 120 ms from the builder", func(t *testing.T) string {
			return mounted(t, startIn(t, t.TempDir(), at(0), "--listen", m.Sites[0].Addr.String()+":0"))
		}, 0},
		{"one server 120 ms from the builder, opens heard", func(t *testing.T) string {
			return mounted(t, startIn(t, t.TempDir(), at(0), "--listen", m.Sites[0].Addr.String()+":0"), "--kernel-opens=false")
		}, 0},
		{"one server 120 ms from the builder, 4 Mbit/s up", func(t *testing.T) string {
			up := link
			up.Rate = 4_000_000
			m.SetLink(1, 0, up)
			t.Cleanup(func() { m.SetLink(1, 0, link) })
			return mounted(t, startIn(t, t.TempDir(), at(0), "--listen", m.Sites[0].Addr.String()+":0"))
		}, 0},
		{"three replicas 120 ms apart", func(t *testing.T) string {
			return mounted(t, startSetOn(t, m, "a", "b", "c")["b"])
		}, 0},
		// The other sites' members at nice 19, as if on machines of
		// their own rather than on the builder's two cores.
		{"three replicas 120 ms apart, other sites niced", func(t *testing.T) string {
			return mounted(t, startSetNiced(t, m, nil, []string{"a", "c"}, "a", "b", "c")["b"])
		}, 0},
		{"two replicas 120 ms apart", func(t *testing.T) string {
			return mounted(t, startSetOn(t, m, "a", "b")["b"])
		}, 0},
		{"three replicas, idle 0.5 s", func(t *testing.T) string {
			return mounted(t, startSetWith(t, m, []string{"--replica-idle", "500ms"}, "a", "b", "c")["b"])
		}, 0},
		{"three replicas, idle 0.1 s", func(t *testing.T) string {
			return mounted(t, startSetWith(t, m, []string{"--replica-idle", "100ms"}, "a", "b", "c")["b"])
		}, 0},
		{"three replicas, shallow control only", func(t *testing.T) string {
			return mounted(t, startSetWith(t, m, []string{"--replica-shallow"}, "a", "b", "c")["b"])
		}, 0},
		// sshfs (SFTP, default options) of an sshd at site a: what people
		// use instead. At 120 ms its configure takes hours.
		{"sshfs 120 ms from the builder", func(t *testing.T) string {
			return sshfsMount(t, at(0), at(1), m.Sites[0].Addr.String())
		}, 10 * time.Minute},
	}
	only := regexp.MustCompile(os.Getenv("FERRY_CELLS"))
	for _, c := range cells {
		if !only.MatchString(c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			dir := c.dir(t)
			up := func() (n int64) {
				for _, j := range []int{0, 2} {
					n += m.Stats(1, j).Bytes
				}
				return n
			}
			before := up()
			// grants reads how many grants the member at b asked for,
			// from the mount's control file, where there is one.
			grants := func() int {
				var n int
				for _, line := range ctlLines(dir, "grants: ") {
					fmt.Sscan(strings.TrimPrefix(line, "grants: "), &n)
				}
				return n
			}
			granted := grants()
			cpu0, busy0 := ferryCPU(), machineBusy()
			self0, build0 := rusage(syscall.RUSAGE_SELF), rusage(syscall.RUSAGE_CHILDREN)
			var phases []string
			var total time.Duration
			res := sshResult{Cell: c.name, Seconds: map[string]float64{}, Grants: map[string]int{}}
			for _, ph := range []struct{ name, script string }{
				{"unpack", "tar xzf " + tarball},
				{"configure", "cd openssh-* && ./configure"},
				{"make", "cd openssh-* && make -j2"},
				{"flush", `python3 -c 'import glob, os; os.fsync(os.open(glob.glob("openssh-*")[0], os.O_RDONLY))'`},
			} {
				limit := c.limit
				if limit == 0 {
					limit = 30 * time.Minute
				}
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				cmd := exec.CommandContext(ctx, "sh", "-c", ph.script)
				cmd.Dir = dir
				cmd.WaitDelay = 10 * time.Second
				start := time.Now()
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil && ctx.Err() != nil && c.limit != 0 {
					total += time.Since(start)
					// How far it got: the entries the build directory holds.
					var n int
					filepath.WalkDir(dir, func(string, fs.DirEntry, error) error { n++; return nil })
					phases = append(phases, fmt.Sprintf("%s not done in %v (%d entries made)", ph.name, limit, n-1))
					t.Logf("%s: %s", c.name, phases[len(phases)-1])
					break
				}
				if err != nil {
					t.Fatalf("%s: %v: %s", ph.name, err, lastLines(out, 20))
				}
				took := time.Since(start)
				total += took
				res.Seconds[ph.name] = took.Seconds()
				phase := fmt.Sprintf("%s %.1fs", ph.name, took.Seconds())
				if n := grants(); n > granted {
					phase += fmt.Sprintf(" (%d grants)", n-granted)
					res.Grants[ph.name] = n - granted
					granted = n
				}
				phases = append(phases, phase)
				var ctl strings.Builder
				for _, line := range ctlLines(dir, "leases.write:", "writeback.waited:", "writeback.pending:") {
					ctl.WriteString("\n\t" + line)
				}
				t.Logf("%s: %s%s", c.name, phases[len(phases)-1], ctl.String())
			}
			sent := up() - before
			size, err := exec.Command("du", "-sb", dir).Output()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-36s %s, total %.1fs; up %.1f MB, tree %s MB", c.name, strings.Join(phases, ", "), total.Seconds(),
				float64(sent)/1e6, mb(strings.Fields(string(size))[0]))
			// Every process of the bed shares this machine's cores: what
			// the servers spend is taken from the build.
			cpu1, busy1 := ferryCPU(), machineBusy()
			// This process is the link emulator (and the harness); its
			// children waited for are the build's commands.
			self1, build1 := rusage(syscall.RUSAGE_SELF), rusage(syscall.RUSAGE_CHILDREN)
			t.Logf("%-36s CPU: mount %.1fs, servers %.1fs, build %.1fs, emulator %.1fs; machine busy %.1fs of %.1fs", c.name,
				cpu1["mount"]-cpu0["mount"], cpu1["serve"]-cpu0["serve"], build1-build0, self1-self0,
				busy1-busy0, total.Seconds()*float64(runtime.NumCPU()))
			res.Total, res.Up = total.Seconds(), sent
			res.MountCPU, res.ServersCPU = cpu1["mount"]-cpu0["mount"], cpu1["serve"]-cpu0["serve"]
			if f := os.Getenv("FERRY_RESULTS"); f != "" {
				if err := res.appendTo(f); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// ctlLines returns the lines of the control file of the mount at dir
// that begin with one of prefixes; none if there is no such file.
func ctlLines(dir string, prefixes ...string) []string {
	b, err := os.ReadFile(filepath.Join(dir, "Ctl"))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				out = append(out, line)
			}
		}
	}
	return out
}

// sshResult is one cell's figures, as FERRY_RESULTS records them.
type sshResult struct {
	Cell       string             `json:"cell"`
	Seconds    map[string]float64 `json:"seconds"` // By phase.
	Grants     map[string]int     `json:"grants,omitempty"`
	Total      float64            `json:"total"`
	Up         int64              `json:"up_bytes"` // From the builder's site to the others.
	MountCPU   float64            `json:"mount_cpu"`
	ServersCPU float64            `json:"servers_cpu"`
	At         string             `json:"at"`
	Commit     string             `json:"commit"`
}

// appendTo appends r to the file name as a line of JSON.
func (r sshResult) appendTo(name string) error {
	r.At = time.Now().UTC().Format(time.RFC3339)
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		r.Commit = strings.TrimSpace(string(out))
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// mb writes a byte count given in decimal as megabytes.
func mb(bytes string) string {
	var n float64
	fmt.Sscan(bytes, &n)
	return fmt.Sprintf("%.1f", n/1e6)
}

// lastLines returns the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// ferryCPU returns the CPU seconds spent by the ferry processes running
// now (their user and system time), by role: "mount" and "serve".
// rusage returns the CPU seconds, user and system, of who
// (syscall.RUSAGE_SELF or RUSAGE_CHILDREN).
func rusage(who int) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func ferryCPU() map[string]float64 {
	cpu := map[string]float64{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) < 2 || filepath.Base(args[0]) != "ferry" {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command's name, which is in parentheses.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		var user, sys float64
		fmt.Sscan(f[11], &user)
		fmt.Sscan(f[12], &sys)
		cpu[args[1]] += (user + sys) / 100 // USER_HZ
	}
	return cpu
}

// machineBusy returns the CPU seconds all cores have spent not idle.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:]
	var busy float64
	for i, v := range f {
		var n float64
		fmt.Sscan(v, &n)
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy / 100
}

// sshfsMount starts an sshd of its own (keys made for the test, root by
// key only) in the namespace server enters, listening on addr, and mounts
// a directory it serves with sshfs (default options) from the namespace
// client enters; it returns the mount point. Both are ended at cleanup.
func sshfsMount(t *testing.T, server, client []string, addr string) string {
	keys, err := sshd.MakeKeys(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	served, conf := t.TempDir(), filepath.Join(keys.Dir, "sshd_config")
	if err := os.WriteFile(conf, sshd.Config(addr, keys), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := sshd.Path()
	if err != nil {
		t.Fatal(err)
	}
	// started runs args, which stay in the foreground, until cleanup.
	started := func(args ...string) {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		})
	}
	started(append(server, bin, "-D", "-e", "-f", conf)...)
	mnt := mountPoint(t)
	// Unmounting ends sshfs; this cleanup runs before the one that
	// signals it.
	opts := "IdentityFile=" + keys.Client + ",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes"
	for try := 0; ; try++ {
		started(append(client, "sshfs", "-f", "-o", opts, "root@"+addr+":"+served, mnt)...)
		if waitFor(5*time.Second, func() bool { return mounted(t, mnt) }) {
			break
		}
		if try == 5 {
			t.Fatal("sshfs did not mount")
		}
	}
	t.Cleanup(func() { exec.Command("fusermount", "-u", "-z", mnt).Run() })
	return mnt
}
