package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testEnv returns a harness and an env whose paths are under a temporary
// directory, enough for the systems' scripts; nothing runs.
func testEnv(t *testing.T) (*harness, *env) {
	dir := t.TempDir()
	d := &dataset{srv: filepath.Join(dir, "srv"), src: filepath.Join(dir, "src")}
	d.extra = extraData{missing: "tree/" + missingName, docEdited: filepath.Join(d.src, "edit", docName), modB: filepath.Join(d.src, "up", modName)}
	h := &harness{o: &options{root: dir}, work: dir, data: d}
	h.systems = allSystems(h, &ferryBuild{h: h})
	e := &env{
		h: h, srvAddr: netip.MustParseAddr("10.0.0.2"), sshConfig: filepath.Join(dir, "ssh_config"),
		srv: d.srv, in: filepath.Join(d.srv, "in"), src: d.src,
		out: filepath.Join(dir, "out"), mnt: filepath.Join(dir, "mnt"),
	}
	return h, e
}

// TestEverySystemHasEveryRow checks that every system either has a command
// for every workload or says why not, so that no row is left out of a
// table silently.
func TestEverySystemHasEveryRow(t *testing.T) {
	h, e := testEnv(t)
	if len(h.systems) != len(systemNames()) {
		t.Fatalf("%d systems, %d names", len(h.systems), len(systemNames()))
	}
	for i, s := range h.systems {
		if got, want := s.name(), systemNames()[i]; got != want {
			t.Errorf("system %d is %q, want %q", i, got, want)
		}
		for _, w := range workloads {
			sc, err := s.script(w, e)
			switch {
			case err == nil && sc == "":
				t.Errorf("%s %s: no command and no reason", s.name(), w.name)
			case err != nil && !errors.Is(err, errNotApplicable) && !errors.Is(err, errNotMeasured):
				t.Errorf("%s %s: %v, want a command or a reason it does not apply", s.name(), w.name, err)
			case err != nil && strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(err.Error(), errNotApplicable.Error()), errNotMeasured.Error())) == ":":
				t.Errorf("%s %s: %q gives no reason", s.name(), w.name, err)
			}
		}
	}
}

// TestReportRows checks that a workload's table has a row for every system
// that was run, with the reason when it has no time, said in full once
// when it is the same under every condition.
func TestReportRows(t *testing.T) {
	dir := t.TempDir()
	c1 := condition{RTT: 10 * time.Millisecond, Rate: 100e6}
	c2 := condition{RTT: 100 * time.Millisecond, Rate: 100e6}
	o := &options{conds: []condition{c1, c2}, runs: 1, out: filepath.Join(dir, "REPORT-test.md"), note: "a test report."}
	r := &report{opts: o, data: &dataset{}, started: time.Now(), finished: time.Now()}
	for _, c := range o.conds {
		r.add(c, "scp", "find", cell{err: notApplicable("scp only copies")})
		r.add(c, "rsync", "find", cell{median: time.Second})
		r.add(c, "nfs", "find", cell{err: fmt.Errorf("%w: no client", errNotMeasured)})
		r.add(c, "ferry", "find", cell{median: time.Second / 2})
	}
	r.add(c1, "sshfs", "find", cell{err: notApplicable("first reason")})
	r.add(c2, "sshfs", "find", cell{err: errors.New("mount: exit status 1")})
	if err := r.write(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(o.out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"- **Note:** a test report.\n",
		"| scp | n/a: scp only copies | n/a |\n",
		"| rsync | 1.00 s (1.00×) | 1.00 s (1.00×) |\n",
		"| ssh | – | – |\n",
		"| sshfs | n/a [1] | failed [2] |\n",
		"| ferry | 0.50 s (0.50×) | 0.50 s (0.50×) |\n",
		"| ferry-mount | – | – |\n",
		"| nfs | not measured: no client | not measured |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "## ls-lR") {
		t.Errorf("report has a table for ls-lR, which has no results:\n%s", got)
	}
}

func TestPlotDirName(t *testing.T) {
	for report, want := range map[string]string{
		"bench/REPORT.md":       "plots",
		"bench/REPORT-smoke.md": "plots-smoke",
		"/tmp/f.md":             "plots-f",
	} {
		if got := plotDirName(report); got != want {
			t.Errorf("plotDirName(%q) = %q, want %q", report, got, want)
		}
	}
}
