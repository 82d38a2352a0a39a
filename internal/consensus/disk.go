package consensus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ferryfs/ferry/internal/store"
)

// Disk keeps a member's raft log, hard state and latest snapshot in pebble,
// synced before raft's messages that depend on them leave. A member that
// restarts loads it into raft's memory storage and goes on.
type Disk struct {
	db *pebble.DB
}

var (
	keyHard = []byte("h")
	keySnap = []byte("s")
)

// keyEntry is the key of the entry at index; keys sort by index.
func keyEntry(index uint64) []byte { return binary.BigEndian.AppendUint64([]byte("e"), index) }

// OpenDisk opens (creating if needed) the log in dir.
func OpenDisk(dir string) (*Disk, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: store.Quiet{}})
	if err != nil {
		return nil, fmt.Errorf("consensus: open log: %w", err)
	}
	return &Disk{db: db}, nil
}

// Close closes the log.
func (d *Disk) Close() error { return d.db.Close() }

// save stores what one Ready asks to persist, synced.
func (d *Disk) save(hs raftpb.HardState, ents []raftpb.Entry, snap raftpb.Snapshot) error {
	b := d.db.NewBatch()
	defer b.Close()
	if !raft.IsEmptySnap(snap) {
		data, err := snap.Marshal()
		if err != nil {
			return err
		}
		if err := b.Set(keySnap, data, nil); err != nil {
			return err
		}
		if err := b.DeleteRange(keyEntry(0), keyEntry(snap.Metadata.Index+1), nil); err != nil {
			return err
		}
	}
	if len(ents) > 0 {
		// Entries from the first index on replace what the log held there.
		if err := b.DeleteRange(keyEntry(ents[0].Index), keyEntry(math.MaxUint64), nil); err != nil {
			return err
		}
		for i := range ents {
			data, err := ents[i].Marshal()
			if err != nil {
				return err
			}
			if err := b.Set(keyEntry(ents[i].Index), data, nil); err != nil {
				return err
			}
		}
	}
	if !raft.IsEmptyHardState(hs) {
		data, err := hs.Marshal()
		if err != nil {
			return err
		}
		if err := b.Set(keyHard, data, nil); err != nil {
			return err
		}
	}
	if b.Empty() {
		return nil
	}
	return b.Commit(pebble.Sync)
}

// saveSnapshot stores a snapshot the member took itself.
func (d *Disk) saveSnapshot(snap raftpb.Snapshot) error {
	data, err := snap.Marshal()
	if err != nil {
		return err
	}
	return d.db.Set(keySnap, data, pebble.Sync)
}

// compact drops the entries up to index, which a saved snapshot covers.
func (d *Disk) compact(index uint64) error {
	return d.db.DeleteRange(keyEntry(0), keyEntry(index+1), pebble.NoSync)
}

// load returns raft's memory storage as the disk left it.
func (d *Disk) load() (*raft.MemoryStorage, error) {
	mem := raft.NewMemoryStorage()
	var snap raftpb.Snapshot
	if v, ok, err := d.get(keySnap); err != nil {
		return nil, err
	} else if ok {
		if err := snap.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("consensus: snapshot on disk: %w", err)
		}
		if err := mem.ApplySnapshot(snap); err != nil {
			return nil, err
		}
	}
	it, err := d.db.NewIter(&pebble.IterOptions{LowerBound: keyEntry(snap.Metadata.Index + 1), UpperBound: keyEntry(math.MaxUint64)})
	if err != nil {
		return nil, err
	}
	var ents []raftpb.Entry
	for ok := it.First(); ok; ok = it.Next() {
		var e raftpb.Entry
		if err := e.Unmarshal(it.Value()); err != nil {
			it.Close()
			return nil, fmt.Errorf("consensus: entry on disk: %w", err)
		}
		ents = append(ents, e)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if err := mem.Append(ents); err != nil {
		return nil, err
	}
	if v, ok, err := d.get(keyHard); err != nil {
		return nil, err
	} else if ok {
		var hs raftpb.HardState
		if err := hs.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("consensus: hard state on disk: %w", err)
		}
		if err := mem.SetHardState(hs); err != nil {
			return nil, err
		}
	}
	return mem, nil
}

func (d *Disk) get(k []byte) ([]byte, bool, error) {
	v, closer, err := d.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), true, nil
}
