package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/history"
	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/netem/netemtest"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestReplicaSet runs three ferry serve processes as one replica set:
// they elect a leader, a grant made through one member's control file is
// seen by the others and stands in the way of theirs, and each member still
// serves its clients.
func TestReplicaSet(t *testing.T) {
	names := []string{"a", "b", "c"}
	es := startSet(t, names...)
	checkSet(t, es, names)
}

// startSet runs a ferry serve for each name, as one replica set.
func startSet(t *testing.T, names ...string) map[string]*env {
	return startSetOn(t, nil, names...)
}

// startSetOn is startSet with the i-th member (and its clients) at site i
// of m, if m is not nil.
func startSetOn(t *testing.T, m *netem.Mesh, names ...string) map[string]*env {
	return startSetWith(t, m, nil, names...)
}

// startSetWith is startSetOn with more flags for every member's serve.
func startSetWith(t *testing.T, m *netem.Mesh, flags []string, names ...string) map[string]*env {
	return startSetNiced(t, m, flags, nil, names...)
}

// startSetNiced is startSetWith with the members named in niced run at
// the lowest CPU priority (nice 19): on a machine that holds every site,
// they then take little of the CPU a build at another site uses, as they
// would on machines of their own.
func startSetNiced(t *testing.T, m *netem.Mesh, flags, niced []string, names ...string) map[string]*env {
	var lines []string
	homes := map[string]string{}
	for i, n := range names {
		homes[n] = t.TempDir()
		cmd := exec.Command(ferryBin, "key", "--server")
		cmd.Env = append(os.Environ(), "FERRY_HOME="+homes[n])
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ferry key --server: %v", err)
		}
		addr := ""
		if m != nil {
			addr = netip.AddrPortFrom(m.Sites[i].Addr, 7441).String()
		} else {
			addr = servertest.FreeAddr(t)
		}
		lines = append(lines, fmt.Sprintf("%s %s %s", n, addr, strings.TrimSpace(string(out))))
	}
	members := filepath.Join(t.TempDir(), "members")
	if err := os.WriteFile(members, []byte("# three sites\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	es := map[string]*env{}
	for i, n := range names {
		var via []string
		if m != nil {
			via = netem.Enter(m.Sites[i].NS)
		}
		run := via
		if slices.Contains(niced, n) {
			run = append(slices.Clone(via), "nice", "-n", "19")
		}
		es[n] = startIn(t, homes[n], run, append([]string{"--members", members, "--metrics", "127.0.0.1:0"}, flags...)...)
		es[n].via = via // its clients are at its site
		es[n].members = members
	}
	return es
}

// TestReplicaJoin adds a member to a running set of two ferry serve
// processes: started with --replica-join on a directory of its own and
// added with "ferry ctl HOST replica add", it copies the tree and serves it,
// and what is changed through it reaches the others.
func TestReplicaJoin(t *testing.T) {
	es := startSet(t, "a", "b")
	src := filepath.Join(t.TempDir(), "f")
	big := strings.Repeat("ferry joins ", 30000)
	if err := os.WriteFile(src, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	es["a"].run(true, "put", src, es["a"].at("/big"))
	tree := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "small"), []byte("small"), 0o644); err != nil {
		t.Fatal(err)
	}
	es["b"].run(true, "put", tree, es["b"].at("/"))

	home := t.TempDir()
	cmd := exec.Command(ferryBin, "key", "--server")
	cmd.Env = append(os.Environ(), "FERRY_HOME="+home)
	fp, err := cmd.Output()
	if err != nil {
		t.Fatalf("ferry key --server: %v", err)
	}
	set, err := os.ReadFile(es["a"].members)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("c %s %s", servertest.FreeAddr(t), strings.TrimSpace(string(fp)))
	members := filepath.Join(t.TempDir(), "members")
	if err := os.WriteFile(members, append(set, line+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startIn(t, home, nil, "--members", members, "--replica-join")
	out, _ := c.run(true, "ctl", c.host)
	if !strings.Contains(out, "joining:") {
		t.Errorf("c's control file before it was added:\n%s", out)
	}
	es["a"].run(true, append([]string{"ctl", es["a"].host, "replica", "add"}, strings.Fields(line)...)...)
	if got, _ := c.run(true, "cat", c.at("/big")); got != big {
		t.Fatalf("c read %d bytes of /big, want %d", len(got), len(big))
	}
	if got, _ := c.run(true, "cat", c.at("/d/small")); got != "small" {
		t.Fatalf("c read %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "big")); err != nil || string(b) != big {
		t.Fatalf("c's directory holds %d bytes of big (%v)", len(b), err)
	}
	out, _ = es["b"].run(true, "ctl", es["b"].host)
	if !strings.Contains(out, "member: c ") || strings.Contains(out, "learner") {
		t.Errorf("b's control file after c joined:\n%s", out)
	}
	if err := os.WriteFile(src, []byte("c wrote"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.run(true, "put", src, c.at("/d/small"))
	if got, _ := es["b"].run(true, "cat", es["b"].at("/d/small")); got != "c wrote" {
		t.Fatalf("b read %q after c wrote", got)
	}

	// Through a mount of the new member too.
	needMount(t)
	mnt := mountPoint(t)
	c.run(true, "mount", c.at("/"), mnt)
	t.Cleanup(func() { c.run(true, "umount", mnt) })
	if got, err := os.ReadFile(filepath.Join(mnt, "big")); err != nil || string(got) != big {
		t.Fatalf("c's mount read %d bytes of /big (%v)", len(got), err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "d", "from-mount"), []byte("written at c's mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Closed at c's mount, the file is read at a: a's read first has c
	// recall what its clients keep back there.
	if got, _ := es["a"].run(true, "cat", es["a"].at("/d/from-mount")); got != "written at c's mount" {
		t.Fatalf("a read %q of what c's mount wrote", got)
	}
}

func checkSet(t *testing.T, es map[string]*env, names []string) {
	// ctl reads a member's control file until it shows want.
	wait := func(n, want string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			out, _ := es[n].run(true, "ctl", es[n].host)
			if strings.Contains(out, want) {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's control file never showed %q:\n%s", n, want, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	out := wait("b", " leader\n")
	for _, want := range []string{"[replica]", "self: b", "member: a ", "member: c "} {
		if !strings.Contains(out, want) {
			t.Errorf("b's control file lacks %q:\n%s", want, out)
		}
	}
	es["a"].run(true, "ctl", es["a"].host, "pass", "grant", "/src", "deep")
	wait("a", "held: /src deep")
	wait("c", "controls: 1 (0 here)")
	_, stderr := es["c"].run(false, "ctl", es["c"].host, "pass", "grant", "/src/main.c")
	if !strings.Contains(stderr, "controlled by a") {
		t.Errorf("c's grant under a's deep control: %s", stderr)
	}
	es["c"].run(true, "ctl", es["c"].host, "pass", "grant", "/doc")
	wait("b", "controls: 2 (0 here)")
	es["a"].run(true, "ctl", es["a"].host, "pass", "release", "/src")
	es["c"].run(true, "ctl", es["c"].host, "pass", "release", "/doc")
	wait("b", "controls: 0 (0 here)")

	// A file put through b (by chunks) is read at a and c at once, and
	// lands in every member's directory.
	big := strings.Repeat("ferry replica ", 20000)
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	es["b"].run(true, "put", src, es["b"].at("/f"))
	for _, n := range []string{"a", "c"} {
		if got, _ := es[n].run(true, "cat", es[n].at("/f")); got != big {
			t.Fatalf("%s read %d bytes of what b put (%d)", n, len(got), len(big))
		}
	}
	out, _ = es["b"].run(true, "ctl", es["b"].host)
	if !strings.Contains(out, "calls.putchunked: 1") || !strings.Contains(out, "[replica]") {
		t.Errorf("b's control file:\n%s", out)
	}
	// A write at c takes the control over; b reads it.
	if err := os.WriteFile(src, []byte("c wrote"), 0o644); err != nil {
		t.Fatal(err)
	}
	es["c"].run(true, "put", src, es["c"].at("/f"))
	if got, _ := es["b"].run(true, "cat", es["b"].at("/f")); got != "c wrote" {
		t.Fatalf("b read %q after c wrote", got)
	}
	resp, err := http.Get("http://" + es["b"].metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"ferry_replica_grants_total{result=\"granted\"}", "ferry_replica_update_lag{member=\"a\"}", "ferry_calls_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("b's metrics lack %s", want)
		}
	}
	for _, n := range names {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := os.ReadFile(filepath.Join(es[n].dir, "f"))
			if err == nil && string(got) == "c wrote" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's directory holds %q, %v", n, got, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestReplicaSetMount: a mount at one site writes back under a write
// lease, which its server holds only while it controls the subtree; a
// read at another site recalls it and sees the close; a write at another
// site takes the subtree over and the mount sees it at its next open.
func TestReplicaSetMount(t *testing.T) {
	needMount(t)
	es := startSet(t, "a", "b", "c")
	a := es["a"]
	mnt := mountPoint(t)
	// The mount is 200 ms from its server, so what it stores in the
	// background arrives well after close returns.
	a.run(true, "mount", servertest.DelayProxy(t, a.host, 100*time.Millisecond)+":/", mnt)
	if !mounted(t, mnt) {
		t.Fatal("ferry mount returned but nothing is mounted")
	}
	t.Cleanup(func() { a.run(true, "umount", mnt) })
	if err := os.Mkdir(filepath.Join(mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, reader := range []string{"c", "b"} {
		v := fmt.Sprintf("written at a, %d\n", i)
		if err := os.WriteFile(filepath.Join(mnt, "dir", "f"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, _ := es[reader].run(true, "cat", es[reader].at("/dir/f")); got != v {
			t.Fatalf("%s read %q after the mount at a closed %q", reader, got, v)
		}
	}
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("written at c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	es["c"].run(true, "put", src, es["c"].at("/dir/f"))
	if got, err := os.ReadFile(filepath.Join(mnt, "dir", "f")); err != nil || string(got) != "written at c\n" {
		t.Fatalf("the mount at a reads %q, %v after c wrote", got, err)
	}
}

// TestReplicaSetSites runs the set on an emulated network of three sites
// 120 ms apart, each member with its clients at its own site: ferry put
// and ferry cat at every site, concurrently, on two files, recorded and
// checked with Porcupine (a read that began after a write returned sees
// it or a later one), then every member's directory must hold the same.
func TestReplicaSetSites(t *testing.T) {
	m := netemtest.MeshForTest(t, 3, func(int, int) netem.Link { return netem.Link{Delay: 60 * time.Millisecond} })
	names := []string{"a", "b", "c"}
	es := startSetOn(t, m, names...)
	var rec history.Recorder
	eachSite(names, func(i int, n string) {
		e := es[n]
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		src := filepath.Join(t.TempDir(), "src")
		for k := range 8 {
			op := history.Op{Client: i, File: fmt.Sprintf("/k%d", rng.IntN(2)), Write: rng.IntN(2) == 0}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			var cmd *exec.Cmd
			if op.Write {
				op.Value = fmt.Sprintf("%s wrote %d\n", n, k)
				if err := os.WriteFile(src, []byte(op.Value), 0o644); err != nil {
					t.Error(err)
					cancel()
					return
				}
				cmd = e.command(ctx, "put", src, e.at(op.File))
			} else {
				cmd = e.command(ctx, "cat", e.at(op.File))
			}
			out, errOut, err := timed(cmd, &op.Call, &op.Return)
			cancel()
			switch {
			case err == nil && !op.Write:
				op.Value = out
			case err != nil && !op.Write && strings.Contains(errOut, "not exist"):
				op.Value = ""
			case err != nil:
				t.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, errOut)
				return
			}
			rec.Add(op)
		}
	})
	if t.Failed() {
		return
	}
	if err := rec.Check(time.Minute, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	// After quiescence every copy is the same (a member that did not
	// read a file may still be applying its last change).
	copyOf := func(n string) string {
		var b strings.Builder
		for _, f := range []string{"k0", "k1"} {
			c, _ := os.ReadFile(filepath.Join(es[n].dir, f))
			fmt.Fprintf(&b, "%s=%q ", f, c)
		}
		return b.String()
	}
	want := ""
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		want = copyOf("a")
		if copyOf("b") == want && copyOf("c") == want {
			break
		}
		if time.Now().After(deadline) {
			for _, n := range names {
				out, _ := es[n].run(true, "ctl", es[n].host)
				if i := strings.Index(out, "[replica]"); i >= 0 {
					out = out[i:]
				}
				t.Logf("%s holds %s; its control file:\n%s", n, copyOf(n), out)
			}
			t.Fatal("the copies never became equal")
		}
	}
	t.Logf("%d operations at three sites 120 ms apart: linearizable; copies equal: %s", rec.Len(), want)
}

// TestReplicaSetSitesDirs is TestReplicaSetSites for the names of one
// directory: ferry put, rm, mv and ls at every site, concurrently,
// recorded and checked with Porcupine (a listing that began after a
// change returned shows it; a remove or rename finds the name exactly
// when the changes before it left it there).
func TestReplicaSetSitesDirs(t *testing.T) {
	m := netemtest.MeshForTest(t, 3, func(int, int) netem.Link { return netem.Link{Delay: 60 * time.Millisecond} })
	names := []string{"a", "b", "c"}
	es := startSetOn(t, m, names...)
	empty := t.TempDir()
	es["a"].run(true, "put", empty, es["a"].at("/d"))
	var rec history.DirRecorder
	eachSite(names, func(i int, n string) {
		e := es[n]
		rng := rand.New(rand.NewPCG(uint64(i), 13))
		name := func() string { return fmt.Sprint("n", rng.IntN(3)) }
		src := filepath.Join(t.TempDir(), "src")
		if err := os.WriteFile(src, []byte(n), 0o644); err != nil {
			t.Error(err)
			return
		}
		for range 8 {
			op := history.DirOp{Client: i, Dir: "/d", Name: name()}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			var cmd *exec.Cmd
			switch rng.IntN(4) {
			case 0:
				op.Kind = history.Add
				cmd = e.command(ctx, "put", src, e.at("/d/"+op.Name))
			case 1:
				op.Kind = history.Remove
				cmd = e.command(ctx, "rm", e.at("/d/"+op.Name))
			case 2:
				op.Kind = history.Rename
				for op.To = name(); op.To == op.Name; op.To = name() {
				}
				cmd = e.command(ctx, "mv", e.at("/d/"+op.Name), e.at("/d/"+op.To))
			default:
				op.Kind = history.List
				cmd = e.command(ctx, "ls", e.at("/d"))
			}
			out, errOut, err := timed(cmd, &op.Call, &op.Return)
			cancel()
			op.OK = err == nil
			missing := err != nil && strings.Contains(errOut, "not exist")
			if err != nil && !(missing && (op.Kind == history.Remove || op.Kind == history.Rename)) {
				t.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, errOut)
				return
			}
			if op.Kind == history.List {
				op.Names = strings.Fields(out)
			}
			rec.Add(op)
		}
	})
	if t.Failed() {
		return
	}
	if err := rec.Check(time.Minute, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// eachSite runs fn for every member name at once, with its index, and
// returns once all have.
func eachSite(names []string, fn func(i int, n string)) {
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i, n)
		}()
	}
	wg.Wait()
}

// timed runs cmd, noting when it was called and when it returned, and
// returns its output.
func timed(cmd *exec.Cmd, call, ret *time.Time) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	*call = time.Now()
	err = cmd.Run()
	*ret = time.Now()
	return out.String(), errOut.String(), err
}

// TestReplicaSetMountHistory is the end-to-end history through mounts:
// three sites 120 ms apart, a mount (write-back, as by default) at each
// site of its own member, its client writing and reading two files whole
// and adding, removing, renaming and listing the names of one directory,
// all at once. Both histories are checked with Porcupine, and then every
// member's copy must be the same.
func TestReplicaSetMountHistory(t *testing.T) {
	mountHistory(t, false)
}

// TestReplicaSetMountReaders is TestReplicaSetMountHistory with a second
// mount at each site for a client that only reads and lists, so that its
// reads never follow a change of its own; its mounts hear opens
// (--kernel-opens=false), TestReplicaSetMountReadersKernelOpens's are as
// by default. The readers caught what bench/REPORT-replicas.md lists for
// session 7: a mount serving its copy under another site's new write
// lease, a listing failed while it changed, a name brought back by a
// store after a rename elsewhere, a file stored half written by a recall.
func TestReplicaSetMountReaders(t *testing.T) {
	mountHistory(t, true, "--kernel-opens=false")
}

// TestReplicaSetMountReadersKernelOpens is TestReplicaSetMountReaders on
// mounts as they are by default, where the kernel opens files itself.
func TestReplicaSetMountReadersKernelOpens(t *testing.T) {
	mountHistory(t, true)
}

// mountHistory runs the history through mounts, with a second mount for a
// reading client at each site if readers, each mount given mountArgs.
func mountHistory(t *testing.T, readers bool, mountArgs ...string) {
	needMount(t)
	m := netemtest.MeshForTest(t, 3, func(int, int) netem.Link { return netem.Link{Delay: 60 * time.Millisecond} })
	names := []string{"a", "b", "c"}
	es := startSetOn(t, m, names...)
	// With readers, a second mount at each site, for a client that only
	// reads: a mount of its own, since a file written with O_TRUNC is
	// not whole in the mount that writes it until it is closed, on any
	// file system.
	clients := slices.Clone(names)
	if readers {
		clients = append(clients, names...)
	}
	mnts := make([]string, len(clients))
	for i, n := range clients {
		mnts[i] = mountPoint(t)
		es[n].run(true, append(append([]string{"mount"}, mountArgs...), es[n].at("/"), mnts[i])...)
		t.Cleanup(func() { es[n].run(true, "umount", mnts[i]) })
	}
	if err := os.Mkdir(filepath.Join(mnts[0], "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	var files history.Recorder
	var dirs history.DirRecorder
	eachSite(clients, func(i int, n string) {
		reader := i >= len(names)
		mnt := mnts[i]
		rng := rand.New(rand.NewPCG(uint64(i), 17))
		name := func() string { return fmt.Sprint("n", rng.IntN(3)) }
		for k := range 12 {
			if rng.IntN(2) == 0 {
				op := history.Op{Client: i, File: fmt.Sprintf("/k%d", rng.IntN(2)), Write: !reader && rng.IntN(2) == 0, Call: time.Now()}
				p := filepath.Join(mnt, op.File)
				if op.Write {
					op.Value = fmt.Sprintf("%s wrote %d\n", n, k)
					if err := os.WriteFile(p, []byte(op.Value), 0o644); err != nil {
						t.Errorf("%s: %v", n, err)
						return
					}
				} else {
					b, err := os.ReadFile(p)
					if err != nil && !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s: %v", n, err)
						return
					}
					op.Value = string(b)
				}
				op.Return = time.Now()
				files.Add(op)
				continue
			}
			op := history.DirOp{Client: i, Dir: "/d", Name: name(), Call: time.Now()}
			p := filepath.Join(mnt, "d", op.Name)
			var err error
			kind := rng.IntN(4)
			if reader {
				kind = 3
			}
			switch kind {
			case 0:
				op.Kind = history.Add
				err = os.WriteFile(p, []byte(n), 0o644)
			case 1:
				op.Kind = history.Remove
				err = os.Remove(p)
			case 2:
				op.Kind = history.Rename
				for op.To = name(); op.To == op.Name; op.To = name() {
				}
				err = os.Rename(p, filepath.Join(mnt, "d", op.To))
			default:
				op.Kind = history.List
				var ents []os.DirEntry
				ents, err = os.ReadDir(filepath.Join(mnt, "d"))
				for _, e := range ents {
					op.Names = append(op.Names, e.Name())
				}
			}
			op.Return = time.Now()
			op.OK = err == nil
			if err != nil && !(errors.Is(err, fs.ErrNotExist) && (op.Kind == history.Remove || op.Kind == history.Rename)) {
				t.Errorf("%s: %s %s: %v", n, op.Kind, op.Name, err)
				return
			}
			dirs.Add(op)
		}
	})
	defer func() {
		if t.Failed() {
			for _, n := range names {
				logProblems(t, es[n].home)
			}
		}
	}()
	if t.Failed() {
		return
	}
	if err := files.Check(time.Minute, t.TempDir()); err != nil {
		t.Errorf("files: %v", err)
	}
	if err := dirs.Check(time.Minute, t.TempDir()); err != nil {
		t.Errorf("the directory: %v", err)
	}
	// After quiescence (a sync at each mount, then the members' updates
	// applied) every copy is the same: names, bytes, modes and times.
	for i := range names {
		if err := os.WriteFile(filepath.Join(mnts[i], "Ctl"), []byte("sync\n"), 0o644); err != nil {
			t.Errorf("sync at %s: %v", names[i], err)
		}
	}
	copyOf := func(n string) string {
		var b strings.Builder
		filepath.WalkDir(es[n].dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				c, _ := os.ReadFile(p)
				var mode os.FileMode
				var mtime int64
				if fi, err := d.Info(); err == nil {
					mode, mtime = fi.Mode(), fi.ModTime().UnixNano()
				}
				fmt.Fprintf(&b, "%s=%q %v %d ", strings.TrimPrefix(p, es[n].dir), c, mode, mtime)
			}
			return nil
		})
		return b.String()
	}
	if !waitFor(20*time.Second, func() bool { return copyOf("b") == copyOf("a") && copyOf("c") == copyOf("a") }) {
		t.Fatalf("the copies differ:\na: %s\nb: %s\nc: %s", copyOf("a"), copyOf("b"), copyOf("c"))
	}
}

// logProblems logs the warnings and errors in the logs of the server and
// the mounts of home, for a test that failed: the logs go with home.
func logProblems(t *testing.T, home string) {
	logs, _ := filepath.Glob(filepath.Join(home, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		// FERRY_KEEP_LOGS names a directory to keep them whole in.
		if keep := os.Getenv("FERRY_KEEP_LOGS"); keep != "" {
			os.WriteFile(filepath.Join(keep, time.Now().Format("150405")+"-"+t.Name()+"-"+filepath.Base(home)+"-"+filepath.Base(l)), b, 0o644)
		}
		var problems []string
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				problems = append(problems, line)
			}
		}
		if len(problems) > 30 {
			problems = append(problems[:15], append([]string{"...\n"}, problems[len(problems)-15:]...)...)
		}
		t.Logf("%s: %d lines, %d warnings and errors:\n%s", filepath.Base(l), strings.Count(string(b), "\n"), len(problems), strings.Join(problems, ""))
	}
}
