package pred

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// now is the fixed time age is measured from in the tests.
var now = time.Date(2024, 6, 15, 12, 0, 0, 0, time.UTC)

// mtimeAgo returns the mtime attribute of an entry changed d before now.
func mtimeAgo(d time.Duration) string { return strconv.FormatInt(now.Add(-d).UnixNano(), 10) }

// goFile is a typical regular file for the tests.
var goFile = ferry.Dir{
	"name": "main.go", "path": "/src/cmd/main.go", "type": "f", "size": "2048",
	"mode": "0644", "mtime": mtimeAgo(36 * time.Hour), "uid": "1000", "gid": "100", "nlink": "1",
}

// gitDir is a .git directory for the prune tests.
var gitDir = ferry.Dir{"name": ".git", "path": "/src/.git", "type": "d", "mode": "0755", "size": "4096"}

// bare is an entry with nothing but a name.
var bare = ferry.Dir{"name": "x"}

func mustParse(t *testing.T, s string) *Pred {
	t.Helper()
	p, err := ParseAt(s, now)
	if err != nil {
		t.Fatalf("ParseAt(%q): %v", s, err)
	}
	return p
}

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "true"},
		{" \t\n ", "true"},
		{"true", "true"},
		{"false", "false"},
		{"prune", "prune"},
		{"name=x", "name=x"},
		{"name = x", "name=x"},
		{"name!=x", "name!=x"},
		{"size<1k", "size<1k"},
		{"size <= 1k", "size<=1k"},
		{"size>1k", "size>1k"},
		{"size>=1k", "size>=1k"},
		{"name~*.go", "name~*.go"},
		{"name !~ *.go", "name!~*.go"},
		{"A=1 & B=2", "A=1 & B=2"},
		{"A=1 and B=2", "A=1 & B=2"},
		{"A=1 B=2", "A=1 & B=2"},
		{"A=1&B=2", "A=1 & B=2"},
		{"A=1 | B=2", "A=1 | B=2"},
		{"A=1 or B=2", "A=1 | B=2"},
		{"A=1|B=2", "A=1 | B=2"},
		{"!A=1", "!A=1"},
		{"not A=1", "!A=1"},
		{"! ! A=1", "!!A=1"},
		{"not not A=1", "!!A=1"},
		{"(A=1)", "A=1"},
		{"((A=1))", "A=1"},
		{"A=1 | B=2 & C=3", "A=1 | B=2 & C=3"},
		{"(A=1 | B=2) & C=3", "(A=1 | B=2) & C=3"},
		{"A=1 & (B=2 & C=3)", "A=1 & B=2 & C=3"},
		{"A=1 | (B=2 | C=3)", "A=1 | B=2 | C=3"},
		{"!(A=1 & B=2)", "!(A=1 & B=2)"},
		{"!(A=1 | B=2) C=3", "!(A=1 | B=2) & C=3"},
		{"name=.git & prune | type=f", "name=.git & prune | type=f"},
		{"name='a b'", `name="a b"`},
		{`name="a b"`, `name="a b"`},
		{`name='it\'s'`, `name="it's"`},
		{`name="say \"hi\""`, `name="say \"hi\""`},
		{`name='a\\b'`, `name=a\b`},
		{`name=a\b`, `name=a\b`},
		{`name='x\ny\tz\r'`, `name="x\ny\tz\r"`},
		{`name=""`, `name=""`},
		{`name='a|b'`, `name="a|b"`},
		{`name='and'`, `name=and`},
		{"name=or", "name=or"},
		{"Addr~*:22", "Addr~*:22"},
		{"mtime>2024-01-01 age<1d12h", "mtime>2024-01-01 & age<1d12h"},
		{"mtime>=2024-01-02T03:04:05+02:00", "mtime>=2024-01-02T03:04:05+02:00"},
		{"true false", "true & false"},
		{"(A=1)(B=2)", "A=1 & B=2"},
	} {
		p, err := ParseAt(tc.in, now)
		if err != nil {
			t.Errorf("ParseAt(%q): %v", tc.in, err)
			continue
		}
		if got := p.String(); got != tc.want {
			t.Errorf("ParseAt(%q).String() = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPrecedence(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"true | true & false", true},    // & binds tighter than |.
		{"false & false | true", true},   // Not false & (false | true).
		{"(true | true) & false", false}, // Parentheses override.
		{"!true | true", true},           // ! binds tighter than |.
		{"!true & false", false},         // ! binds tighter than &: not !(true & false).
		{"!(true & false)", true},
		{"not false and false", false},
		{"false or true false", false}, // Juxtaposition is &, tighter than or.
		{"!!true", true},
		{"true false | true", true},
	} {
		p := mustParse(t, tc.in)
		if got, _ := p.Eval(goFile, 0); got != tc.want {
			t.Errorf("%q: match = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestEval(t *testing.T) {
	link := ferry.Dir{"name": "l", "path": "/l", "type": "l", "target": "/etc/passwd"}
	odd := ferry.Dir{"name": "odd", "size": "big", "mode": "9", "mtime": "yesterday"}
	for _, tc := range []struct {
		pred  string
		d     ferry.Dir
		depth int
		match bool
		prune bool
	}{
		// Strings.
		{"name=main.go", goFile, 0, true, false},
		{"name=main", goFile, 0, false, false},
		{"name!=main", goFile, 0, true, false},
		{"name<n", goFile, 0, true, false},
		{"name>n", goFile, 0, false, false},
		{"name>=main.go name<=main.go", goFile, 0, true, false},
		{"type=f", goFile, 0, true, false},
		{"type=d", gitDir, 0, true, false},
		{"type=l target=/etc/passwd", link, 0, true, false},
		{`name="main.go"`, goFile, 0, true, false},

		// Globs.
		{"name~*.go", goFile, 0, true, false},
		{"name!~*.go", goFile, 0, false, false},
		{"name~main.?o", goFile, 0, true, false},
		{"name~[lm]ain.go", goFile, 0, true, false},
		{"path~/src/*.go", goFile, 0, false, false},
		{"path~/src/*/*.go", goFile, 0, true, false},
		{"path~/src/**.go", goFile, 0, true, false},
		{"path~/src/**/main.go", goFile, 0, true, false},
		{"path~**/main.go", goFile, 0, true, false},
		{"path~/src/**", gitDir, 0, true, false},
		{"path~/lib/**", gitDir, 0, false, false},
		{"mode~07*", gitDir, 0, true, false},
		{"depth~1?", goFile, 12, true, false},
		{"name~'*'", bare, 0, true, false},
		{`name~\*`, bare, 0, false, false},
		{`name~\*`, ferry.Dir{"name": "*"}, 0, true, false},
		{`name~'\\*'`, ferry.Dir{"name": "*"}, 0, true, false},

		// Numbers.
		{"size=2048", goFile, 0, true, false},
		{"size=2k", goFile, 0, true, false},
		{"size=2K", goFile, 0, true, false},
		{"size>1k", goFile, 0, true, false},
		{"size<1M", goFile, 0, true, false},
		{"size>=1G", goFile, 0, false, false},
		{"size<1T", goFile, 0, true, false},
		{"size>999", goFile, 0, true, false}, // Numeric: as strings "2048" < "999".
		{"uid=1000 gid=100 nlink=1", goFile, 0, true, false},
		{"uid<999", goFile, 0, false, false},
		{"mode=0644", goFile, 0, true, false},
		{"mode=644", goFile, 0, true, false},
		{"mode>0700", gitDir, 0, true, false},
		{"mode<0700", goFile, 0, true, false},
		{"depth=0", goFile, 0, true, false},
		{"depth<=2", goFile, 3, false, false},
		{"depth>2", goFile, 3, true, false},
		{"age>1d", goFile, 0, true, false},
		{"age<2d", goFile, 0, true, false},
		{"age>1d12h", goFile, 0, false, false},
		{"age>=1d12h", goFile, 0, true, false},
		{"age>36h", goFile, 0, false, false},
		{"age<37h", goFile, 0, true, false},
		{"age<90s", goFile, 0, false, false},
		{"age>-1h", goFile, 0, true, false},
		{"mtime<2024-06-14", goFile, 0, false, false},
		{"mtime>=2024-06-14", goFile, 0, true, false},
		{"mtime=2024-06-14T01:00:00+01:00", goFile, 0, true, false}, // main.go is from 00:00 UTC on the 14th.
		{"mtime<=2024-06-14T00:00:00Z", goFile, 0, true, false},
		{"mtime=" + mtimeAgo(36*time.Hour), goFile, 0, true, false},

		// Missing or malformed attributes.
		{"hash=x", goFile, 0, false, false},
		{"hash!=x", goFile, 0, true, false},
		{"hash~*", goFile, 0, false, false},
		{"hash!~*", goFile, 0, true, false},
		{"hash<x", goFile, 0, false, false},
		{"size>=0", bare, 0, false, false},
		{"size!=0", bare, 0, true, false},
		{"size<1", odd, 0, false, false},
		{"size!=1", odd, 0, true, false},
		{"mode=0", odd, 0, false, false},
		{"age<1d", bare, 0, false, false},
		{"age!=1d", bare, 0, true, false},
		{"age>0", odd, 0, false, false},
		{"type=f", bare, 0, false, false},
		{"size~b*", odd, 0, true, false},
		{"depth!=0", bare, 0, false, false}, // Depth is never missing.

		// Prune.
		{"prune", goFile, 0, false, true},
		{"!prune", goFile, 0, true, true},
		{"name=.git & prune | type=f", gitDir, 1, false, true},
		{"name=.git & prune | type=f", goFile, 2, true, false},
		{"name=.git & prune | type=d", ferry.Dir{"name": "src", "type": "d"}, 1, true, false},
		{"type=f | prune", goFile, 0, true, false}, // Short circuit: prune not reached.
		{"type=d | prune", goFile, 0, false, true},
		{"false & prune", goFile, 0, false, false},
		{"true & prune", goFile, 0, false, true},
		{"(name=.git prune) or true", gitDir, 0, true, true},
		{"depth>=1 prune | true", gitDir, 1, true, true},
		{"depth>=1 prune | true", gitDir, 0, true, false},
	} {
		p := mustParse(t, tc.pred)
		match, prune := p.Eval(tc.d, tc.depth)
		if match != tc.match || prune != tc.prune {
			t.Errorf("%q on %v at depth %d: got %v, %v, want %v, %v", tc.pred, tc.d, tc.depth, match, prune, tc.match, tc.prune)
		}
	}
}

func TestParseValues(t *testing.T) {
	for _, tc := range []struct {
		parse func(string) (int64, error)
		in    string
		want  int64
	}{
		{ParseSize, "0", 0},
		{ParseSize, "512", 512},
		{ParseSize, "1k", 1 << 10},
		{ParseSize, "3K", 3 << 10},
		{ParseSize, "5M", 5 << 20},
		{ParseSize, "2G", 2 << 30},
		{ParseSize, "7T", 7 << 40},
		{ParseSize, "8388607T", 8388607 << 40},
		{parseMode, "0644", 0o644},
		{parseMode, "4755", 0o4755},
		{parseTime, "0", 0},
		{parseTime, "-5", -5},
		{parseTime, "1970-01-02", int64(24 * time.Hour)},
		{parseTime, "1970-01-01T00:00:01.5Z", 1500 * int64(time.Millisecond)},
		{parseTime, "1970-01-01T01:00:00+01:00", 0},
		{parseAge, "90s", 90 * int64(time.Second)},
		{parseAge, "2h", 2 * int64(time.Hour)},
		{parseAge, "7d", 7 * 24 * int64(time.Hour)},
		{parseAge, "1d12h", 36 * int64(time.Hour)},
		{parseAge, "0d", 0},
		{parseAge, "0", 0},
		{parseAge, "-1h", -int64(time.Hour)},
		{parseAge, "1.5h", 90 * int64(time.Minute)},
	} {
		got, err := tc.parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parse(%q) = %d, %v, want %d", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		parse func(string) (int64, error)
		in    string
	}{
		{ParseSize, ""}, {ParseSize, "k"}, {ParseSize, "-1"}, {ParseSize, "1.5M"}, {ParseSize, "1m"},
		{ParseSize, "1KB"}, {ParseSize, "8388608T"}, {ParseSize, "99999999999999999999"},
		{parseMode, "9"}, {parseMode, "rwx"}, {parseMode, ""},
		{parseInt, "1k"}, {parseInt, ""}, {parseInt, "0x10"},
		{parseTime, "2024-13-01"}, {parseTime, "yesterday"}, {parseTime, "2024-01-01 10:00"},
		{parseTime, "3000-01-01"}, {parseTime, "1600-01-01"},
		{parseAge, ""}, {parseAge, "d"}, {parseAge, "7"}, {parseAge, "1w"}, {parseAge, "1.5d"},
		{parseAge, "-1d"}, {parseAge, "1d-1h"}, {parseAge, "1dd"}, {parseAge, "1d2d"},
		{parseAge, "106752d"}, {parseAge, "106751d24h"},
	} {
		if got, err := tc.parse(tc.in); err == nil {
			t.Errorf("parse(%q) = %d, want an error", tc.in, got)
		}
	}
}

func TestMaxDepth(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int
		bounded bool
	}{
		{"", 0, false},
		{"name=x", 0, false},
		{"depth<=2", 2, true},
		{"depth<3 & name~x", 2, true},
		{"name~x depth=4", 4, true},
		{"depth<=5 depth<3", 2, true},
		{"!(depth>4)", 4, true},
		{"!(depth>=4)", 3, true},
		{"not depth!=1", 1, true},
		{"depth<0", 0, true},
		{"depth<-9223372036854775808", 0, true},
		{"false", 0, true},
		{"name=x & false", 0, true},
		{"depth>2", 0, false},
		{"depth!=2", 0, false},
		{"!(depth<2)", 0, false},
		{"depth~1", 0, false},
		{"depth<=2 | name=x", 0, false}, // Not provable: an or at the top.
		{"(depth<=2 | depth<=3)", 0, false},
		{"!!depth<2", 0, false}, // Conservative: only one negation is looked through.
	} {
		p := mustParse(t, tc.in)
		got, bounded := p.MaxDepth()
		if got != tc.want || bounded != tc.bounded {
			t.Errorf("%q: MaxDepth() = %d, %v, want %d, %v", tc.in, got, bounded, tc.want, tc.bounded)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		in  string
		pos int
		msg string
	}{
		{"(", 2, "expected expression, found end of input"},
		{"nmae~*.go", 1, `no attribute "nmae"; did you mean name?`},
		{"type=d & sze>1M", 10, `no attribute "sze"; did you mean size?`},
		{"foo=bar", 1, `no attribute "foo" (known: name, path,`},
		{"not=1", 1, `no attribute "not"`},
		{"type=x", 6, `no type "x": a type is f (file), d (directory)`},
		{"type=file", 6, `no type "file": a type is f`},
		{"type!=dir", 7, `no type "dir"`},
		{"size>1Q", 6, `bad size "1Q"`},
		{"()", 2, `expected expression, found ")"`},
		{"(name=x", 8, `expected ")" after expression, found end of input`},
		{"(name=x name", 13, `expected comparison operator after "name", found end of input`},
		{"((A=1) | B=2 ", 14, `expected ")" after expression`},
		{"name=x)", 7, `unexpected ")"`},
		{"A=1 B=2 ) C=3", 9, `unexpected ")"`},
		{"name", 5, `expected comparison operator after "name", found end of input`},
		{"name x", 6, `expected comparison operator after "name", found "x"`},
		{"name=", 6, `expected value after "=", found end of input`},
		{"name= & x=1", 7, `expected value after "=", found "&"`},
		{"name=(x)", 6, `expected value after "=", found "("`},
		{"=x", 1, `expected expression, found "="`},
		{"'name'=x", 1, `expected expression, found string "name"`},
		{"& A=1", 1, `expected expression, found "&"`},
		{"A=1 &", 6, "expected expression, found end of input"},
		{"A=1 & & B=2", 7, `expected expression, found "&"`},
		{"A=1 | | B=2", 7, `expected expression, found "|"`},
		{"A=1 or", 7, "expected expression, found end of input"},
		{"not", 4, "expected expression, found end of input"},
		{"A=1 and or B=2", 9, `expected expression, found "or"`},
		{"and A=1", 1, `expected expression, found "and"`},
		{"or", 1, `expected expression, found "or"`},
		{"!", 2, "expected expression, found end of input"},
		{"A=1 && B=2", 6, `expected expression, found "&"`},
		{"a==1", 2, `unknown operator "=="`},
		{"a =~ 1", 3, `unknown operator "=~"`},
		{"a<>1", 2, `unknown operator "<>"`},
		{"a=>1", 2, `unknown operator "=>"`},
		{"a=!1", 2, `unknown operator "=!"`},
		{"a !! 1", 3, `expected comparison operator after "a", found "!"`},
		{"name='abc", 6, "unterminated string"},
		{`name="abc\"`, 6, "unterminated string"},
		{`name="abc\`, 6, "unterminated string"},
		{`A=1 B="x\qy"`, 9, `unknown escape "\\q" in string`},
		{"A=1 ) 'x", 5, `unexpected ")"`}, // The leftmost error wins.
		{"a=( 'x", 3, `expected value after "=", found "("`},
		{"A=1 'x", 5, "unterminated string"},
		{"A=1 B==2", 6, `unknown operator "=="`},
		{"size>1X", 6, `bad size "1X"`},
		{"size > 1.5M", 8, `bad size "1.5M"`},
		{"size>99999999T", 6, "size too large"},
		{"uid=root", 5, `bad number "root"`},
		{"gid=-", 5, `bad number "-"`},
		{"nlink>1k", 7, `bad number "1k"`},
		{"depth<x", 7, `bad number "x"`},
		{"mode=0799", 6, `bad mode "0799"`},
		{"mtime>yesterday", 7, `bad time "yesterday"`},
		{"mtime>2024-02-30", 7, `bad time "2024-02-30"`},
		{"mtime>9999-01-01", 7, `time "9999-01-01" out of range`},
		{"age<1w", 5, `bad age "1w"`},
		{"age<", 5, `expected value after "<", found end of input`},
		{"age~1d", 4, "~ does not apply to age"},
		{"age!~1d", 4, "!~ does not apply to age"},
		{"name~[a", 6, `bad glob "[a"`},
		{"name~'[]'", 6, `bad glob "[]"`},
		{`path~'a\\'`, 6, `bad glob "a\\"`},
		{`name~'\*'`, 7, `unknown escape "\\*" in string`},
		{"type=f name!~[z-", 14, `bad glob "[z-"`},
		{strings.Repeat("(", maxNest+1) + "true", maxNest + 1, "expression nested too deeply"},
		{strings.Repeat("!", maxNest+1) + "true", maxNest + 1, "expression nested too deeply"},
	} {
		_, err := ParseAt(tc.in, now)
		if err == nil {
			t.Errorf("ParseAt(%q) succeeded, want an error", tc.in)
			continue
		}
		if !ferry.IsKind(err, ferry.KindInvalid) {
			t.Errorf("ParseAt(%q): kind %v, want %v", tc.in, ferry.KindOf(err), ferry.KindInvalid)
		}
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParseAt(%q): %v is not a *SyntaxError", tc.in, err)
			continue
		}
		if se.Pos != tc.pos || !strings.HasPrefix(se.Msg, tc.msg) {
			t.Errorf("ParseAt(%q): %v, want at column %d: %s...", tc.in, se, tc.pos, tc.msg)
		}
	}
}

func TestErrorText(t *testing.T) {
	_, err := Parse("(name=x name=y")
	want := `pred.Parse invalid argument: at column 15: expected ")" after expression, found end of input`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

func TestNesting(t *testing.T) {
	s := strings.Repeat("(", maxNest) + "true" + strings.Repeat(")", maxNest)
	p := mustParse(t, s)
	if got := p.String(); got != "true" {
		t.Errorf("String() = %q, want true", got)
	}
	s = strings.Repeat("!", maxNest) + "true"
	if got, _ := mustParse(t, s).Eval(bare, 0); got != true {
		t.Errorf("%d negations of true: got %v, want true", maxNest, got)
	}
}

func TestNilPred(t *testing.T) {
	var p *Pred
	if m, prune := p.Eval(bare, 3); !m || prune {
		t.Errorf("nil Eval = %v, %v, want true, false", m, prune)
	}
	if _, ok := p.MaxDepth(); ok {
		t.Errorf("nil MaxDepth bounded, want not")
	}
	if got := p.String(); got != "true" {
		t.Errorf("nil String() = %q, want true", got)
	}
}

// roundTripInputs are predicates whose String must parse back to an
// equivalent predicate; TestRoundTrip and the fuzz seeds use them.
var roundTripInputs = []string{
	"",
	"name=.git & prune | type=f",
	"A=1 B=2 or not (C=3 | D!=4) and E<5",
	"name~'*.go' path!~'/src/**/testdata/**'",
	`name="a \"quoted\" name" | name='tab\there'`,
	"size>1M & size<=1G | size=0",
	"age<7d mtime>=2024-01-01 | age>1d12h",
	"mode>=0755 uid=0 gid!=0 nlink>1",
	"depth<=2 & !(type=d | type=l)",
	"!!true & !false",
	"prune | !prune",
	`X="" Y='' Z=a\b`,
	"((((A=1)))) | ((B=2) & (C=3 | D=4))",
	"Addr~*:22 Cache=hot",
}

// samples are the entries and depths on which equivalent predicates must
// agree, in TestRoundTrip and FuzzParse.
var (
	samples = []ferry.Dir{
		goFile, gitDir, bare, {},
		{"name": "a b", "path": "/a b", "type": "l", "target": "x", "size": "0", "mtime": "0", "mode": "0777"},
		{"name": "1", "path": "/d/1", "type": "o", "uid": "0", "gid": "0", "nlink": "3", "size": "1048576", "Addr": "h:22"},
		{"name": "\"'\\", "size": "x", "mode": "z", "mtime": "z", "uid": "", "not": "1", "and": "2"},
	}
	sampleDepths = []int{0, 1, 2, 5}
)

// sameEval reports the first sample on which p and q differ.
func sameEval(p, q *Pred) (ferry.Dir, int, bool) {
	for _, d := range samples {
		for _, depth := range sampleDepths {
			m1, p1 := p.Eval(d, depth)
			m2, p2 := q.Eval(d, depth)
			if m1 != m2 || p1 != p2 {
				return d, depth, false
			}
		}
	}
	return nil, 0, true
}

func TestRoundTrip(t *testing.T) {
	for _, in := range roundTripInputs {
		p := mustParse(t, in)
		s := p.String()
		q, err := ParseAt(s, now)
		if err != nil {
			t.Errorf("%q: ParseAt(String() = %q): %v", in, s, err)
			continue
		}
		if got := q.String(); got != s {
			t.Errorf("%q: String() = %q, then %q", in, s, got)
		}
		if d, depth, ok := sameEval(p, q); !ok {
			t.Errorf("%q and %q differ on %v at depth %d", in, s, d, depth)
		}
	}
}

func TestConcurrentEval(t *testing.T) {
	p := mustParse(t, "name=.git & prune | path~/src/** & age<2d")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				d := samples[i%len(samples)]
				m, prune := p.Eval(d, i%4)
				wantM, wantP := d["name"] != ".git" && d["path"] == "/src/cmd/main.go", d["name"] == ".git"
				if m != wantM || prune != wantP {
					t.Errorf("Eval(%v) = %v, %v, want %v, %v", d, m, prune, wantM, wantP)
					return
				}
			}
		})
	}
	wg.Wait()
}
