package netemcmd

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
	"github.com/ferryfs/ferry/internal/testenv"
)

func TestFlags(t *testing.T) {
	cmd := Command()
	cmd.SetArgs([]string{"--rate", "nonsense"})
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Errorf("--rate nonsense: error %v, want one naming the value", err)
	}
	cmd = Command()
	cmd.SetArgs([]string{"--loss", "150%"})
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	if err := cmd.Execute(); err == nil {
		t.Errorf("--loss 150%%: no error")
	}
}

// upWriter is the output of Run, safe to read while Run writes, that
// closes up when the link is reported up.
type upWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	up   chan struct{}
	once sync.Once
}

func (w *upWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), "link up") {
		w.once.Do(func() { close(w.up) })
	}
	return n, err
}

func (w *upWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestRun runs the emulator until a while after it reports the link up
// (setting up namespaces takes a varying time on a busy machine), then
// stops it, and checks what it said and that it removed the bed.
func TestRun(t *testing.T) {
	testenv.RequireErr(t, netem.Available())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &upWriter{up: make(chan struct{})}
	go func() {
		select {
		case <-out.up:
			time.Sleep(300 * time.Millisecond) // At least one tick of the statistics.
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := Run(ctx, out, netem.Symmetric(10*time.Millisecond, 5_000_000, 0.01), 100*time.Millisecond); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("output:\n%s", out.String())
	for _, want := range []string{"client namespace ferry-", "server namespace ferry-", "nsenter --net=/var/run/netns/", "up   (client to server)", "removed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
