package fusefs

import (
	"os/exec"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

func TestZZStrictGit(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	repo := dir + "/repo"
	run := func(d string, args ...string) string {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = d
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("/", "cp", "-r", "/usr/local/go/src/cmd/go/internal", repo)
	run(repo, "git", "init", "-q")
	run(repo, "git", "add", "-A")
	run(repo, "git", "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "x")
	srv := servertest.Start(t, dir)
	addr := servertest.DelayProxy(t, srv.Addr, 50*time.Millisecond)
	mnt := t.TempDir()
	s, err := Mount(mnt, srv.ClientVia(t, "root", addr), Options{Log: testLog(t), TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Unmount()
	for i := 0; i < 4; i++ {
		before := srv.Srv.Calls()
		t0 := time.Now()
		run("/", "git", "-C", mnt+"/repo", "status", "--porcelain")
		el := time.Since(t0)
		after := srv.Srv.Calls()
		t.Logf("run %d: %v calls before %v after %v", i, el, before, after)
	}
}
