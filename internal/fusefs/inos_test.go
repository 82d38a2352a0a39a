package fusefs

import (
	"strconv"
	"testing"
)

// TestInoTable: a path keeps its number until it is removed, a rename takes
// the numbers of a whole subtree along, and keys that are not paths are
// kept apart from the paths' tree.
func TestInoTable(t *testing.T) {
	tab := newInoTable(3)
	a, ab, abc, ad := tab.number("/a", false), tab.number("/a/b", false), tab.number("/a/b/c", false), tab.number("/a/d", false)
	link := tab.number("#77", false)
	if a != 3 || ab != 4 || abc != 5 || ad != 6 || link != 7 {
		t.Fatalf("first numbers: %d %d %d %d %d, want 3 to 7", a, ab, abc, ad, link)
	}
	if n := tab.number("/a/b/c", false); n != abc {
		t.Errorf("/a/b/c again: %d, want %d", n, abc)
	}
	if n := tab.number("/a/d", true); n == ad {
		t.Errorf("/a/d fresh kept its number %d", n)
	}
	ad = tab.number("/a/d", false)

	tab.move("/a/b", "/x/y")
	for _, c := range []struct {
		key  string
		want uint64 // 0: a number not given before
	}{
		{"/x/y", ab},
		{"/x/y/c", abc},
		{"/a", a},
		{"/a/d", ad},
		{"#77", link},
	} {
		if got := tab.number(c.key, false); got != c.want {
			t.Errorf("after the move %s: %d, want %d", c.key, got, c.want)
		}
	}
	if n := tab.number("/a/b/c", false); n == abc || n == ab {
		t.Errorf("/a/b/c after its move: %d, an old number", n)
	}

	// A rename over a name drops what that name held.
	tab.move("/x/y", "/a")
	if n := tab.number("/a/c", false); n != abc {
		t.Errorf("/a/c after the rename over /a: %d, want %d", n, abc)
	}
	if n := tab.number("/a/d", false); n == ad {
		t.Errorf("/a/d survived the rename over /a with %d", n)
	}

	tab.drop("/a")
	if n := tab.number("/a/c", false); n == abc {
		t.Errorf("/a/c survived the removal of /a with %d", n)
	}
	tab.drop("/nothing/here")
	tab.move("/nothing", "/else")
	if n := tab.number("#77", false); n != link {
		t.Errorf("#77 at the end: %d, want %d", n, link)
	}
	tab.set("#77", 99)
	tab.set("/s", 98)
	if tab.number("#77", false) != 99 || tab.number("/s", false) != 98 {
		t.Error("set did not take")
	}
}

// TestInoTableDrop: dropping one name takes that name alone and leaves
// every other path its number.
func TestInoTableDrop(t *testing.T) {
	tab := newInoTable(3)
	want := map[string]uint64{}
	for i := range 1000 {
		p := "/big/" + string(rune('a'+i%26)) + "/" + strconv.Itoa(i)
		want[p] = tab.number(p, false)
	}
	small := tab.number("/small/f", false)
	tab.drop("/small/f")
	for p, n := range want {
		if got := tab.number(p, false); got != n {
			t.Fatalf("%s after dropping /small/f: %d, want %d", p, got, n)
		}
	}
	if got := tab.number("/small/f", false); got == small {
		t.Errorf("/small/f kept its number %d after its drop", got)
	}
}
