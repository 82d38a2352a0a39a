package control

import "testing"

type step struct {
	cmd    []byte
	ok     bool
	deep   bool   // the first control of the result is deep
	holder string // the first control's holder, "" to not check
}

func grant(m string, deep bool, ps ...string) []byte { return GrantCmd(m, deep, ps...) }

func TestRules(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"shallow then other member below", []step{
			{grant("a", false, "/d"), true, false, "a"},
			{grant("b", false, "/d/f"), true, false, "b"},
		}},
		{"deep refuses others below", []step{
			{grant("a", true, "/d"), true, true, "a"},
			{grant("b", false, "/d/e/f"), false, true, "a"},
			{grant("a", false, "/d/e/f"), true, true, "a"}, // covered by its own deep control
		}},
		{"deep downgraded when another holds below", []step{
			{grant("b", false, "/d/x"), true, false, "b"},
			{grant("a", true, "/d"), true, false, "a"},
			{grant("c", false, "/d/y"), true, false, "c"},
		}},
		{"deep kept when only the asker holds below", []step{
			{grant("a", false, "/d/x"), true, false, "a"},
			{grant("a", true, "/d"), true, true, "a"},
		}},
		{"same path refused", []step{
			{grant("a", false, "/f"), true, false, "a"},
			{grant("b", true, "/f"), false, false, "a"},
			{grant("a", false, "/f"), true, false, "a"},
		}},
		{"holder widens to deep", []step{
			{grant("a", false, "/d"), true, false, "a"},
			{grant("a", true, "/d"), true, true, "a"},
			{grant("b", false, "/d/z"), false, true, "a"},
		}},
		{"rename all or nothing", []step{
			{grant("b", false, "/y"), true, false, "b"},
			{grant("a", false, "/x", "/y"), false, false, "b"},
			{grant("a", false, "/x"), true, false, "a"}, // /x was not granted by the refused rename
		}},
		{"root deep excludes everyone", []step{
			{grant("a", true, "/"), true, true, "a"},
			{grant("b", false, "/any/where"), false, true, "a"},
		}},
		{"malformed", []step{
			{[]byte{0xff, 0xff}, false, false, ""},
			{grant("a", false, "/a/../b"), false, false, ""},
			{grant("", false, "/a"), false, false, ""},
			{grant("a", false), false, false, ""},
			{grant("a", false, "/1", "/2", "/3"), false, false, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := New()
			for i, s := range tt.steps {
				r, err := DecodeResult(tab.Apply(uint64(i+2), s.cmd))
				if err != nil {
					t.Fatal(err)
				}
				if r.OK != s.ok {
					t.Fatalf("step %d: ok %v, want %v (%s)", i, r.OK, s.ok, r.Reason)
				}
				if s.holder != "" {
					if len(r.Controls) == 0 || r.Controls[0].Holder != s.holder || r.Controls[0].Deep != s.deep {
						t.Fatalf("step %d: controls %+v, want holder %s deep %v", i, r.Controls, s.holder, s.deep)
					}
				}
				if err := tab.Check(); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
		})
	}
}

func TestReleaseEpoch(t *testing.T) {
	tab := New()
	r, _ := DecodeResult(tab.Apply(5, grant("a", true, "/d")))
	c := r.Controls[0]
	if c.Epoch != 5 {
		t.Fatalf("epoch %d, want the grant's index 5", c.Epoch)
	}
	old := c
	old.Epoch = 4
	if r, _ := DecodeResult(tab.Apply(6, ReleaseCmd(old))); r.OK {
		t.Fatal("a release of another epoch was applied")
	}
	if r, _ := DecodeResult(tab.Apply(7, ReleaseCmd(c))); !r.OK {
		t.Fatalf("release refused: %s", r.Reason)
	}
	if _, ok := tab.Controller("/d/x"); ok || tab.Len() != 0 {
		t.Fatal("control left after release")
	}
	if r, _ := DecodeResult(tab.Apply(8, grant("b", true, "/d/x"))); !r.OK || r.Controls[0].Epoch != 8 {
		t.Fatalf("grant after release: %+v", r)
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	tab := New()
	tab.Apply(2, grant("a", true, "/d"))
	tab.Apply(3, grant("b", false, "/e/f"))
	tab.Apply(4, grant("c", true, "/e"))
	n := New()
	if err := n.Restore(tab.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if n.Sum() != tab.Sum() || n.Index() != 4 {
		t.Fatalf("restored table differs: %+v vs %+v", n.Rows(), tab.Rows())
	}
	if err := n.Restore([]byte("garbage")); err == nil {
		t.Fatal("garbage restored")
	}
}

// FuzzTable applies a command sequence drawn from the input to a table and
// checks its invariants after each command, and that a snapshot restores
// the same table.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{3, 0, 0, 4, 1, 1, 7, 2, 2, 0x83, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		tab := New()
		paths := []string{"/", "/a", "/a/b", "/a/b/c", "/a/d", "/e", "/e/f"}
		members := []string{"a", "b", "c"}
		for i := 0; i+2 < len(in); i += 3 {
			m, p, q := members[int(in[i])%3], paths[int(in[i+1])%len(paths)], paths[int(in[i+2])%len(paths)]
			var cmd []byte
			switch in[i] >> 6 {
			case 0:
				cmd = grant(m, in[i]&4 != 0, p)
			case 1:
				cmd = grant(m, in[i]&4 != 0, p, q)
			case 2:
				if c, ok := tab.Controller(p); ok {
					cmd = ReleaseCmd(c)
				} else {
					cmd = ReleaseCmd(Control{Path: p, Holder: m, Epoch: uint64(in[i+2])})
				}
			default:
				cmd = in[i : i+3]
			}
			tab.Apply(uint64(i+2), cmd)
			if err := tab.Check(); err != nil {
				t.Fatalf("after command %d: %v", i/3, err)
			}
		}
		n := New()
		if err := n.Restore(tab.Snapshot()); err != nil || n.Sum() != tab.Sum() {
			t.Fatalf("snapshot: %v", err)
		}
	})
}

// FuzzApply feeds arbitrary bytes as a command: it must never panic or
// break the table.
func FuzzApply(f *testing.F) {
	f.Add(grant("a", true, "/x"))
	f.Add(ReleaseCmd(Control{Path: "/x", Holder: "a", Epoch: 2}))
	f.Fuzz(func(t *testing.T, in []byte) {
		tab := New()
		tab.Apply(2, grant("z", false, "/x/y"))
		out := tab.Apply(3, in)
		if _, err := DecodeResult(out); err != nil {
			t.Fatal(err)
		}
		if err := tab.Check(); err != nil {
			t.Fatal(err)
		}
		if c, ok := tab.Controller("/x/y"); tab.Index() != 3 || !ok && tab.Len() != 0 || ok && c.Holder == "" {
			t.Fatalf("table after %x: index %d, rows %+v", in, tab.Index(), tab.Rows())
		}
	})
}

// FuzzJoin feeds Join and Remove arbitrary contexts: a member is recorded
// only from a whole one naming the id of the change, never twice, removed
// with its controls and never admitted again, and all of it survives a
// snapshot.
func FuzzJoin(f *testing.F) {
	f.Add(uint64(4), EncodeMember(Member{Name: "d", Addr: "d:1", Fingerprint: "SHA256:d", ID: 4}))
	f.Add(uint64(5), EncodeMember(Member{Name: "d", Addr: "d:1", Fingerprint: "SHA256:d", ID: 4}))
	f.Add(uint64(4), []byte{0x08, 0x04, 0xff})
	f.Fuzz(func(t *testing.T, id uint64, info []byte) {
		tab := New()
		tab.Apply(2, grant("a", true, "/x"))
		m, ok := tab.Join(3, id, info)
		if ok && (m.ID != id || m.ID == 0 || m.Name == "" || m.Addr == "" || m.Fingerprint == "") {
			t.Fatalf("joined %+v from %x for id %d", m, info, id)
		}
		if _, again := tab.Join(4, id, info); again {
			t.Fatal("a member joined twice")
		}
		if len(tab.Members()) != map[bool]int{true: 1, false: 0}[ok] || tab.Index() != 4 {
			t.Fatalf("members %+v, index %d", tab.Members(), tab.Index())
		}
		// Removed, it loses its controls and is not admitted again.
		tab.Apply(5, grant(m.Name, false, "/y"))
		gone, removed := tab.Remove(6, id, info)
		if ok && (!removed || gone != m) || removed && (gone.ID != id || gone.Name == "" || tab.Admits(id) || len(tab.Held(gone.Name)) != 0 || len(tab.Members()) != 0) {
			t.Fatalf("removing %+v (joined %v): %v %+v; admitted %v, holds %v", m, ok, removed, gone, tab.Admits(id), tab.Held(gone.Name))
		}
		if _, again := tab.Join(7, id, info); again {
			t.Fatal("a member removed joined again")
		}
		if err := tab.Check(); err != nil {
			t.Fatal(err)
		}
		back := New()
		if err := back.Restore(tab.Snapshot()); err != nil {
			t.Fatal(err)
		}
		if back.Sum() != tab.Sum() || len(back.Gone()) != len(tab.Gone()) || back.Admits(id) != tab.Admits(id) {
			t.Fatal("members do not survive a snapshot")
		}
	})
}
