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
	cacheBudget = 96 << 20
	// dirFiles bounds how many files one prefetch brings.
	dirFiles = 2000
	// treeFile, treeBudget and treeFiles bound a prefetch of a whole
	// subtree, made once a program is seen going through a tree (see
	// want). It takes bigger files than a directory's prefetch: such a
	// program reads them all, and one stream carries them without a
	// round trip each.
	treeFile   = 1 << 20
	treeBudget = 48 << 20
	treeFiles  = 20000
)

// contents keeps the content of small files that a FindGet of their
// directory brought ahead of their first read. An entry is used only while
// the file's attributes still show the size and mtime it had when fetched,
// and is dropped whenever the metadata cache drops the path, so it is as
// coherent as the kernel's own page cache of the file (see Open).
type contents struct {
	fsys ferry.Finder
	log  *slog.Logger
	max  int64

	mu    sync.Mutex
	size  int64                    // Bytes of data held.
	ents  map[string]*list.Element // Path to its *content in lru.
	lru   *list.List               // Front: most recently used.
	dirs  map[string]bool          // Directories fetched or being fetched.
	trees map[string]bool          // Roots of subtrees fetched or being fetched whole.
	// seq counts drops; dropped holds each path's last, and allDropped
	// the last of everything, so a fetch that began before a path was
	// dropped does not bring its old content back.
	seq        uint64
	dropped    map[string]uint64
	allDropped uint64
	stats      struct{ hits, fetches int64 }
	// running holds the roots of the fetches in progress, and changed
	// is signalled when one ends or a file arrives, for await.
	running map[string]bool
	changed *sync.Cond
}

type content struct {
	path  string
	mtime string
	size  int64
	data  []byte
}

func newContents(fsys ferry.Finder, log *slog.Logger, max int64) *contents {
	c := &contents{fsys: fsys, log: log, max: max,
		ents: map[string]*list.Element{}, lru: list.New(), dirs: map[string]bool{}, trees: map[string]bool{},
		dropped: map[string]uint64{}, running: map[string]bool{}}
	c.changed = sync.NewCond(&c.mu)
	return c
}

// get returns the content of the file at d's path if it is held and d
// still describes it.
func (c *contents) get(d ferry.Dir) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getLocked(d)
}

// awaitMax bounds how long await waits for a fetch to bring a file: past
// it the file's own Get is likely the quicker.
const awaitMax = time.Second

// await is get, waiting (at most awaitMax, and while ctx lasts) for a
// fetch in progress that will bring the file d describes: a program
// reading a directory's files one by one (git status, grep -r) then takes
// them from the fetch's stream instead of asking for each while the
// stream is on its way.
func (c *contents) await(ctx context.Context, d ferry.Dir) ([]byte, bool) {
	if d.Type() != ferry.TypeFile || d.Size() > smallFile {
		return nil, false
	}
	wake := func() {
		c.mu.Lock()
		c.changed.Broadcast()
		c.mu.Unlock()
	}
	timer := time.AfterFunc(awaitMax, wake)
	defer timer.Stop()
	stop := context.AfterFunc(ctx, wake)
	defer stop()
	deadline := time.Now().Add(awaitMax)
	dir := path.Dir(d.Path())
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if data, ok := c.getLocked(d); ok {
			return data, true
		}
		if !c.coming(dir) || ctx.Err() != nil || !time.Now().Before(deadline) {
			return nil, false
		}
		c.changed.Wait()
	}
}

// coming reports whether a fetch in progress covers the small files of
// dir. c.mu is held.
func (c *contents) coming(dir string) bool {
	if c.running[dir] {
		return true
	}
	for a := dir; ; a = path.Dir(a) {
		if c.running[a] && c.trees[a] {
			return true
		}
		if a == "/" || a == "." {
			return false
		}
	}
}

// getLocked is get. c.mu is held.
func (c *contents) getLocked(d ferry.Dir) ([]byte, bool) {
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
// If the directory's parent, or another directory beside it, was fetched
// before, a program is going through the tree (grep -r, git status, a
// build): then the parent's whole subtree is fetched in one request, so
// that each directory does not cost a round trip of its own; and the
// grandparent's, if a subtree beside the parent was fetched so, and so on
// up.
func (c *contents) want(d ferry.Dir) {
	if d.Type() != ferry.TypeFile || d.Size() > smallFile {
		return
	}
	dir := path.Dir(d.Path())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirs[dir] || c.inTree(dir) {
		return
	}
	c.stats.fetches++
	if parent := path.Dir(dir); parent != dir && c.scanned(parent) {
		// Climb while a subtree beside is being walked too: git status
		// and grep -r go through one top directory after another, and
		// each would otherwise cost two fetches of its own.
		for up := path.Dir(parent); up != parent && c.treeBeside(up, parent); parent, up = up, path.Dir(up) {
		}
		c.trees[parent] = true
		c.running[parent] = true
		go c.fetch(parent, true)
		return
	}
	c.dirs[dir] = true
	c.running[dir] = true
	go c.fetch(dir, false)
}

// inTree reports whether a subtree fetch covers dir. c.mu is held.
func (c *contents) inTree(dir string) bool {
	for a := dir; ; a = path.Dir(a) {
		if c.trees[a] {
			return true
		}
		if a == "/" || a == "." {
			return false
		}
	}
}

// treeBeside reports whether a subtree of dir other than p was fetched
// whole. c.mu is held.
func (c *contents) treeBeside(dir, p string) bool {
	for t := range c.trees {
		if t != p && path.Dir(t) == dir {
			return true
		}
	}
	return false
}

// scanned reports whether dir or one of its subdirectories was fetched.
// c.mu is held.
func (c *contents) scanned(dir string) bool {
	if c.dirs[dir] {
		return true
	}
	for q := range c.dirs {
		if path.Dir(q) == dir {
			return true
		}
	}
	return false
}

// fetch brings the small files directly in dir, or with tree everywhere
// below it, with one FindGet.
func (c *contents) fetch(dir string, tree bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() {
		c.mu.Lock()
		delete(c.running, dir)
		c.changed.Broadcast()
		c.mu.Unlock()
	}()
	c.mu.Lock()
	began := c.seq
	c.mu.Unlock()
	pred := "depth=1 & type=f & size<=" + strconv.Itoa(smallFile)
	files, budget := dirFiles, int64(dirBudget)
	if tree {
		pred = "type=f & size<=" + strconv.Itoa(treeFile)
		files, budget = treeFiles, treeBudget
	}
	// A subtree fetch cut short by its budget leaves the directories it
	// did not finish to fetches of their own.
	complete := false
	var last string
	defer func() {
		if tree && !complete {
			c.mu.Lock()
			delete(c.trees, dir)
			delete(c.dirs, last)
			c.mu.Unlock()
		}
	}()
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
			if n == files || got+e.Dir.Size() > budget {
				return
			}
			n++
			got += e.Dir.Size()
			if tree {
				if d := path.Dir(e.Dir.Path()); d != last {
					last = d
					c.mu.Lock()
					c.dirs[d] = true
					c.mu.Unlock()
				}
			}
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
		return
	}
	complete = true
}

// keep holds data as the content of the file d describes, which this
// mount has just stored: a build reads back the objects it wrote (the
// linker), and each would otherwise cost a Get. Files above treeFile are
// not kept.
func (c *contents) keep(d ferry.Dir, data []byte) {
	if int64(len(data)) != d.Size() || d.Size() > treeFile {
		return
	}
	c.mu.Lock()
	began := c.seq
	c.mu.Unlock()
	c.add(&content{path: d.Path(), mtime: d[ferry.AttrMtime], size: d.Size(), data: data}, began)
}

// held returns what is held for the path p, if anything.
func (c *contents) held(p string) (*content, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.ents[p]
	if !ok {
		return nil, false
	}
	return e.Value.(*content), true
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
	c.changed.Broadcast()
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
	deleteBelow(c.dirs, p)
	deleteBelow(c.trees, p)
}

// counts returns the hits, the prefetches started and the files held, for
// tests.
func (c *contents) counts() (hits, fetches int64, files int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.hits, c.stats.fetches, len(c.ents)
}
