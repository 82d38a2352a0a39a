package fusefs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRemountReadsFromDisk: a mount holds what it fetched in its chunk
// cache on disk (the default), so a later mount over the same cache reads
// a tree read before without a byte of its files on the wire (a file
// read by chunks costs its chunk list), except a file changed meanwhile
// on the server's disk, even one whose size and mtime were put back as
// they were: that one reads as it is now. The bytes are random, so that
// compression hides none sent.
func TestRemountReadsFromDisk(t *testing.T) {
	served, cacheDir := t.TempDir(), t.TempDir()
	want := map[string][]byte{}
	var names []string
	r := rand.New(rand.NewPCG(1, 2))
	small := 0
	for i := range 90 {
		p := filepath.Join(fmt.Sprintf("d%d", i%3), fmt.Sprintf("f%02d", i))
		n := 2000 + i*150
		if i == 45 {
			n = 300 << 10 // Read by chunks.
		} else {
			small++
		}
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if err := os.MkdirAll(filepath.Join(served, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(served, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
		want[p] = b
		names = append(names, p)
	}
	// In order, as grep -r reads: the first directory is fetched, the
	// others walked.
	slices.Sort(names)
	// readAll reads every file through a new mount over the cache and
	// returns the file bytes its client received and the files the
	// cache's records gave.
	readAll := func(t *testing.T) (wire, recalled int64) {
		mnt := serveHelper(t, helper{dir: served, cacheDir: cacheDir})
		for _, p := range names {
			got, err := os.ReadFile(filepath.Join(mnt, p))
			if err != nil {
				t.Fatal(err)
			}
			if b := want[p]; !bytes.Equal(got, b) {
				t.Fatalf("%s: read %d bytes unlike the %d written", p, len(got), len(b))
			}
		}
		status, err := os.ReadFile(filepath.Join(mnt, "Ctl"))
		if err != nil {
			t.Fatal(err)
		}
		return ctlNumber(t, status, "get.wire"), ctlNumber(t, status, "contents.recalled")
	}
	var first int64
	t.Run("first", func(t *testing.T) {
		first, _ = readAll(t)
		if first == 0 {
			t.Fatal("the first mount received nothing")
		}
	})
	t.Run("again", func(t *testing.T) {
		wire, recalled := readAll(t)
		if wire > 4<<10 || recalled != int64(small) {
			t.Errorf("received %d bytes (the first mount %d), %d of %d small files from the records", wire, first, recalled, small)
		}
	})
	// One file rewritten on the server's disk with other bytes of the
	// same size, its mtime put back.
	p := filepath.Join("d1", "f04")
	name := filepath.Join(served, p)
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	want[p] = bytes.Repeat([]byte("Z"), len(want[p]))
	changed := int64(len(want[p]))
	if err := os.WriteFile(name, want[p], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(name, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	t.Run("changed", func(t *testing.T) {
		wire, _ := readAll(t) // Fails if the old bytes are read.
		// The file's Z's compress to almost nothing: what else comes is
		// its directory's small files, which its miss fetches.
		if wire == 0 || wire > first/2 {
			t.Errorf("after one file of %d bytes changed, received %d bytes (the first mount %d)", changed, wire, first)
		}
	})
}

// ctlNumber returns the number after "key: " in the control file's text.
func ctlNumber(t *testing.T, status []byte, key string) int64 {
	t.Helper()
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+": "); ok {
			n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			return n
		}
	}
	t.Fatalf("the control file shows no %s:\n%s", key, status)
	return 0
}
