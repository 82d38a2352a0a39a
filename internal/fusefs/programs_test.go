package fusefs

import (
	"fmt"
	"github.com/ferryfs/ferry/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestPrograms runs real programs on a mount of a real server over the
// wire and checks what they leave, on the mount and on the server.
// TestPrograms runs programs on a mount with strict close-to-open and on
// one with write-back, checking what the server ends up with.
func TestPrograms(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(map[bool]string{false: "strict", true: "writeback"}[wb], func(t *testing.T) { testPrograms(t, wb) })
	}
}

func testPrograms(t *testing.T, writeBack bool) {
	served := t.TempDir()
	mnt := serveElsewhere(t, served, writeBack)
	// server returns where rel is in the served directory, once
	// everything written through the mount is stored there (with
	// write-back, fsync of the mount's root waits for it).
	server := func(rel string) string {
		t.Helper()
		if err := syncDir(mnt); err != nil {
			status, _ := os.ReadFile(filepath.Join(mnt, "Ctl"))
			t.Fatalf("fsync of the mount: %v; the mount's status:\n%s", err, status)
		}
		return filepath.Join(served, rel)
	}
	local := t.TempDir()
	run := func(t *testing.T, dir, name string, args ...string) string {
		t.Helper()
		if _, err := exec.LookPath(name); err != nil && !strings.Contains(name, "/") {
			testenv.Require(t, name+" is not installed")
		}
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HOME="+local, "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	// A source tree to work with, made locally.
	src := filepath.Join(local, "src")
	for i := 0; i < 30; i++ {
		writeFile(t, filepath.Join(src, fmt.Sprintf("dir%d/file%d.txt", i%5, i)), strings.Repeat(fmt.Sprintf("line %d of file %d\n", i, i), i+1))
	}
	writeFile(t, filepath.Join(src, "bin.dat"), string(make([]byte, 300000)))
	os.Symlink("dir0/file0.txt", filepath.Join(src, "link"))

	t.Run("tar", func(t *testing.T) {
		run(t, local, "tar", "cf", "src.tar", "src")
		dst := filepath.Join(mnt, "tar")
		os.Mkdir(dst, 0o755)
		run(t, dst, "tar", "xf", filepath.Join(local, "src.tar"))
		run(t, local, "diff", "-r", "--no-dereference", src, filepath.Join(dst, "src"))
		run(t, local, "diff", "-r", "--no-dereference", src, server("tar/src"))
		// And back out.
		run(t, dst, "tar", "cf", filepath.Join(local, "back.tar"), "src")
		back := filepath.Join(local, "back")
		os.Mkdir(back, 0o755)
		run(t, back, "tar", "xf", filepath.Join(local, "back.tar"))
		run(t, local, "diff", "-r", "--no-dereference", src, filepath.Join(back, "src"))
	})

	t.Run("grep", func(t *testing.T) {
		dst := filepath.Join(mnt, "grep")
		run(t, local, "cp", "-a", src, dst)
		got := run(t, dst, "grep", "-r", "-c", "of file 1[0-9]$", ".")
		want := run(t, server("grep"), "grep", "-r", "-c", "of file 1[0-9]$", ".")
		got, want = sortLines(got), sortLines(want)
		if got != want || !strings.Contains(got, "file12.txt:13") {
			t.Errorf("grep -r on the mount:\n%s\non the server:\n%s", got, want)
		}
		run(t, local, "diff", "-r", "--no-dereference", src, dst)
	})

	t.Run("rsync", func(t *testing.T) {
		dst := filepath.Join(mnt, "rsync")
		run(t, local, "rsync", "-a", src+"/", dst+"/")
		run(t, local, "diff", "-r", "--no-dereference", src, server("rsync"))
		writeFile(t, filepath.Join(src, "dir1/file1.txt"), "changed\n")
		run(t, local, "rsync", "-a", src+"/", dst+"/")
		if got := readFile(t, server("rsync/dir1/file1.txt")); got != "changed\n" {
			t.Errorf("after a second rsync, the server has %q", got)
		}
		out := filepath.Join(local, "rsync-out")
		run(t, local, "rsync", "-a", dst+"/", out+"/")
		run(t, local, "diff", "-r", "--no-dereference", src, out)
	})

	t.Run("editor", func(t *testing.T) {
		p := filepath.Join(mnt, "doc.txt")
		writeFile(t, p, "version 1\n")
		// Save as editors do: a temporary file, fsync, rename over.
		for i := 2; i <= 4; i++ {
			tmp := filepath.Join(mnt, ".doc.txt.swp")
			f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(f, "version %d\n", i)
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("version %d\n", i)
			if got := readFile(t, p); got != want {
				t.Errorf("after save %d the mount has %q", i, got)
			}
			if got := readFile(t, server("doc.txt")); got != want {
				t.Errorf("after save %d the server has %q", i, got)
			}
		}
		if _, err := os.Stat(server(".doc.txt.swp")); !os.IsNotExist(err) {
			t.Errorf("the temporary file is left: %v", err)
		}
	})

	t.Run("git", func(t *testing.T) {
		repo := filepath.Join(mnt, "repo")
		run(t, mnt, "git", "init", "-q", "-b", "main", repo)
		run(t, local, "cp", "-a", src+"/.", repo)
		run(t, repo, "git", "add", "-A")
		run(t, repo, "git", "commit", "-q", "-m", "first")
		if out := run(t, repo, "git", "status", "--porcelain"); out != "" {
			t.Errorf("git status after commit: %q", out)
		}
		writeFile(t, filepath.Join(repo, "dir2/file2.txt"), "edited\n")
		if out := run(t, repo, "git", "status", "--porcelain"); out != " M dir2/file2.txt\n" {
			t.Errorf("git status after an edit: %q", out)
		}
		run(t, repo, "git", "commit", "-q", "-am", "second")
		if out := run(t, repo, "git", "log", "--oneline"); strings.Count(out, "\n") != 2 {
			t.Errorf("git log: %q", out)
		}
		run(t, repo, "git", "fsck", "--no-progress")
		// Clone out of the mount and into it.
		run(t, local, "git", "clone", "-q", repo, filepath.Join(local, "clone"))
		if got := readFile(t, filepath.Join(local, "clone/dir2/file2.txt")); got != "edited\n" {
			t.Errorf("clone of the mount's repository has %q", got)
		}
		run(t, mnt, "git", "clone", "-q", filepath.Join(local, "clone"), filepath.Join(mnt, "clone2"))
		if out := run(t, filepath.Join(mnt, "clone2"), "git", "status", "--porcelain"); out != "" {
			t.Errorf("git status in a clone on the mount: %q", out)
		}
		// The server's copy is a working repository too.
		if out := run(t, server("repo"), "git", "log", "--oneline"); strings.Count(out, "\n") != 2 {
			t.Errorf("git log on the server: %q", out)
		}
	})

	t.Run("make", func(t *testing.T) {
		proj := filepath.Join(mnt, "proj")
		var objs []string
		main := "#include <stdio.h>\n"
		body := ""
		for i := 0; i < 12; i++ {
			writeFile(t, filepath.Join(proj, fmt.Sprintf("f%d.c", i)), fmt.Sprintf("#include \"f.h\"\nint f%d(void) { return %d; }\n", i, i))
			objs = append(objs, fmt.Sprintf("f%d.o", i))
			main += fmt.Sprintf("int f%d(void);\n", i)
			body += fmt.Sprintf(" + f%d()", i)
		}
		writeFile(t, filepath.Join(proj, "f.h"), "#define UNUSED 1\n")
		writeFile(t, filepath.Join(proj, "main.c"), main+"int main(void) { printf(\"%d\\n\", 0"+body+"); return 0; }\n")
		writeFile(t, filepath.Join(proj, "Makefile"), "prog: main.o "+strings.Join(objs, " ")+"\n\tcc -o $@ $^\n%.o: %.c f.h\n\tcc -c -o $@ $<\n")
		run(t, proj, "make", "-j4")
		if out := run(t, proj, "./prog"); out != "66\n" {
			t.Errorf("the program built on the mount printed %q", out)
		}
		if out := run(t, proj, "make"); !strings.Contains(out, "up to date") {
			t.Errorf("a second make rebuilt:\n%s", out)
		}
		writeFile(t, filepath.Join(proj, "f3.c"), "#include \"f.h\"\nint f3(void) { return 103; }\n")
		out := run(t, proj, "make")
		if strings.Count(out, "cc ") != 2 {
			t.Errorf("after an edit of one file, make ran:\n%s", out)
		}
		if out := run(t, proj, "./prog"); out != "166\n" {
			t.Errorf("the rebuilt program printed %q", out)
		}
		if out := run(t, server("proj"), "./prog"); out != "166\n" {
			t.Errorf("the program on the server printed %q", out)
		}
	})
}

func sortLines(s string) string {
	l := strings.Split(s, "\n")
	sort.Strings(l)
	return strings.Join(l, "\n")
}
