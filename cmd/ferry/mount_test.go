package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/testenv"
)

// needMount skips a test that mounts unless CI=true, where it fails.
func needMount(t *testing.T) {
	t.Helper()
	reason := ""
	if os.Geteuid() != 0 {
		reason = "mounting needs root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		reason = "no /dev/fuse"
	} else if out, _ := exec.Command(ferryBin, "help").CombinedOutput(); !bytes.Contains(out, []byte("mount")) {
		reason = "this ferry has no mount command"
	}
	testenv.Require(t, reason)
}

// mounted reports whether mnt is a mount point.
func mounted(t *testing.T, mnt string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == mnt {
			return true
		}
	}
	return false
}

// alive reports whether the process pid exists.
// alive reports whether the process pid runs: it exists and has not
// exited (a zombie has, and waits only for its parent to reap it).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(stat), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}

// fgMount is a ferry mount --foreground the test started.
type fgMount struct {
	dir    string // The mount point.
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	exited chan struct{} // Closed once the process exited; err is set then.
	err    error
}

// mountForeground mounts the root of e's tree with ferry mount
// --foreground at a new directory, returns once it is mounted, and kills
// and unmounts it when the test ends if it is still there.
func mountForeground(t *testing.T, e *env) *fgMount {
	t.Helper()
	m := &fgMount{dir: t.TempDir(), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	m.cmd = exec.Command(ferryBin, "mount", "--foreground", e.at("/"), m.dir)
	m.cmd.Env = e.environ()
	m.cmd.Stderr = m.stderr
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		m.err = m.cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		<-m.exited
		if mounted(t, m.dir) {
			syscall.Unmount(m.dir, syscall.MNT_DETACH)
		}
	})
	if !waitFor(20*time.Second, func() bool { return mounted(t, m.dir) }) {
		t.Fatalf("not mounted:\n%s", m.stderr.String())
	}
	return m
}

// mountPoint returns a new empty directory to mount on, unmounted when
// the test ends if a test's mount is still there.
func mountPoint(t *testing.T) string {
	mnt := t.TempDir()
	t.Cleanup(func() {
		if mounted(t, mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return mnt
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

func TestMountEndToEnd(t *testing.T) {
	needMount(t)
	e := start(t)
	writeTree(t, e.dir, map[string]string{"hello.txt": "hello\n", "src/a.c": "int a;\n"})
	mnt := mountPoint(t)

	// In the background: the command returns once mounted.
	e.run(true, "mount", e.at("/"), mnt)
	if !mounted(t, mnt) {
		t.Fatal("ferry mount returned but nothing is mounted")
	}
	// Each mount logs to a file of its own, named for its mount point.
	log, _ := os.ReadFile(filepath.Join(e.home, "mount-"+strings.ReplaceAll(strings.Trim(mnt, "/"), "/", "-")+".log"))
	m := regexp.MustCompile(`pid=(\d+)`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("the mount log names no pid:\n%s", log)
	}
	pid, _ := strconv.Atoi(string(m[1]))
	t.Cleanup(func() {
		if alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	// Server to mount.
	b, err := os.ReadFile(filepath.Join(mnt, "hello.txt"))
	if err != nil || string(b) != "hello\n" {
		t.Errorf("read through the mount: %q, %v", b, err)
	}
	// Mount to server: another client sees it when close returns (the
	// mount keeps it back under a write lease, which that client's call
	// recalls), and the server's disk has it once the mount syncs.
	if err := os.WriteFile(filepath.Join(mnt, "src/b.c"), []byte("int b;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := e.run(true, "cat", e.at("/src/b.c")); out != "int b;\n" {
		t.Errorf("written through the mount, another client reads %q", out)
	}
	if err := os.Mkdir(filepath.Join(mnt, "newdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "Ctl"), []byte("sync\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(e.dir, "newdir")); err != nil || !fi.IsDir() {
		t.Errorf("mkdir through the mount, then sync: %v", err)
	}
	// A change on the server shows in the mount by the next open once
	// the metadata timeout (or the watch) has let it through.
	writeTree(t, e.dir, map[string]string{"hello.txt": "changed on the server\n"})
	if !waitFor(5*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(mnt, "hello.txt"))
		return string(b) == "changed on the server\n"
	}) {
		t.Errorf("a change on the server never showed in the mount")
	}
	out, _ := exec.Command("ls", filepath.Join(mnt, "src")).CombinedOutput()
	if string(out) != "a.c\nb.c\n" {
		t.Errorf("ls of the mount: %q", out)
	}
	// A second mount on the same mount point is refused, not stacked.
	if _, errOut := e.run(false, "mount", e.at("/src"), mnt); !strings.Contains(errOut, "mounted there already") {
		t.Errorf("a second mount on %s: %q", mnt, errOut)
	}
	// The control file: the mount's state and every layer's below, and
	// commands passed down to the server.
	out, err = exec.Command("cat", filepath.Join(mnt, "Ctl")).CombinedOutput()
	for _, want := range []string{"[mount]", "contents.bytes:", "[client]", "[server]", "debug: false"} {
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("cat Ctl lacks %q (%v):\n%s", want, err, out)
		}
	}
	// Six sections, from the mount down to the server's disk.
	var sections []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "[") {
			sections = append(sections, l)
		}
	}
	if want := []string{"[mount]", "[cache]", "[client]", "[server]", "[index]", "[trash]"}; !slices.Equal(sections, want) {
		t.Errorf("Ctl's sections are %v, want %v", sections, want)
	}
	if out, err := exec.Command("sh", "-c", "echo 'pass pass pass debug on' > "+filepath.Join(mnt, "Ctl")).CombinedOutput(); err != nil {
		t.Errorf("echo 'pass pass pass debug on' > Ctl: %v %s", err, out)
	}
	if out, _ := os.ReadFile(filepath.Join(mnt, "Ctl")); !strings.Contains(string(out), "debug: true") {
		t.Errorf("the server's debug is not on after a command through the mount:\n%s", out)
	}
	if out, err := exec.Command("sh", "-c", "echo bogus > "+filepath.Join(mnt, "Ctl")).CombinedOutput(); err == nil {
		t.Errorf("echo bogus > Ctl succeeded: %s", out)
	}

	// ferry umount: the mount goes, and its process has exited when it
	// returns.
	// A busy mount says what to do; --lazy detaches it.
	busy, err := os.Open(filepath.Join(mnt, "hello.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut := e.run(false, "umount", mnt); !strings.Contains(errOut, "--lazy") {
		t.Errorf("ferry umount of a busy mount: %q, want a hint", errOut)
	}
	busy.Close()
	e.run(true, "umount", mnt)
	if mounted(t, mnt) {
		t.Errorf("still mounted after ferry umount")
	}
	if _, errOut := e.run(false, "umount", mnt); !strings.Contains(errOut, "nothing is mounted there") {
		t.Errorf("ferry umount of nothing: %q", errOut)
	}
	if alive(pid) {
		t.Errorf("the mount process %d is still running when ferry umount returns", pid)
	}

	// Errors are reported by the command that starts the background mount.
	_, errOut := e.run(false, "mount", e.at("/hello.txt"), mnt)
	if !strings.Contains(errOut, "not a directory") {
		t.Errorf("mounting a file: %q", errOut)
	}
	if _, errOut := e.run(false, "mount", "-o", "ro,bogus", e.at("/"), mnt); !strings.Contains(errOut, "unknown mount option") {
		t.Errorf("mounting with -o bogus: %q", errOut)
	}
	if _, errOut := e.run(false, "mount", e.at("/"), filepath.Join(mnt, "no-such-dir")); !strings.Contains(errOut, "mount point does not exist") {
		t.Errorf("mounting on a missing mount point: %q", errOut)
	}

	// -o ro: reads work, writes fail; df tells the server's numbers.
	e.run(true, "mount", "-o", "ro", e.at("/"), mnt)
	if b, err := os.ReadFile(filepath.Join(mnt, "hello.txt")); err != nil || string(b) != "changed on the server\n" {
		t.Errorf("read through a read-only mount: %q, %v", b, err)
	}
	if out, err := exec.Command("sh", "-c", "echo x > "+filepath.Join(mnt, "new")).CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only") {
		t.Errorf("a write to a read-only mount: %v %s", err, out)
	}
	var sm, sd syscall.Statfs_t
	if syscall.Statfs(mnt, &sm) != nil || syscall.Statfs(e.dir, &sd) != nil || sm.Files != sd.Files {
		t.Errorf("statfs of the mount says %d files, the server's disk %d", sm.Files, sd.Files)
	}
	e.run(true, "umount", mnt)
}

func TestMountForegroundSIGTERM(t *testing.T) {
	needMount(t)
	e := start(t)
	writeTree(t, e.dir, map[string]string{"f": "f"})
	m := mountForeground(t, e)
	mnt := m.dir
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "f" {
		t.Errorf("read: %q %v", b, err)
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
		if m.err != nil {
			t.Errorf("ferry mount exited with %v on SIGTERM:\n%s", m.err, m.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("ferry mount did not exit on SIGTERM")
	}
	if mounted(t, mnt) {
		t.Errorf("still mounted after SIGTERM")
	}
}

// TestMountHelper: linked as mount.ferry, the binary mounts what a line
// of /etc/fstab names, as mount(8) calls it: the options fstab keeps for
// itself are dropped, Ferry's own (timeout=, home=) are taken, a fake
// mount (-f) does nothing, and a typo fails with mount(8)'s status 1.
func TestMountHelper(t *testing.T) {
	needMount(t)
	e := start(t)
	writeTree(t, e.dir, map[string]string{"hello.txt": "hello\n"})
	helper := filepath.Join(t.TempDir(), "mount.ferry")
	if err := os.Symlink(ferryBin, helper); err != nil {
		t.Fatal(err)
	}
	mnt := mountPoint(t)
	// As at boot: no FERRY_HOME in the environment, the keys named by
	// the home option.
	var env []string
	for _, v := range e.environ() {
		if !strings.HasPrefix(v, "FERRY_HOME=") {
			env = append(env, v)
		}
	}
	helperRun := func(args ...string) (int, string) {
		cmd := exec.Command(helper, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	opts := "rw,ro,_netdev,noauto,nofail,x-systemd.automount,nosuid,nodev,timeout=20s,home=" + e.home
	if code, out := helperRun("-f", e.at("/"), mnt, "-o", opts); code != 0 || mounted(t, mnt) {
		t.Errorf("a fake mount: status %d, mounted %v: %s", code, mounted(t, mnt), out)
	}
	if code, out := helperRun(e.at("/"), mnt, "-o", "timout=20s"); code != 1 || !strings.Contains(out, "unknown mount option") {
		t.Errorf("a mount with a typo: status %d: %s", code, out)
	}
	if code, out := helperRun(e.at("/"), mnt, "-n", "-o", opts); code != 0 {
		logs, _ := filepath.Glob(filepath.Join(e.home, "mount-*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", l, b)
		}
		t.Fatalf("mount.ferry: status %d: %s", code, out)
	}
	if !mounted(t, mnt) {
		t.Fatal("mount.ferry returned 0 but nothing is mounted")
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("read through the mount: %q, %v", b, err)
	}
	if out, err := exec.Command("sh", "-c", "echo x > "+filepath.Join(mnt, "new")).CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only") {
		t.Errorf("a write to a mount made with ro: %v %s", err, out)
	}
	e.run(true, "umount", mnt)
	if mounted(t, mnt) {
		t.Errorf("still mounted after ferry umount")
	}
}

// TestMountFstab: an fstab line of type ferry mounts with mount(8), which
// runs /sbin/mount.ferry (linked to the binary under test for the test
// when make install has not put one there), from a temporary fstab.
func TestMountFstab(t *testing.T) {
	needMount(t)
	const helper = "/sbin/mount.ferry"
	if _, err := os.Lstat(helper); os.IsNotExist(err) {
		if err := os.Symlink(ferryBin, helper); err != nil {
			testenv.Require(t, "cannot link "+helper+": "+err.Error())
		}
		t.Cleanup(func() { os.Remove(helper) })
	} else if l, _ := os.Readlink(helper); l != ferryBin {
		t.Logf("%s is %q, not this test's binary", helper, l)
	}
	e := start(t)
	writeTree(t, e.dir, map[string]string{"hello.txt": "hello\n"})
	e.run(true, "ls", e.at("/")) // Pins the server's key in e.home.
	mnt := mountPoint(t)
	fstab := filepath.Join(t.TempDir(), "fstab")
	line := fmt.Sprintf("%s %s ferry _netdev,noauto,ro,timeout=20s,home=%s 0 0\n", e.at("/"), mnt, e.home)
	if err := os.WriteFile(fstab, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-T", fstab, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -T %s %s: %v\n%s", fstab, mnt, err, out)
	}
	if !mounted(t, mnt) {
		t.Fatal("mount returned 0 but nothing is mounted")
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("read through the fstab mount: %q, %v", b, err)
	}
	if out, err := exec.Command("sh", "-c", "echo x > "+filepath.Join(mnt, "new")).CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only") {
		t.Errorf("a write to the ro fstab mount: %v %s", err, out)
	}
	e.run(true, "umount", mnt)
}

// TestGetBesideMount: a ferry get run beside a mount of the same server
// uses the mount's chunk cache (pebble locks it for one process) through
// the socket the mount shares it on: a file the mount has read crosses the
// wire again only as its chunk list. Once the mount is gone, a get uses
// the cache itself.
func TestGetBesideMount(t *testing.T) {
	needMount(t)
	e := start(t)
	data := make([]byte, 2<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(e.dir, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	mnt := mountPoint(t)
	e.run(true, "mount", e.at("/"), mnt)
	if !mounted(t, mnt) {
		t.Fatal("ferry mount returned but nothing is mounted")
	}
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			e.run(true, "umount", mnt)
		}
	})
	// The mount reads the file by chunks, and keeps them. A read that
	// waited over a second for that fetch (a loaded machine) was served
	// by a ranged read the chunk cache does not keep, but the fetch goes
	// on while the file is open: it stays open until the cache holds it.
	f, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(f); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through the mount: %d bytes, %v", len(got), err)
	}
	held := regexp.MustCompile(`cache\.bytes: ([0-9]+) of`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctl, _ := os.ReadFile(filepath.Join(mnt, "Ctl"))
		if m := held.FindSubmatch(ctl); m != nil {
			if n, _ := strconv.Atoi(string(m[1])); n >= len(data) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mount's chunk cache never held the file it read:\n%s", ctl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.Close()
	wire := regexp.MustCompile(`of files, ([0-9.]+) (B|KiB|MiB) on the wire`)
	get := func(what string) {
		t.Helper()
		dst := t.TempDir()
		_, errOut := e.run(true, "get", e.at("/big"), dst)
		if strings.Contains(errOut, "no chunk cache") {
			t.Errorf("%s: %s", what, errOut)
		}
		m := wire.FindStringSubmatch(errOut)
		if m == nil {
			t.Fatalf("%s: the get did not say what crossed the wire: %q", what, errOut)
		}
		n, _ := strconv.ParseFloat(m[1], 64)
		if m[2] == "MiB" || m[2] == "KiB" && n > 256 {
			t.Errorf("%s: %s %s crossed the wire for a file whose chunks the cache holds", what, m[1], m[2])
		}
		if got, err := os.ReadFile(filepath.Join(dst, "big")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: the file got: %d bytes, %v", what, len(got), err)
		}
	}
	get("beside the mount")
	e.run(true, "umount", mnt)
	unmounted = true
	get("after the mount")
}
