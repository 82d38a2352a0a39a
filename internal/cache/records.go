package cache

import (
	"encoding/binary"
	"errors"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/chunk"
	"github.com/ferryfs/ferry/internal/store"
)

// records is where a disk that has one (store.Names) keeps, by path, a
// record of each file held on it: which chunks hold which version of the
// file. A later mount of the same server reads it on a miss, so a tree
// walked before is read from the disk without a byte of its files on the
// wire. A record is used only for the version it names: the same inode,
// size, mtime and ctime. A client can set a file's mtime back, but not
// its ctime, so a file changed while no mount watched it (a reproducible
// build's tar writes every file with one mtime) is never taken for the
// version recorded.
type records interface {
	Set(p string, v []byte)
	Get(p string) ([]byte, bool)
	Delete(p string)
}

// recordsOf returns disk's records, if it keeps any.
func recordsOf(disk store.ChunkCache) records {
	if d, ok := disk.(interface{ Names() *store.Names }); ok {
		return d.Names()
	}
	return nil
}

// recordVersion is the first byte of a record in the format below.
const recordVersion = 1

// encodeRecord returns the record of f: the version byte, the size as a
// uvarint, the inode, mtime and ctime each as a uvarint length and its
// bytes, then the chunks' hashes.
func encodeRecord(f *content) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(f.ino)+len(f.mtime)+len(f.ctime)+len(f.hashes)*chunk.HashSize)
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(f.size))
	for _, s := range []string{f.ino, f.mtime, f.ctime} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, h := range f.hashes {
		b = append(b, h[:]...)
	}
	return b
}

var errRecord = errors.New("cache: a malformed record")

// decodeRecord returns the content a record describes for the path p,
// held on disk.
func decodeRecord(p string, b []byte) (*content, error) {
	if len(b) == 0 || b[0] != recordVersion {
		return nil, errRecord
	}
	b = b[1:]
	size, n := binary.Uvarint(b)
	if n <= 0 || size > 1<<40 {
		return nil, errRecord
	}
	b = b[n:]
	var s [3]string
	for i := range s {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return nil, errRecord
		}
		s[i] = string(b[n : n+int(l)])
		b = b[n+int(l):]
	}
	if len(b)%chunk.HashSize != 0 || (len(b) == 0) != (size == 0) {
		return nil, errRecord
	}
	hs := make([]chunk.Hash, len(b)/chunk.HashSize)
	for i := range hs {
		copy(hs[i][:], b[i*chunk.HashSize:])
	}
	return &content{path: p, size: int64(size), ino: s[0], mtime: s[1], ctime: s[2], hashes: hs, onDisk: true, recorded: true}, nil
}

// versionOf reports whether f is the version of the file d describes
// that a record may stand for: one that names an inode and a ctime.
func (f *content) versionOf(d ferry.Dir) bool {
	return f.ino != "" && f.ctime != "" && f.ino == d[ferry.AttrIno] && f.ctime == d[ferry.AttrCtime] &&
		f.mtime == d[ferry.AttrMtime] && f.size == d.Size()
}
