// Package replica makes several Ferry servers, one per site, one replica
// set: each holds a full copy of the tree, and which member controls which
// object (internal/control) is agreed on one raft log
// (internal/consensus). Set runs the set: its members, their mutually
// authenticated connections, the log and the control table, members
// added while it runs, and the "[replica]" section of the control file;
// FS, the replica layer, serves, forwards and streams updates by that
// table; join.go has a member added to a running set copy the tree.
package replica

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"strings"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/control"
)

// Member is one server of a replica set, as the set's members file names
// it: "NAME ADDR FINGERPRINT" a line, where ADDR is the address the member
// listens on for the other members and FINGERPRINT its server key's. Its
// raft id comes from its name (memberID), so every member agrees on it.
type Member = control.Member

// MaxMembers bounds a set: every grant waits for a majority of them.
const MaxMembers = 9

// memberID gives a member its raft id from its name.
func memberID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// LoadMembers reads a members file.
func LoadMembers(file string) ([]Member, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, ferry.E("replica.LoadMembers", file, err)
	}
	defer f.Close()
	ms, err := ParseMembers(f)
	if err != nil {
		return nil, ferry.E("replica.LoadMembers", file, ferry.KindInvalid, err)
	}
	return ms, nil
}

// ParseMembers reads the lines of a members file; blank lines and lines
// starting with # are skipped.
func ParseMembers(r io.Reader) ([]Member, error) {
	var ms []Member
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want NAME ADDR FINGERPRINT, got %d fields", n, len(f))
		}
		m := Member{Name: f[0], Addr: f[1], Fingerprint: f[2], ID: memberID(f[0])}
		for _, k := range []string{"name " + m.Name, "addr " + m.Addr, "key " + m.Fingerprint, fmt.Sprint("id ", m.ID)} {
			if seen[k] {
				return nil, fmt.Errorf("line %d: %s named twice", n, k)
			}
			seen[k] = true
		}
		ms = append(ms, m)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ms) == 0 || len(ms) > MaxMembers {
		return nil, fmt.Errorf("a set has 1 to %d members, not %d", MaxMembers, len(ms))
	}
	return ms, nil
}
