package pred

import (
	"math/rand/v2"
	"path"
	"strings"
	"testing"
	"time"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"", "", true},
		{"", "a", false},
		{"abc", "abc", true},
		{"abc", "abd", false},
		{"a*", "abc", true},
		{"a*", "a/c", false},
		{"*c", "abc", true},
		{"a*c", "ac", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"?", "é", true},
		{"?", "/", false},
		{"??", "é", false},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{"[^a-c]x", "dx", true},
		{"[^a-c]x", "/x", false}, // Unlike path.Match, a class never matches '/'.
		{"[é]", "é", true},
		{`[\]]`, "]", true},
		{`[\-]`, "-", true},
		{`\*`, "*", true},
		{`\*`, "a", false},
		{`\[`, "[", true},
		{"**", "", true},
		{"**", "a/b/c", true},
		{"/src/**", "/src/a/b.go", true},
		{"/src/**", "/lib/a", false},
		{"/src/**.go", "/src/a/b.go", true},
		{"/src/**.go", "/src/a/b.c", false},
		{"/src/**/*.go", "/src/a/b/c.go", true},
		{"/src/**/*.go", "/src/c.go", true}, // **/ is zero or more directories.
		{"/src/**/*.go", "/srcc.go", false},
		{"/a/**/b", "/a/b", true},
		{"/a/**/b", "/a/x/y/b", true},
		{"/a/**/b", "/a/xb", false},
		{"**/b", "b", true},
		{"**/b", "x/b", true},
		{"**/b", "xb", false},
		{"x**/b", "x/b", true}, // Not a whole element: ** as ever.
		{"x**/b", "xb", false},
		{`\**/b`, "*/b", true},
		{"**/*_test.go", "/x/y_test.go", true},
		{"**/*_test.go", "/x/y_test.go/z", false},
		{"a**b", "a/x/b", true},
		{"a***b", "a/x/b", true},
		{"*a*", "x/a", false},
		{"**a*", "x/ab", true},
		{"**a*", "x/ab/c", false},
		{"**x*y", "x/xy", true}, // The "*" fails at '/'; "**" must take over.
		{"[*]", "*", true},
		{"[*][*]", "**", true},
		{"a?c", "a/c", false},
	} {
		g, err := compileGlob(tc.pattern)
		if err != nil {
			t.Errorf("compileGlob(%q): %v", tc.pattern, err)
			continue
		}
		if got := g.match(tc.s); got != tc.want {
			t.Errorf("%q match %q = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

func TestGlobBad(t *testing.T) {
	for _, p := range []string{"[", "[a", "[]", "[^]", "[a-", "[a-]", "[-a]", `\`, `a\`, `[\`, "[\xff]", "a[", "**[", "[]a]"} {
		if _, err := compileGlob(p); err != path.ErrBadPattern {
			t.Errorf("compileGlob(%q): %v, want %v", p, err, path.ErrBadPattern)
		}
	}
}

// TestGlobLikePathMatch checks that glob agrees with path.Match on random
// patterns and strings, but for "**" and for negated classes on strings with
// '/', which path.Match lets such a class match.
func TestGlobLikePathMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(parts []string, n int) string {
		var b strings.Builder
		for range r.IntN(n) {
			b.WriteString(parts[r.IntN(len(parts))])
		}
		return b.String()
	}
	patParts := []string{"a", "b", "é", "/", "*", "?", "[ab]", "[a-é]", "[^a]", `\*`, `\a`, "x"}
	strParts := []string{"a", "b", "é", "/", "*", "x", "\xff"}
	for range 20000 {
		p := pick(patParts, 7)
		if strings.Contains(p, "**") {
			continue
		}
		s := pick(strParts, 8)
		if strings.Contains(p, "^") && strings.Contains(s, "/") {
			continue
		}
		g, err := compileGlob(p)
		if err != nil {
			t.Fatalf("compileGlob(%q): %v", p, err)
		}
		want, _ := path.Match(p, s)
		if got := g.match(s); got != want {
			t.Errorf("%q match %q = %v, path.Match says %v", p, s, got, want)
		}
	}
}

// TestGlobLinear checks that many stars do not make matching exponential.
func TestGlobLinear(t *testing.T) {
	g, err := compileGlob(strings.Repeat("**a", 50) + "b")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Repeat("a", 4096)
	start := time.Now()
	if g.match(s) {
		t.Errorf("matched, want no match")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("match took %v", d)
	}
}
