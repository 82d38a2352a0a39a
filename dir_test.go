package ferry

import (
	"io/fs"
	"testing"
	"time"
)

func TestModeRoundTrip(t *testing.T) {
	cases := []struct {
		attr string
		mode fs.FileMode
	}{
		{"0644", 0o644},
		{"0755", 0o755},
		{"04755", 0o755 | fs.ModeSetuid},
		{"02775", 0o775 | fs.ModeSetgid},
		{"01777", 0o777 | fs.ModeSticky},
		{"07000", fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky},
	}
	for _, tc := range cases {
		d := Dir{AttrMode: tc.attr}
		if got := d.Mode(); got != tc.mode {
			t.Errorf("Dir{mode=%s}.Mode() = %v, want %v", tc.attr, got, tc.mode)
		}
		d2 := Dir{}
		d2.SetMode(tc.mode)
		if d2[AttrMode] != tc.attr {
			t.Errorf("SetMode(%v) = %q, want %q", tc.mode, d2[AttrMode], tc.attr)
		}
	}
}

func TestDirAttributes(t *testing.T) {
	d := Dir{AttrName: "a", "Addr": "x", AttrSize: "12"}
	if s := d.Stored(); len(s) != 2 || s["Addr"] != "" {
		t.Errorf("Stored() = %v, want the decoration gone", s)
	}
	if d.Size() != 12 || d.Type() != TypeFile {
		t.Errorf("Size, Type = %d, %q", d.Size(), d.Type())
	}
	now := time.Unix(1700000000, 123)
	d.SetMtime(now)
	if !d.Mtime().Equal(now) {
		t.Errorf("Mtime = %v, want %v", d.Mtime(), now)
	}
	if got, want := (Dir{"b": "x y", "a": ""}).String(), `a="" b="x y"`; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestIFMT(t *testing.T) {
	for _, c := range []struct {
		typ  string
		bits uint32
	}{
		{TypeFile, 0o100000}, {TypeDir, 0o040000}, {TypeSymlink, 0o120000},
		{TypeFifo, 0o010000}, {TypeSocket, 0o140000}, {TypeChar, 0o020000}, {TypeBlock, 0o060000},
	} {
		if got := IFMT(c.typ); got != c.bits {
			t.Errorf("IFMT(%q) = %#o, want %#o", c.typ, got, c.bits)
		}
		if got := TypeOfIFMT(c.bits | 0o755); got != c.typ {
			t.Errorf("TypeOfIFMT(%#o) = %q, want %q", c.bits|0o755, got, c.typ)
		}
	}
	if got := IFMT(TypeOther); got != 0 {
		t.Errorf("IFMT(TypeOther) = %#o, want 0", got)
	}
	if got := TypeOfIFMT(0o644); got != TypeOther {
		t.Errorf("TypeOfIFMT(0o644) = %q, want %q", got, TypeOther)
	}
}
