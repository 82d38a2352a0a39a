package ferry

import (
	"path"
	"strings"
)

// Limits on paths, as on Linux.
const (
	MaxNameLen = 255  // MaxNameLen is the longest path element in bytes.
	MaxPathLen = 4096 // MaxPathLen is the longest path in bytes.
)

// CleanPath returns the rooted, clean form of p ("a//b/../c" is "/a/c").
// ".." never climbs above the root: "/../x" is "/x". Confinement on disk does
// not rest on this (a Tree resolves paths below its root itself); CleanPath
// gives every layer one spelling of each path. It fails with KindInvalid for a
// path with a NUL byte, an element longer than MaxNameLen or a total longer
// than MaxPathLen.
func CleanPath(p string) (string, error) {
	const op = "ferry.CleanPath"
	if strings.IndexByte(p, 0) >= 0 {
		return "", E(op, p, KindInvalid, "path contains a NUL byte")
	}
	if len(p) > MaxPathLen {
		return "", E(op, p[:64]+"...", KindInvalid, "path too long")
	}
	c := path.Clean("/" + p)
	for _, elem := range strings.Split(c, "/") {
		if len(elem) > MaxNameLen {
			return "", E(op, p, KindInvalid, "path element too long")
		}
	}
	return c, nil
}

// Elems returns the elements of a clean rooted path; "/" has none.
func Elems(p string) []string {
	if p == "/" || p == "" {
		return nil
	}
	return strings.Split(strings.TrimPrefix(p, "/"), "/")
}

// Depth returns how many elements p has below the root: 0 for "/".
func Depth(p string) int { return len(Elems(p)) }

// HasPrefix reports whether the clean path p is dir or lies below it.
func HasPrefix(p, dir string) bool {
	if dir == "/" || p == dir {
		return true
	}
	// Without building dir+"/": the caches call this for every entry
	// they hold when a tree is dropped.
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}
