package cache

import (
	"container/list"
	"context"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/pred"
	"github.com/ferryfs/ferry/internal/store"
)

// Limits of the prefetch of file contents. A directory's small files are
// worth fetching together when a program reads one of them: grep, diff and
// compilers read most files of the directories they touch, and a file of a
// few KiB costs a whole round trip on its own. SmallFile is where a file
// stops being small: above it, the round trip of its own Get is a minor
// part of its transfer time at the rates Ferry is built for.
const (
	SmallFile = 64 << 10
	// dirFiles bounds how many files one directory's prefetch brings.
	dirFiles = 2000
	// treeFile bounds the files a walk's stream carries (see walk). It
	// takes bigger files than a directory's prefetch: a program going
	// through a tree reads them all, and one stream carries them
	// without a round trip each.
	treeFile = 1 << 20
	// DefaultMemory is the default of Options.Memory.
	DefaultMemory = 256 << 20
	// maxWalks bounds the walks remembered, running or ended.
	maxWalks = 64
	// maxWindow bounds what a walk holds ahead of a program slower than
	// the link: the round trip at 1 Gbit/s and 100 ms, more than enough
	// to keep the stream going as the program reads on, and what a
	// program that stops leaves unread.
	maxWindow = 16 << 20
	// maxExcluded bounds the directories a walk's predicate leaves out
	// because their small files were fetched already.
	maxExcluded = 32
)

// contents keeps the content of files fetched ahead of their first read.
// An entry is used only while the file's attributes still show the size
// and mtime it had when fetched, and is dropped whenever the metadata cache
// drops the path, so it is as coherent as the kernel's own page cache of
// the file (see Open).
//
// Two kinds of fetch fill it. The first small file read in a directory
// fetches the directory's small files with one FindGet. Once a program is
// seen going through a tree (it reads in a second directory below one
// already fetched), a walk streams the rest of the tree in the order the
// program goes, from the file it reads on (see walk): every byte crosses
// the wire once, and the stream waits while what it brought and the
// program has not reached fills its window.
type contents struct {
	fsys ferry.Finder
	log  *slog.Logger
	// disk, in disk mode, holds the data as chunks, and memory only
	// where to find it, and the data of files not yet read, up to
	// memMax; nil in memory mode.
	disk store.ChunkCache
	recs records // The disk's records by path, if it keeps them.
	max  int64   // The budget: bytes of data held at most, in memory or on disk.
	// awaitMax is AwaitMax but in tests that must not fall back to a
	// Get of their own on a machine too loaded to fetch in time.
	awaitMax time.Duration
	memMax   int64
	// window bounds what a walk holds ahead of the program.
	window int64
	// arrival is Options.Arrived.
	arrival func(p string)
	ctx     context.Context
	stop    context.CancelFunc

	mu    sync.Mutex
	size  int64                    // Bytes of data held.
	inMem int64                    // In disk mode, the bytes of data also in memory.
	ents  map[string]*list.Element // Path to its *content in read or unread.
	// read holds the files a program has read, unread the others, each
	// with the most recently used at the front. The budget pushes out
	// read files first: the kernel's page cache has them too, and a
	// program that reads a file seldom reads it again soon.
	read, unread *list.List
	dirs         map[string]bool // Directories whose small files were fetched or are being fetched.
	// recalledDirs holds the directories where the disk's records gave
	// a file: a file there they lack changed since, and is fetched
	// alone.
	recalledDirs map[string]bool
	walks        []*walk // Oldest first.
	// evicted holds the paths the budget pushed out, which a fetch may
	// bring again.
	evicted map[string]bool
	// seq counts drops; dropped holds each path's last, droppedTrees
	// each tree's and allDropped the last of everything, so a fetch that
	// began before a path was dropped does not bring its old content
	// back.
	seq          uint64
	dropped      map[string]uint64
	droppedTrees map[string]uint64
	allDropped   uint64
	stats        contentStats
	// running holds the directories whose fetch is in progress; changed
	// is signalled when one ends, a file arrives or a program moves on.
	running map[string]bool
	changed *sync.Cond
	arrived time.Time // When the last file arrived.
}

// contentStats counts what the prefetch did, for the log and tests.
type contentStats struct {
	hits, dirFetches, walks int64
	files, bytes            int64 // Brought by fetches.
	evicted                 int64
	peak                    int64 // The most bytes held at once.
	// lost counts files whose chunks the disk no longer had when read
	// (its own budget dropped them, or a write was not kept); recalled
	// the files found through the disk's records.
	lost, recalled int64
}

type content struct {
	path  string
	mtime string
	size  int64
	// ino and ctime name the version, with size and mtime, for a
	// record (see records).
	ino, ctime string
	data       []byte
	// hashes, in disk mode, are the chunks that hold the data. The data
	// stays in memory too until it is first read: a program walking a
	// tree reads a file soon after it arrives, and the disk's store has
	// not settled yet.
	hashes []chunk.Hash
	onDisk bool
	// recorded is set when the disk's records have f already.
	recorded bool
	w        *walk // The walk that brought it, if one did.
	read     bool
}

// with returns a copy of f describing the file d, with f's data: the same
// content under another name or attributes.
func (f *content) with(d ferry.Dir) *content {
	return &content{path: d.Path(), mtime: d[ferry.AttrMtime], size: d.Size(), ino: d[ferry.AttrIno], ctime: d[ferry.AttrCtime],
		data: f.data, hashes: f.hashes, onDisk: f.onDisk}
}

// walk is a stream of the files of a tree below root, from the path from
// on in walk order (see walkLess), that follows a program going through
// the tree.
type walk struct {
	root, from string
	last       string // The last file received whole, or "".
	pos        string // The furthest file the program has asked for.
	done       bool
	began      uint64 // contents.seq when it began.
	cancel     context.CancelFunc
	used       time.Time // When the program last asked for one of its files.
	// ahead holds the files received beyond pos, in order, and aheadBytes
	// their size: the stream waits while that fills the window.
	ahead      []*content
	aheadBytes int64
}

// covers reports whether p is in the part of the tree w streams.
func (w *walk) covers(p string) bool {
	return ferry.HasPrefix(p, w.root) && !walkLess(p, w.from)
}

// received reports whether w's stream went past p.
func (w *walk) received(p string) bool {
	return w.last != "" && !walkLess(w.last, p)
}

// advance moves the program's position in w to p if p is further.
func (w *walk) advance(p string) {
	w.used = time.Now()
	if !walkLess(w.pos, p) {
		return
	}
	w.pos = p
	for len(w.ahead) > 0 && !walkLess(p, w.ahead[0].path) {
		w.aheadBytes -= w.ahead[0].size
		w.ahead = w.ahead[1:]
	}
}

// newContents returns a cache of at most budget bytes of file contents
// fetched from fsys, held in memory, or on disk if it is not nil (with at
// most memory bytes of files not yet read in memory too). A walk holds at
// most a quarter of the budget ahead of the program, and never more than
// maxWindow.
func newContents(fsys ferry.Finder, log *slog.Logger, budget int64, disk store.ChunkCache, memory int64) *contents {
	ctx, stop := context.WithCancel(context.Background())
	c := &contents{fsys: fsys, log: log, disk: disk, recs: recordsOf(disk), max: budget, awaitMax: AwaitMax, memMax: memory, window: min(max(budget/4, 1<<20), maxWindow),
		ctx: ctx, stop: stop,
		ents: map[string]*list.Element{}, read: list.New(), unread: list.New(), dirs: map[string]bool{}, recalledDirs: map[string]bool{},
		evicted: map[string]bool{}, dropped: map[string]uint64{}, droppedTrees: map[string]uint64{},
		running: map[string]bool{}}
	c.changed = sync.NewCond(&c.mu)
	return c
}

// wake wakes those waiting on c.changed, to look at the time or the
// context they wait with.
func (c *contents) wake() {
	c.mu.Lock()
	c.changed.Broadcast()
	c.mu.Unlock()
}

// where names where the contents are held, for the control file.
func (c *contents) where() string {
	if c.disk != nil {
		return "disk"
	}
	return "memory"
}

// close stops every fetch.
func (c *contents) close() { c.stop() }

// open returns the content of the file d describes if it is held, or
// arrives soon by a fetch in progress or one it starts.
func (c *contents) open(ctx context.Context, d ferry.Dir) ([]byte, bool) {
	if data, ok := c.get(d); ok {
		return data, true
	}
	c.want(d)
	return c.await(ctx, d)
}

// get returns the content of the file at d's path if it is held and d
// still describes it.
func (c *contents) get(d ferry.Dir) ([]byte, bool) {
	c.mu.Lock()
	f, data, ok := c.getLocked(d)
	began := c.seq
	c.mu.Unlock()
	if !ok {
		if f = c.recorded(d); f == nil {
			return nil, false
		}
		c.mu.Lock()
		if c.hold(f, began) {
			c.stats.recalled++
			if len(c.recalledDirs) >= 1<<16 {
				clear(c.recalledDirs)
			}
			c.recalledDirs[path.Dir(f.path)] = true
			f, data, ok = c.getLocked(d)
		}
		c.mu.Unlock()
		if !ok {
			return nil, false
		}
	}
	return c.load(f, data)
}

// recorded returns what the disk's records say it holds of the file d
// describes, or nil.
func (c *contents) recorded(d ferry.Dir) *content {
	if c.recs == nil || d.Type() != ferry.TypeFile || d.Size() > treeFile {
		return nil
	}
	b, ok := c.recs.Get(d.Path())
	if !ok {
		return nil
	}
	f, err := decodeRecord(d.Path(), b)
	if err != nil {
		c.recs.Delete(d.Path())
		return nil
	}
	if !f.versionOf(d) {
		return nil
	}
	return f
}

// AwaitMax bounds how long await waits for a fetch that brings nothing:
// past it the file's own Get is likely the quicker.
const AwaitMax = time.Second

// await is get, waiting (while ctx lasts) for a fetch in progress that
// will bring the file d describes, as long as files keep arriving: a
// program reading a directory's files one by one (git status, grep -r)
// then takes them from the fetch's stream instead of asking for each
// while the stream is on its way.
func (c *contents) await(ctx context.Context, d ferry.Dir) ([]byte, bool) {
	if d.Type() != ferry.TypeFile || d.Size() > treeFile {
		return nil, false
	}
	stop := context.AfterFunc(ctx, c.wake)
	defer stop()
	c.mu.Lock()
	f, data, ok := c.awaitLocked(ctx, d)
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	return c.load(f, data)
}

// awaitLocked is await's wait, which returns what getLocked returns once
// the file comes. c.mu is held.
func (c *contents) awaitLocked(ctx context.Context, d ferry.Dir) (*content, []byte, bool) {
	p := d.Path()
	since := time.Now()
	for {
		if f, data, ok := c.getLocked(d); ok {
			return f, data, true
		}
		if !c.coming(p, d.Size()) || ctx.Err() != nil {
			return nil, nil, false
		}
		if c.arrived.After(since) {
			since = c.arrived
		}
		left := c.awaitMax - time.Since(since)
		if left <= 0 {
			return nil, nil, false
		}
		t := time.AfterFunc(left, c.wake)
		c.changed.Wait()
		t.Stop()
	}
}

// coming reports whether a fetch in progress will bring the file at p of
// the given size. c.mu is held.
func (c *contents) coming(p string, size int64) bool {
	if size <= SmallFile && c.running[path.Dir(p)] {
		return true
	}
	return c.walkFor(p) != nil
}

// walkFor returns the running walk that will bring p, if any. c.mu is
// held.
func (c *contents) walkFor(p string) *walk {
	for _, w := range c.walks {
		if !w.done && w.covers(p) && !w.received(p) {
			return w
		}
	}
	return nil
}

// getLocked returns what is held for the file d describes, counted as
// read, and its data if memory holds it, for load. In disk mode the data
// leaves memory with its first read. c.mu is held.
func (c *contents) getLocked(d ferry.Dir) (*content, []byte, bool) {
	e, ok := c.ents[d.Path()]
	if !ok {
		return nil, nil, false
	}
	f := e.Value.(*content)
	if f.mtime != d[ferry.AttrMtime] || f.size != d.Size() {
		c.removeLocked(e)
		return nil, nil, false
	}
	data := f.data
	// Kept after a store and read now: to the disk, as what a prefetch
	// brings is on arrival, so that memory holds data only of files not
	// yet read (trim).
	c.toDisk(f)
	c.unload(f)
	if f.read {
		c.read.MoveToFront(e)
	} else {
		c.unread.Remove(e)
		f.read = true
		c.ents[f.path] = c.read.PushFront(f)
	}
	c.stats.hits++
	if f.w != nil && !f.w.done {
		f.w.advance(f.path)
		c.changed.Broadcast()
	}
	return f, data, true
}

// unload drops f's data from memory if the disk holds it. c.mu is held.
func (c *contents) unload(f *content) {
	if f.onDisk && f.data != nil {
		f.data = nil
		c.inMem -= f.size
	}
}

// load returns f's data: data, what memory held, or what it reads from
// the disk. A file the disk no longer holds whole is dropped, and the
// caller gets it from the tree.
func (c *contents) load(f *content, data []byte) ([]byte, bool) {
	if data != nil || !f.onDisk {
		return data, true
	}
	data = make([]byte, 0, f.size)
	next := c.disk.GetMany(c.ctx, f.hashes)
	for range f.hashes {
		b, ok := next()
		if !ok {
			c.lose(f)
			return nil, false
		}
		data = append(data, b...)
	}
	if int64(len(data)) != f.size {
		c.lose(f)
		return nil, false
	}
	return data, true
}

// lose drops f, whose chunks the disk lacks, if it is still held.
func (c *contents) lose(f *content) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.lost++
	if e, ok := c.ents[f.path]; ok && e.Value.(*content) == f {
		c.removeLocked(e)
		c.evicted[f.path] = true
	}
}

// spill, in disk mode, stores f's data on the disk, as the chunks a
// chunked read of the file would find there too. Nothing changes f.data
// once it is held, so the disk may keep it as it is.
func (c *contents) spill(f *content) {
	if c.disk == nil || f.onDisk {
		return
	}
	b := f.data
	hs := make([]chunk.Hash, 0, len(b)/chunk.Default.Avg+1)
	for len(b) > 0 {
		n := chunk.Default.Cut(b)
		h := chunk.Sum(b[:n])
		c.disk.AddFixed(h, b[:n])
		hs = append(hs, h)
		b = b[n:]
	}
	f.hashes, f.onDisk = hs, true
}

// want starts a fetch that brings the file d describes, unless one is
// bringing it or brought it already:
//
//   - the first small file read in a directory fetches the directory's
//     small files;
//   - a file in a directory whose parent, or a directory beside it, was
//     fetched shows a program going through the tree (grep -r, git status,
//     a build): a walk then streams the parent's tree from this file on,
//     or the grandparent's, if a tree beside the parent was walked too,
//     and so on up.
//
// Files of the part of a walk the program has passed, and of a directory
// fetched already, are not fetched again, unless the budget pushed them
// out and a walk brings them: a program reading them now is not walking,
// and each gets a Get of its own.
func (c *contents) want(d ferry.Dir) {
	if d.Type() != ferry.TypeFile || d.Size() > treeFile {
		return
	}
	p, dir := d.Path(), path.Dir(d.Path())
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.walkFor(p); w != nil {
		w.advance(p)
		c.changed.Broadcast()
		return
	}
	if d.Size() > SmallFile || c.running[dir] || c.recalledDirs[dir] {
		return
	}
	again := c.evicted[p]
	if c.fetched(p) && !again {
		return
	}
	for _, w := range c.walks {
		if !w.done && ferry.HasPrefix(dir, w.root) {
			// Behind a walk in progress: not a walk of its own.
			return
		}
	}
	if parent := path.Dir(dir); parent != dir && c.scanned(parent) {
		for up := path.Dir(parent); up != parent && c.treeBeside(up, parent); parent, up = up, path.Dir(up) {
		}
		c.startWalk(parent, p)
		return
	}
	if again {
		// Its directory's other files may well be held.
		return
	}
	c.stats.dirFetches++
	c.dirs[dir] = true
	c.running[dir] = true
	c.log.Debug("prefetching small files", "dir", dir, "for", p)
	go c.fetchDir(dir)
}

// fetched reports whether a fetch brought, or went past, the file at p.
// c.mu is held.
func (c *contents) fetched(p string) bool {
	if c.dirs[path.Dir(p)] {
		return true
	}
	for _, w := range c.walks {
		if w.covers(p) && w.received(p) {
			return true
		}
	}
	return false
}

// scanned reports whether dir, or a directory directly in it, was fetched
// or walked. c.mu is held.
func (c *contents) scanned(dir string) bool {
	if c.dirs[dir] {
		return true
	}
	for q := range c.dirs {
		if path.Dir(q) == dir {
			return true
		}
	}
	for _, w := range c.walks {
		if w.root == dir || path.Dir(w.root) == dir {
			return true
		}
	}
	return false
}

// treeBeside reports whether a tree directly in dir other than p was
// walked. c.mu is held.
func (c *contents) treeBeside(dir, p string) bool {
	for _, w := range c.walks {
		if w.root != p && path.Dir(w.root) == dir {
			return true
		}
	}
	return false
}

// startWalk starts a walk of root from the file at from. Walks below root
// in progress stop: the program has moved on from them. c.mu is held.
func (c *contents) startWalk(root, from string) {
	for _, w := range c.walks {
		if !w.done && ferry.HasPrefix(w.root, root) {
			w.cancel()
		}
	}
	if len(c.walks) >= maxWalks {
		// The oldest ended walks are forgotten; their files are held
		// or were read.
		keep := c.walks[:0]
		for i, w := range c.walks {
			if !w.done || len(c.walks)-i <= maxWalks/2 {
				keep = append(keep, w)
			}
		}
		c.walks = keep
	}
	ctx, cancel := context.WithCancel(c.ctx)
	w := &walk{root: root, from: from, pos: from, began: c.seq, cancel: cancel, used: time.Now()}
	c.walks = append(c.walks, w)
	c.stats.walks++
	// Directories whose small files were fetched already are left out,
	// up to a point: a long predicate costs the server on every entry.
	var skip []string
	for q := range c.dirs {
		passed := walkLess(q, from) && !ferry.HasPrefix(from, q)
		if len(skip) < maxExcluded && ferry.HasPrefix(q, root) && !passed {
			skip = append(skip, "path~"+pred.Quote(childrenOf(q))+" & size<="+strconv.Itoa(SmallFile))
		}
	}
	want := "type=f & size<=" + strconv.Itoa(treeFile)
	if len(skip) > 0 {
		want += " & !(" + strings.Join(skip, " | ") + ")"
	}
	c.log.Debug("prefetching a walk", "root", root, "from", from)
	go c.runWalk(ctx, w, walkFrom(root, from, want))
}

// idleStop is how long a walk whose window is full waits for the program
// to read on before it stops: the program has stopped, or gone elsewhere.
const idleStop = 5 * time.Second

// runWalk streams w's files into the cache, keeping at most the window
// ahead of the program.
func (c *contents) runWalk(ctx context.Context, w *walk, pred string) {
	defer func() {
		c.mu.Lock()
		w.done = true
		w.ahead = nil
		c.changed.Broadcast()
		c.mu.Unlock()
		w.cancel()
	}()
	st := c.fsys.FindGet(ctx, w.root, pred)
	defer st.Close()
	stop := context.AfterFunc(ctx, c.wake)
	defer stop()
	err := receive(st, func(d ferry.Dir) bool { return c.roomAhead(ctx, w) },
		func(f *content) { c.add(f, w.began, w) })
	if err != nil && ctx.Err() == nil {
		c.log.Debug("a walk's prefetch failed", "root", w.root, "from", w.from, "err", err)
	}
}

// roomAhead waits while what w holds ahead of the program fills the
// window. It reports false if the walk is to stop: cancelled, or the
// program idle for idleStop.
func (c *contents) roomAhead(ctx context.Context, w *walk) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w.aheadBytes >= c.window {
		if ctx.Err() != nil {
			return false
		}
		idle := time.Since(w.used)
		if idle >= idleStop {
			c.log.Debug("a walk's prefetch stopped: the program reads no more", "root", w.root, "last", w.last)
			return false
		}
		t := time.AfterFunc(idleStop-idle, c.wake)
		c.changed.Wait()
		t.Stop()
	}
	return ctx.Err() == nil
}

// fetchDir brings the small files directly in dir with one FindGet.
func (c *contents) fetchDir(dir string) {
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
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
	st := c.fsys.FindGet(ctx, dir, "depth=1 & type=f & size<="+strconv.Itoa(SmallFile))
	defer st.Close()
	n := 0
	err := receive(st, func(ferry.Dir) bool { n++; return n <= dirFiles }, func(f *content) { c.add(f, began, nil) })
	if err != nil {
		c.log.Debug("prefetching small files failed", "dir", dir, "err", err)
	}
}

// receive reads the files of a FindGet's stream, st: next is asked before
// each file whether to go on, and add is given each file received whole.
// It returns the stream's error, closing it first if next stopped it.
func receive(st *ferry.Stream[ferry.Entry], next func(ferry.Dir) bool, add func(*content)) error {
	var cur *content
	for e := range st.All() {
		switch {
		case e.Err != nil:
			cur = nil
		case e.Dir != nil:
			if cur != nil && int64(len(cur.data)) == cur.size {
				add(cur)
			}
			cur = nil
			if e.Dir.Type() != ferry.TypeFile {
				continue
			}
			if !next(e.Dir) {
				st.Close()
				return nil
			}
			cur = &content{path: e.Dir.Path(), mtime: e.Dir[ferry.AttrMtime], size: e.Dir.Size(),
				ino: e.Dir[ferry.AttrIno], ctime: e.Dir[ferry.AttrCtime], data: make([]byte, 0, e.Dir.Size())}
		case cur != nil:
			if int64(len(cur.data)+len(e.Data)) > cur.size {
				// The file grew while it was read: leave it to Get.
				cur = nil
				continue
			}
			cur.data = append(cur.data, e.Data...)
		}
	}
	if cur != nil && int64(len(cur.data)) == cur.size {
		add(cur)
	}
	return st.Err()
}

// keep holds data as the content of the file d describes, which this
// mount has just stored: a build reads back the objects it wrote (the
// linker), and each would otherwise cost a Get. Files above treeFile are
// not kept.
func (c *contents) keep(d ferry.Dir, data []byte) {
	if int64(len(data)) != d.Size() || d.Size() > treeFile {
		return
	}
	c.keepHeld(d, &content{size: d.Size(), data: data})
}

// keepHeld holds f's data as the content of the file d describes: what
// was held under another name, or with other attributes. In disk mode it
// goes to the disk only when it is first read or memory must make room
// (getLocked, trim): a file stored again and again (configure's
// config.log, rewritten at each of its thousand closes) would otherwise
// be cut, hashed and written each time.
func (c *contents) keepHeld(d ferry.Dir, f *content) {
	if f.size != d.Size() {
		return
	}
	f = f.with(d)
	if f.data == nil && !f.onDisk {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold(f, c.seq)
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

// add holds f, which a fetch that began at seq began brought whole (w, if
// a walk did).
func (c *contents) add(f *content, began uint64, w *walk) {
	c.spill(f)
	c.mu.Lock()
	if w != nil {
		w.last = f.path
		f.w = w
	}
	c.arrived = time.Now()
	c.changed.Broadcast()
	c.stats.files++
	c.stats.bytes += f.size
	held := c.hold(f, began)
	if held && w != nil && walkLess(w.pos, f.path) {
		w.ahead = append(w.ahead, f)
		w.aheadBytes += f.size
	}
	c.mu.Unlock()
	if held && c.arrival != nil {
		c.arrival(f.path)
	}
}

// hold holds f, unless its path was dropped since began, and reports
// whether it did. c.mu is held.
func (c *contents) hold(f *content, began uint64) bool {
	if c.droppedSince(f.path, began) {
		return false
	}
	if e, ok := c.ents[f.path]; ok {
		c.removeLocked(e)
	}
	delete(c.evicted, f.path)
	f.read = false
	c.ents[f.path] = c.unread.PushFront(f)
	c.size += f.size
	c.record(f)
	if c.disk != nil && f.data != nil {
		c.inMem += f.size
	}
	c.trim()
	c.stats.peak = max(c.stats.peak, c.size)
	return true
}

// droppedSince reports whether p, or a tree above it, was dropped after
// seq. c.mu is held.
func (c *contents) droppedSince(p string, seq uint64) bool {
	if c.allDropped > seq || c.dropped[p] > seq {
		return true
	}
	for a := p; ; a = path.Dir(a) {
		if c.droppedTrees[a] > seq {
			return true
		}
		if a == "/" || a == "." {
			return false
		}
	}
}

// trim evicts files until the budget holds: read files first, then the
// others, the least recently used first in each, sparing those a walk
// holds ahead of the program, which it is about to read. c.mu is held.
func (c *contents) trim() {
	for _, l := range []*list.List{c.read, c.unread} {
		for e := l.Back(); e != nil && c.size > c.max; {
			prev := e.Prev()
			f := e.Value.(*content)
			if f.w == nil || f.w.done || f.read || !walkLess(f.w.pos, f.path) {
				c.removeLocked(e)
				if len(c.evicted) >= 1<<16 {
					clear(c.evicted)
				}
				c.evicted[f.path] = true
				c.stats.evicted++
			}
			e = prev
		}
	}
	// In disk mode the oldest files not yet read leave memory first;
	// those kept after a store go to the disk then.
	for e := c.unread.Back(); e != nil && c.inMem > c.memMax; e = e.Prev() {
		f := e.Value.(*content)
		c.toDisk(f)
		c.unload(f)
	}
}

// toDisk, in disk mode, puts on the disk, with its record, the data of f
// that memory alone holds (a file kept after a store). c.mu is held.
func (c *contents) toDisk(f *content) {
	if f.data != nil && !f.onDisk {
		c.spill(f)
		c.record(f)
	}
}

// record writes the record of f, held on the disk, if it has none yet.
// c.mu is held.
func (c *contents) record(f *content) {
	if c.recs != nil && f.onDisk && !f.recorded && f.ino != "" && f.ctime != "" {
		c.recs.Set(f.path, encodeRecord(f))
		f.recorded = true
	}
}

// removeLocked drops one file, and its record.
func (c *contents) removeLocked(e *list.Element) {
	c.forgetLocked(e)
	if f := e.Value.(*content); f.recorded {
		c.recs.Delete(f.path)
	}
}

// forgetLocked drops one file, keeping its record: what a record names is
// checked against the file's attributes when it is used, so a tree
// dropped because events were lost, or the lease ended (an unmount), is
// still found there later.
func (c *contents) forgetLocked(e *list.Element) {
	f := e.Value.(*content)
	if f.read {
		c.read.Remove(e)
	} else {
		c.unread.Remove(e)
	}
	delete(c.ents, f.path)
	c.size -= f.size
	if c.disk != nil && f.data != nil {
		c.inMem -= f.size
		// Data the disk does not hold stays with f: a caller may
		// hold f under another name or version (keepHeld).
		if f.onDisk {
			f.data = nil
		}
	}
}

// drop forgets p and, with tree, everything below it. The metadata cache
// calls it for every path it drops; it walks its own listings below p, so
// it asks for the whole tree only when it drops more than they lead to.
// A dropped tree may be fetched again: walks in it stop, and a walk above
// it no longer keeps what it brings from it.
func (c *contents) drop(p string, tree bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if len(c.dropped) >= 8192 || len(c.droppedTrees) >= 1024 {
		clear(c.dropped)
		clear(c.droppedTrees)
		c.allDropped = c.seq
	}
	c.dropped[p] = c.seq
	if !tree {
		if e, ok := c.ents[p]; ok {
			c.removeLocked(e)
		}
		return
	}
	c.droppedTrees[p] = c.seq
	for q, e := range c.ents {
		if ferry.HasPrefix(q, p) {
			c.forgetLocked(e)
		}
	}
	deleteBelow(c.dirs, p)
	deleteBelow(c.recalledDirs, p)
	deleteBelow(c.evicted, p)
	keep := c.walks[:0]
	for _, w := range c.walks {
		if ferry.HasPrefix(w.root, p) {
			w.cancel()
			continue
		}
		keep = append(keep, w)
	}
	c.walks = keep
}

// counts returns the hits, the fetches started and the files held, for
// tests.
func (c *contents) counts() (hits, fetches int64, files int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.hits, c.stats.dirFetches + c.stats.walks, len(c.ents)
}

// report returns what the cache holds and has done, for the log.
func (c *contents) report() contentStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
