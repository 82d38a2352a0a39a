package pred

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferryfs/ferry"
)

// Pred is a compiled predicate. It is immutable, so safe for concurrent use.
// A nil *Pred matches everything.
type Pred struct {
	root     node
	now      int64 // now is the time age is measured from, in ns since the epoch.
	maxDepth int
	bounded  bool
}

// SyntaxError describes a malformed predicate.
type SyntaxError struct {
	Pos int    // Pos is the 1-based byte column of the offending token.
	Msg string // Msg says what is wrong there.
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("at column %d: %s", e.Pos, e.Msg) }

// maxNest bounds the nesting of parentheses and negations, so that a hostile
// predicate cannot exhaust the stack of the server that parses it.
const maxNest = 1000

// Parse compiles the predicate s, measuring age from the current time. An empty or blank
// s matches everything. A malformed s fails with a ferry.KindInvalid error
// wrapping a *SyntaxError.
func Parse(s string) (*Pred, error) { return ParseAt(s, time.Now()) }

// ParseAt is Parse measuring age from the given time, for tests and for
// callers that evaluate one predicate against a snapshot.
func ParseAt(s string, now time.Time) (*Pred, error) {
	p := &parser{toks: lex(s), now: now.UnixNano()}
	var root node = constNode(true)
	if p.peek().kind != tEOF {
		var err error
		if root, err = p.parseOr(); err == nil && p.peek().kind != tEOF {
			err = p.errorf(p.peek(), "unexpected %s", describe(p.peek()))
		}
		// Names are checked once the syntax is: a syntax error says
		// more about what went wrong.
		for _, a := range p.attrs {
			if err != nil {
				break
			}
			if aerr := checkAttr(a.text); aerr != nil {
				err = p.errorf(a, "%v", aerr)
			}
		}
		if err != nil {
			return nil, ferry.E("pred.Parse", "", ferry.KindInvalid, err)
		}
	}
	pr := &Pred{root: root, now: p.now}
	pr.maxDepth, pr.bounded = maxDepth(root)
	return pr, nil
}

// Eval reports whether the entry d, at depth below the find's root (0 for
// the root itself), matches, and whether the walk should not descend below
// it because a prune was evaluated.
func (p *Pred) Eval(d ferry.Dir, depth int) (match, prune bool) {
	if p == nil {
		return true, false
	}
	e := &env{d: d, depth: depth, now: p.now}
	match = p.root.eval(e)
	return match, e.prune
}

// MaxDepth returns a depth below which nothing can match, so the walk need
// not descend below it, when the top-level conjunction of p bounds the depth
// ("depth<=2" and "depth<3 & name~x" give 2, true; "false" gives 0, true).
// Otherwise it returns 0, false. A bound below 0 is reported as 0: the root
// is visited anyway.
func (p *Pred) MaxDepth() (int, bool) {
	if p == nil {
		return 0, false
	}
	return p.maxDepth, p.bounded
}

// String returns p in canonical form: Parse accepts it and yields an
// equivalent predicate with the same String. Values are written as given, so
// "age<7d" stays relative to the time of each parse.
func (p *Pred) String() string {
	if p == nil {
		return "true"
	}
	var b strings.Builder
	format(&b, p.root, 0)
	return b.String()
}

// node is a node of the syntax tree.
type node interface {
	// eval reports whether the node holds for e.d, recording a prune in e.
	eval(e *env) bool
}

// env is what a node is evaluated against.
type env struct {
	d     ferry.Dir
	depth int
	now   int64
	prune bool
}

type (
	orNode    []node           // orNode holds if one of its nodes holds.
	andNode   []node           // andNode holds if all of its nodes hold.
	notNode   struct{ x node } // notNode holds if x does not.
	constNode bool             // constNode is true or false.
	pruneNode struct{}         // pruneNode is false and sets prune.
)

// cmpNode is a comparison ATTR OP VALUE.
type cmpNode struct {
	attr, op, val string
	num           *numAttr // num describes a numeric attribute; nil for a string.
	n             int64    // n is val as a number, for a numeric comparison.
	glob          glob     // glob is val compiled, for ~ and !~.
}

func (x orNode) eval(e *env) bool {
	for _, y := range x {
		if y.eval(e) {
			return true
		}
	}
	return false
}

func (x andNode) eval(e *env) bool {
	for _, y := range x {
		if !y.eval(e) {
			return false
		}
	}
	return true
}

func (x notNode) eval(e *env) bool { return !x.x.eval(e) }
func (x constNode) eval(*env) bool { return bool(x) }

func (pruneNode) eval(e *env) bool {
	e.prune = true
	return false
}

// isGlob reports whether c matches a glob rather than compares.
func (c *cmpNode) isGlob() bool { return c.op == "~" || c.op == "!~" }

// missing is the result of c on an entry that lacks its attribute: only the
// negative operators hold.
func (c *cmpNode) missing() bool { return c.op == "!=" || c.op == "!~" }

func (c *cmpNode) String() string { return c.attr + c.op + Quote(c.val) }

func (c *cmpNode) eval(e *env) bool {
	if c.isGlob() {
		s, ok := e.d[c.attr]
		if c.attr == "depth" {
			s, ok = strconv.Itoa(e.depth), true
		}
		if !ok {
			return c.missing()
		}
		return c.glob.match(s) == (c.op == "~")
	}
	if c.num == nil {
		s, ok := e.d[c.attr]
		if !ok {
			return c.missing()
		}
		return holds(c.op, strings.Compare(s, c.val))
	}
	n, ok := c.number(e)
	if !ok {
		return c.missing()
	}
	return holds(c.op, cmp.Compare(n, c.n))
}

// number returns the numeric attribute of e that c compares.
func (c *cmpNode) number(e *env) (int64, bool) {
	switch c.attr {
	case "depth":
		return int64(e.depth), true
	case "age":
		m, err := strconv.ParseInt(e.d[ferry.AttrMtime], 10, 64)
		return sub(e.now, m), err == nil
	}
	n, err := strconv.ParseInt(e.d[c.attr], c.num.base, 64)
	return n, err == nil
}

// holds reports whether the ordering operator op holds of cmp.Compare's
// result c.
func holds(op string, c int) bool {
	switch op {
	case "=":
		return c == 0
	case "!=":
		return c != 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	}
	return c >= 0
}

// Precedences, for format: a node is parenthesized when its own is lower
// than its context's.
const (
	precOr = 1 + iota
	precAnd
	precUnary
)

// format writes n to b in canonical form, in a context of precedence prec.
func format(b *strings.Builder, n node, prec int) {
	list := func(xs []node, own int, sep string) {
		if own < prec {
			b.WriteByte('(')
		}
		for i, x := range xs {
			if i > 0 {
				b.WriteString(sep)
			}
			format(b, x, own)
		}
		if own < prec {
			b.WriteByte(')')
		}
	}
	switch n := n.(type) {
	case orNode:
		list(n, precOr, " | ")
	case andNode:
		list(n, precAnd, " & ")
	case notNode:
		b.WriteByte('!')
		format(b, n.x, precUnary)
	case constNode:
		b.WriteString(strconv.FormatBool(bool(n)))
	case pruneNode:
		b.WriteString("prune")
	case *cmpNode:
		b.WriteString(n.String())
	}
}

// maxDepth computes MaxDepth's result for the predicate root. Only the
// top-level conjunction is looked at: any of its terms must hold for a
// match, so the tightest bound among them holds.
func maxDepth(root node) (int, bool) {
	terms, ok := root.(andNode)
	if !ok {
		terms = andNode{root}
	}
	bound, bounded := int64(math.MaxInt), false
	for _, t := range terms {
		if b, ok := depthBound(t); ok {
			bound, bounded = min(bound, b), true
		}
	}
	if !bounded {
		return 0, false
	}
	return int(max(bound, 0)), true
}

// depthBound returns the greatest depth at which the term t can hold, if t
// bounds it: false, depth<N, depth<=N, depth=N, and the negations of
// depth>N, depth>=N and depth!=N.
func depthBound(t node) (int64, bool) {
	if t == constNode(false) {
		return 0, true
	}
	not, negated := t.(notNode)
	if negated {
		t = not.x
	}
	c, ok := t.(*cmpNode)
	if !ok || c.attr != "depth" || c.isGlob() {
		return 0, false
	}
	op := c.op
	if negated {
		op = map[string]string{">": "<=", ">=": "<", "!=": "="}[op]
	}
	switch op {
	case "<=", "=":
		return c.n, true
	case "<":
		return max(c.n, math.MinInt64+1) - 1, true
	}
	return 0, false
}

// parser is a recursive descent parser over the tokens of a predicate:
//
//	or    = and { ("|" | "or") and }
//	and   = unary { ["&" | "and"] unary }
//	unary = ("!" | "not") unary | "(" or ")" | "true" | "false" | "prune" | WORD OP VALUE
type parser struct {
	toks  []token
	i     int
	now   int64
	nest  int
	attrs []token // The attributes compared, checked after the syntax.
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if p.i < len(p.toks)-1 {
		p.i++
	}
	return t
}

// keyword reports whether the next token is the keyword kw: the bare word kw
// not followed by an operator, which would make it an attribute name.
func (p *parser) keyword(kw string) bool {
	t := p.peek()
	return t.kind == tWord && t.text == kw && p.toks[min(p.i+1, len(p.toks)-1)].kind != tCmp
}

// errorf returns a syntax error at t; at a lexical error, that error.
func (p *parser) errorf(t token, format string, args ...any) error {
	if t.kind == tErr {
		return t.err
	}
	return &SyntaxError{Pos: t.pos + 1, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) parseOr() (node, error) {
	var xs orNode
	for {
		x, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		if y, ok := x.(orNode); ok {
			xs = append(xs, y...)
		} else {
			xs = append(xs, x)
		}
		if p.peek().kind != tOr && !p.keyword("or") {
			break
		}
		p.next()
	}
	if len(xs) == 1 {
		return xs[0], nil
	}
	return xs, nil
}

func (p *parser) parseAnd() (node, error) {
	var xs andNode
	for {
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		if y, ok := x.(andNode); ok {
			xs = append(xs, y...)
		} else {
			xs = append(xs, x)
		}
		if p.peek().kind == tAnd || p.keyword("and") {
			p.next()
			continue
		}
		// Juxtaposition: whatever may start a term continues the
		// conjunction; a string cannot, but parseUnary says why.
		if !p.startsTerm() {
			break
		}
	}
	if len(xs) == 1 {
		return xs[0], nil
	}
	return xs, nil
}

// startsTerm reports whether the next token may start a term.
func (p *parser) startsTerm() bool {
	switch p.peek().kind {
	case tWord:
		return !p.keyword("or")
	case tString, tNot, tLParen:
		return true
	}
	return false
}

func (p *parser) parseUnary() (node, error) {
	t := p.peek()
	switch {
	case t.kind == tNot || t.kind == tLParen || p.keyword("not"):
		return p.parseNested()
	case p.keyword("true"), p.keyword("false"):
		p.next()
		return constNode(t.text == "true"), nil
	case p.keyword("prune"):
		p.next()
		return pruneNode{}, nil
	case t.kind == tWord && !p.keyword("and") && !p.keyword("or"):
		return p.parseCmp()
	}
	return nil, p.errorf(t, "expected expression, found %s", describe(t))
}

// parseNested parses a negation or a parenthesized expression, the two
// constructs that nest.
func (p *parser) parseNested() (node, error) {
	t := p.next()
	if p.nest++; p.nest > maxNest {
		return nil, p.errorf(t, "expression nested too deeply")
	}
	defer func() { p.nest-- }()
	if t.kind != tLParen {
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		return notNode{x}, nil
	}
	x, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tRParen {
		return nil, p.errorf(p.peek(), `expected ")" after expression, found %s`, describe(p.peek()))
	}
	p.next()
	return x, nil
}

func (p *parser) parseCmp() (node, error) {
	attr := p.next()
	op := p.peek()
	if op.kind != tCmp {
		return nil, p.errorf(op, "expected comparison operator after %q, found %s", attr.text, describe(op))
	}
	p.next()
	val := p.peek()
	if val.kind != tWord && val.kind != tString {
		return nil, p.errorf(val, "expected value after %q, found %s", op.text, describe(val))
	}
	p.next()
	p.attrs = append(p.attrs, attr)
	c := &cmpNode{attr: attr.text, op: op.text, val: val.text}
	if num, ok := numeric[c.attr]; ok {
		c.num = &num
	}
	if c.attr == ferry.AttrType && !c.isGlob() && !types[c.val] {
		hint := ""
		if t, ok := typeWords[strings.ToLower(c.val)]; ok {
			hint = "; did you mean " + t + "?"
		}
		return nil, p.errorf(val, "no type %q: a type is f (file), d (directory), l (symbolic link), p (named pipe), s (socket), c, b (devices) or o (other)%s", c.val, hint)
	}
	var err error
	switch {
	case c.isGlob() && c.attr == "age":
		return nil, p.errorf(op, "%s does not apply to age", op.text)
	case c.isGlob():
		if c.glob, err = compileGlob(c.val); err != nil {
			return nil, p.errorf(val, "bad glob %q: %v", c.val, err)
		}
	case c.num != nil:
		if c.n, err = c.num.parse(c.val); err != nil {
			return nil, p.errorf(val, "%v", err)
		}
	}
	return c, nil
}

// attrs are the attributes a predicate may name: the stored ones of
// ferry.Dir and those the predicate derives. Extended attributes
// (ferry.XattrPrefix) and a layer's decorations (ferry.IsDecoration) may
// be named too.
var attrs = []string{ferry.AttrName, ferry.AttrPath, ferry.AttrType, ferry.AttrSize, ferry.AttrMode,
	ferry.AttrMtime, ferry.AttrUid, ferry.AttrGid, ferry.AttrTarget, ferry.AttrHash, ferry.AttrNlink,
	ferry.AttrRdev, ferry.AttrAtime, ferry.AttrCtime, ferry.AttrIno, "age", "depth"}

// checkAttr refuses an attribute no entry has: a typo would otherwise
// match nothing (or, with != and !~, everything) without a word.
func checkAttr(a string) error {
	if slices.Contains(attrs, a) || strings.HasPrefix(a, ferry.XattrPrefix) || ferry.IsDecoration(a) {
		return nil
	}
	if s := suggest(a, attrs); s != "" {
		return fmt.Errorf("no attribute %q%s", a, s)
	}
	return fmt.Errorf("no attribute %q (known: %s, and %sNAME)", a, strings.Join(attrs, ", "), ferry.XattrPrefix)
}

// types are the values of ferry.AttrType; typeWords maps the words people
// type for them to them, for a hint.
var (
	types     = map[string]bool{"f": true, "d": true, "l": true, "p": true, "s": true, "c": true, "b": true, "o": true}
	typeWords = map[string]string{"file": "f", "dir": "d", "directory": "d", "link": "l", "symlink": "l", "pipe": "p", "fifo": "p", "socket": "s"}
)

// suggest returns "; did you mean X?" for the name among names closest to
// s, if one is close (one edit in a short name, two in a longer one), else
// "".
func suggest(s string, names []string) string {
	best, bestD := "", 2
	if len(s) > 4 {
		bestD = 3
	}
	for _, w := range names {
		if d := editDistance(s, w); d < bestD {
			best, bestD = w, d
		}
	}
	if best == "" {
		return ""
	}
	return "; did you mean " + best + "?"
}

// editDistance is the edit distance of a and b in bytes, a swap of two
// neighbours counting as one edit (optimal string alignment).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
