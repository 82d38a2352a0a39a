package pred

import (
	"path"
	"strings"
	"unicode/utf8"
)

// glob is a compiled glob pattern: path.Match syntax plus "**", which
// matches any run of bytes, '/' included. path.Match cannot be reused piece
// by piece for "**" without backtracking that is exponential in the number
// of stars, so glob runs the pattern as an automaton over the input instead,
// in time proportional to the product of their lengths.
type glob []globItem

// globItem is one element of a glob.
type globItem struct {
	kind   byte      // kind is one of the item kinds below.
	b      byte      // b is the byte of a literal.
	neg    bool      // neg negates a class.
	ranges [][2]rune // ranges are the inclusive rune ranges of a class.
}

// The kinds of globItem.
const (
	gLit     = iota // gLit matches the byte b.
	gOne            // gOne (?) matches one rune but '/'.
	gClass          // gClass ([...]) matches one rune but '/' in (or, if neg, not in) its ranges.
	gStar           // gStar (*) matches any run of bytes but '/'.
	gAny            // gAny (**) matches any run of bytes.
	gDirs           // gDirs (**/ as a whole path element) matches nothing, or goes on to gDirsRun.
	gDirsRun        // gDirsRun, after gDirs, matches a run of bytes ending in '/'.
)

// compileGlob compiles pattern. A pattern that path.Match rejects is
// malformed; the error is then path.ErrBadPattern.
func compileGlob(pattern string) (glob, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, err
	}
	var g glob
	for i := 0; i < len(pattern); {
		switch c := pattern[i]; c {
		case '*':
			j := i
			for j < len(pattern) && pattern[j] == '*' {
				j++
			}
			switch {
			case j-i == 1:
				g = append(g, globItem{kind: gStar})
			case j < len(pattern) && pattern[j] == '/' && (i == 0 || pattern[i-1] == '/'):
				// "a/**/b" matches a/b too, as in bash's globstar and
				// gitignore: zero or more directories.
				g = append(g, globItem{kind: gDirs}, globItem{kind: gDirsRun})
				j++
			default:
				g = append(g, globItem{kind: gAny})
			}
			i = j
		case '?':
			g = append(g, globItem{kind: gOne})
			i++
		case '[':
			it, n, ok := compileClass(pattern[i:])
			if !ok {
				return nil, path.ErrBadPattern
			}
			g = append(g, it)
			i += n
		case '\\':
			if i+1 == len(pattern) {
				return nil, path.ErrBadPattern
			}
			g = append(g, globItem{kind: gLit, b: pattern[i+1]})
			i += 2
		default:
			g = append(g, globItem{kind: gLit, b: c})
			i++
		}
	}
	return g, nil
}

// compileClass compiles the class at the start of s ("[^a-z]...") and
// returns it and its length in s. It follows path.Match's rules, so that
// it accepts what path.Match accepts.
func compileClass(s string) (globItem, int, bool) {
	it := globItem{kind: gClass}
	i := 1
	if i < len(s) && s[i] == '^' {
		it.neg = true
		i++
	}
	for {
		if i < len(s) && s[i] == ']' && len(it.ranges) > 0 {
			return it, i + 1, true
		}
		lo, n, ok := classRune(s[i:])
		if !ok {
			return it, 0, false
		}
		i += n
		hi := lo
		if i < len(s) && s[i] == '-' {
			if hi, n, ok = classRune(s[i+1:]); !ok {
				return it, 0, false
			}
			i += 1 + n
		}
		it.ranges = append(it.ranges, [2]rune{lo, hi})
	}
}

// classRune reads a possibly escaped rune of a class, as path.Match's getEsc.
func classRune(s string) (rune, int, bool) {
	if s == "" || s[0] == '-' || s[0] == ']' {
		return 0, 0, false
	}
	esc := 0
	if s[0] == '\\' {
		esc = 1
	}
	r, n := utf8.DecodeRuneInString(s[esc:])
	if r == utf8.RuneError && n <= 1 || esc+n == len(s) {
		return 0, 0, false
	}
	return r, esc + n, true
}

// match reports whether g matches all of s. It tracks, for each byte
// position of s, which items of g the match may have reached there; an item
// that consumes a rune moves the match up to utf8.UTFMax bytes ahead, so a
// ring of utf8.UTFMax+1 rows of states suffices.
func (g glob) match(s string) bool {
	const rows = utf8.UTFMax + 1
	m := len(g) + 1 // State len(g) means the whole pattern has matched.
	live := make([]bool, rows*m)
	row := func(pos int) []bool {
		r := pos % rows
		return live[r*m : (r+1)*m]
	}
	row(0)[0] = true
	for pos := 0; pos <= len(s); pos++ {
		cur := row(pos)
		// States are visited in increasing order, so that a star's empty
		// match, which enables the next state in this row, is seen.
		for i, on := range cur {
			if !on {
				continue
			}
			cur[i] = false // Clear the row for its reuse rows bytes ahead.
			if i == len(g) {
				if pos == len(s) {
					return true
				}
				continue
			}
			it := g[i]
			switch it.kind {
			case gStar, gAny:
				cur[i+1] = true
			case gDirs:
				// No byte of its own: skip the run, or begin it.
				cur[i+1], cur[i+2] = true, true
				continue
			}
			if pos == len(s) {
				continue
			}
			switch it.kind {
			case gLit:
				if s[pos] == it.b {
					row(pos + 1)[i+1] = true
				}
			case gOne, gClass:
				r, n := utf8.DecodeRuneInString(s[pos:])
				if r != '/' && (it.kind == gOne || it.inClass(r)) {
					row(pos + n)[i+1] = true
				}
			case gStar:
				if s[pos] != '/' {
					row(pos + 1)[i] = true
				}
			case gAny:
				row(pos + 1)[i] = true
			case gDirsRun:
				row(pos + 1)[i] = true
				if s[pos] == '/' {
					row(pos + 1)[i+1] = true
				}
			}
		}
	}
	return false
}

// inClass reports whether r is matched by the class it.
func (it globItem) inClass(r rune) bool {
	in := false
	for _, rg := range it.ranges {
		in = in || rg[0] <= r && r <= rg[1]
	}
	return in != it.neg
}

// EscapeGlob returns a glob that matches s and nothing else.
func EscapeGlob(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
