package netemcmd

import (
	"bytes"
	"context"
	"strings"
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

func TestRun(t *testing.T) {
	testenv.RequireErr(t, netem.Available())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, &out, netem.Symmetric(10*time.Millisecond, 5_000_000, 0.01), 100*time.Millisecond); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("output:\n%s", out.String())
	for _, want := range []string{"client namespace ferry-", "server namespace ferry-", "nsenter --net=/var/run/netns/", "up   (client to server)", "removed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
