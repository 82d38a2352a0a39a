// Package cache is the client's cache as a layer: a ferry.FS and
// ferry.Watcher over any ferry.FS, holding what a front end (the FUSE
// adaptor, a native command) would otherwise ask the tree below for again
// and again.
//
// It holds four things, each fed by the calls that pay least on a slow link:
//
//   - Metadata (meta.go): on first use of a directory one Find of the
//     subtree below it, bounded by depth and by an entry budget; entries,
//     complete listings and the absence of names in them are answered here
//     while they can be trusted. Bounded in entries, least recently used
//     first.
//   - Small-file contents (contents.go): a directory's small files with one
//     FindGet on the first read of one, and the rest of a tree streamed in
//     the order a program is seen reading it (walkorder.go), within a
//     memory budget.
//   - Write-behind (writeback.go, Options.WriteBehind): whole-file puts,
//     new directories and removals of files return at once and run in the
//     background, ordered per path with every later call on it; Sync waits
//     for them and reports their failures.
//   - The watch as lease: one watch on the cached root, taken when a layer
//     above first calls Watch. While it lasts what was fetched under it is
//     trusted; each event drops what it names, and is passed up through
//     Watch, so the layer above (the FUSE adaptor: the kernel's caches)
//     drops its copies too. A callback break (an event with Ack) is
//     acknowledged below once every watcher above has acknowledged it.
//     Without a watch nothing is trusted longer than Options.TTL.
//
// Every change goes through the layer's Tree methods (or Make, Created and
// Discard, which a front end that makes files locally needs), which record
// what the change did, so the cache never asks the tree about its own
// writes.
package cache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/store"
)

// Options configure a cache. The zero value is usable.
type Options struct {
	// Root is the subtree the cache watches; "/" if empty.
	Root string
	// Log receives the cache's messages; nothing is logged if nil.
	Log *slog.Logger
	// PrefetchDepth bounds the Find issued on first use of a directory
	// (default 16). The entry budget is what bounds a walk of a big tree;
	// the depth mostly keeps a deep one from delaying the listings near
	// its top.
	PrefetchDepth int
	// PrefetchBudget stops a prefetch after this many entries (default
	// 20000); what it completed is kept.
	PrefetchBudget int
	// MetaEntries bounds the entries of metadata kept (default
	// DefaultMetaEntries; each costs about MetaEntrySize bytes).
	MetaEntries int
	// TTL is how long metadata is trusted without a watch (default 1 s).
	TTL time.Duration
	// CallTimeout bounds each background call and each check the cache
	// makes of its own accord (default 1 min).
	CallTimeout time.Duration
	// WatchBackoff is the first wait before re-establishing a lost watch
	// (default 100 ms); it doubles up to a minute.
	WatchBackoff time.Duration
	// Memory bounds the bytes of file contents held fetched ahead of
	// their reads (default DefaultMemory), in memory mode.
	Memory int64
	// Disk, if set, puts the cache in disk mode: the contents fetched
	// ahead are held on it as chunks (where a chunked read of the same
	// file finds them too), and memory holds only where they are; those
	// kept of files just written go there when Memory must make room. A
	// tree much larger than the memory budget then stays cached for warm
	// walks.
	Disk store.ChunkCache
	// DiskBytes bounds the bytes of contents held on Disk (default half
	// of what Disk may hold, leaving the rest to whole files read by
	// chunks).
	DiskBytes int64
	// WriteBehind makes whole-file Puts of files up to 16 MiB (while
	// less than 256 MiB waits), Makes of directories, Removes of files
	// with one name, renames and attribute changes return before the tree
	// below has them: the call runs in the background, in order with
	// every other call on the same paths, and Sync reports its failure.
	// Where the tree below lends write leases (ferry.WriteLeaser), only
	// changes under a lease this cache holds go behind, so another
	// client's call there waits until they are stored (close-to-open
	// holds); without, every change may.
	WriteBehind bool
	// Ungrouped stores each change kept back in a call of its own, as
	// before groups (ferry.Grouper), to compare with them. By default a
	// tree below that applies changes in groups gets them so.
	Ungrouped bool
	// LeaseIdle is how long a write lease is kept unused before it is
	// given back (default LeaseIdle).
	LeaseIdle time.Duration
	// Uid and Gid are the owner the tree gives entries made without one;
	// what a change made in the background shows until it is done.
	Uid, Gid int64
	// HeldDir, if set, reports whether the layer above holds p as a
	// directory (the kernel's node, for the FUSE adaptor). An event for
	// such a path is checked with a Stat before it is passed up, so a
	// directory whose times alone changed keeps its name above.
	HeldDir func(p string) bool
	// Handover, if set, has the layer above hand over the changes it
	// still holds at or below root (the FUSE adaptor's files written
	// with no handle) before the cache waits for what it keeps back
	// there: a recall, a release, a sync, a drain. With all false (a
	// recall, a release), files whose close has not come yet stay: what
	// another client sees of a file is what its last close left.
	Handover func(ctx context.Context, root string, all bool)
	// Arrived, if set, is told the path of each file whose content a
	// fetch brought, once the cache holds it, outside the cache's locks:
	// the layer above may pass it on unasked (the FUSE adaptor gives it
	// to the kernel). It must not block.
	Arrived func(p string)
}

// FS is a caching layer over a ferry.FS.
type FS struct {
	below ferry.FS
	opt   Options
	log   *slog.Logger
	meta  *meta
	data  *contents
	wback *writeback

	ctx       context.Context // Ends with Close.
	cancel    context.CancelFunc
	watchOnce sync.Once
	ready     chan struct{} // Closed once the first lease is held, or cannot be.
	readyOnce sync.Once
	done      chan struct{} // Closed when the watch loop ends.

	subMu sync.Mutex
	subs  map[*sub]struct{}

	// breaks counts the callback breaks acknowledged; storedFiles and
	// storedBytes the files written behind and stored since.
	breaks                   atomic.Int64
	storedFiles, storedBytes atomic.Int64
	// coalesced counts the stores that replaced one not yet started;
	// unsentFiles and unsentBytes the files created and removed before
	// their store started.
	coalesced, unsentFiles, unsentBytes atomic.Int64
	// owners records that the tree below took a change of a file's owner
	// to another user: such changes then go behind too. setter, if the
	// tree below says whether it takes them (ownerSetter), lets them go
	// behind from the first.
	owners atomic.Bool
	setter ownerSetter
	// current, if the tree below has it, serves files the lease vouches
	// for from what it kept (Get).
	current ferry.CurrentGetter
	// leases are the write leases held, if the tree below lends them
	// and Options.WriteBehind is set.
	leases *writeLeases

	// gens counts, by path, the changes whose background store may
	// still end: a store that ends after a later change of its path
	// must not record what it stored over what that change recorded.
	genMu sync.Mutex
	gens  map[string]uint64
	// made holds the files made above (Created) with no change of them
	// since: the tree below has no file there yet.
	made map[string]bool
}

var (
	_ ferry.FS        = (*FS)(nil)
	_ ferry.Watcher   = (*FS)(nil)
	_ ferry.Unwrapper = (*FS)(nil)
)

// New returns a cache over below. It watches below from the first call
// of its own Watch, and until Close.
func New(below ferry.FS, opt Options) *FS {
	if opt.Root == "" {
		opt.Root = "/"
	}
	if r, err := ferry.CleanPath(opt.Root); err == nil {
		opt.Root = r
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.PrefetchDepth <= 0 {
		opt.PrefetchDepth = 16
	}
	if opt.PrefetchBudget <= 0 {
		opt.PrefetchBudget = 20000
	}
	if opt.MetaEntries <= 0 {
		opt.MetaEntries = DefaultMetaEntries
	}
	if opt.TTL <= 0 {
		opt.TTL = time.Second
	}
	if opt.CallTimeout <= 0 {
		opt.CallTimeout = time.Minute
	}
	if opt.WatchBackoff <= 0 {
		opt.WatchBackoff = 100 * time.Millisecond
	}
	if opt.Memory <= 0 {
		opt.Memory = DefaultMemory
	}
	if opt.Disk != nil && opt.DiskBytes <= 0 {
		opt.DiskBytes = max(opt.Disk.Stats().MaxBytes/2, 1)
	}
	if opt.LeaseIdle <= 0 {
		opt.LeaseIdle = LeaseIdle
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &FS{
		below: below, opt: opt, log: opt.Log,
		meta:  newMeta(below, opt.PrefetchDepth, opt.PrefetchBudget, opt.MetaEntries, opt.TTL),
		data:  newContents(below, opt.Log, contentsBudget(opt), opt.Disk, opt.Memory),
		wback: newWriteback(opt.CallTimeout, below, grouperOf(below, opt)),
		ctx:   ctx, cancel: cancel,
		ready: make(chan struct{}),
		done:  make(chan struct{}),
		subs:  map[*sub]struct{}{},
		gens:  map[string]uint64{},
		made:  map[string]bool{},
	}
	c.setter, _ = ferry.As[ownerSetter](below)
	c.current, _ = ferry.As[ferry.CurrentGetter](below)
	if wl, ok := ferry.As[ferry.WriteLeaser](below); ok && opt.WriteBehind {
		c.leases = &writeLeases{wl: wl, roots: map[string]time.Time{}, shallow: map[string]bool{}, refused: map[string]time.Time{},
			asking: map[string]chan struct{}{}, revoked: map[string]bool{}, echoes: map[string]*echoSet{}}
	}
	c.data.arrival = opt.Arrived
	c.meta.data = c.data
	c.meta.settle = func(ctx context.Context, p string) error { return c.wback.wait(ctx, p) }
	c.meta.busy = c.wback.busy
	return c
}

// contentsBudget returns the bytes of contents opt lets the cache hold:
// on disk in disk mode, else in memory.
func contentsBudget(opt Options) int64 {
	if opt.Disk != nil {
		return opt.DiskBytes
	}
	return opt.Memory
}

// grouperOf returns the tree below's groups of changes, if write-behind is
// to use them.
func grouperOf(below ferry.FS, opt Options) ferry.Grouper {
	if !opt.WriteBehind || opt.Ungrouped {
		return nil
	}
	g, _ := ferry.As[ferry.Grouper](below)
	return g
}

// Unwrap implements ferry.Unwrapper.
func (c *FS) Unwrap() ferry.FS { return c.below }

// Close stops the watch and the fetches in progress. Changes still in the
// background go on; Drain waits for them.
func (c *FS) Close() error {
	c.cancel()
	c.wback.close()
	c.data.close()
	c.watchOnce.Do(func() { close(c.done) }) // Never watched.
	<-c.done
	st := c.data.report()
	c.log.Info("file contents prefetched", "files", st.files, "bytes", st.bytes, "hits", st.hits,
		"directories", st.dirFetches, "walks", st.walks, "evicted", st.evicted, "lost", st.lost, "recalled", st.recalled, "peak", st.peak, "budget", c.data.max, "on", c.data.where())
	return nil
}

// Drain waits until every change in the background is done, or ctx is.
func (c *FS) Drain(ctx context.Context) error {
	c.handover(ctx, "/", true)
	if ops, bytes := c.wback.pending(); ops > 0 {
		c.log.Info("storing what was written", "files", ops, "bytes", bytes)
	}
	if err := c.wback.wait(ctx, "/"); err != nil {
		ops, bytes := c.wback.pending()
		c.log.Error("changes not stored", "files", ops, "bytes", bytes)
		return err
	}
	return nil
}

// Ready is closed once the cache holds its first lease, or has learned
// that it cannot have one yet: a front end that waits for it before its
// first walk makes that walk under the lease.
func (c *FS) Ready() <-chan struct{} { return c.ready }

func (c *FS) setReady() { c.readyOnce.Do(func() { close(c.ready) }) }

// Leased reports whether the cache holds a lease (its watch is in place).
func (c *FS) Leased() bool { return c.meta.leased() }

// Lookup returns the entry for name in dir: from the cache, from a
// prefetch of dir (which it starts, or waits for), or from a Stat. A
// name missing from a listed directory fails with KindNotExist at once.
func (c *FS) Lookup(ctx context.Context, dir, name string) (ferry.Dir, error) {
	return c.meta.lookup(ctx, dir, name)
}

// List returns the entries of dir sorted by name, prefetching it (and
// below it) if it is not cached.
func (c *FS) List(ctx context.Context, dir string) ([]ferry.Dir, error) {
	return c.meta.list(ctx, dir)
}

// Fresh returns the entry at p as the tree below has it now, after this
// cache's changes to it in the background: what an open must see without
// a lease (close-to-open).
func (c *FS) Fresh(ctx context.Context, p string) (ferry.Dir, error) {
	return c.meta.stat(ctx, p)
}

// Known returns the trusted entry at p, if the cache holds one, without
// asking below.
func (c *FS) Known(p string) ferry.Dir { return c.meta.known(p) }

// Contents returns the content of the file d describes if the cache holds
// it, or it arrives soon by a prefetch in progress or one this starts.
func (c *FS) Contents(ctx context.Context, d ferry.Dir) ([]byte, bool) {
	if data, ok := c.pending(d); ok {
		return data, true
	}
	return c.data.open(ctx, d)
}

// pending returns the content of the file d describes if a store of it
// in the background holds it.
func (c *FS) pending(d ferry.Dir) ([]byte, bool) {
	data, ok := c.wback.content(d.Path())
	if !ok || int64(len(data)) != d.Size() {
		return nil, false
	}
	return data, true
}

// Settle waits until the changes in the background on ps (and on paths
// above or below them) are done.
func (c *FS) Settle(ctx context.Context, ps ...string) error { return c.wback.wait(ctx, ps...) }

// Sync waits until the changes in the background at or below p are done,
// and returns (and forgets) the first failure among them.
func (c *FS) Sync(ctx context.Context, p string) error {
	c.handover(ctx, p, true)
	return c.wback.sync(ctx, p)
}

// handover has the layer above hand over what it holds at or below root
// (Options.Handover).
func (c *FS) handover(ctx context.Context, root string, all bool) {
	if c.opt.Handover != nil {
		c.opt.Handover(ctx, root, all)
	}
}

// KeepsBack reports whether a change of p goes behind now (under a write
// lease this cache holds, or is given now; see Options.WriteBehind), and
// counts the lease as in use. A layer above that holds changes of its
// own (Options.Handover) asks it to know whether it may keep them back
// too.
func (c *FS) KeepsBack(ctx context.Context, p string) bool {
	queued, ok := c.behind(ctx, p)
	if ok {
		queued()
	}
	return ok
}

// Failed returns (and forgets) the failure of a background change of p,
// without waiting.
func (c *FS) Failed(p string) error { return c.wback.failed(p) }

// Created records d, a file made above and not yet stored (the FUSE
// adaptor stores a new file at its first close): it is looked up and
// listed as d until a Put stores it or Discard forgets it.
func (c *FS) Created(d ferry.Dir) {
	c.genMu.Lock()
	c.made[d.Path()] = true
	c.genMu.Unlock()
	c.meta.addPending(d)
	c.meta.touch(path.Dir(d.Path()), 0, nil)
}

// Discard forgets the file at p, made above and never stored, as
// removed.
func (c *FS) Discard(p string) {
	c.nextGen(p)
	c.Unstored(p)
	c.meta.touch(path.Dir(p), 0, nil)
}

// Unstored forgets the file at p, whose store failed: it shows as the
// tree below has it.
func (c *FS) Unstored(p string) {
	c.meta.dropPending(p)
	c.meta.forget(p)
}

// LinkChanged drops the entries and contents of every name of the file d
// describes, if it has several: one of its names was made or removed, and
// the link count and ctime the others show changed. A front end that knew
// the file when the cache did not tells it so.
func (c *FS) LinkChanged(d ferry.Dir) { c.meta.dropLinked(d) }

// OtherName returns a name other than not that the cache knows the file d
// with several names by, or "": where a front end that holds the file
// open stores it once not is removed.
func (c *FS) OtherName(d ferry.Dir, not string) string { return c.meta.otherName(d, not) }

// Drop forgets everything cached, here and (through Watch) above.
func (c *FS) Drop() {
	c.meta.dropAll()
	c.emit(ferry.Event{Path: c.opt.Root, Lost: true})
}

// Counts returns how many Finds and Stats the metadata cache has issued.
func (c *FS) Counts() (finds, stats uint64) { return c.meta.counts() }

// ContentCounts returns the reads answered from prefetched contents, the
// prefetches started and the files held.
func (c *FS) ContentCounts() (hits, fetches int64, files int) { return c.data.counts() }

// Status implements ctl.Controller: the cache's section of the control
// file.
func (c *FS) Status(context.Context) string {
	var b strings.Builder
	fmt.Fprintf(&b, "lease: %v\n", c.meta.leased())
	fmt.Fprintf(&b, "breaks: %d\n", c.breaks.Load())
	fmt.Fprintf(&b, "writeback: %v\n", c.opt.WriteBehind)
	ops, bytes := c.wback.pending()
	fmt.Fprintf(&b, "writeback.pending: %d calls, %d bytes\n", ops, bytes)
	fmt.Fprintf(&b, "writeback.stored: %d files, %d bytes\n", c.storedFiles.Load(), c.storedBytes.Load())
	fmt.Fprintf(&b, "writeback.coalesced: %d stores\n", c.coalesced.Load())
	if c.wback.grouper != nil {
		fmt.Fprintf(&b, "writeback.groups: %d groups, %d changes\n", c.wback.groups.Load(), c.wback.grouped.Load())
	}
	fmt.Fprintf(&b, "writeback.waited: %d changes made at once waited for those kept back\n", c.wback.followed.Load())
	fmt.Fprintf(&b, "writeback.unsent: %d files, %d bytes\n", c.unsentFiles.Load(), c.unsentBytes.Load())
	if w := c.leases; w != nil {
		w.mu.Lock()
		held := len(w.roots)
		w.mu.Unlock()
		fmt.Fprintf(&b, "leases.write: %d held, %d granted (%d shallow), %d recalled, %d released, %d lost\n",
			held, w.granted.Load(), w.shallows.Load(), w.recalls.Load(), w.released.Load(), w.lost.Load())
	}
	d := c.data
	d.mu.Lock()
	size, inMem, files, st := d.size, d.inMem, len(d.ents), d.stats
	d.mu.Unlock()
	fmt.Fprintf(&b, "contents.on: %s\n", d.where())
	if d.disk != nil {
		fmt.Fprintf(&b, "contents.memory: %d of %d bytes of files not yet read\n", inMem, d.memMax)
	}
	fmt.Fprintf(&b, "contents.bytes: %d of %d\ncontents.files: %d\ncontents.peak: %d\n", size, d.max, files, st.peak)
	fmt.Fprintf(&b, "contents.fetched: %d files, %d bytes\ncontents.evicted: %d\ncontents.lost: %d\ncontents.recalled: %d\ncontents.walks: %d\n", st.files, st.bytes, st.evicted, st.lost, st.recalled, st.walks)
	finds, stats := c.meta.counts()
	fmt.Fprintf(&b, "meta.finds: %d\nmeta.stats: %d\n", finds, stats)
	ents, evicted := c.meta.size()
	fmt.Fprintf(&b, "meta.entries: %d of %d\nmeta.evicted: %d\n", ents, c.meta.max, evicted)
	return b.String()
}

// Command implements ctl.Controller. "sync" waits for every change still
// in the background; "drop" forgets everything cached, here and above.
func (c *FS) Command(ctx context.Context, args []string) error {
	switch args[0] {
	case "sync":
		ctx, cancel := context.WithTimeout(ctx, c.opt.CallTimeout)
		defer cancel()
		c.handover(ctx, c.opt.Root, true)
		return c.wback.wait(ctx, c.opt.Root)
	case "drop":
		c.Drop()
		return nil
	}
	return ferry.E("cache.Command", ferry.CtlPath, ferry.KindInvalid, "the cache knows no command "+args[0]+" (sync, drop)")
}

// nextGen counts a change of p that a store in the background must not
// undo, and returns its number.
func (c *FS) nextGen(p string) uint64 {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	delete(c.made, p)
	c.gens[p]++
	return c.gens[p]
}

// stored records that the tree below now has whatever this cache made at
// ps: a change made there at once, not behind.
func (c *FS) stored(ps ...string) {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	for _, p := range ps {
		delete(c.made, p)
	}
}

// unmade reports whether the file at p was made above (Created) and not
// changed since: the tree below has none there yet.
func (c *FS) unmade(p string) bool {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	return c.made[p]
}

// lastGen reports whether gen is still the last change of p, and forgets
// p's count if so.
func (c *FS) lastGen(p string, gen uint64) bool {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	if c.gens[p] != gen {
		return false
	}
	delete(c.gens, p)
	return true
}

// Stat implements ferry.Tree: from the cache where it can.
func (c *FS) Stat(ctx context.Context, p string) *ferry.Future[ferry.Dir] {
	// The control file goes below untouched: what it reads changes
	// with every read, and what is written to it is a command.
	if ferry.IsCtl(p) {
		return c.below.Stat(ctx, p)
	}
	if d := c.meta.known(p); d != nil {
		return ferry.Resolved(d, nil)
	}
	return ferry.Go(func() (ferry.Dir, error) {
		p, err := ferry.CleanPath(p)
		if err != nil {
			return nil, err
		}
		return c.meta.getattr(ctx, p)
	})
}

// Get implements ferry.Tree: a whole file held here is read from memory;
// otherwise the tree below is asked once the changes of p in the
// background are done.
func (c *FS) Get(ctx context.Context, p string, off, count int64) io.ReadCloser {
	if ferry.IsCtl(p) {
		return c.below.Get(ctx, p, off, count)
	}
	if d := c.meta.known(p); d != nil && off >= 0 {
		if data, ok := c.pending(d); ok {
			end := int64(len(data))
			if count >= 0 {
				end = min(end, off+count)
			}
			return io.NopCloser(bytes.NewReader(data[min(off, end):end]))
		}
		if off == 0 && count < 0 {
			if data, ok := c.data.get(d); ok {
				return io.NopCloser(bytes.NewReader(data))
			}
		}
	}
	return &settledReader{open: func() (io.ReadCloser, error) {
		if err := c.wback.wait(ctx, p); err != nil {
			return nil, err
		}
		// A file the lease vouches for may be served from what the tree
		// below kept of an earlier read (a large file's chunk list).
		if c.current != nil {
			if d := c.meta.current(p); d != nil && d.Type() == ferry.TypeFile {
				return c.current.GetCurrent(ctx, d, off, count), nil
			}
		}
		return c.below.Get(ctx, p, off, count), nil
	}}
}

// settledReader opens its reader at the first Read.
type settledReader struct {
	open func() (io.ReadCloser, error)
	r    io.ReadCloser
	err  error
}

func (s *settledReader) Read(b []byte) (int, error) {
	if s.r == nil && s.err == nil {
		s.r, s.err = s.open()
	}
	if s.err != nil {
		return 0, s.err
	}
	return s.r.Read(b)
}

func (s *settledReader) Close() error {
	if s.r != nil {
		return s.r.Close()
	}
	return nil
}

// Find implements ferry.Finder: below, after this cache's changes there.
func (c *FS) Find(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	return c.settledStream(ctx, p, func() *ferry.Stream[ferry.Entry] { return c.below.Find(ctx, p, pred) })
}

// FindGet implements ferry.Finder: below, after this cache's changes
// there.
func (c *FS) FindGet(ctx context.Context, p, pred string) *ferry.Stream[ferry.Entry] {
	return c.settledStream(ctx, p, func() *ferry.Stream[ferry.Entry] { return c.below.FindGet(ctx, p, pred) })
}

func (c *FS) settledStream(ctx context.Context, p string, open func() *ferry.Stream[ferry.Entry]) *ferry.Stream[ferry.Entry] {
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Entry) error) error {
		if err := c.wback.wait(ctx, p); err != nil {
			return err
		}
		st := open()
		defer st.Close()
		for e := range st.All() {
			if err := send(e); err != nil {
				return err
			}
		}
		return st.Err()
	})
}

// Held returns the content of the file d describes if the cache holds it
// now, without fetching or waiting for it.
func (c *FS) Held(d ferry.Dir) ([]byte, bool) {
	if data, ok := c.pending(d); ok {
		return data, true
	}
	return c.data.get(d)
}
