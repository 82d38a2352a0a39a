package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	var lines []string
	homes := map[string]string{}
	for _, n := range names {
		homes[n] = t.TempDir()
		cmd := exec.Command(ferryBin, "key", "--server")
		cmd.Env = append(os.Environ(), "FERRY_HOME="+homes[n])
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ferry key --server: %v", err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		lines = append(lines, fmt.Sprintf("%s %s %s", n, addr, strings.TrimSpace(string(out))))
	}
	members := filepath.Join(t.TempDir(), "members")
	if err := os.WriteFile(members, []byte("# three sites\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	es := map[string]*env{}
	for _, n := range names {
		es[n] = startIn(t, homes[n], nil, "--members", members, "--metrics", "127.0.0.1:0")
	}
	return es
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
