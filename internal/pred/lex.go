package pred

import (
	"fmt"
	"strconv"
	"strings"
)

// tokKind is the kind of a token.
type tokKind int

const (
	tEOF    tokKind = iota // tEOF ends the input.
	tErr                   // tErr is a lexical error; it ends the tokens too.
	tWord                  // tWord is a bare word: an attribute, a value or a keyword.
	tString                // tString is a quoted string, always a value.
	tCmp                   // tCmp is a comparison operator.
	tNot                   // tNot is "!".
	tAnd                   // tAnd is "&".
	tOr                    // tOr is "|".
	tLParen                // tLParen is "(".
	tRParen                // tRParen is ")".
)

// token is one lexical item of a predicate.
type token struct {
	kind tokKind
	text string       // text is the word, the unquoted string or the operator.
	pos  int          // pos is the byte offset of the token in the input.
	err  *SyntaxError // err is set for tErr.
}

// opChars are the characters of operators. A run of them is lexed as one
// token, so that "==" or "=~" is reported as an unknown operator rather than
// as something puzzling later.
const opChars = "=!<>~"

// punct gives the kinds of the one-character tokens.
var punct = map[byte]tokKind{'(': tLParen, ')': tRParen, '&': tAnd, '|': tOr}

// cmpOps are the comparison operators.
var cmpOps = []string{"=", "!=", "<", "<=", ">", ">=", "~", "!~"}

// isSpace reports whether c separates tokens.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// isWordByte reports whether c may appear in a bare word.
func isWordByte(c byte) bool {
	return !isSpace(c) && strings.IndexByte("()&|'\""+opChars, c) < 0
}

// lex splits s into tokens. The last token is tEOF, or tErr at the first
// lexical error: the parser reports that error only if it gets that far, so
// the error reported is always the leftmost.
func lex(s string) []token {
	var toks []token
	for i := 0; ; {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return append(toks, token{kind: tEOF, pos: i})
		}
		c := s[i]
		switch {
		case c == '(' || c == ')' || c == '&' || c == '|':
			toks = append(toks, token{kind: punct[c], text: s[i : i+1], pos: i})
			i++
		case c == '\'' || c == '"':
			text, n, err := unquote(s, i)
			if err != nil {
				return append(toks, token{kind: tErr, pos: err.Pos - 1, err: err})
			}
			toks = append(toks, token{kind: tString, text: text, pos: i})
			i += n
		case strings.IndexByte(opChars, c) >= 0:
			j := i
			for j < len(s) && strings.IndexByte(opChars, s[j]) >= 0 {
				j++
			}
			op := s[i:j]
			switch {
			case isCmp(op):
				toks = append(toks, token{kind: tCmp, text: op, pos: i})
			case strings.Trim(op, "!") == "":
				for k := i; k < j; k++ {
					toks = append(toks, token{kind: tNot, text: "!", pos: k})
				}
			default:
				err := &SyntaxError{Pos: i + 1, Msg: fmt.Sprintf("unknown operator %q", op)}
				return append(toks, token{kind: tErr, pos: i, err: err})
			}
			i = j
		default:
			j := i
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			toks = append(toks, token{kind: tWord, text: s[i:j], pos: i})
			i = j
		}
	}
}

// isCmp reports whether op is a comparison operator.
func isCmp(op string) bool {
	for _, o := range cmpOps {
		if op == o {
			return true
		}
	}
	return false
}

// unquote reads the quoted string that starts at s[start] and returns its
// text and its length in s, quotes included.
func unquote(s string, start int) (string, int, *SyntaxError) {
	q := s[start]
	var b strings.Builder
	for i := start + 1; i < len(s); i++ {
		switch c := s[i]; c {
		case q:
			return b.String(), i + 1 - start, nil
		case '\\':
			if i+1 == len(s) {
				break
			}
			i++
			switch e := s[i]; e {
			case '\\', '"', '\'':
				b.WriteByte(e)
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			default:
				return "", 0, &SyntaxError{Pos: i, Msg: fmt.Sprintf("unknown escape %q in string", s[i-1:i+1])}
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, &SyntaxError{Pos: start + 1, Msg: "unterminated string"}
}

// Quote returns v as a value token: bare if it can be, else a double-quoted
// string that the parser reads back as v. Programs that build predicates
// quote names with it.
func Quote(v string) string {
	bare := v != ""
	for i := 0; i < len(v) && bare; i++ {
		bare = isWordByte(v[i])
	}
	if bare {
		return v
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\', '"':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		case '\r':
			b.WriteString(`\r`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// describe names a token for an error message.
func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of input"
	case tString:
		return "string " + strconv.Quote(t.text)
	}
	return strconv.Quote(t.text)
}
