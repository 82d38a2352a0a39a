package cache

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/local"
	"github.com/ferryfs/ferry/internal/store"
)

// TestRecordsOutliveTheCache: in disk mode a cache opened later over the
// same disk reads the files an earlier one held without a byte of them
// from the tree, except a file changed meanwhile, even one whose size
// and mtime were put back as they were.
func TestRecordsOutliveTheCache(t *testing.T) {
	dir := t.TempDir()
	testTree(t, dir, 8<<20, 3)
	tree, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	disk := t.TempDir()
	// pass reads every file in walk order through a cache over a disk
	// opened for the pass, and returns the bytes of files up to
	// treeFile that the tree sent, and the files the records gave.
	pass := func() (sent, recalled int64) {
		t.Helper()
		chunks, err := store.OpenCache(disk, 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		defer chunks.Close()
		s := &sentBytes{FS: tree, sent: map[string]int64{}}
		c := newContents(s, testLog(t), 64<<20, chunks, 1<<20)
		defer c.close()
		// Each read waits for the fetch that brings its file, however
		// slow the machine: one read by a Get of its own would leave
		// the file out of the cache, and the next pass would fetch it.
		c.awaitMax = time.Minute
		for _, d := range walkFiles(t, tree) {
			readChecked(t, c, s, dir, d)
			if d.Size() <= treeFile {
				s.mu.Lock()
				sent += s.sent[d.Path()]
				s.mu.Unlock()
			}
		}
		return sent, c.report().recalled
	}
	first, _ := pass()
	if first == 0 {
		t.Fatal("the first pass sent nothing")
	}
	sent, recalled := pass()
	if sent != 0 || recalled == 0 {
		t.Errorf("the second pass sent %d bytes, %d files from the records (the first sent %d)", sent, recalled, first)
	}
	// One file rewritten with other bytes of the same size, its mtime
	// put back.
	files := walkFiles(t, tree)
	var d ferry.Dir
	for _, f := range files {
		if f.Size() > 0 && f.Size() <= SmallFile {
			d = f
			break
		}
	}
	name := filepath.Join(dir, d.Path())
	old, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(name, bytes.Repeat([]byte("Z"), len(old)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(name, d.Mtime(), d.Mtime()); err != nil {
		t.Fatal(err)
	}
	sent, _ = pass() // Fails if the old bytes are read.
	// The changed file is the first read in its directory, so its miss
	// fetches the directory's small files, as a first read there does.
	var small int64
	for _, f := range files {
		if path.Dir(f.Path()) == path.Dir(d.Path()) && f.Size() <= SmallFile {
			small += f.Size()
		}
	}
	if sent < d.Size() || sent > small {
		t.Errorf("after a change of one file of %d bytes, the third pass sent %d bytes (its directory's small files: %d)", d.Size(), sent, small)
	}
}

// FuzzDecodeRecord: any bytes decode to a record or an error, never a
// panic, and a record decoded encodes to one that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(&content{size: 5, ino: "12", mtime: "1700000000000000000", ctime: "1700000000000000001",
		hashes: []chunk.Hash{chunk.Sum([]byte("hello"))}}))
	f.Add(encodeRecord(&content{ino: "1", mtime: "2", ctime: "3"}))
	f.Add([]byte{recordVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord("/p", b)
		if err != nil {
			return
		}
		again, err := decodeRecord("/p", encodeRecord(r))
		if err != nil {
			t.Fatalf("a decoded record does not decode again: %v", err)
		}
		if !reflect.DeepEqual(r, again) {
			t.Fatalf("decoded %+v, then %+v", r, again)
		}
	})
}
