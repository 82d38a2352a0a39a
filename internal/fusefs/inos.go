package fusefs

import (
	"strings"
	"sync"
)

// inoTable numbers the paths the kernel has seen, so that a path keeps its
// inode number when the kernel forgets it and looks it up again (git
// compares them), and takes it along when renamed here. Paths are held as a
// tree of names: a removal or a rename costs the depth of its path, not the
// number of paths seen (an rm -rf removes a tree one name at a time). Keys
// that are not paths (a linked file's, inoKey; the control file's) are kept
// apart.
type inoTable struct {
	mu    sync.Mutex
	last  uint64
	root  inoNode
	other map[string]uint64
}

// inoNode is a path's number (0 if it has none) and the names below it.
type inoNode struct {
	ino  uint64
	kids map[string]*inoNode
}

// newInoTable returns a table whose first number is first.
func newInoTable(first uint64) *inoTable {
	return &inoTable{last: first - 1, other: map[string]uint64{}}
}

// number returns key's number, giving it a new one if it has none or if
// fresh is set (another file now has the path).
func (t *inoTable) number(key string, fresh bool) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !isPath(key) {
		if n, ok := t.other[key]; ok && !fresh {
			return n
		}
		t.last++
		t.other[key] = t.last
		return t.last
	}
	nd := t.walk(key, true)
	if nd.ino == 0 || fresh {
		t.last++
		nd.ino = t.last
	}
	return nd.ino
}

// set gives key the number ino.
func (t *inoTable) set(key string, ino uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !isPath(key) {
		t.other[key] = ino
		return
	}
	t.walk(key, true).ino = ino
}

// drop forgets the numbers of p and of every path below it.
func (t *inoTable) drop(p string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.detach(p)
}

// move gives to, and the paths below it, the numbers of from and of the
// paths below it; from's are forgotten, and so are to's own.
func (t *inoTable) move(from, to string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	nd := t.detach(from)
	t.detach(to)
	if nd == nil || !isPath(to) || to == "/" {
		return
	}
	dir, name := splitPath(to)
	parent := t.walk(dir, true)
	if parent.kids == nil {
		parent.kids = map[string]*inoNode{}
	}
	parent.kids[name] = nd
}

// detach removes the node of p from the tree and returns it, or nil if p
// has none; the root is never removed. t.mu is held.
func (t *inoTable) detach(p string) *inoNode {
	if !isPath(p) || p == "/" {
		return nil
	}
	dir, name := splitPath(p)
	parent := t.walk(dir, false)
	if parent == nil {
		return nil
	}
	nd := parent.kids[name]
	delete(parent.kids, name)
	return nd
}

// walk returns the node of the path p, making it and the nodes above it if
// create is set; else nil if it has none. t.mu is held.
func (t *inoTable) walk(p string, create bool) *inoNode {
	nd := &t.root
	rest := strings.TrimPrefix(p, "/")
	for rest != "" {
		var name string
		name, rest, _ = strings.Cut(rest, "/")
		if name == "" {
			continue
		}
		kid := nd.kids[name]
		if kid == nil {
			if !create {
				return nil
			}
			if nd.kids == nil {
				nd.kids = map[string]*inoNode{}
			}
			kid = &inoNode{}
			nd.kids[name] = kid
		}
		nd = kid
	}
	return nd
}

// isPath reports whether key is a path, as opposed to the other keys of an
// inoTable.
func isPath(key string) bool { return strings.HasPrefix(key, "/") }

// splitPath splits the clean path p, not "/", into its directory and name.
func splitPath(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '/')
	dir, name = p[:i], p[i+1:]
	if dir == "" {
		dir = "/"
	}
	return dir, name
}
