package local

import (
	"context"
	"errors"
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

// Watch implements ferry.Watcher with inotify: one watch per directory of the
// subtree, added as directories appear. It sees changes made through the
// tree and changes made directly in the directory by other programs alike.
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
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return ferry.E(op, p, ferry.KindIO, err)
		}
		// os.NewFile puts the non-blocking descriptor in the poller, so a
		// Read waits without a thread and Close ends it.
		f := os.NewFile(uintptr(fd), "inotify")
		var once sync.Once
		closeF := func() { once.Do(func() { f.Close() }) }
		defer closeF()
		stop := context.AfterFunc(ctx, closeF)
		defer stop()

		w := &watch{t: t, fd: fd, root: p, paths: map[int]string{}}
		if err := w.add(p, nil); err != nil {
			return err
		}
		if err := send(ferry.Event{Path: p, Lost: true}); err != nil {
			return err
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				if ctx.Err() != nil {
					return ferry.E(op, p, ferry.KindCanceled, ctx.Err())
				}
				return ferry.E(op, p, ferry.KindIO, err)
			}
			for _, ev := range w.parse(buf[:n]) {
				if err := send(ev); err != nil {
					return err
				}
			}
			if _, ok := w.paths[w.rootWd]; !ok {
				return ferry.E(op, p, ferry.KindNotExist, "the watched directory went away")
			}
		}
	})
}

// watch is the state of one Watch: which directory each watch descriptor
// stands for.
type watch struct {
	t      *Tree
	fd     int
	root   string
	rootWd int
	paths  map[int]string
}

// add watches the directory p and every directory below it. Entries found
// in directories that were not watched before are reported through found,
// since they may have appeared before their directory's watch was in place.
func (w *watch) add(p string, found func(string)) error {
	d, err := w.t.root.Open(rel(p))
	if err != nil {
		return fail("local.Watch", p, err)
	}
	wd, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(int(d.Fd())), watchMask)
	if err != nil {
		d.Close()
		if errors.Is(err, unix.ENOTDIR) {
			return nil // A file: its parent's watch covers it.
		}
		return fail("local.Watch", p, err)
	}
	if p == w.root && len(w.paths) == 0 {
		w.rootWd = wd
	}
	w.paths[wd] = p
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return nil // Vanished or unreadable: its events will say so.
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
	return nil
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
			out = append(out, ferry.Event{Path: w.root, Lost: true})
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
					w.forget(dir)
					if dir == w.root {
						delete(w.paths, w.rootWd) // Ends the watch.
					}
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
		if q != w.root && ferry.HasPrefix(q, p) {
			delete(w.paths, wd)
		}
	}
}
