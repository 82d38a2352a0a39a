package pred

import (
	"errors"
	"testing"

	"github.com/ferryfs/ferry"
)

// FuzzParse checks that Parse never panics, that its errors are well formed,
// and that String is canonical: it parses back to the same String, an
// equivalent predicate and the same depth bound, which is sound on the
// samples.
func FuzzParse(f *testing.F) {
	for _, s := range roundTripInputs {
		f.Add(s)
	}
	for _, s := range []string{
		"(", ")", "!", "&", "|", "a", "a=", "=a", "a==b", "a=!b", "'", `"\`, `'\q'`,
		"name~[", "size>1Q", "age~1d", "mtime>2024-99-99", "depth<x", "a=1 ) b=2",
		"not", "not not", "and=1 or=2 not=3", "a=1 or or b=2", "true prune false",
		"!(depth>3) depth<=5", "depth<0 | depth>9223372036854775807",
		"path~'**/\\\\*'", "name~[^/]", "a=\x00\xff", "a=\"\n\t\"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseAt(s, now)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || !ferry.IsKind(err, ferry.KindInvalid) {
				t.Fatalf("ParseAt(%q): %v: not a KindInvalid *SyntaxError", s, err)
			}
			if se.Pos < 1 || se.Pos > len(s)+1 {
				t.Fatalf("ParseAt(%q): %v: column out of range", s, err)
			}
			return
		}
		c := p.String()
		q, err := ParseAt(c, now)
		if err != nil {
			t.Fatalf("ParseAt(%q): String() = %q does not parse: %v", s, c, err)
		}
		if c2 := q.String(); c2 != c {
			t.Fatalf("ParseAt(%q): String() = %q, then %q", s, c, c2)
		}
		if d, depth, ok := sameEval(p, q); !ok {
			t.Fatalf("%q and its String %q differ on %v at depth %d", s, c, d, depth)
		}
		n1, ok1 := p.MaxDepth()
		n2, ok2 := q.MaxDepth()
		if n1 != n2 || ok1 != ok2 {
			t.Fatalf("%q: MaxDepth %d, %v; of its String %q: %d, %v", s, n1, ok1, c, n2, ok2)
		}
		if !ok1 {
			return
		}
		for _, d := range samples {
			for _, depth := range sampleDepths {
				if m, _ := p.Eval(d, depth); m && depth > n1 {
					t.Fatalf("%q: MaxDepth %d, but matches %v at depth %d", s, n1, d, depth)
				}
			}
		}
	})
}

// FuzzQuote checks that programs can build predicates from any name: a
// value written by Quote parses back to itself, and a glob written by
// EscapeGlob matches the text it escapes and nothing longer.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "a", "a b", `'"`, `\`, "*?[]", "net.go", "x\x00y", "\xff", "é", "**", "a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		p, err := ParseAt("name="+Quote(v), now)
		if err != nil {
			t.Fatalf("Quote(%q) = %s does not parse: %v", v, Quote(v), err)
		}
		if ok, _ := p.Eval(ferry.Dir{ferry.AttrName: v}, 0); !ok {
			t.Fatalf("name=%s does not hold for the name %q", Quote(v), v)
		}
		g, err := compileGlob(EscapeGlob(v))
		if err != nil {
			t.Fatalf("EscapeGlob(%q) = %q does not compile: %v", v, EscapeGlob(v), err)
		}
		if !g.match(v) {
			t.Fatalf("EscapeGlob(%q) = %q does not match it", v, EscapeGlob(v))
		}
		if g.match(v + "x") {
			t.Fatalf("EscapeGlob(%q) = %q matches more", v, EscapeGlob(v))
		}
	})
}
