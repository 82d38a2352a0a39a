package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMountKilledLeavesPrefix kills (SIGKILL) a write-back mount while a
// program in it saves files the way git and editors do: write a temporary
// file, rename it into place; every third save also removes an older
// file. The tree on the server, once quiet, must be one the program's own
// tree was at some moment: each file whole, none saved after one that is
// missing. Three rounds, killed at different moments.
func TestMountKilledLeavesPrefix(t *testing.T) {
	needMount(t)
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) { killedMount(t, round) })
	}
}

func killedMount(t *testing.T, round int) {
	e := start(t)
	if err := os.Mkdir(filepath.Join(e.dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := mountForeground(t, e)
	mnt, stderr := m.dir, m.stderr
	// The program's states: each a listing of the directory, name=content.
	files := map[string]string{}
	state := func() string {
		var b []string
		for _, n := range slices.Sorted(func(yield func(string) bool) {
			for n := range files {
				if !yield(n) {
					return
				}
			}
		}) {
			b = append(b, n+"="+files[n])
		}
		return strings.Join(b, " ")
	}
	states := []string{state()}
	rng := rand.New(rand.NewPCG(uint64(round), 3))
	killAt := time.Now().Add(time.Duration(1500+rng.IntN(2000)) * time.Millisecond)
	dir := filepath.Join(mnt, "d")
	for i := 0; time.Now().Before(killAt); i++ {
		content := fmt.Sprintf("save %d of round %d", i, round)
		if err := os.WriteFile(filepath.Join(dir, "tmp"), []byte(content), 0o644); err != nil {
			t.Fatalf("save %d: %v\n%s", i, err, stderr.String())
		}
		files["tmp"] = content
		states = append(states, state())
		name := fmt.Sprintf("f%03d", i)
		if err := os.Rename(filepath.Join(dir, "tmp"), filepath.Join(dir, name)); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
		delete(files, "tmp")
		files[name] = content
		states = append(states, state())
		if i%3 == 2 {
			old := fmt.Sprintf("f%03d", i-2)
			if err := os.Remove(filepath.Join(dir, old)); err != nil {
				t.Fatalf("save %d: %v", i, err)
			}
			delete(files, old)
			states = append(states, state())
		}
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	}
	m.cmd.Process.Kill()
	<-m.exited
	// What the server took before the kill lands; then its tree is quiet.
	read := func() string {
		ents, err := os.ReadDir(filepath.Join(e.dir, "d"))
		if err != nil {
			t.Fatal(err)
		}
		var b []string
		for _, de := range ents {
			data, err := os.ReadFile(filepath.Join(e.dir, "d", de.Name()))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, de.Name()+"="+string(data))
		}
		return strings.Join(b, " ")
	}
	got := read()
	for {
		time.Sleep(500 * time.Millisecond)
		again := read()
		if again == got {
			break
		}
		got = again
	}
	if i := slices.Index(states, got); i >= 0 {
		t.Logf("killed after %d states: the server shows state %d", len(states)-1, i)
		return
	}
	t.Errorf("the server shows a state the program's tree never had:\n  %s\nlast state:\n  %s", got, states[len(states)-1])
}
