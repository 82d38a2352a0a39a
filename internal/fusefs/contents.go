package fusefs

import (
	"container/list"
	"context"
	"log/slog"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
)

// Limits of the small-file prefetch. A directory's small files are worth
// fetching together when a program reads one of them: grep, diff and
// compilers read most files of the directories they touch, and a file of a
// few KiB costs a whole round trip on its own. smallFile is where a file
// stops being small: above it, the round trip of its own Get is a minor part
// of its transfer time at the rates Ferry is built for. dirBudget bounds
// what one directory's prefetch may bring (at 100 Mbit/s, about a third of
// a second of the link), and cacheBudget the memory all prefetched files
// hold.
const (
	smallFile   = 64 << 10
	dirBudget   = 4 << 20
	cacheBudget = 64 << 20
	// dirFiles bounds how many files one prefetch brings.
	dirFiles = 2000
)

// contents keeps the content of small files that a FindGet of their
// directory brought ahead of their first read. An entry is used only while
// the file's attributes still show the size and mtime it had when fetched,
// and is dropped whenever the metadata cache drops the path, so it is as
// coherent as the kernel's own page cache of the file (see Open).
type contents struct {
	fsys  ferry.Finder
	log   *slog.Logger
	max   int64
	files int // dirFiles, a field so tests can lower it.

	mu   sync.Mutex
	size int64                    // Bytes of data held.
	ents map[string]*list.Element // Path to its *content in lru.
	lru  *list.List               // Front: most recently used.
	dirs map[string]bool          // Directories fetched or being fetched.
	// seq counts drops; dropped holds each path's last, and allDropped
	// the last of everything, so a fetch that began before a path was
	// dropped does not bring its old content back.
	seq        uint64
	dropped    map[string]uint64
	allDropped uint64
	stats      struct{ hits, fetches int64 }
}

type content struct {
	path  string
	mtime string
	size  int64
	data  []byte
}

func newContents(fsys ferry.Finder, log *slog.Logger, max int64) *contents {
	return &contents{fsys: fsys, log: log, max: max, files: dirFiles,
		ents: map[string]*list.Element{}, lru: list.New(), dirs: map[string]bool{},
		dropped: map[string]uint64{}}
}

// get returns the content of the file at d's path if it is held and d
// still describes it.
func (c *contents) get(d ferry.Dir) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.ents[d.Path()]
	if !ok {
		return nil, false
	}
	f := e.Value.(*content)
	if f.mtime != d[ferry.AttrMtime] || f.size != d.Size() {
		c.removeLocked(e)
		return nil, false
	}
	c.lru.MoveToFront(e)
	c.stats.hits++
	return f.data, true
}

// want starts a prefetch of the small files of the directory of the file d
// describes, unless that directory was fetched already or d is not small.
func (c *contents) want(d ferry.Dir) {
	if d.Type() != ferry.TypeFile || d.Size() > smallFile {
		return
	}
	dir := path.Dir(d.Path())
	c.mu.Lock()
	if c.dirs[dir] {
		c.mu.Unlock()
		return
	}
	c.dirs[dir] = true
	c.stats.fetches++
	c.mu.Unlock()
	go c.fetch(dir)
}

// fetch brings the small files directly in dir with one FindGet.
func (c *contents) fetch(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.mu.Lock()
	began := c.seq
	c.mu.Unlock()
	pred := "depth=1 & type=f & size<=" + strconv.Itoa(smallFile)
	st := c.fsys.FindGet(ctx, dir, pred)
	defer st.Close()
	var cur *content
	var got int64
	n := 0
	keep := func() {
		if cur != nil && int64(len(cur.data)) == cur.size {
			c.add(cur, began)
		}
		cur = nil
	}
	for e := range st.All() {
		switch {
		case e.Err != nil:
			keep()
		case e.Dir != nil:
			keep()
			if e.Dir.Type() != ferry.TypeFile {
				continue
			}
			if n == c.files || got+e.Dir.Size() > dirBudget {
				return
			}
			n++
			got += e.Dir.Size()
			cur = &content{path: e.Dir.Path(), mtime: e.Dir[ferry.AttrMtime], size: e.Dir.Size(),
				data: make([]byte, 0, e.Dir.Size())}
		case cur != nil:
			if int64(len(cur.data)+len(e.Data)) > cur.size {
				// The file grew while it was read: leave it to Get.
				cur = nil
				continue
			}
			cur.data = append(cur.data, e.Data...)
		}
	}
	keep()
	if err := st.Err(); err != nil {
		c.log.Debug("prefetching small files failed", "dir", dir, "err", err)
	}
}

func (c *contents) add(f *content, began uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.allDropped > began || c.dropped[f.path] > began {
		return
	}
	if e, ok := c.ents[f.path]; ok {
		c.removeLocked(e)
	}
	c.ents[f.path] = c.lru.PushFront(f)
	c.size += int64(len(f.data))
	for c.size > c.max {
		c.removeLocked(c.lru.Back())
	}
}

// removeLocked drops one file; its directory may be fetched again.
func (c *contents) removeLocked(e *list.Element) {
	f := c.lru.Remove(e).(*content)
	delete(c.ents, f.path)
	delete(c.dirs, path.Dir(f.path))
	c.size -= int64(len(f.data))
}

// drop forgets p and, with tree, everything below it. The metadata cache
// calls it for every path it drops; it walks its own listings below p, so
// it asks for the whole tree only when it drops more than they lead to.
func (c *contents) drop(p string, tree bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if len(c.dropped) >= 8192 {
		clear(c.dropped)
		c.allDropped = c.seq
	}
	c.dropped[p] = c.seq
	if e, ok := c.ents[p]; ok {
		c.removeLocked(e)
	}
	delete(c.dirs, p)
	if !tree {
		return
	}
	c.allDropped = c.seq
	for q, e := range c.ents {
		if ferry.HasPrefix(q, p) {
			c.removeLocked(e)
		}
	}
	for q := range c.dirs {
		if ferry.HasPrefix(q, p) {
			delete(c.dirs, q)
		}
	}
}

// counts returns the hits, the prefetches started and the files held, for
// tests.
func (c *contents) counts() (hits, fetches int64, files int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.hits, c.stats.fetches, len(c.ents)
}
