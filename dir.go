package ferry

import (
	"encoding/base64"
	"io/fs"
	"maps"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Dir is a directory entry: a set of name/value attributes, as in ZX.
//
// The standard attributes are named by the Attr constants. Values are
// strings so that layers can add attributes of their own without changing the
// wire format. Attributes whose names start with an upper-case letter are
// decorations added by a layer (an address, an error, a cache state): they are
// never stored by a Tree and never sent where stored attributes are expected.
type Dir map[string]string

// The standard attribute names.
const (
	AttrName   = "name"   // AttrName is the last element of the path.
	AttrPath   = "path"   // AttrPath is the rooted, clean path in the tree ("/a/b").
	AttrType   = "type"   // AttrType is one of the Type constants.
	AttrSize   = "size"   // AttrSize is the size in bytes, decimal.
	AttrMode   = "mode"   // AttrMode is the permission bits in octal ("0644").
	AttrMtime  = "mtime"  // AttrMtime is the modification time in nanoseconds since the Unix epoch.
	AttrUid    = "uid"    // AttrUid is the numeric owner.
	AttrGid    = "gid"    // AttrGid is the numeric group.
	AttrTarget = "target" // AttrTarget is a symbolic link's target.
	AttrHash   = "hash"   // AttrHash is a content hash ("blake3:<hex>") where known.
	AttrNlink  = "nlink"  // AttrNlink is the number of hard links where known.
	AttrRdev   = "rdev"   // AttrRdev is a device's number (Linux encoding), decimal.
	AttrAtime  = "atime"  // AttrAtime is the access time in nanoseconds since the Unix epoch.
	AttrCtime  = "ctime"  // AttrCtime is the status change time in nanoseconds; it cannot be set.
	AttrIno    = "ino"    // AttrIno is the server's inode number where known: the same for hard links of one file.
)

// The values of AttrType.
const (
	TypeFile    = "f" // TypeFile is a regular file.
	TypeDir     = "d" // TypeDir is a directory.
	TypeSymlink = "l" // TypeSymlink is a symbolic link.
	TypeFifo    = "p" // TypeFifo is a named pipe: its data never crosses the wire.
	TypeSocket  = "s" // TypeSocket is a Unix socket's name.
	TypeChar    = "c" // TypeChar is a character device, with AttrRdev.
	TypeBlock   = "b" // TypeBlock is a block device, with AttrRdev.
	TypeOther   = "o" // TypeOther is an entry of any other kind: listed but not served.
)

// typeIFMT holds the S_IFMT bits of a POSIX file mode for each type that
// has them.
var typeIFMT = map[string]uint32{
	TypeFile:    0o100000,
	TypeDir:     0o040000,
	TypeSymlink: 0o120000,
	TypeFifo:    0o010000,
	TypeSocket:  0o140000,
	TypeChar:    0o020000,
	TypeBlock:   0o060000,
}

// IFMT returns the S_IFMT bits of a POSIX file mode for the type t, or 0
// for TypeOther or a type it does not know.
func IFMT(t string) uint32 { return typeIFMT[t] }

// TypeOfIFMT returns the type whose S_IFMT bits mode has, or TypeOther.
func TypeOfIFMT(mode uint32) string {
	for t, m := range typeIFMT {
		if mode&0o170000 == m {
			return t
		}
	}
	return TypeOther
}

// IsSpecial reports whether t names a node that holds no data of its own in
// the tree: a pipe, a socket or a device. Put creates them; Get refuses them.
func IsSpecial(t string) bool {
	switch t {
	case TypeFifo, TypeSocket, TypeChar, TypeBlock:
		return true
	}
	return false
}

// XattrPrefix begins the attributes that carry a file's or directory's
// extended attributes: "xattr.user.comment" holds the extended attribute
// user.comment, its value in standard base64. Trees carry the namespace
// XattrNamespace only: the others (security, trusted, system) mean
// something only to the server's own kernel and users. A Wstat that sets
// one to XattrRemove removes it.
const (
	XattrPrefix    = "xattr."
	XattrNamespace = "user."
	XattrRemove    = "-"
)

// Xattr returns the value of the extended attribute name, if d has it.
func (d Dir) Xattr(name string) ([]byte, bool) {
	s, ok := d[XattrPrefix+name]
	if !ok || s == XattrRemove {
		return nil, false
	}
	v, err := base64.StdEncoding.DecodeString(s)
	return v, err == nil
}

// SetXattr sets the extended attribute name to v.
func (d Dir) SetXattr(name string, v []byte) {
	d[XattrPrefix+name] = base64.StdEncoding.EncodeToString(v)
}

// Xattrs returns the names of d's extended attributes, sorted.
func (d Dir) Xattrs() []string {
	var names []string
	for k, v := range d {
		if strings.HasPrefix(k, XattrPrefix) && v != XattrRemove {
			names = append(names, k[len(XattrPrefix):])
		}
	}
	sort.Strings(names)
	return names
}

// KeepXattrs prepares d, the attributes of a file that replaces old whole,
// to keep old's extended attributes: it adds those d does not name and
// drops those d removes (there is nothing to remove from a new file).
func (d Dir) KeepXattrs(old Dir) {
	for k, v := range old {
		if _, named := d[k]; !named && strings.HasPrefix(k, XattrPrefix) {
			d[k] = v
		}
	}
	for k, v := range d {
		if strings.HasPrefix(k, XattrPrefix) && v == XattrRemove {
			delete(d, k)
		}
	}
}

// AttrParentMtime and AttrParentCtime are decorations of the entry that a
// Put, Move or Link returns, where the tree knows them: the mtime and
// ctime (nanoseconds) of the directory holding the entry right after the
// call, so that a client keeping that directory's attributes need not
// guess them.
const (
	AttrParentMtime = "ParentMtime"
	AttrParentCtime = "ParentCtime"
)

// IsDecoration reports whether the attribute name is a layer's decoration,
// which is never stored: names that start with an upper-case letter.
func IsDecoration(name string) bool {
	for _, r := range name {
		return unicode.IsUpper(r)
	}
	return false
}

// Stored returns a copy of d without decorations.
func (d Dir) Stored() Dir {
	out := make(Dir, len(d))
	for k, v := range d {
		if !IsDecoration(k) {
			out[k] = v
		}
	}
	return out
}

// Clone returns a copy of d; the copy of nil is an empty Dir.
func (d Dir) Clone() Dir {
	if d == nil {
		return Dir{}
	}
	return maps.Clone(d)
}

// Name returns the AttrName attribute.
func (d Dir) Name() string { return d[AttrName] }

// Path returns the AttrPath attribute.
func (d Dir) Path() string { return d[AttrPath] }

// Type returns the AttrType attribute; an entry without one is a file.
func (d Dir) Type() string {
	if t := d[AttrType]; t != "" {
		return t
	}
	return TypeFile
}

// Linked reports whether d is a file with other names (hard links), whose
// link count, ctime and content every name shares.
func (d Dir) Linked() bool {
	return !d.IsDir() && d.Int(AttrNlink) > 1 && d[AttrIno] != ""
}

// IsDir reports whether d is a directory.
func (d Dir) IsDir() bool { return d[AttrType] == TypeDir }

// Int returns a decimal attribute, or 0 if it is absent or malformed.
func (d Dir) Int(name string) int64 {
	n, _ := strconv.ParseInt(d[name], 10, 64)
	return n
}

// Size returns the AttrSize attribute.
func (d Dir) Size() int64 { return d.Int(AttrSize) }

// Mode returns the permission bits of AttrMode, with the setuid, setgid
// and sticky bits as fs.FileMode flags, or 0 if absent.
func (d Dir) Mode() fs.FileMode {
	n, _ := strconv.ParseUint(d[AttrMode], 8, 32)
	m := fs.FileMode(n) & fs.ModePerm
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Mtime returns the AttrMtime attribute as a time, or the zero time if absent.
func (d Dir) Mtime() time.Time {
	s, ok := d[AttrMtime]
	if !ok {
		return time.Time{}
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, n)
}

// Atime returns the AttrAtime attribute as a time, or the mtime if absent.
func (d Dir) Atime() time.Time { return d.timeOr(AttrAtime) }

// Ctime returns the AttrCtime attribute as a time, or the mtime if absent.
func (d Dir) Ctime() time.Time { return d.timeOr(AttrCtime) }

func (d Dir) timeOr(name string) time.Time {
	if _, ok := d[name]; ok {
		return time.Unix(0, d.Int(name))
	}
	return d.Mtime()
}

// SetInt sets a decimal attribute.
func (d Dir) SetInt(name string, v int64) { d[name] = strconv.FormatInt(v, 10) }

// SetMode sets AttrMode.
func (d Dir) SetMode(m fs.FileMode) {
	var bits uint32 = uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	d[AttrMode] = "0" + strconv.FormatUint(uint64(bits), 8)
}

// SetMtime sets AttrMtime.
func (d Dir) SetMtime(t time.Time) { d.SetInt(AttrMtime, t.UnixNano()) }

// String formats d as sorted name=value pairs, quoted where needed.
func (d Dir) String() string {
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		v := d[k]
		if v == "" || strings.ContainsAny(v, " \t\n\"'\\") {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	return b.String()
}

// ModeBits returns the mode bits of a Unix mode word as stored in AttrMode,
// for callers converting from syscall.Stat_t.
func ModeBits(m uint32) string {
	return "0" + strconv.FormatUint(uint64(m&0o7777), 8)
}
