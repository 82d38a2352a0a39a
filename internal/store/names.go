package store

import (
	"bytes"

	"github.com/cockroachdb/pebble/v2"
)

// MaxNames bounds the records Names keeps. Past it they are all dropped
// at once: each is only a shortcut to chunks the cache may hold, and the
// next walk records again what it reads.
const MaxNames = 1 << 20

// Names returns the cache's table of records by path: what a cache layer
// in disk mode wrote about each file it holds as chunks (which chunks,
// for which version of the file), so that a later mount of the same
// server finds them. The records are the caller's format; keys are 'n'
// and the path.
func (c *Cache) Names() *Names { return &Names{c: c} }

// Names is a Cache's table of records by path. Set and Delete hand
// their writes to the cache's background writer, as Add does, so a
// caller never waits for the store: a record lost (the backlog full, or
// a crash) costs a fetch, and one left stale is the caller's to check.
type Names struct{ c *Cache }

func nameKey(p string) []byte { return append([]byte{'n'}, p...) }

// Set records v for the path p.
func (n *Names) Set(p string, v []byte) { n.c.queueName(p, bytes.Clone(v)) }

// Delete forgets the record of the path p.
func (n *Names) Delete(p string) { n.c.queueName(p, nil) }

// Get returns the record of the path p, if there is one.
func (n *Names) Get(p string) ([]byte, bool) {
	v, ok, err := get(n.c.db, nameKey(p))
	return v, ok && err == nil
}

// queueName hands the background writer the record v of p (nil: its
// removal), unless the cache is closed or the backlog full.
func (c *Cache) queueName(p string, v []byte) {
	if p == "" {
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.closed {
		return
	}
	c.startWriter()
	select {
	case c.adds <- added{name: p, data: v}:
	default:
		c.dropped.Add(1)
	}
}

// writeName stores the record v of p, or removes it if v is nil. It does
// not read the table: it counts every record set, of a path recorded or
// not, towards MaxNames.
func (c *Cache) writeName(p string, v []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v == nil {
		c.db.Delete(nameKey(p), noSync)
		return
	}
	if c.names >= MaxNames {
		if c.db.DeleteRange([]byte{'n'}, []byte{'n' + 1}, noSync) == nil {
			c.names = 0
		}
	}
	if c.db.Set(nameKey(p), v, noSync) == nil {
		c.names++
	}
}

// countNames counts the records of db's table, for OpenCache.
func countNames(db *pebble.DB) (int64, error) {
	var n int64
	err := scan(db, []byte{'n'}, func(_, _ []byte) bool {
		n++
		return true
	})
	return n, err
}
