package remote

import (
	"container/list"
	"context"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
)

var _ ferry.CurrentGetter = (*Client)(nil)

// maxKeptRefs bounds the chunk references chunkMaps holds, about 48
// bytes each: 12 MiB, the lists of 2 GiB of files at the average chunk.
const maxKeptRefs = 256 << 10

// chunkMaps keeps the chunk lists of the files read by chunks, each with
// the file's version (its inode, size, mtime and ctime, as the cache's
// records name one), most recently used first, so that a read of the
// same version that a caller vouches for (GetCurrent) is served from the
// chunk cache with no call. The kernel drops pages of large files it
// read, and asks for them again; without the list each of those reads
// waits a round trip for it, or for a ranged Get of the bytes.
type chunkMaps struct {
	mu   sync.Mutex
	lru  list.List // Of *chunkMap.
	by   map[string]*list.Element
	refs int
	// fetching holds the whole fetches in progress (fetchWhole), each
	// closed when it ends; ranged the versions of files read from past
	// their start with no chunk list kept, at most maxRanged.
	fetching map[string]chan struct{}
	ranged   map[string]string
	// bg counts the whole fetches running, under bgCtx, which close
	// (Client.Close) cancels; no fetch starts once closed is set.
	bg     sync.WaitGroup
	bgCtx  context.Context
	cancel context.CancelFunc
	closed bool
}

// wholeWait bounds how long a read waits for its file's whole fetch: on
// a slow link (16 MiB take 33 s at 4 Mbit/s) the read is then a ranged
// Get, and the fetch goes on for the reads after it.
const wholeWait = time.Second

// wholeMax bounds the files GetCurrent fetches whole when a second read
// starts past a file's start and no chunk list is kept: at 100 Mbit/s
// about a second. A program that reads a file at scattered offsets (git
// its packs, a linker or a debugger a binary) would otherwise wait a
// round trip at each, and be sent up to a window of bytes past each read
// that the next read throws away (a cold git log -p received 64 MB for a
// 5.1 MB pack). The first such read is a ranged Get, so a program that
// reads only a file's end (tail) waits a round trip, not for the file.
// A larger file is read by ranges.
const wholeMax = 16 << 20

// maxRanged bounds chunkMaps.ranged; it is emptied when full.
const maxRanged = 4096

// rangedBefore reports whether the version of the file d describes was
// read from past its start before, and records that it is now.
func (m *chunkMaps) rangedBefore(d ferry.Dir) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := version(d)
	if m.ranged[d.Path()] == v {
		return true
	}
	if m.ranged == nil || len(m.ranged) >= maxRanged {
		m.ranged = map[string]string{}
	}
	m.ranged[d.Path()] = v
	return false
}

// chunkMap is the chunk list of one version of a file.
type chunkMap struct {
	path, version string
	refs          []chunk.Ref
}

// version returns what identifies the version of the file d describes.
// A client can set a file's mtime back, but not its ctime.
func version(d ferry.Dir) string {
	return d[ferry.AttrIno] + " " + d[ferry.AttrSize] + " " + d[ferry.AttrMtime] + " " + d[ferry.AttrCtime]
}

// keep records refs as the chunk list of the file d describes.
func (m *chunkMaps) keep(d ferry.Dir, refs []chunk.Ref) {
	var size int64
	for _, r := range refs {
		size += int64(r.Len)
	}
	if size != d.Size() || len(refs) > maxKeptRefs {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.by == nil {
		m.by = map[string]*list.Element{}
	}
	m.dropLocked(d.Path())
	m.by[d.Path()] = m.lru.PushFront(&chunkMap{path: d.Path(), version: version(d), refs: refs})
	m.refs += len(refs)
	for m.refs > maxKeptRefs {
		m.dropLocked(m.lru.Back().Value.(*chunkMap).path)
	}
}

// get returns the chunk list kept of the version of the file d describes.
func (m *chunkMaps) get(d ferry.Dir) ([]chunk.Ref, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.by[d.Path()]
	if !ok {
		return nil, false
	}
	f := e.Value.(*chunkMap)
	if f.version != version(d) {
		m.dropLocked(f.path)
		return nil, false
	}
	m.lru.MoveToFront(e)
	return f.refs, true
}

// drop forgets the list kept of p.
func (m *chunkMaps) drop(p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropLocked(p)
}

// dropLocked forgets the list kept of p; m.mu is held.
func (m *chunkMaps) dropLocked(p string) {
	if e, ok := m.by[p]; ok {
		m.refs -= len(e.Value.(*chunkMap).refs)
		m.lru.Remove(e)
		delete(m.by, p)
	}
}

// GetCurrent implements ferry.CurrentGetter: bytes off to off+count (to
// the end if count < 0) of the file d describes, from the chunk cache if
// a read of d's version by chunks left its chunk list; the bytes of a
// chunk the cache no longer holds, and after it, come by a plain Get.
func (c *Client) GetCurrent(ctx context.Context, d ferry.Dir, off, count int64) io.ReadCloser {
	p := d.Path()
	if c.cache == nil || off < 0 {
		return c.Get(ctx, p, off, count)
	}
	refs, ok := c.maps.get(d)
	if !ok && off > 0 && d.Size() <= wholeMax && c.byChunks(p) && c.maps.rangedBefore(d) {
		c.fetchWhole(ctx, p)
		refs, ok = c.maps.get(d)
	}
	if !ok {
		return c.Get(ctx, p, off, count)
	}
	end := d.Size()
	if count >= 0 {
		end = min(end, off+count)
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		pos, err := c.copyKept(ctx, pw, refs, off, end)
		if err != nil || pos >= end {
			pw.CloseWithError(err)
			return
		}
		// A chunk the cache no longer holds: the list is of no more use,
		// and the rest comes from the server.
		c.maps.drop(p)
		left := int64(-1)
		if count >= 0 {
			left = end - pos
		}
		r := c.getStream(ctx, p, pos, left)
		_, err = io.Copy(pw, r)
		r.Close()
		pw.CloseWithError(err)
	}()
	return &pipeReader{PipeReader: pr, ctx: ctx, cancel: cancel, path: p}
}

// copyKept writes bytes off to end of the file whose chunk list is refs
// to w from the chunk cache, and returns the offset it reached: end, or
// that of the first chunk the cache lacks.
func (c *Client) copyKept(ctx context.Context, w io.Writer, refs []chunk.Ref, off, end int64) (int64, error) {
	i := sort.Search(len(refs), func(i int) bool { return refs[i].Off+int64(refs[i].Len) > off })
	pos := off
	for i < len(refs) && pos < end {
		batch := refs[i:min(len(refs), i+64)]
		hs := make([]chunk.Hash, len(batch))
		for j, r := range batch {
			hs[j] = r.Hash
		}
		bctx, cancel := context.WithCancel(ctx)
		next := c.cache.GetMany(bctx, hs)
		for _, r := range batch {
			data, ok := next()
			if !ok || len(data) != r.Len {
				cancel()
				return pos, ctx.Err()
			}
			data = data[pos-r.Off : min(int64(r.Len), end-r.Off)]
			if _, err := w.Write(data); err != nil {
				cancel()
				return pos, err
			}
			pos += int64(len(data))
			if pos >= end {
				break
			}
		}
		cancel()
		i += len(batch)
	}
	return pos, nil
}

// fetchWhole fetches the file at p by chunks into the chunk cache, which
// keeps its chunk list, and returns when that is done, ctx ends or
// wholeWait has passed; the fetch goes on until the client closes. Reads
// that come meanwhile wait for the same fetch.
func (c *Client) fetchWhole(ctx context.Context, p string) {
	m := &c.maps
	m.mu.Lock()
	done, ok := m.fetching[p]
	if !ok {
		if m.closed {
			m.mu.Unlock()
			return
		}
		if m.fetching == nil {
			m.fetching = map[string]chan struct{}{}
		}
		if m.bgCtx == nil {
			m.bgCtx, m.cancel = context.WithCancel(context.Background())
		}
		done = make(chan struct{})
		m.fetching[p] = done
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			defer func() {
				m.mu.Lock()
				delete(m.fetching, p)
				m.mu.Unlock()
				close(done)
			}()
			r := c.getByChunks(m.bgCtx, p)
			io.Copy(io.Discard, r)
			r.Close()
		}()
	}
	m.mu.Unlock()
	t := time.NewTimer(wholeWait)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// close ends the whole fetches and waits for them: they use the chunk
// cache, which the client may close next.
func (m *chunkMaps) close() {
	m.mu.Lock()
	m.closed = true
	cancel := m.cancel
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.bg.Wait()
}
