package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDemo runs scripts/demo.sh, what `make demo` (the README's first
// command) runs after setup: it serves a tree on loopback and uses every
// native command on it, checking what it copies. It broke once without a
// test noticing: a change to the server's first log line hid its address.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", "../../scripts/demo.sh").CombinedOutput()
	if err != nil {
		t.Fatalf("demo.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"(the downloaded tree is identical)", "(the uploaded tree is identical)", "demo done"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo.sh printed no %q:\n%s", want, out)
		}
	}
}
