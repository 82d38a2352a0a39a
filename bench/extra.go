package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The data of the workloads beyond copies and walks: a name that is not
// there, a C project, a large text document with a one-line edit and two
// versions of a Go module. Each is made once per run; the per-run copies
// the workloads change are made by prepare, untimed, before every run.
const (
	missingName = "ferry-bench-no-such-name"
	cprojName   = "cproj"
	repoName    = "repo"
	docName     = "doc.txt"
	modName     = "mod"

	// upgradeModule and its two versions are the module of the upgrade
	// workload, from the local module cache: consecutive minor releases
	// (139 and 139 files, 24 of them different or only in one version).
	upgradeModule = "github.com/prometheus/client_golang"
	upgradeFrom   = "v1.15.0"
	upgradeTo     = "v1.16.0"
)

// extraData are the paths and expected results of those workloads.
type extraData struct {
	// missing is the path, relative to the server's tree, of a name that
	// does not exist in the tree's deepest directory.
	missing string

	cproj        string // pristine C project, copied to srv/in before each make-j2 and recompile run
	cprojModules int    // its .c files (and headers) beside main.c: the profile's
	cprojWant    string // what the built program prints

	// touchHeader is the client's changed copy of one module's header
	// (src/recompile/), which the recompile workload writes over the
	// project's include/touchName; the program built then prints
	// touchWant.
	touchHeader, touchName, touchWant string

	doc, docEdited string // pristine document; the client's edited copy (src/edit/doc.txt)
	docSize        int    // the most bytes the document may have: the profile's
	docFrom        string
	docLine        int   // the edited line, from 1
	docBytes       int64 // the pristine document's size

	modA, modB string // pristine version A; the client's version B (src/up/mod)
	modDir     string // the directory of upgradeModule they hold, "" for all of it
	modFiles   [2]int // files of A and B
	modDiffer  int    // files of B that are new or differ from A, plus files of A not in B
	modErr     error  // why the upgrade workload's data could not be made

	repoFrom  string // the directory the git repository is made of
	repoFiles int    // the files it tracks
	repoErr   error  // why the git-status workload's data could not be made
}

// prepareExtra makes the extra data under work and d.src.
func prepareExtra(ctx context.Context, d *dataset, work string) error {
	x := &d.extra
	pristine := filepath.Join(work, "pristine")
	if err := os.MkdirAll(pristine, 0o755); err != nil {
		return err
	}

	// The deepest directory of the tree, first in walk order.
	deepest, depth := treeName, 0
	err := filepath.WalkDir(filepath.Join(d.srv, treeName), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			rel, _ := filepath.Rel(d.srv, p)
			if n := strings.Count(rel, "/"); n > depth {
				deepest, depth = rel, n
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	x.missing = filepath.Join(deepest, missingName)

	x.cproj = filepath.Join(pristine, cprojName)
	if x.cprojWant, err = makeCProject(x.cproj, x.cprojModules); err != nil {
		return err
	}
	if err := makeTouch(x, filepath.Join(d.src, "recompile")); err != nil {
		return err
	}

	x.doc = filepath.Join(pristine, docName)
	x.docEdited = filepath.Join(d.src, "edit", docName)
	if err := makeDoc(ctx, d, x); err != nil {
		return err
	}

	x.modA = filepath.Join(pristine, "mod-"+upgradeFrom)
	x.modB = filepath.Join(d.src, "up", modName)
	x.modErr = makeModules(ctx, x)
	x.repoFiles, x.repoErr = makeRepo(ctx, x.repoFrom, filepath.Join(d.srv, repoName))
	return nil
}

// makeRepo makes a git repository at dst of a copy of the directory from,
// with everything committed, and returns how many files it tracks.
func makeRepo(ctx context.Context, from, dst string) (int, error) {
	if from == "" {
		return 0, fmt.Errorf("%w: the profile names no directory for the repository", errUnavailable)
	}
	if _, err := output(ctx, "cp", "-a", from, dst); err != nil {
		return 0, err
	}
	git := func(args ...string) (string, error) {
		return output(ctx, "git", append([]string{"-C", dst, "-c", "user.name=bench", "-c", "user.email=bench@example.com"}, args...)...)
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "bench"}} {
		if _, err := git(args...); err != nil {
			return 0, err
		}
	}
	out, err := git("ls-files")
	if err != nil {
		return 0, err
	}
	return strings.Count(out, "\n"), nil
}

// makeDoc writes the document: Debian's license texts, then Go source files
// in walk order, up to x.docSize and cut at a line's end; and the client's
// copy with one line in the middle changed.
func makeDoc(ctx context.Context, d *dataset, x *extraData) error {
	var b bytes.Buffer
	add := func(p string) {
		if b.Len() >= x.docSize {
			return
		}
		if data, err := os.ReadFile(p); err == nil {
			b.Write(data)
		}
	}
	x.docFrom = "/usr/share/common-licenses and " + filepath.Join(d.bigFrom, "src")
	if ents, err := os.ReadDir("/usr/share/common-licenses"); err == nil {
		for _, e := range ents {
			if e.Type().IsRegular() {
				add(filepath.Join("/usr/share/common-licenses", e.Name()))
			}
		}
	}
	err := filepath.WalkDir(filepath.Join(d.bigFrom, "src"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || b.Len() >= x.docSize {
			if b.Len() >= x.docSize {
				return filepath.SkipAll
			}
			return nil
		}
		if e.Type().IsRegular() && strings.HasSuffix(p, ".go") {
			add(p)
		}
		return ctx.Err()
	})
	if err != nil {
		return err
	}
	doc := b.Bytes()
	if len(doc) > x.docSize {
		doc = doc[:x.docSize]
	}
	if i := bytes.LastIndexByte(doc, '\n'); i >= 0 {
		doc = doc[:i+1]
	}
	if len(doc) < x.docSize/2 {
		return fmt.Errorf("only %d bytes of text for the document", len(doc))
	}
	// The edit: the line in the middle gets a few words more.
	mid := bytes.IndexByte(doc[len(doc)/2:], '\n') + len(doc)/2 + 1
	end := mid + bytes.IndexByte(doc[mid:], '\n')
	x.docLine = bytes.Count(doc[:mid], []byte("\n")) + 1
	x.docBytes = int64(len(doc))
	edited := slices.Concat(doc[:end], []byte(" // edited by ferry-bench"), doc[end:])
	if err := os.WriteFile(x.doc, doc, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(x.docEdited), 0o755); err != nil {
		return err
	}
	return os.WriteFile(x.docEdited, edited, 0o644)
}

// stampTree sets the modification time of every file and directory in
// dir to t.
func stampTree(dir string, t time.Time) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		return os.Chtimes(p, t, t)
	})
}

// makeModules copies the two versions of upgradeModule (or of its
// directory x.modDir) out of the module cache, downloading them through
// the Go module proxy if they are not there, writable, and counts what
// differs.
func makeModules(ctx context.Context, x *extraData) error {
	// Each version's files get one time of their own, as a release
	// unpacked on its day has: the module cache's are the times of its
	// extraction, which on a fresh machine may fall in the same second
	// for both versions, and then a file of the same size in both
	// (VERSION) looks unchanged to rsync's and ferry sync's quick check.
	for _, c := range []struct {
		version, dst string
		stamp        time.Time
	}{{upgradeFrom, x.modA, time.Date(2023, 4, 18, 12, 0, 0, 0, time.UTC)}, {upgradeTo, x.modB, time.Date(2023, 6, 30, 12, 0, 0, 0, time.UTC)}} {
		// go mod download answers from the cache when it can; its Dir
		// is the module's directory, whatever the escaping of its path.
		out, err := output(ctx, "go", "mod", "download", "-json", upgradeModule+"@"+c.version)
		var m struct{ Dir, Error string }
		if jerr := json.Unmarshal([]byte(out), &m); err != nil || jerr != nil || m.Dir == "" {
			return fmt.Errorf("%w: cannot download %s@%s: %v %s", errUnavailable, upgradeModule, c.version, err, m.Error)
		}
		src := filepath.Join(m.Dir, x.modDir)
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("%w: %s@%s has no %s", errUnavailable, upgradeModule, c.version, x.modDir)
		}
		if err := os.MkdirAll(filepath.Dir(c.dst), 0o755); err != nil {
			return err
		}
		if _, err := output(ctx, "cp", "-a", src, c.dst); err != nil {
			return err
		}
		if _, err := output(ctx, "chmod", "-R", "u+w", c.dst); err != nil {
			return err
		}
		if err := stampTree(c.dst, c.stamp); err != nil {
			return err
		}
	}
	a, err := readTree(x.modA)
	if err != nil {
		return err
	}
	b, err := readTree(x.modB)
	if err != nil {
		return err
	}
	x.modFiles = [2]int{len(a), len(b)}
	for p, data := range b {
		if old, ok := a[p]; !ok || !bytes.Equal(old, data) {
			x.modDiffer++
		}
	}
	for p := range a {
		if _, ok := b[p]; !ok {
			x.modDiffer++
		}
	}
	return nil
}

// readTree returns the contents of every regular file under dir by path
// relative to it.
func readTree(dir string) (map[string][]byte, error) {
	m := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			m[rel] = data
		}
		return nil
	})
	return m, err
}

// touchSalt is added to the salt of the module whose header the recompile
// workload changes, so that the program's sum changes.
const touchSalt = 1000

// makeTouch writes, under dir, the changed header of the recompile
// workload: module n/2's, included by its module and by main.c, with a
// salt touchSalt higher. It fills in x's touch fields.
func makeTouch(x *extraData, dir string) error {
	n := x.cprojModules
	k := n / 2
	x.touchName = fmt.Sprintf("include/m%03d.h", k)
	x.touchHeader = filepath.Join(dir, filepath.Base(x.touchName))
	x.touchWant = cprojOutput(n, k, k+touchSalt)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(x.touchHeader, []byte(cprojHeader(k, k+touchSalt)), 0o644)
}

// cprojEntry is entry j of module i's table.
func cprojEntry(i, j int) int { return (i*31 + j*17 + 7) % 101 }

// cprojTable is the length of each module's table.
const cprojTable = 8

// cprojValue is what module i's function returns with the given salt: its
// table weighed by position, exclusive-or the salt, as weigh computes it.
func cprojValue(i, salt int) int {
	s := 0
	for j := range cprojTable {
		s += cprojEntry(i, j) * (j + 1)
	}
	return s ^ salt
}

// cprojOutput is what the program of n modules prints when module touched
// has the given salt and every other module i has salt i; touched -1
// leaves every salt as generated.
func cprojOutput(n, touched, salt int) string {
	sum := 0
	for i := range n {
		if i == touched {
			sum += cprojValue(i, salt)
		} else {
			sum += cprojValue(i, i)
		}
	}
	return fmt.Sprintf("%d modules, sum %d\n", n, sum)
}

// cprojHeader is the header of module i, which defines its salt.
func cprojHeader(i, salt int) string {
	name := fmt.Sprintf("m%03d", i)
	return fmt.Sprintf("#ifndef %[1]s_H\n#define %[1]s_H\n/* %[2]s.h: module %[3]d of the ferry-bench C project. */\n/* %[1]s_SALT is mixed into %[2]s_value's sum. */\n#define %[1]s_SALT %[4]d\nint %[2]s_value(void);\n#endif\n",
		strings.ToUpper(name), name, i, salt)
}

// makeCProject writes a C project of n modules to dir: src/mNNN.c, each
// with its header include/mNNN.h (which defines the module's salt) and the
// shared include/common.h, and src/main.c calling them all, with a
// Makefile that builds obj/*.o and the program prog. The code is
// generated, deterministically: a small table and a loop per module. It
// returns what prog prints.
func makeCProject(dir string, n int) (string, error) {
	files := map[string]string{}
	files["include/common.h"] = `#ifndef COMMON_H
#define COMMON_H
/* common.h: shared by every module of the ferry-bench C project. */
#include <stddef.h>
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
int weigh(const int *t, size_t n, int salt);
#endif
`
	files["src/weigh.c"] = `#include "common.h"

/* weigh sums t weighted by position, then mixes in salt. */
int weigh(const int *t, size_t n, int salt)
{
	int s = 0;
	for (size_t i = 0; i < n; i++)
		s += t[i] * (int)(i + 1);
	return s ^ salt;
}
`
	var decls, calls strings.Builder
	for i := range n {
		name := fmt.Sprintf("m%03d", i)
		var table []string
		for j := range cprojTable {
			table = append(table, fmt.Sprint(cprojEntry(i, j)))
		}
		files["include/"+name+".h"] = cprojHeader(i, i)
		files["src/"+name+".c"] = fmt.Sprintf(`#include "common.h"
#include "%[1]s.h"

/* %[1]s_table is module %[2]d's data. */
static const int %[1]s_table[] = {%[3]s};

/* %[1]s_value returns the weighed sum of the table. */
int %[1]s_value(void)
{
	return weigh(%[1]s_table, COUNT(%[1]s_table), %[4]s_SALT);
}
`, name, i, strings.Join(table, ", "), strings.ToUpper(name))
		fmt.Fprintf(&decls, "#include \"%s.h\"\n", name)
		fmt.Fprintf(&calls, "\tsum += %s_value();\n", name)
	}
	files["src/main.c"] = fmt.Sprintf(`#include <stdio.h>
#include "common.h"
%s
int main(void)
{
	long sum = 0;
%s	printf("%%d modules, sum %%ld\n", %d, sum);
	return 0;
}
`, decls.String(), calls.String(), n)
	files["Makefile"] = `# Makefile of the ferry-bench C project: make -j2 builds prog.
CC ?= cc
CFLAGS ?= -O1
CPPFLAGS = -Iinclude
SRCS := $(wildcard src/*.c)
OBJS := $(SRCS:src/%.c=obj/%.o)

prog: $(OBJS)
	$(CC) -o $@ $(OBJS)

obj/main.o: src/main.c $(wildcard include/*.h) | obj
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

obj/weigh.o: src/weigh.c include/common.h | obj
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

obj/%.o: src/%.c include/%.h include/common.h | obj
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

obj:
	mkdir -p obj

clean:
	rm -rf obj prog
.PHONY: clean
`
	for p, s := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return "", err
		}
	}
	return cprojOutput(n, -1, 0), nil
}

// unavailable returns why w's data could not be made, or nil.
func (d *dataset) unavailable(w workload) error {
	switch w.name {
	case "upgrade":
		return d.extra.modErr
	case "git-status":
		return d.extra.repoErr
	}
	return nil
}

// prepare puts on the server, untimed, what a run of w changes: a copy of
// the tree to remove, the C project to build, the document to edit,
// version A of the module. The upload directory is empty when it runs.
// With random data it makes put-file's file afresh, so that no earlier
// run's upload can have left its chunks on the server.
func prepare(ctx context.Context, e *env, w workload) error {
	x := &e.h.data.extra
	var src, dst string
	switch w.name {
	case "put-file":
		if e.h.data.random {
			return writeRandom(e.h.data.putBig, e.h.data.bigSize)
		}
		return nil
	case "rm-tree":
		src, dst = filepath.Join(e.srv, treeName), filepath.Join(e.in, treeName)
	case "make-j2", "recompile":
		src, dst = x.cproj, filepath.Join(e.in, cprojName)
	case "edit-save":
		src, dst = x.doc, filepath.Join(e.in, docName)
	case "upgrade":
		src, dst = x.modA, filepath.Join(e.in, modName)
	default:
		return nil
	}
	_, err := output(ctx, "cp", "-a", src, dst)
	return err
}

// warmup returns the untimed script that runs after s's reset and before
// the timed run of w, or "".
func warmup(s system, w workload, e *env) string {
	if w.name == "recompile" {
		return recompileWarmup(s, e)
	}
	switch s.(type) {
	case *sshfs, *ferryMount:
		return mountWarmup(w, e)
	case localDisk:
		if w.name == "git-status" {
			sc, _ := s.script(w, e)
			return sc
		}
	}
	return ""
}

// recompileWarmup builds the C project once and then writes the changed
// header over the module's, through the path s's timed build uses: the
// mount for sshfs and Ferry's mounts, the server's disk for ssh and the
// local disk. The first build runs on a Ferry mount, where it leaves what
// Ferry keeps between builds (the server's copies of the replaced objects,
// the client's chunk cache), and on the server's disk for the others:
// sshfs keeps nothing a later build could use, and a build through it
// takes about a quarter of an hour at 100 ms. The header is changed two
// seconds after the build: SFTP gives times in whole seconds, and a header
// as old as main.o in seconds would not make sshfs's make compile main.c
// again.
func recompileWarmup(s system, e *env) string {
	x := &e.h.data.extra
	dir := filepath.Join(e.in, cprojName)
	build, touch := dir, dir
	switch s.(type) {
	case *ferryMount:
		build, touch = e.mnt+"/in/"+cprojName, e.mnt+"/in/"+cprojName
	case *sshfs:
		touch = e.mnt + "/in/" + cprojName
	}
	return fmt.Sprintf("make -j2 -C %s && sleep 2 && cp %s %s", q(build), q(x.touchHeader), q(touch+"/"+x.touchName))
}

// verifyRecompiled checks that the objects that include the changed
// header, main.o and the module's, were compiled after it was changed: the
// program's output shows only the module's, since main.o comes out the
// same.
func verifyRecompiled(dir, header string) error {
	h, err := os.Stat(filepath.Join(dir, header))
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	for _, o := range []string{"main.o", strings.TrimSuffix(filepath.Base(header), ".h") + ".o"} {
		st, err := os.Stat(filepath.Join(dir, "obj", o))
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		if st.ModTime().Before(h.ModTime()) {
			return fmt.Errorf("verify: obj/%s was not compiled again after %s changed", o, header)
		}
	}
	return nil
}

// verifyExtra checks the server's side after a run of the workloads that
// change it.
func verifyExtra(e *env, s system, w workload) error {
	x := &e.h.data.extra
	switch w.name {
	case "rm-tree":
		if _, err := os.Lstat(filepath.Join(e.in, treeName)); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("verify: the tree is still there (%v)", err)
		}
	case "make-j2", "recompile":
		want := x.cprojWant
		if w.name == "recompile" {
			want = x.touchWant
		}
		out, err := exec.Command(filepath.Join(e.in, cprojName, "prog")).Output()
		if err != nil {
			return fmt.Errorf("verify: running the built program: %w", err)
		}
		if string(out) != want {
			return fmt.Errorf("verify: the built program printed %q, want %q", out, want)
		}
		if w.name == "recompile" {
			return verifyRecompiled(filepath.Join(e.in, cprojName), x.touchName)
		}
	case "edit-save":
		got, err := os.ReadFile(filepath.Join(e.in, docName))
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		want, err := os.ReadFile(x.docEdited)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("verify: the server's document (%d bytes) is not the edited one (%d bytes)", len(got), len(want))
		}
	case "upgrade":
		got, err := readTree(filepath.Join(e.in, modName))
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		want, err := readTree(x.modB)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		for p, data := range want {
			if g, ok := got[p]; !ok {
				return fmt.Errorf("verify: %s is missing", p)
			} else if !bytes.Equal(g, data) {
				return fmt.Errorf("verify: %s is not version %s's", p, upgradeTo)
			}
		}
		// rsync --delete and ferry sync --delete promise the exact tree;
		// the others leave what B dropped, as the workload's description
		// says.
		if extra := len(got) - len(want); extra > 0 && (s.name() == "rsync" || s.name() == "ferry") {
			return fmt.Errorf("verify: %d files that %s dropped are still there", extra, upgradeTo)
		}
	}
	return nil
}
