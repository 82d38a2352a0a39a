package local

import (
	"context"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
)

var _ ferry.Watcher = (*Tree)(nil)

// watchMask is what a watch asks inotify for: every change to an entry's
// content, attributes or name, and the loss of the watched directory.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Watch implements ferry.Watcher with inotify. All the Watches of a Tree
// share one inotify instance, with one watch per directory whatever the
// number of Watches covering it: the kernel allows a user 128 instances by
// default, and a server holds a Watch for every mount. Directories are
// watched as they appear. A Watch sees changes made through the tree and
// changes made directly in the directory by other programs alike.
// Directories are opened through the root and watched through their
// /proc/self/fd links (which inotify must follow, so no IN_DONT_FOLLOW), so
// a watch never resolves a path outside the root.
func (t *Tree) Watch(ctx context.Context, p string) *ferry.Stream[ferry.Event] {
	const op = "local.Watch"
	p, err := clean(ctx, op, p)
	if err != nil {
		return ferry.ErrStream[ferry.Event](err)
	}
	return ferry.NewStream(ctx, func(ctx context.Context, send func(ferry.Event) error) error {
		w, err := t.watcher()
		if err != nil {
			return ferry.E(op, p, ferry.KindIO, err)
		}
		sub := &watchSub{root: p, wake: make(chan struct{}, 1)}
		defer w.unsubscribe(sub)
		if err := w.subscribe(sub); err != nil {
			return err
		}
		if err := send(ferry.Event{Path: p, Lost: true}); err != nil {
			return err
		}
		for {
			select {
			case <-ctx.Done():
				return ferry.E(op, p, ferry.KindCanceled, ctx.Err())
			case <-sub.wake:
			}
			evs, lost, err := sub.take()
			if lost {
				evs = []ferry.Event{{Path: p, Lost: true}}
			}
			for _, ev := range evs {
				if err := send(ev); err != nil {
					return err
				}
			}
			if err != nil {
				return err
			}
		}
	})
}

// watchQueue bounds the events waiting for one Watch's reader: past it
// they are dropped for one Lost event for the Watch's root, so that a slow
// reader neither holds the others up nor grows without bound.
const watchQueue = 4096

// watchSub is one Watch of a shared watch: the events for its subtree not
// yet sent.
type watchSub struct {
	root  string
	dir   string // root, or its directory if root is no directory.
	dirWd int
	wake  chan struct{}

	mu   sync.Mutex
	evs  []ferry.Event
	lost bool  // Events were dropped.
	err  error // Why the Watch ends, once it must.
}

// put queues evs, the events for the subscriber's subtree, or its end.
func (s *watchSub) put(evs []ferry.Event, err error) {
	s.mu.Lock()
	if len(s.evs)+len(evs) > watchQueue {
		s.evs, s.lost = nil, true
	} else if !s.lost {
		s.evs = append(s.evs, evs...)
	}
	if err != nil && s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *watchSub) take() (evs []ferry.Event, lost bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs, lost, err = s.evs, s.lost, s.err
	s.evs, s.lost = nil, false
	return evs, lost, err
}

// watcher returns the Tree's shared watch, starting it if no Watch runs.
func (t *Tree) watcher() (*watch, error) {
	t.watchMu.Lock()
	defer t.watchMu.Unlock()
	if t.watch != nil {
		t.watch.refs++
		return t.watch, nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// os.NewFile puts the non-blocking descriptor in the poller, so a
	// Read waits without a thread and Close ends it.
	w := &watch{t: t, fd: fd, f: os.NewFile(uintptr(fd), "inotify"), paths: map[int]string{}, subs: map[*watchSub]bool{}, refs: 1}
	t.watch = w
	go w.read()
	return w, nil
}

// watch is a Tree's shared inotify instance: which directory each watch
// descriptor stands for, and the Watches it serves.
type watch struct {
	t    *Tree
	fd   int
	f    *os.File
	refs int // Watches holding it; the Tree's watchMu guards it.

	mu    sync.Mutex // Guards paths and subs.
	paths map[int]string
	subs  map[*watchSub]bool
}

// subscribe watches sub's subtree and starts passing it its events.
func (w *watch) subscribe(sub *watchSub) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	sub.dir = sub.root
	if fi, err := w.t.root.Lstat(rel(sub.root)); err == nil && !fi.IsDir() {
		sub.dir = path.Dir(sub.root) // A file: its directory's watch covers it.
	}
	wd, err := w.add(sub.dir, nil)
	if err != nil {
		return err
	}
	sub.dirWd = wd
	w.subs[sub] = true
	return nil
}

// unsubscribe stops passing sub events, and ends the shared watch when
// no Watch is left. The kernel's watches stay while any Watch runs: there
// is at most one per directory of the tree.
func (w *watch) unsubscribe(sub *watchSub) {
	w.mu.Lock()
	delete(w.subs, sub)
	w.mu.Unlock()
	w.t.watchMu.Lock()
	defer w.t.watchMu.Unlock()
	if w.refs--; w.refs == 0 {
		w.t.watch = nil
		w.f.Close()
	}
}

// read passes the events the kernel reports to the Watches they concern
// until the instance is closed.
func (w *watch) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		w.mu.Lock()
		if err != nil {
			for sub := range w.subs {
				sub.put(nil, ferry.E("local.Watch", sub.root, ferry.KindIO, err))
			}
			w.mu.Unlock()
			return
		}
		evs := w.parse(buf[:n])
		for sub := range w.subs {
			var mine []ferry.Event
			for _, ev := range evs {
				if ev.Path == "" || ferry.HasPrefix(ev.Path, sub.root) {
					if ev.Path == "" {
						ev.Path = sub.root
					}
					mine = append(mine, ev)
				}
			}
			var gone error
			if w.paths[sub.dirWd] != sub.dir {
				gone = ferry.E("local.Watch", sub.root, ferry.KindNotExist, "the watched directory went away")
			}
			if len(mine) > 0 || gone != nil {
				sub.put(mine, gone)
			}
		}
		w.mu.Unlock()
	}
}

// add watches the directory p and every directory below it, and returns
// p's watch descriptor. Entries found in directories that were not watched
// before are reported through found, since they may have appeared before
// their directory's watch was in place. The caller holds w.mu.
func (w *watch) add(p string, found func(string)) (int, error) {
	d, err := w.t.root.Open(rel(p))
	if err != nil {
		return 0, fail("local.Watch", p, err)
	}
	wd, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(int(d.Fd())), watchMask)
	if err != nil {
		d.Close()
		return 0, fail("local.Watch", p, err)
	}
	w.paths[wd] = p
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return wd, nil // Vanished or unreadable: its events will say so.
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		cp := path.Join(p, e.Name())
		if found != nil {
			found(cp)
		}
		if e.IsDir() {
			w.add(cp, found)
		}
	}
	return wd, nil
}

// parse turns a buffer of inotify events into Events, updating the watches
// as directories come, go and move.
func (w *watch) parse(b []byte) []ferry.Event {
	var out []ferry.Event
	for len(b) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		b = b[end:]
		mask := raw.Mask
		if mask&unix.IN_Q_OVERFLOW != 0 {
			// No path: every Watch has lost events.
			out = append(out, ferry.Event{Lost: true})
			continue
		}
		dir, ok := w.paths[int(raw.Wd)]
		if !ok {
			continue
		}
		if mask&unix.IN_IGNORED != 0 {
			delete(w.paths, int(raw.Wd))
			continue
		}
		if name == "" {
			// The watched directory itself: deleted or moved away.
			if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
				out = append(out, ferry.Event{Path: dir, Lost: true})
				if mask&unix.IN_MOVE_SELF != 0 {
					w.forget(dir) // Ends the Watches of dir and below.
				}
			} else {
				out = append(out, ferry.Event{Path: dir})
			}
			continue
		}
		if strings.HasPrefix(name, TempPrefix) {
			continue
		}
		p := path.Join(dir, name)
		isDir := mask&unix.IN_ISDIR != 0
		switch {
		case isDir && mask&unix.IN_MOVED_FROM != 0:
			w.forget(p)
			out = append(out, ferry.Event{Path: p, Lost: true})
		case isDir && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			out = append(out, ferry.Event{Path: p, Lost: mask&unix.IN_MOVED_TO != 0})
			w.add(p, func(q string) { out = append(out, ferry.Event{Path: q}) })
		default:
			out = append(out, ferry.Event{Path: p})
		}
	}
	return out
}

// forget drops the watches of p and below from the path map; the kernel's
// watches follow the inodes, and are re-mapped if they reappear in the tree.
func (w *watch) forget(p string) {
	for wd, q := range w.paths {
		if ferry.HasPrefix(q, p) {
			delete(w.paths, wd)
		}
	}
}
