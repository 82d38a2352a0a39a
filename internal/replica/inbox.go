package replica

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ferryfs/ferry"
)

// inbox records, per member, the last of its updates applied here, on
// disk as well as in memory: a member that restarts is sent again what
// the others kept for it (every update whose acknowledgement they did
// not get, and acknowledgements in flight are lost with the connection),
// and must skip what it applied already. Re-applying is not harmless:
// "move a b" then "put a" applied twice leaves the second a at b. Each
// record is written before the next update from its member is applied,
// so a member that stops re-applies at most the one update it was
// applying, which is harmless alone: a put or wstat sets what it set,
// and a remove, move or link whose source is gone fails.
type inbox struct {
	dir     string
	mu      sync.Mutex
	from    map[uint64]uint64 // member id -> seq
	changed chan struct{}
	files   map[uint64]*record
	closed  bool
}

// record is the file holding one member's last applied update: its
// sequence and a checksum, rewritten in place.
type record struct {
	mu      sync.Mutex
	fd      int
	written uint64
}

const recordSize = 12

// openInbox loads the records in dir, creating it if needed.
func openInbox(dir string) (*inbox, error) {
	in := &inbox{dir: dir, from: map[uint64]uint64{}, changed: make(chan struct{}), files: map[uint64]*record{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range names {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		seq, ok := decodeRecord(b)
		if !ok {
			return nil, fmt.Errorf("replica: the record of member %d's applied updates is damaged (%d bytes)", id, len(b))
		}
		in.from[id] = seq
	}
	return in, nil
}

func encodeRecord(seq uint64) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, recordSize), seq)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func decodeRecord(b []byte) (uint64, bool) {
	if len(b) != recordSize || crc32.ChecksumIEEE(b[:8]) != binary.BigEndian.Uint32(b[8:]) {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}

// close closes the records' files.
func (in *inbox) close() {
	in.mu.Lock()
	in.closed = true
	files := slices.Collect(maps.Values(in.files))
	in.mu.Unlock()
	for _, r := range files {
		r.mu.Lock()
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
		r.fd = -1
		r.mu.Unlock()
	}
}

// done records that id's update seq is applied, on disk before it
// returns.
func (in *inbox) done(id, seq uint64) error {
	return in.record(id, seq, false)
}

// cut records the updates a copy of the tree holds (see join.go): for the
// members named, exactly those; for others, none.
func (in *inbox) cut(seqs map[uint64]uint64) error {
	in.mu.Lock()
	for id := range in.from {
		if _, ok := seqs[id]; !ok {
			seqs[id] = 0
		}
	}
	in.mu.Unlock()
	for id, seq := range seqs {
		if err := in.record(id, seq, true); err != nil {
			return err
		}
	}
	return nil
}

// record sets id's last applied update to seq (to at least seq unless
// exact), in memory and then on disk.
func (in *inbox) record(id, seq uint64, exact bool) error {
	in.mu.Lock()
	if exact {
		in.from[id] = seq
	} else {
		in.from[id] = max(in.from[id], seq)
	}
	close(in.changed)
	in.changed = make(chan struct{})
	r := in.files[id]
	if r == nil {
		r = &record{fd: -1}
		in.files[id] = r
	}
	in.mu.Unlock()

	// What is written is read again under r.mu, so that of two records
	// made at once the later is the one left on disk; close, which
	// closes the file under r.mu, is seen here too.
	r.mu.Lock()
	defer r.mu.Unlock()
	in.mu.Lock()
	seq, closed := in.from[id], in.closed
	in.mu.Unlock()
	if closed {
		return ferry.E("replica", in.dir, ferry.KindUnavailable, "the inbox is closed")
	}
	if r.written == seq && r.fd >= 0 {
		return nil
	}
	name := filepath.Join(in.dir, strconv.FormatUint(id, 10))
	if r.fd < 0 {
		fd, err := unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return ferry.E("replica", name, ferry.KindIO, err)
		}
		r.fd = fd
	}
	if _, err := unix.Pwrite(r.fd, encodeRecord(seq), 0); err != nil {
		return ferry.E("replica", name, ferry.KindIO, err)
	}
	if err := unix.Fdatasync(r.fd); err != nil {
		return ferry.E("replica", name, ferry.KindIO, err)
	}
	r.written = seq
	return nil
}

// last returns the last of id's updates applied here.
func (in *inbox) last(id uint64) uint64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.from[id]
}

// wait waits until id's update seq is applied here.
func (in *inbox) wait(ctx context.Context, id, seq uint64) error {
	for {
		in.mu.Lock()
		got, ch := in.from[id], in.changed
		in.mu.Unlock()
		if got >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ferry.E("replica", "", ferry.KindUnavailable, fmt.Sprintf("waiting for another member's update %d: %v", seq, ctx.Err()))
		case <-ch:
		}
	}
}
