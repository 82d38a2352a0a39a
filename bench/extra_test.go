package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCProject builds a small generated C project and checks that the
// program prints what makeCProject says it will: the make-j2 workload's
// check depends on it.
func TestCProject(t *testing.T) {
	for _, tool := range []string{"make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	want, err := makeCProject(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("make", "-j2", "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, out)
	}
	got, err := exec.Command(filepath.Join(dir, "prog")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("prog printed %q, want %q", got, want)
	}
}

// TestDoc checks that the edited document differs from the original in one
// line only, the one it names.
func TestDoc(t *testing.T) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skip(err)
	}
	d := &dataset{src: t.TempDir(), bigFrom: strings.TrimSpace(string(goroot))}
	x := &d.extra
	x.docSize = 1 << 20
	x.doc = filepath.Join(t.TempDir(), docName)
	x.docEdited = filepath.Join(d.src, "edit", docName)
	if err := makeDoc(context.Background(), d, x); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(x.doc)
	b, _ := os.ReadFile(x.docEdited)
	if len(a) > x.docSize || int64(len(a)) != x.docBytes {
		t.Errorf("document of %d bytes, docBytes %d, want at most %d", len(a), x.docBytes, x.docSize)
	}
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	if len(la) != len(lb) {
		t.Fatalf("%d lines, edited %d", len(la), len(lb))
	}
	var changed []int
	for i := range la {
		if !bytes.Equal(la[i], lb[i]) {
			changed = append(changed, i+1)
		}
	}
	if len(changed) != 1 || changed[0] != x.docLine {
		t.Errorf("changed lines %v, want [%d]", changed, x.docLine)
	}
}

// TestRecompile builds a small generated C project, writes the recompile
// workload's changed header over the original and builds again, and checks
// that exactly the touched module and main.c were compiled again and that
// the program prints what makeTouch says it will.
func TestRecompile(t *testing.T) {
	for _, tool := range []string{"make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
	for _, n := range []int{1, 5} {
		dir := t.TempDir()
		x := &extraData{cprojModules: n}
		if _, err := makeCProject(dir, n); err != nil {
			t.Fatal(err)
		}
		if err := makeTouch(x, t.TempDir()); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("make", "-j2", "-C", dir).CombinedOutput(); err != nil {
			t.Fatalf("make: %v\n%s", err, out)
		}
		before := modTimes(t, filepath.Join(dir, "obj"))
		// make compares modification times, which a fast machine may
		// give the header and the objects alike.
		time.Sleep(10 * time.Millisecond)
		h, err := os.ReadFile(x.touchHeader)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, x.touchName), h, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("make", "-j2", "-C", dir).CombinedOutput(); err != nil {
			t.Fatalf("make again: %v\n%s", err, out)
		}
		after := modTimes(t, filepath.Join(dir, "obj"))
		var rebuilt []string
		for name, mt := range after {
			if !mt.Equal(before[name]) {
				rebuilt = append(rebuilt, name)
			}
		}
		slices.Sort(rebuilt)
		want := []string{strings.TrimSuffix(filepath.Base(x.touchName), ".h") + ".o", "main.o"}
		slices.Sort(want)
		if !slices.Equal(rebuilt, want) {
			t.Errorf("%d modules: rebuilt %v, want %v", n, rebuilt, want)
		}
		got, err := exec.Command(filepath.Join(dir, "prog")).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != x.touchWant {
			t.Errorf("%d modules: prog printed %q, want %q", n, got, x.touchWant)
		}
		if untouched := cprojOutput(n, -1, 0); x.touchWant == untouched {
			t.Errorf("%d modules: the change leaves the output %q as it was", n, untouched)
		}
	}
}

// modTimes returns the modification time of each file in dir by name.
func modTimes(t *testing.T, dir string) map[string]time.Time {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]time.Time{}
	for _, e := range ents {
		i, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = i.ModTime()
	}
	return m
}
