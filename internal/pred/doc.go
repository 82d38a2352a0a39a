// Package pred is the predicate language of Finder.Find: a find(1)-like
// boolean expression over the attributes of a ferry.Dir. The client sends the
// predicate as text and the side that holds the tree evaluates it, so a whole
// search costs one request however slow the link.
//
// Examples:
//
//	name~*.go                         entries named *.go
//	type=d and name=.git              .git directories
//	type=f size>1M age<7d             big files changed this week (juxtaposition is and)
//	name=.git & prune | type=f        files, never descending into .git
//	path~/src/** & !name~*_test.go    everything below /src but tests
//	depth<=2 (type=d or type=l)       directories and links near the root
//	mtime>=2024-01-01 uid!=0          recent files not owned by root
//	name='my file' | name="it's"      quoted values
//
// The syntax, from the loosest binding to the tightest:
//
//	a | b, a or b          either holds
//	a & b, a and b, a b    both hold
//	!a, not a              a does not hold
//	(a)                    grouping
//	true, false            constants
//	prune                  false, and tells the walk not to descend below the
//	                       entry, like find's -prune; being false, it leaves
//	                       the pruned entry out of the results, unless the
//	                       predicate says "prune | true": "name=.git &
//	                       (prune | true)" lists .git itself, not below it
//	ATTR OP VALUE          a comparison
//
// Evaluation is left to right with short circuit, so prune takes effect
// only when it is reached: in "name=.git & prune | type=f" a .git directory
// is pruned (and does not match) while other entries go on to "type=f".
//
// OP is = != < <= > >= ~ (matches the glob) or !~ (does not match the glob),
// with or without spaces around it. ATTR is a bare word; VALUE is a bare word
// or a quoted string. A bare word is a run of bytes other than white space and
// the characters ( ) & | = ! < > ~ ' and ". A string is in single or double
// quotes and may use the escapes \\ \" \' \n \t and \r. The keywords (and,
// or, not, true, false, prune) are keywords only where no operator follows
// them: "not=x" names an attribute not (and fails: there is none). The words and, or and not
// and juxtaposition spare shell users most quoting; the symbols need it:
//
//	ferry find / 'type=f & size>1M'
//
// Attributes compare as numbers or as strings:
//
//	size         bytes; the value may end in k or K, M, G, T (powers of 1024): size>=1M
//	uid, gid     decimal numbers
//	nlink        decimal number
//	mode         octal: mode=0755
//	mtime        an RFC 3339 time, a date 2006-01-02 (midnight UTC) or
//	             nanoseconds since the epoch: mtime<2024-01-01T12:00:00Z
//	age          derived: the time since mtime, measured from the "now" the
//	             predicate was parsed at; the value is a Go duration with an
//	             optional leading number of days: age<90s, age>7d, age<1d12h
//	depth        not an attribute of the entry but its depth below the
//	             find's root, which has depth 0: depth<=2
//	type         f (file), d (directory), l (symbolic link), p (named pipe),
//	             s (socket), c and b (character and block device), o (other)
//	others       name, path, target, hash, atime, ctime, ino, rdev,
//	             extended attributes (xattr.NAME) and a layer's decorations
//	             (names that begin with a capital) compare as strings,
//	             byte by byte
//
// Any other attribute name is an error, with the closest name if one is
// near ("nmae~*.go": did you mean name?), and so is a type that is not one
// of the letters above: a typo must not silently match nothing.
// A comparison on an attribute the entry lacks is false, except != and !~,
// which are true. A stored numeric attribute that does not parse counts as
// missing.
//
// The ~ and !~ operators match globs, in the syntax of path.Match: * matches
// any run of characters but '/', ? any one character but '/', [...] a class of
// characters, and \ escapes the next character; in addition ** matches any
// run of characters, '/' included, and "**/" as a whole path element matches
// zero or more directories, as in bash's globstar and gitignore:
// "path~/src/**/*.go" matches /src/a.go and /src/x/y/a.go. As in the shell, a class never matches
// '/' (path.Match lets a negated class match it). A glob must match the whole
// value: on name the entry's last path element, on path its whole rooted path
// ("path~/src/**.go"), on other attributes their stored text ("mode~07??"),
// and on depth its decimal form. Globs do not apply to age.
//
// A malformed predicate fails with a ferry.KindInvalid error wrapping a
// *SyntaxError, which gives the column of the offending token.
package pred
