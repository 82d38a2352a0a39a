package store

import (
	"testing"
)

// TestNames: records are kept by path across a reopen, replaced, deleted
// and counted.
func TestNames(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Names()
	n.Set("/a", []byte("1"))
	n.Set("/a", []byte("2"))
	n.Set("/b/c", []byte("3"))
	n.Set("/b/d", []byte("4"))
	n.Delete("/b/d")
	n.Delete("/missing")
	// Close waits for the writes handed to the background.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c, err = OpenCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n = c.Names()
	for _, tc := range []struct {
		p, want string
		ok      bool
	}{
		{"/a", "2", true},
		{"/b/c", "3", true},
		{"/b/d", "", false},
		{"/b", "", false},
	} {
		v, ok := n.Get(tc.p)
		if ok != tc.ok || string(v) != tc.want {
			t.Errorf("Get(%s) = %q, %v; want %q, %v", tc.p, v, ok, tc.want, tc.ok)
		}
	}
	if got := c.names; got != 2 {
		t.Errorf("after reopening, Len = %d, want 2", got)
	}
}

// TestNamesBounded: past MaxNames the table starts again rather than grow.
func TestNamesBounded(t *testing.T) {
	c, err := OpenCache("", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := c.Names()
	c.mu.Lock()
	c.names = MaxNames - 1 // As if the table were nearly full.
	c.mu.Unlock()
	// What the background writer does with each Set.
	c.writeName("/x", []byte("x"))
	if got := c.names; got != MaxNames {
		t.Fatalf("Len = %d, want %d", got, MaxNames)
	}
	c.writeName("/y", []byte("y"))
	if got := c.names; got != 1 {
		t.Errorf("past the bound, Len = %d, want 1", got)
	}
	if _, ok := n.Get("/x"); ok {
		t.Error("a record from before the reset is still there")
	}
	if v, ok := n.Get("/y"); !ok || string(v) != "y" {
		t.Errorf("the record made at the reset is %q, %v", v, ok)
	}
}
