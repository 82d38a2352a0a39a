package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
