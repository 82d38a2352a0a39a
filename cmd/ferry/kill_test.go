package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/servertest"
)

var killLoops = flag.Int("kill.loops", 3, "server kills during TestKillDuringUpload (make killloop runs more)")

// TestKillDuringUpload kills the server with SIGKILL again and again while
// one ferry put of a 32 MiB file runs, restarting it on the same address
// each time. The put rides the restarts out and completes; the file is
// never there half-written; no temporary file is left in the tree; and
// each restarted server salvages what had reached its disk, so the put
// tried again sends only the rest.
func TestKillDuringUpload(t *testing.T) {
	const size = 32 << 20
	home, dir := t.TempDir(), t.TempDir()
	src := filepath.Join(t.TempDir(), "big")
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := servertest.FreeAddr(t)
	proxy, count := servertest.CountProxy(t, addr)
	sent := &count.Up
	env := append(os.Environ(), "FERRY_HOME="+home, "GORACE=atexit_sleep_ms=0")

	// serve starts a server on addr and returns it once it listens.
	var logs bytes.Buffer
	var logMu sync.Mutex
	serve := func() *exec.Cmd {
		cmd := exec.Command(ferryBin, "serve", dir, "--listen", addr, "--grace", "1s")
		cmd.Env = env
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		listening := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := sync.Once{}
			for sc.Scan() {
				logMu.Lock()
				logs.WriteString(sc.Text() + "\n")
				logMu.Unlock()
				if strings.Contains(sc.Text(), "serving") {
					once.Do(func() { close(listening) })
				}
			}
		}()
		select {
		case <-listening:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("ferry serve printed no address")
		}
		return cmd
	}
	srv, began := serve(), time.Now()
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		srv.Wait()
	}()

	put := exec.Command(ferryBin, "put", src, proxy+":/big")
	put.Env = env
	var putOut bytes.Buffer
	put.Stdout, put.Stderr = &putOut, &putOut
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	var putErr error
	putExited := make(chan struct{})
	go func() { putErr = put.Wait(); close(putExited) }()
	defer func() {
		put.Process.Kill() // Nothing, if it exited.
		<-putExited
	}()
	isExited := func() bool {
		select {
		case <-putExited:
			return true
		default:
			return false
		}
	}

	kills := 0
	var sentBefore int64 // What the client had sent by the last kill.
	for i := range *killLoops {
		// Kill once this server's put holds a little more of the upload
		// than the last one's did, so that each restart has salvaged what
		// arrived before (a kill while it salvages loses that).
		want := int64(i+1) * size / int64(*killLoops+1)
		if !waitFor(60*time.Second, func() bool { return tempBytes(dir, began) >= want || isExited() }) {
			t.Fatalf("the upload made no progress to %d bytes before kill %d", want, i+1)
		}
		if isExited() {
			break
		}
		srv.Process.Kill()
		srv.Wait()
		kills++
		sentBefore = sent.Load()
		if _, err := os.Stat(filepath.Join(dir, "big")); err == nil {
			if got, _ := os.ReadFile(filepath.Join(dir, "big")); !bytes.Equal(got, data) {
				t.Fatalf("after kill %d the file is there, torn (%d bytes)", kills, len(got))
			}
		}
		srv, began = serve(), time.Now()
	}
	select {
	case <-putExited:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the put did not complete after the last restart\n%s", putOut.String())
	}
	if putErr != nil {
		t.Fatalf("ferry put: %v\n%s", putErr, putOut.String())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "big")); !bytes.Equal(got, data) {
		t.Fatalf("the stored file differs from the source (%d bytes)", len(got))
	}
	if !waitFor(30*time.Second, func() bool { return len(fstest.Temps(dir)) == 0 }) {
		logMu.Lock()
		t.Fatalf("temporary files left in the tree: %v\nserver logs:\n%s", fstest.Temps(dir), logs.String())
	}
	// What the servers had received when they were killed is lost with
	// them: up to a stream window each, more than the whole file over
	// loopback. What counts is that the last server, after its start
	// salvaged the chunks that had reached the disk, asked for only the
	// rest: without the salvage it asks for all of it.
	total, last := float64(sent.Load())/size, float64(sent.Load()-sentBefore)/size
	t.Logf("%d kills; the client sent %.2f times the file's size in all, %.2f after the last restart", kills, total, last)
	if kills > 0 && last > 0.5 {
		t.Errorf("after the last restart the client sent %.2f times the file's size, though %.2f of it had reached the disk: the restarted server did not resume the upload", last, float64(*killLoops)/float64(*killLoops+1))
	}
}

// tempBytes returns the bytes on disk of the put temporary files in dir
// written since since (they are sparse until the chunks arrive).
func tempBytes(dir string, since time.Time) int64 {
	var n int64
	for _, p := range fstest.Temps(dir) {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil && !time.Unix(st.Mtim.Unix()).Before(since) {
			n += st.Blocks * 512
		}
	}
	return n
}
