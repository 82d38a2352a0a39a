package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryfs/ferry/internal/servertest"
)

// writeTree makes files (relative path to content; a content starting
// with "->" makes a link to the rest, one ending in "/" a directory) below
// dir, each file with the mtime at.
func writeTree(t *testing.T, dir string, files map[string]string, at time.Time) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(rel, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(content, "->"):
			os.Remove(p)
			err = os.Symlink(content[2:], p)
		default:
			if err = os.WriteFile(p, []byte(content), 0o644); err == nil {
				err = os.Chtimes(p, at, at)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot describes every entry below dir: type, mode and mtime (but a
// link's), content or target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := de.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %v %d", fi.Mode().Perm(), fi.ModTime().UnixNano())
		default:
			b, _ := os.ReadFile(p)
			out[rel] = fmt.Sprintf("file %v %d %q", fi.Mode().Perm(), fi.ModTime().UnixNano(), b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameTree reports the entries of want that got lacks or holds otherwise.
func sameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for rel, w := range want {
		if g := got[rel]; g != w {
			t.Errorf("%s: %s: got %.80s, want %.80s", what, rel, g, w)
		}
	}
}

func TestSync(t *testing.T) {
	old := time.Unix(1_600_000_000, 123456789)
	big := make([]byte, 300<<10)
	rand.Read(big)
	src := map[string]string{
		"top.txt":         "top\n",
		"a/b/c.txt":       "deep\n",
		"a/b/same.txt":    "the same on both sides\n",
		"a/changed.txt":   "new content\n",
		"a/big.bin":       string(big),
		"link":            "->a/b/c.txt",
		"empty/":          "",
		"a/mode-only.txt": "mode\n",
	}
	dstBefore := map[string]string{
		"a/b/same.txt":    "the same on both sides\n",
		"a/changed.txt":   "old content\n",
		"a/mode-only.txt": "mode\n",
		"extra.txt":       "not in the source\n",
		"gone/deep/x":     "a directory not in the source\n",
	}
	const extras = 4 // extra.txt, gone, gone/deep, gone/deep/x.

	for _, tc := range []struct {
		name      string
		srcRemote bool // Else the destination is remote.
	}{
		{"local to remote", false},
		{"remote to local", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := servertest.Start(t, "")
			c := s.Client(t, "tester")
			srcDir, dstDir := t.TempDir(), t.TempDir()
			var srcSide, dstSide syncSide
			if tc.srcRemote {
				srcDir = filepath.Join(s.Dir, "src")
				d, closeD, err := localSide(dstDir, "/")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeD)
				srcSide, dstSide = syncSide{fs: c, root: "/src", c: c}, d
			} else {
				dstDir = filepath.Join(s.Dir, "dst")
				sd, closeS, err := localSide(srcDir, "/")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeS)
				srcSide, dstSide = sd, syncSide{fs: c, root: "/dst", c: c}
			}
			writeTree(t, srcDir, src, old)
			os.Chmod(filepath.Join(srcDir, "a/mode-only.txt"), 0o600)
			os.Chtimes(filepath.Join(srcDir, "a"), old, old)
			writeTree(t, dstDir, dstBefore, old)
			os.Chtimes(filepath.Join(dstDir, "a/changed.txt"), old.Add(time.Hour), old.Add(time.Hour))
			want := snapshot(t, srcDir)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			run := func(o syncOpts) (syncStats, string) {
				t.Helper()
				var out, errOut bytes.Buffer
				o.out, o.errOut = &out, &errOut
				st, err := syncTrees(ctx, srcSide, dstSide, o)
				if err != nil {
					t.Fatalf("sync %+v: %v\n%s", o, err, errOut.String())
				}
				return st, out.String()
			}

			// A dry run changes nothing and says what it would do.
			before := snapshot(t, dstDir)
			st, out := run(syncOpts{dryRun: true, delete: true})
			if after := snapshot(t, dstDir); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("dry run changed the destination:\nbefore %v\nafter  %v", before, after)
			}
			for _, line := range []string{"copy " + dstSide.root + "/a/big.bin", "link " + dstSide.root + "/link -> a/b/c.txt", "mkdir " + dstSide.root + "/empty", "delete " + dstSide.root + "/gone", "attrs " + dstSide.root + "/a/mode-only.txt"} {
				if !strings.Contains(out, strings.Replace(line, "//", "/", 1)) {
					t.Errorf("dry run output lacks %q:\n%s", line, out)
				}
			}
			if want := (syncStats{files: 6, bytes: int64(len(big) + 4 + 5 + 12), deleted: extras, unchanged: 1}); st != want {
				t.Errorf("dry run: got %+v, want %+v", st, want)
			}

			// Without --delete the extras stay.
			st, _ = run(syncOpts{})
			got := snapshot(t, dstDir)
			sameTree(t, "after sync", got, want)
			if _, ok := got["extra.txt"]; !ok || st.deleted != 0 {
				t.Errorf("sync without --delete removed extra.txt or counted %d deleted", st.deleted)
			}
			if st.files != 6 || st.wire < int64(len(big)) {
				t.Errorf("sync: got %+v, want 6 files and at least %d bytes on the wire", st, len(big))
			}

			// With --delete they go.
			st, _ = run(syncOpts{delete: true})
			got = snapshot(t, dstDir)
			sameTree(t, "after sync --delete", got, want)
			if len(got) != len(want) || st.deleted != extras || st.files != 0 {
				t.Errorf("sync --delete: %d entries (want %d), stats %+v (want %d deleted, 0 files)", len(got), len(want), st, extras)
			}

			// A second sync finds everything unchanged and sends nothing.
			start := time.Now()
			st, out = run(syncOpts{delete: true, verbose: true})
			if want := (syncStats{unchanged: len(want)}); st != want || out != "" {
				t.Errorf("second sync: got %+v, output %q; want %+v and no output", st, out, want)
			}
			t.Logf("second sync of %d entries: %+v in %v", len(want), st, time.Since(start))
		})
	}
}

// TestSyncSendsOnlyChanges: files the destination holds with other times
// (a tree unpacked again, a new release) go by chunks whatever their size,
// so identical ones cost their chunk lists and changed ones the chunks
// that changed, and the destination ends up the source's.
func TestSyncSendsOnlyChanges(t *testing.T) {
	s := servertest.StartChunked(t, "")
	c := s.Client(t, "tester")
	srcDir, dstDir := t.TempDir(), filepath.Join(s.Dir, "dst")
	files, edited := map[string]string{}, map[string]string{}
	total := 0
	for i := range 40 {
		var b strings.Builder
		for j := range 600 {
			fmt.Fprintf(&b, "file %d line %d: %x\n", i, j, (i*7919+j*104729)%1000003)
		}
		rel := fmt.Sprintf("pkg%d/f%02d.go", i%4, i)
		files[rel] = b.String()
		edited[rel] = b.String()
		total += b.Len()
	}
	for _, rel := range []string{"pkg0/f00.go", "pkg1/f05.go"} {
		edited[rel] = strings.Replace(files[rel], "line 300:", "line three hundred:", 1)
	}
	writeTree(t, dstDir, files, time.Unix(1_600_000_000, 0))
	writeTree(t, srcDir, edited, time.Unix(1_700_000_000, 0))
	src, closeS, err := localSide(srcDir, "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeS)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	before := s.Srv.Calls()
	st, err := syncTrees(ctx, src, syncSide{fs: c, root: "/dst", c: c}, syncOpts{out: &out, errOut: &errOut})
	if err != nil {
		t.Fatalf("sync: %v\n%s", err, errOut.String())
	}
	sameTree(t, "destination", snapshot(t, dstDir), snapshot(t, srcDir))
	// Every file went on one stream, not a call each.
	if got := servertest.CallsSince(s.Srv, before, "putbatch", 1); got != 1 {
		t.Errorf("%d PutChunkedBatch streams, want 1", got)
	}
	if got := servertest.CallsSince(s.Srv, before, "putchunked", int64(len(files))); got != int64(len(files)) {
		t.Errorf("%d chunked puts, want %d", got, len(files))
	}
	if st.files != len(files) {
		t.Errorf("copied %d files, want all %d (their times differ)", st.files, len(files))
	}
	// Two changed chunks of at most 64 KiB, and a list per file.
	if wire := st.wire; wire > int64(total)/10 {
		t.Errorf("sent %d bytes of file data for %d bytes of files of which two lines changed, want under a tenth", wire, total)
	}
}

// TestSyncLeavesHidden: a file a mount hid (removed while a program there
// may hold it open, cache.Hide) is neither copied from the server nor
// deleted there by sync --delete as an extra (its directory going takes
// it, as another client's rm -r would).
func TestSyncLeavesHidden(t *testing.T) {
	const hidden = ".ferry-gone-0123456789abcdef"
	s := servertest.Start(t, "")
	c := s.Client(t, "tester")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := time.Unix(1_600_000_000, 0)
	sync := func(src, dst syncSide) syncStats {
		t.Helper()
		var out bytes.Buffer
		st, err := syncTrees(ctx, src, dst, syncOpts{delete: true, out: &out, errOut: &out})
		if err != nil {
			t.Fatalf("sync: %v\n%s", err, out.String())
		}
		return st
	}
	side := func(dir string) syncSide {
		d, closeD, err := localSide(dir, "/")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeD)
		return d
	}

	// To the server: the hidden file stays, what is not in the source goes.
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "a\n", "d/b.txt": "b\n"}, old)
	writeTree(t, filepath.Join(s.Dir, "dst"), map[string]string{"extra.txt": "x\n", "d/" + hidden: "held open\n"}, old)
	sync(side(src), syncSide{fs: c, root: "/dst", c: c})
	if _, err := os.Stat(filepath.Join(s.Dir, "dst", "extra.txt")); !os.IsNotExist(err) {
		t.Errorf("extra.txt not deleted: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(s.Dir, "dst", "d", hidden)); err != nil || string(got) != "held open\n" {
		t.Errorf("the hidden file after sync --delete: %q, %v", got, err)
	}

	// From the server: the hidden file is not copied.
	dst := t.TempDir()
	sync(syncSide{fs: c, root: "/dst", c: c}, side(dst))
	if _, err := os.Stat(filepath.Join(dst, "d", hidden)); !os.IsNotExist(err) {
		t.Errorf("the hidden file was copied from the server: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "a.txt")); err != nil {
		t.Errorf("a.txt not copied: %v", err)
	}
}
