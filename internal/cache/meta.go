package cache

import (
	"container/list"
	"context"
	"path"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
)

// meta is the adaptor's metadata cache: the entries and directory listings
// that arrived from the tree, answered locally while they can be trusted.
//
// An entry or listing can be trusted while it is younger than ttl, or for as
// long as the watch (the lease) under which it was fetched lasts: a watch
// reports every change, and each change drops what it touches. A fetch that
// overlaps an invalidation is trusted only for ttl, since it may have read
// the entry before the change the invalidation reports.
//
// On first use of a directory, meta issues one Find for its subtree bounded
// by depth and by an entry budget, and fills every entry and every listing
// that the walk completed. A lookup waits only until its own name or its
// directory's listing has arrived, not for the whole walk.
type meta struct {
	fsys   ferry.FS
	depth  int           // depth bound of a prefetch below its directory
	budget int           // entries after which a prefetch stops
	ttl    time.Duration // trust without a lease

	max  int // Entries kept at most (0: no bound); see evict.
	mu   sync.Mutex
	cond *sync.Cond // Broadcast as fetches make progress.
	ents map[string]*entry
	lru  *list.List // Of the paths in ents, most recently used first.
	// links holds, by the server's inode number, the paths of the
	// entries in ents that are files with several names.
	links    map[string]map[string]struct{}
	dirs     map[string]*listing
	fetching map[string]*fetch
	pending  map[string]ferry.Dir // Files created here but not yet on the server.
	own      map[string]time.Time // Paths this mount changed, and when.
	ownPrune int                  // Sweep own when it holds more.
	inflight map[string]int       // Paths this mount's calls are changing (expect).
	lease    uint64               // The current watch's number; 0 while there is none.
	leases   uint64               // How many leases there have been.
	seq      uint64               // Counts invalidations.
	// inval holds the paths invalidated lately, each with the seq of
	// its last invalidation, and allSeq the seq of the last time
	// everything was: a result is doubted only if its own path or one
	// above it changed while it was on its way, so a busy tree's events
	// do not discredit every answer in flight.
	inval  map[string]uint64
	allSeq uint64
	// kids holds the same invalidations by parent directory and name,
	// so that a listing that was on its way while names in it changed
	// can doubt those names.
	kids map[string]map[string]uint64
	data *contents // Prefetched small files, dropped with their entries.
	// settle waits for this mount's background calls on a path
	// (writeback.wait) before the tree is asked about it: until they are
	// done the tree's answer is older than what this mount did.
	settle func(ctx context.Context, p string) error
	// busy, if set, reports whether changes at, above or below p are
	// still in the background (what settle would wait for).
	busy func(p string) bool

	// Counters, for tests and the log.
	finds, stats, evicted uint64
}

// MetaEntrySize is about what one cached entry costs in memory, its
// listing's name included (a Dir of a dozen attributes in a map); it
// turns a memory budget into Options.MetaEntries. Measured on a copy of
// Go's src (12,800 entries) as the heap the metadata held.
const MetaEntrySize = 2 << 10

// DefaultMetaEntries is the default of Options.MetaEntries: about 200 MB.
const DefaultMetaEntries = 100_000

// entry is a cached Dir.
type entry struct {
	d     ferry.Dir
	at    time.Time
	lease uint64
	el    *list.Element // In meta.lru.
}

// listing is the complete set of names of a directory.
type listing struct {
	names map[string]struct{}
	at    time.Time
	lease uint64
	// doubt holds names that an event reported changed since the
	// listing was made, with the invalidation's sequence number: each is
	// checked with a Stat before it is believed present or absent.
	doubt map[string]uint64
}

// fetch is a prefetch in flight.
type fetch struct {
	done  bool
	err   error
	depth int // How far below its directory it lists.
	// names are the entries the fetch found in its directory, as the
	// tree below had them, for a listing whose entries changed while it
	// was fetched (list).
	names []ferry.Dir
}

// covering returns an unfinished fetch of a directory above dir whose walk
// will reach dir, so that a lookup or listing in dir waits for it rather
// than asking again. m.mu is held.
func (m *meta) covering(dir string) *fetch {
	for a, n := dir, 0; a != "/" && a != "." && a != ""; n++ {
		a = path.Dir(a)
		if f := m.fetching[a]; f != nil && !f.done && n+1 < f.depth {
			return f
		}
	}
	return nil
}

func newMeta(fsys ferry.FS, depth, budget, most int, ttl time.Duration) *meta {
	if most > 0 {
		// A prefetch brings less than the cache keeps, so that it never
		// evicts its own entries before the program it runs ahead of
		// uses them; the walk goes on from where it stopped.
		budget = max(min(budget, most-most/8), 1)
	}
	m := &meta{
		fsys: fsys, depth: depth, budget: budget, ttl: ttl, max: most,
		ents:     map[string]*entry{},
		lru:      list.New(),
		links:    map[string]map[string]struct{}{},
		dirs:     map[string]*listing{},
		fetching: map[string]*fetch{},
		pending:  map[string]ferry.Dir{},
		own:      map[string]time.Time{},
		ownPrune: ownPruneMin,
		inflight: map[string]int{},
		inval:    map[string]uint64{},
		kids:     map[string]map[string]uint64{},
	}
	m.cond = sync.NewCond(&m.mu)
	return m
}

// trusted reports whether something fetched at at under lease may still be
// believed. m.mu is held.
func (m *meta) trusted(at time.Time, lease uint64) bool {
	return lease != 0 && lease == m.lease || time.Since(at) < m.ttl
}

// leased reports whether a watch is in place.
func (m *meta) leased() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease != 0
}

// cached returns the trusted entry at p, if any. m.mu is held.
func (m *meta) cached(p string) ferry.Dir {
	if d, ok := m.pending[p]; ok {
		return d
	}
	if e := m.ents[p]; e != nil && m.trusted(e.at, e.lease) {
		m.lru.MoveToFront(e.el)
		return e.d
	}
	return nil
}

// put records e as p's entry, the most recently used, and evicts the least
// recently used entries while there are more than max. m.mu is held.
func (m *meta) put(p string, e *entry) {
	if old := m.ents[p]; old != nil {
		m.lru.Remove(old.el)
		m.unlink(p, old.d)
	}
	e.el = m.lru.PushFront(p)
	m.ents[p] = e
	if e.d.Linked() {
		ps := m.links[e.d[ferry.AttrIno]]
		if ps == nil {
			ps = map[string]struct{}{}
			m.links[e.d[ferry.AttrIno]] = ps
		}
		ps[p] = struct{}{}
	}
	if m.max > 0 && len(m.ents) > m.max {
		m.evict(m.low())
	}
}

// low is what evict leaves when the cache is over its bound: a tenth
// under it, so that eviction runs once per many entries. m.mu is held.
func (m *meta) low() int { return m.max - m.max/10 }

// del forgets p's entry. m.mu is held.
func (m *meta) del(p string) {
	if e := m.ents[p]; e != nil {
		m.lru.Remove(e.el)
		delete(m.ents, p)
		m.unlink(p, e.d)
	}
}

// unlink forgets that p is a name of the linked file d. m.mu is held.
func (m *meta) unlink(p string, d ferry.Dir) {
	if ps := m.links[d[ferry.AttrIno]]; ps != nil {
		delete(ps, p)
		if len(ps) == 0 {
			delete(m.links, d[ferry.AttrIno])
		}
	}
}

// evict forgets the least recently used entries until n are left, each
// with its own listing and its directory's (a listing is trusted only with
// all its entries): the cache's memory is bounded whatever the tree's
// size, and what goes is asked for again if used. File contents stay
// (they have their own budget, and are checked against the entry they
// are read for). m.mu is held.
func (m *meta) evict(n int) {
	for skipped := 0; len(m.ents) > n && skipped < len(m.ents); {
		el := m.lru.Back()
		p := el.Value.(string)
		if f := m.fetching[path.Dir(p)]; f != nil && !f.done {
			// Its directory is being listed: the listing needs all
			// its entries, however many (the bound then waits).
			m.lru.MoveToFront(el)
			skipped++
			continue
		}
		m.del(p)
		delete(m.dirs, p)
		delete(m.dirs, path.Dir(p))
		m.evicted++
	}
}

// dropLinked drops the cached entries and contents of all the names of
// the file d describes, if it has several: a link, an unlink or a write
// through one name changes the link count, ctime or content that the
// others show. The caller records what it knows after. (A change by
// another client is seen only under the name it was made through: the
// server's watch reports names, not files.)
func (m *meta) dropLinked(d ferry.Dir) {
	if d == nil || !d.Linked() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for q := range m.links[d[ferry.AttrIno]] {
		m.del(q)
		m.data.drop(q, false)
	}
}

// otherName returns a name other than not that the cache knows the linked
// file d by, or "".
func (m *meta) otherName(d ferry.Dir, not string) string {
	if d == nil || !d.Linked() {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for q := range m.links[d[ferry.AttrIno]] {
		if q != not {
			return q
		}
	}
	return ""
}

// dropAllLinked drops every cached file with several names: a name the
// cache knew nothing about was removed or replaced, and it may have been
// one of theirs.
func (m *meta) dropAllLinked() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ps := range m.links {
		for q := range ps {
			m.del(q)
			m.data.drop(q, false)
		}
	}
}

// known returns what the cache holds for p, if it is trusted, without
// asking the server.
func (m *meta) known(p string) ferry.Dir {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cached(p)
}

// current returns p's entry if the watch's lease vouches for it: taken
// under the lease in place, with no change of it pending.
func (m *meta) current(p string) ferry.Dir {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pending[p]; ok {
		return nil
	}
	if e := m.ents[p]; e != nil && e.lease != 0 && e.lease == m.lease {
		return e.d
	}
	return nil
}

// last returns what the cache last held for p, trusted or not: a base
// for what a change made in the background will show.
func (m *meta) last(p string) ferry.Dir {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.pending[p]; ok {
		return d
	}
	if e := m.ents[p]; e != nil {
		return e.d
	}
	return nil
}

// listed returns the trusted listing of dir, if any. m.mu is held.
func (m *meta) listed(dir string) *listing {
	if l := m.dirs[dir]; l != nil && m.trusted(l.at, l.lease) {
		return l
	}
	return nil
}

// stamp returns what to record with the results of a call that starts now.
func (m *meta) stamp() (at time.Time, lease, seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now(), m.lease, m.seq
}

// leaseFor returns the lease to record for a result about p whose call
// began at seq under lease: none if p was invalidated in between. m.mu is
// held.
func (m *meta) leaseFor(p string, lease, seq uint64) uint64 {
	if lease != m.lease || m.changedSince(p, seq) {
		return 0
	}
	return lease
}

// changedSince reports whether p, or a directory above it, was invalidated
// after seq. m.mu is held.
func (m *meta) changedSince(p string, seq uint64) bool {
	if m.allSeq > seq {
		return true
	}
	for {
		if m.inval[p] > seq {
			return true
		}
		if p == "/" || p == "." || p == "" {
			return false
		}
		p = path.Dir(p)
	}
}

// invalidated records that p changed at a new seq. m.mu is held.
func (m *meta) invalidated(p string) {
	m.seq++
	if len(m.inval) >= 8192 {
		// Forget the details: everything before now is in doubt.
		clear(m.inval)
		clear(m.kids)
		m.allSeq = m.seq
	}
	m.inval[p] = m.seq
	if p != "/" {
		k := m.kids[path.Dir(p)]
		if k == nil {
			k = map[string]uint64{}
			m.kids[path.Dir(p)] = k
		}
		k[path.Base(p)] = m.seq
	}
}

// lookup returns the entry for name in dir. It answers from the cache
// where it can, waits for a prefetch of dir otherwise, and falls back to a
// Stat. A missing entry fails with KindNotExist.
func (m *meta) lookup(ctx context.Context, dir, name string) (ferry.Dir, error) {
	p := path.Join(dir, name)
	m.mu.Lock()
	started := false
	for {
		if d := m.cached(p); d != nil {
			m.mu.Unlock()
			return d, nil
		}
		if l := m.listed(dir); l != nil {
			if _, doubted := l.doubt[name]; doubted {
				break
			}
			if _, ok := l.names[name]; !ok {
				m.mu.Unlock()
				return nil, ferry.E("cache.Lookup", p, ferry.KindNotExist)
			}
			break // Listed, but its entry has expired or was dropped.
		}
		f := m.fetching[dir]
		if f == nil {
			f = m.covering(dir)
		}
		if f == nil {
			if started {
				break // The prefetch ended without an answer (budget, error).
			}
			if m.busy != nil {
				m.mu.Unlock()
				busy := m.busy(dir)
				m.mu.Lock()
				if busy {
					// A prefetch of dir would wait until every
					// change kept back below it is stored (an
					// unpack's, seconds at a long round trip); a
					// Stat of p waits only for those of p.
					break
				}
			}
			started = true
			m.startFetch(dir)
			continue
		}
		if ctx.Err() != nil {
			m.mu.Unlock()
			return nil, ferry.E("cache.Lookup", p, ferry.KindCanceled, ctx.Err())
		}
		m.cond.Wait()
	}
	m.mu.Unlock()
	return m.stat(ctx, p)
}

// getattr returns the entry at p from the cache or, failing that, a Stat.
func (m *meta) getattr(ctx context.Context, p string) (ferry.Dir, error) {
	m.mu.Lock()
	d := m.cached(p)
	bounded := m.max > 0 && len(m.ents) >= m.low()
	m.mu.Unlock()
	if d != nil {
		return d, nil
	}
	if bounded && p != "/" {
		// The entry may have been evicted with its neighbours: fetch
		// its directory's (one Find), not each file's (a Stat each).
		return m.lookup(ctx, path.Dir(p), path.Base(p))
	}
	return m.stat(ctx, p)
}

// stat asks the tree for p and caches the answer.
func (m *meta) stat(ctx context.Context, p string) (ferry.Dir, error) {
	if m.settle != nil {
		if err := m.settle(ctx, p); err != nil {
			return nil, err
		}
	}
	at, lease, seq := m.stamp()
	m.mu.Lock()
	m.stats++
	m.mu.Unlock()
	d, err := m.fsys.Stat(ctx, p).Wait()
	if err != nil && !ferry.IsKind(err, ferry.KindNotExist) {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.dirs[path.Dir(p)]
	if p == "/" {
		l = nil
	}
	if err != nil {
		m.dropTree(p)
		if l != nil {
			if s, ok := l.doubt[path.Base(p)]; !ok || s <= seq {
				delete(l.names, path.Base(p))
				delete(l.doubt, path.Base(p))
			}
		}
		return nil, err
	}
	if m.changedSince(p, seq) {
		// This mount changed p while the answer was on its way: the
		// answer may be older than what the cache holds.
		if c := m.cached(p); c != nil {
			return c, nil
		}
		return d, nil
	}
	m.put(p, &entry{d: d, at: at, lease: m.leaseFor(p, lease, seq)})
	if l != nil {
		if s, ok := l.doubt[path.Base(p)]; !ok || s <= seq {
			l.names[path.Base(p)] = struct{}{}
			delete(l.doubt, path.Base(p))
		}
	}
	return d, nil
}

// resolve stats the doubted names of dir's listing, in parallel.
func (m *meta) resolve(ctx context.Context, dir string, names []string) {
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.stat(ctx, path.Join(dir, name))
		}()
	}
	wg.Wait()
}

// list returns the sorted names and entries of dir, prefetching it (and
// below it) if it is not cached. A directory too large for the budget is
// listed on its own, whole.
func (m *meta) list(ctx context.Context, dir string) ([]ferry.Dir, error) {
	m.mu.Lock()
	started, whole := false, false
	var last *fetch
	for tries := 0; ; tries++ {
		if l := m.listed(dir); l != nil && len(l.doubt) > 0 && tries < 3 {
			var names []string
			for name := range l.doubt {
				names = append(names, name)
			}
			m.mu.Unlock()
			m.resolve(ctx, dir, names)
			m.mu.Lock()
			continue
		}
		if l := m.listed(dir); l != nil && len(l.doubt) == 0 {
			out := make([]ferry.Dir, 0, len(l.names)+len(m.pending))
			missing := false
			for name := range l.names {
				d := m.cached(path.Join(dir, name))
				if d == nil {
					missing = true
					break
				}
				out = append(out, d)
			}
			if !missing {
				out = m.withPending(dir, out)
				m.mu.Unlock()
				return out, nil
			}
			// An entry expired before its listing: fetch both again.
			delete(m.dirs, dir)
		}
		f := m.fetching[dir]
		if f == nil && !started {
			f = m.covering(dir)
		}
		if f == nil && last != nil && last.err != nil {
			m.mu.Unlock()
			return nil, last.err
		}
		if f == nil {
			if whole {
				// Changes came in while the listing was fetched, twice:
				// what the tree below had when it was read is a listing
				// of a moment concurrent with them.
				if last != nil && last.err == nil && last.names != nil {
					out := m.withPending(dir, last.names)
					m.mu.Unlock()
					return out, nil
				}
				m.mu.Unlock()
				return nil, ferry.E("cache.List", dir, ferry.KindIO, "directory changed while being listed")
			}
			if started {
				whole = true
				m.startWhole(dir)
			} else {
				started = true
				m.startFetch(dir)
			}
			continue
		}
		last = f
		if ctx.Err() != nil {
			m.mu.Unlock()
			return nil, ferry.E("cache.List", dir, ferry.KindCanceled, ctx.Err())
		}
		m.cond.Wait()
	}
}

// withPending returns the entries ds of dir with the files made here and
// not yet stored in dir added, sorted by name. m.mu is held.
func (m *meta) withPending(dir string, ds []ferry.Dir) []ferry.Dir {
	out := slices.Clone(ds)
	have := map[string]bool{}
	for _, d := range ds {
		have[d.Name()] = true
	}
	for p, d := range m.pending {
		if path.Dir(p) == dir && !have[d.Name()] {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// startFetch starts a bounded prefetch of dir unless one is in flight.
// m.mu is held.
func (m *meta) startFetch(dir string) {
	m.start(dir, m.depth, m.budget, 0)
}

// startWhole starts a listing of dir alone, without a budget.
func (m *meta) startWhole(dir string) {
	m.start(dir, 1, 0, maxGen)
}

// maxGen bounds how many times a prefetch continues below its depth bound.
const maxGen = 3

// start starts a prefetch of dir to depth below it. A prefetch that ends
// within its budget continues (gen counts how often) with prefetches of
// the directories at its depth bound, all in flight at once, so a walk of a
// deep tree waits about one round trip per depth levels, not one per
// directory. m.mu is held.
func (m *meta) start(dir string, depth, budget, gen int) {
	if m.fetching[dir] != nil {
		return
	}
	f := &fetch{depth: depth}
	m.fetching[dir] = f
	m.finds++
	go func() {
		// The fetch serves every waiter, so no one request's context
		// may cancel it; it has a deadline of its own.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The tree's answer is as new as this cache's own changes
		// below dir only once those kept back are stored: believed
		// before, it brings back a name a rename took away (a
		// temporary file renamed into place, still on the server).
		// Changes made after the stamp are told apart by their seq.
		var err error
		if m.settle != nil {
			err = m.settle(ctx, dir)
		}
		var next []string
		var names []ferry.Dir
		if err == nil {
			at, lease, seq := m.stamp()
			next, names, err = m.run(ctx, dir, depth, budget, at, lease, seq)
		}
		m.mu.Lock()
		f.names = names
		if err == nil && gen < maxGen {
			for _, d := range next {
				if m.listed(d) == nil {
					m.start(d, depth, budget/max(1, len(next)), gen+1)
				}
			}
		}
		f.done, f.err = true, err
		// A failed fetch stays visible to its waiters until they have
		// seen it; the next one replaces it.
		if m.fetching[dir] == f {
			delete(m.fetching, dir)
		}
		m.cond.Broadcast()
		m.mu.Unlock()
	}()
}

// run performs one prefetch: Find with a depth bound, filling entries as
// they arrive and each listing once the walk has left its directory. It
// returns the directories left to list below the bound and, if the walk
// read all of dir, the entries in it.
func (m *meta) run(ctx context.Context, dir string, depth, budget int, at time.Time, lease, seq uint64) (next []string, names []ferry.Dir, err error) {
	s := m.fsys.Find(ctx, dir, "depth<="+strconv.Itoa(depth))
	defer s.Close()
	type open struct {
		path  string
		names map[string]struct{}
	}
	var stack []open
	base := ferry.Depth(dir)
	n := 0
	complete := func(o open) { // m.mu is held.
		l := &listing{names: o.names, at: at, lease: m.leaseFor(o.path, lease, seq)}
		if lease != 0 && l.lease == 0 {
			// Begun under the lease, and the directory changed (or
			// the lease ended) while the walk was on its way: the
			// names may be older than the change, and are not trusted
			// at all (another client may hold changes to them back
			// under a write lease, which only a call recalls).
			l.at = time.Time{}
		}
		// The walk may have passed a name before or after this mount
		// (or another, by an event) created or removed it.
		for name, s := range m.kids[o.path] {
			if s > seq {
				if l.doubt == nil {
					l.doubt = map[string]uint64{}
				}
				l.doubt[name] = s
			}
		}
		m.dirs[o.path] = l
	}
	whole := []ferry.Dir{}
	for e := range s.All() {
		p := e.Dir.Path()
		if e.Err != nil {
			if p == dir {
				return nil, nil, e.Err
			}
			if path.Dir(p) == dir {
				whole = nil
			}
			// An unreadable entry: its directory's listing is
			// incomplete, so it is not recorded.
			m.mu.Lock()
			for i := range stack {
				if ferry.HasPrefix(p, stack[i].path) {
					stack[i].names = nil
				}
			}
			m.mu.Unlock()
			continue
		}
		m.mu.Lock()
		for len(stack) > 0 && !ferry.HasPrefix(p, stack[len(stack)-1].path) {
			if o := stack[len(stack)-1]; o.names != nil {
				complete(o)
			}
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].names != nil {
			stack[len(stack)-1].names[e.Dir.Name()] = struct{}{}
		}
		if _, ok := m.pending[p]; !ok && !m.changedSince(p, seq) {
			m.put(p, &entry{d: e.Dir, at: at, lease: m.leaseFor(p, lease, seq)})
		}
		if whole != nil && p != dir && path.Dir(p) == dir {
			whole = append(whole, e.Dir)
		}
		if e.Dir.IsDir() && ferry.Depth(p)-base < depth {
			stack = append(stack, open{path: p, names: map[string]struct{}{}})
		} else if e.Dir.IsDir() {
			next = append(next, p)
		}
		n++
		if n%256 == 0 {
			m.cond.Broadcast()
		}
		m.mu.Unlock()
		if budget > 0 && n >= budget {
			return nil, nil, nil // The open directories stay unlisted.
		}
	}
	if err := s.Err(); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	for i := len(stack) - 1; i >= 0; i-- {
		if stack[i].names != nil {
			complete(stack[i])
		}
	}
	m.mu.Unlock()
	if budget > 0 && n >= budget/2 {
		next = nil // Big enough: go on only where the walk goes.
	}
	return next, whole, nil
}

// set records d, the result of this mount's own call, at its path and in
// its parent's listing.
func (m *meta) set(d ferry.Dir) {
	p := d.Path()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markOwn(p)
	m.invalidated(p)
	m.data.drop(p, false)
	m.put(p, &entry{d: d, at: time.Now(), lease: m.lease})
	if l := m.dirs[path.Dir(p)]; l != nil && p != "/" {
		l.names[d.Name()] = struct{}{}
	}
}

// forget drops p and everything cached below it, and its name from its
// parent's listing: this mount removed it or learned that it is gone.
func (m *meta) forget(p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markOwn(p)
	m.invalidated(p)
	m.dropTree(p)
	if l := m.dirs[path.Dir(p)]; l != nil {
		delete(l.names, path.Base(p))
	}
}

// invalidate drops p and what is below it, and puts p's name in doubt in
// its parent's listing: p changed behind this mount's back.
func (m *meta) invalidate(p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.invalidateLocked(p)
}

// invalidateLocked is invalidate. m.mu is held.
func (m *meta) invalidateLocked(p string) {
	m.invalidated(p)
	m.dropTree(p)
	if l := m.dirs[path.Dir(p)]; l != nil && p != "/" {
		if l.doubt == nil {
			l.doubt = map[string]uint64{}
		}
		l.doubt[path.Base(p)] = m.seq
	}
}

// invalidateAll drops p and every entry and listing at or below it, whether
// or not a listing leads to it: events were lost.
func (m *meta) invalidateAll(p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.invalidated(p)
	m.data.drop(p, true)
	for q := range m.ents {
		if ferry.HasPrefix(q, p) {
			m.del(q)
		}
	}
	deleteBelow(m.dirs, p)
	if l := m.dirs[path.Dir(p)]; l != nil && p != "/" {
		if l.doubt == nil {
			l.doubt = map[string]uint64{}
		}
		l.doubt[path.Base(p)] = m.seq
	}
}

// deleteBelow deletes the keys of m that are p or paths below it.
func deleteBelow[V any](m map[string]V, p string) {
	for k := range m {
		if ferry.HasPrefix(k, p) {
			delete(m, k)
		}
	}
}

// dropTree drops p and, following the listings, what is cached below it.
// Entries below p that are in no listing are left to expire. m.mu is held.
func (m *meta) dropTree(p string) {
	m.data.drop(p, false)
	m.del(p)
	if l := m.dirs[p]; l != nil {
		delete(m.dirs, p)
		for name := range l.names {
			m.dropTree(path.Join(p, name))
		}
	}
}

// dropAll forgets everything: the lease is gone or events were lost.
func (m *meta) dropAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	m.allSeq = m.seq
	m.data.drop("/", true)
	clear(m.ents)
	clear(m.links)
	m.lru.Init()
	clear(m.dirs)
}

// setLease records that a watch is in place (on) or gone (off).
func (m *meta) setLease(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	if on {
		m.leases++
		m.lease = m.leases
	} else {
		m.lease = 0
	}
}

// update records d, what this mount's change in the background will
// make, at its path, in place of a pending file's entry if it has one.
func (m *meta) update(d ferry.Dir) {
	p := d.Path()
	m.mu.Lock()
	_, pending := m.pending[p]
	m.mu.Unlock()
	m.set(d)
	if pending {
		m.addPending(d)
	}
}

// absent reports whether p is known not to exist: its directory's
// listing is trusted and does not hold it.
func (m *meta) absent(p string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pending[p]; ok {
		return false
	}
	l := m.listed(path.Dir(p))
	if l == nil || p == "/" {
		return false
	}
	_, doubted := l.doubt[path.Base(p)]
	_, named := l.names[path.Base(p)]
	return !doubted && !named
}

// pendingBelow reports whether a file created here below the directory p
// is not yet on the server.
func (m *meta) pendingBelow(p string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q := range m.pending {
		if ferry.HasPrefix(q, p) {
			return true
		}
	}
	return false
}

// addPending records a file created here that is not yet on the server.
func (m *meta) addPending(d ferry.Dir) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.invalidated(d.Path())
	m.pending[d.Path()] = d
}

// dropPending forgets a pending file.
func (m *meta) dropPending(p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, p)
}

// renamed moves the cache's knowledge of from to to, as a Move did.
func (m *meta) renamed(from string, d ferry.Dir) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markOwn(from)
	m.markOwn(d.Path())
	m.invalidated(from)
	m.invalidated(d.Path())
	m.dropTree(from)
	delete(m.pending, from) // Whatever was pending there has moved.
	if l := m.dirs[path.Dir(from)]; l != nil {
		delete(l.names, path.Base(from))
	}
	to := d.Path()
	m.dropTree(to)
	m.put(to, &entry{d: d, at: time.Now(), lease: m.lease})
	if l := m.dirs[path.Dir(to)]; l != nil {
		l.names[d.Name()] = struct{}{}
	}
}

// touch moves the cached mtime and ctime of dir and its link count by
// nlink: this mount changed its entries, and the server's will have moved
// too. The times are those the server reported with got, the entry the
// change made, if it did (then they need no correcting when the change's
// echo arrives); else now.
func (m *meta) touch(dir string, nlink int64, got ferry.Dir) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markOwn(dir)
	if e := m.ents[dir]; e != nil {
		d := e.d.Clone()
		mt, ct := got[ferry.AttrParentMtime], got[ferry.AttrParentCtime]
		if mt == "" || ct == "" {
			now := strconv.FormatInt(time.Now().UnixNano(), 10)
			mt, ct = now, now
		}
		d[ferry.AttrMtime] = mt
		if _, ok := d[ferry.AttrCtime]; ok {
			d[ferry.AttrCtime] = ct
		}
		if n := d.Int(ferry.AttrNlink); n > 0 && nlink != 0 {
			d.SetInt(ferry.AttrNlink, n+nlink)
		}
		e.d = d
	}
}

// created records that this mount just made the directory dir, so its
// listing is known to be empty.
func (m *meta) created(dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dirs[dir] = &listing{names: map[string]struct{}{}, at: time.Now(), lease: m.lease}
}

// emptyDir reports whether the cache holds a trusted listing of the
// directory p that is empty, with no name in doubt.
func (m *meta) emptyDir(p string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.listed(p)
	return l != nil && len(l.names) == 0 && len(l.doubt) == 0
}

// ownWindow is how long after this mount changed a path an event for it
// is taken to be the echo of that change, and checked before it is acted on.
const ownWindow = 10 * time.Second

// expect marks ps as about to be changed by this mount, until the
// returned func is called once the call's answer is recorded. The server's
// event for the change can arrive, and be checked, before that answer: a
// check that then finds no entry leaves it to the answer, rather than
// dropping p, which would make the kernel forget the entry the call is
// making (a new directory's: getcwd then failed in it).
func (m *meta) expect(ps ...string) (done func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range ps {
		m.markOwn(p)
		m.inflight[p]++
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, p := range ps {
			if m.inflight[p]--; m.inflight[p] <= 0 {
				delete(m.inflight, p)
			}
		}
	}
}

// markOwn records that this mount changed p. m.mu is held.
func (m *meta) markOwn(p string) {
	now := time.Now()
	m.own[p] = now
	if len(m.own) > m.ownPrune {
		for q, t := range m.own {
			if now.Sub(t) > ownWindow {
				delete(m.own, q)
			}
		}
		// The next sweep waits until the paths have doubled, so that a
		// burst of changes (an rm -rf) does not sweep at each one.
		m.ownPrune = max(ownPruneMin, 2*len(m.own))
	}
}

// ownPruneMin is how many paths meta.own holds before old ones are swept.
const ownPruneMin = 4096

// worthChecking reports whether an event for p should be checked with a
// Stat before the cache is dropped: p was changed by this mount a moment
// ago (the event is likely its echo), or p is a cached directory (whose
// listing is worth keeping when only its times changed).
// invalidateForeign is invalidate, unless p is worth checking first: in
// one step, so that this mount's own change of p recorded in between
// (with the content it stored) is not dropped as if another's.
func (m *meta) invalidateForeign(p string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.worthCheckingLocked(p) {
		return false
	}
	m.invalidateLocked(p)
	return true
}

// worthCheckingLocked reports whether an event for p should be checked
// with a Stat before the cache is dropped: p was changed by this mount a
// moment ago (the event is likely its echo), or p is a cached directory
// (whose listing is worth keeping when only its times changed). m.mu is
// held.
func (m *meta) worthCheckingLocked(p string) bool {
	if t, ok := m.own[p]; ok && time.Since(t) < ownWindow {
		return true
	}
	e := m.ents[p]
	return e != nil && e.d.IsDir()
}

// check compares the server's answer for p (d or err, from a Stat begun at
// seq) with the cache. It returns true if the cache already agrees and
// nothing need be dropped; a directory whose attributes changed is updated
// in place, listing kept, and reported with attrs so the kernel's copy of
// its attributes is dropped.
func (m *meta) check(p string, d ferry.Dir, err error, seq uint64) (agrees, attrs bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkLocked(p, d, err, seq)
}

// invalidateUnchanged is invalidate, unless p changed since seq, when the
// answer that made the caller doubt the cache was asked for: it is then
// stale. What changed p since is newer: this mount's own call (whose
// result, and a stored file's content, the cache holds), or a change by
// others, whose own event is handled in its turn.
func (m *meta) invalidateUnchanged(p string, seq uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.changedSince(p, seq) {
		return false
	}
	m.invalidateLocked(p)
	return true
}

// checkLocked is check. m.mu is held.
func (m *meta) checkLocked(p string, d ferry.Dir, err error, seq uint64) (agrees, attrs bool) {
	// An answer that agrees with the cache confirms it, even if p
	// changed again meanwhile (the event often arrives before the reply
	// to the change that caused it); one that disagrees is believed
	// only if nothing changed p since the Stat began.
	changed := m.changedSince(p, seq)
	e := m.ents[p]
	if err != nil {
		if !ferry.IsKind(err, ferry.KindNotExist) || e != nil {
			return false, false
		}
		l := m.dirs[path.Dir(p)]
		if l == nil {
			return true, false
		}
		_, listed := l.names[path.Base(p)]
		return !listed, false
	}
	if e == nil {
		// A call of this mount is making p: its answer will say.
		return m.inflight[p] > 0, false
	}
	same := true
	for _, k := range []string{ferry.AttrType, ferry.AttrSize, ferry.AttrMtime, ferry.AttrMode, ferry.AttrUid, ferry.AttrGid, ferry.AttrTarget, ferry.AttrNlink, ferry.AttrRdev} {
		if e.d[k] != d[k] {
			same = false
		}
	}
	if same {
		return true, false
	}
	if !changed && e.d.IsDir() && d.IsDir() {
		e.d = d
		e.at, e.lease = time.Now(), m.lease
		return true, true
	}
	return false, false
}

// counts returns how many Finds and Stats the cache has issued.
func (m *meta) counts() (finds, stats uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.finds, m.stats
}

// size returns the entries held, and how many were evicted.
func (m *meta) size() (entries int, evicted uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ents), m.evicted
}
