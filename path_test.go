package ferry

import (
	"strings"
	"testing"
)

func TestCleanPath(t *testing.T) {
	cases := []struct {
		in, want string
		kind     Kind // KindOther: no error.
	}{
		{"", "/", KindOther},
		{"/", "/", KindOther},
		{"a//b/../c/", "/a/c", KindOther},
		{"/../../x", "/x", KindOther},
		{"..", "/", KindOther},
		{"/a\x00b", "", KindInvalid},
		{"/" + strings.Repeat("x", 255), "/" + strings.Repeat("x", 255), KindOther},
		{"/" + strings.Repeat("x", 256), "", KindInvalid},
		{strings.Repeat("/ab", 1366), "", KindInvalid},
	}
	for _, tc := range cases {
		got, err := CleanPath(tc.in)
		if tc.kind != KindOther {
			if KindOf(err) != tc.kind {
				t.Errorf("CleanPath(%.20q) error %v, want kind %v", tc.in, err, tc.kind)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("CleanPath(%.20q) = %.20q, %v; want %.20q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"", "/", "a/../../b", "/a//b/./c", "\x00", "/" + strings.Repeat("é", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := CleanPath(in)
		if err != nil {
			if KindOf(err) != KindInvalid {
				t.Fatalf("CleanPath(%q) failed with kind %v, want invalid", in, KindOf(err))
			}
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") || strings.Contains(p, "//") {
			t.Fatalf("CleanPath(%q) = %q: not rooted and clean", in, p)
		}
		for _, e := range Elems(p) {
			if e == ".." || e == "." || e == "" || len(e) > MaxNameLen {
				t.Fatalf("CleanPath(%q) = %q has element %q", in, p, e)
			}
		}
		if again, err := CleanPath(p); err != nil || again != p {
			t.Fatalf("CleanPath is not idempotent on %q: %q, %v", p, again, err)
		}
	})
}

func TestErrorKinds(t *testing.T) {
	err := E("op", "/p", KindNotExist, "gone")
	if !IsKind(err, KindNotExist) || KindOf(err) != KindNotExist {
		t.Errorf("KindOf(%v) = %v, want not exist", err, KindOf(err))
	}
	wrapped := E("outer", "/q", err)
	if KindOf(wrapped) != KindNotExist {
		t.Errorf("a wrapped error lost its kind: %v", KindOf(wrapped))
	}
	if got, want := err.Error(), "op /p: does not exist: gone"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestHasPrefix(t *testing.T) {
	for _, c := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/a", "/", true},
		{"/", "/", true},
		{"/ab", "/a", false},
		{"/a", "/a/b", false},
		{"/", "/a", false},
		{"/b/a", "/a", false},
		{"/a/b/c", "/a/b", true},
		{"/a/bc", "/a/b", false},
	} {
		if got := HasPrefix(c.p, c.dir); got != c.want {
			t.Errorf("HasPrefix(%q, %q) = %v, want %v", c.p, c.dir, got, c.want)
		}
	}
}

func TestIsCtl(t *testing.T) {
	for p, want := range map[string]bool{
		"/Ctl": true, "Ctl": true, "/Ctl/": true, "//Ctl/.": true, "/a/../Ctl": true,
		"/Ctl2": false, "/a/Ctl": false, "/ctl": false, "/": false, "": false, "/Ctl\x00": false,
	} {
		if got := IsCtl(p); got != want {
			t.Errorf("IsCtl(%q) = %v, want %v", p, got, want)
		}
	}
}
