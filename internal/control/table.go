// Package control is a replica set's control table: which member server
// controls which object of the tree (the primary of the replication paper,
// Zhang and Honeyman). It is the state machine of the set's raft log
// (internal/consensus): every member applies the same commands in the same
// order and so holds the same table. Nothing in it reads a clock or a random
// number; a command's effect depends only on the table and the command.
//
// A member controls a path shallowly (the object itself: a file, or a
// directory's own entries) or deeply (the path and everything below it). A
// grant is refused when another member controls the path or deeply controls
// an ancestor; a deep request is granted shallow when another member
// controls something below. Each directory keeps, per member, a count of
// the controls below it (the paper's ancestry counters), so both checks
// cost the path's depth, not the table's size. A grant's epoch is the log
// index that made it; a member's updates carry it, and a release names it,
// so a release or an update from an older grant changes nothing.
package control

import (
	"crypto/sha256"
	"fmt"
	"path"
	"sort"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/proto"
	pb "google.golang.org/protobuf/proto"
)

// Control is one row of the table.
type Control struct {
	Path   string
	Holder string
	Deep   bool
	Epoch  uint64
}

// Covers reports whether c controls p.
func (c Control) Covers(p string) bool {
	return c.Path == p || c.Deep && ferry.HasPrefix(p, c.Path)
}

// Member is a server of a replica set.
type Member struct {
	Name        string
	Addr        string // where it listens for the other members
	Fingerprint string // of its server key
	ID          uint64 // raft's
}

// EncodeMember encodes m as the context of the configuration change that
// adds it to the set.
func EncodeMember(m Member) []byte {
	b, err := pb.Marshal(toSetMember(m))
	if err != nil {
		panic(err) // a message we built always marshals
	}
	return b
}

// memberOf decodes info, the context of a change of member id: the
// member it names, if it names id and a name.
func memberOf(id uint64, info []byte) (Member, bool) {
	var m proto.SetMember
	if err := pb.Unmarshal(info, &m); err != nil || m.Id != id || id == 0 || m.Name == "" {
		return Member{}, false
	}
	return fromSetMember(&m), true
}

func toSetMember(m Member) *proto.SetMember {
	return &proto.SetMember{Id: m.ID, Name: m.Name, Addr: m.Addr, Fingerprint: m.Fingerprint}
}

func fromSetMember(m *proto.SetMember) Member {
	return Member{Name: m.Name, Addr: m.Addr, Fingerprint: m.Fingerprint, ID: m.Id}
}

// Table is the control table. It is not safe for concurrent use; the
// consensus node applies to it from one goroutine and serves readers under
// its own lock.
type Table struct {
	rows   map[string]Control
	counts map[string]map[string]int // directory -> member -> controls strictly below it
	index  uint64                    // the last entry applied
	// members are those added to the set since it began, by id; the
	// members it began with are in every member's members file.
	members map[uint64]Member
	// removed are the members removed from the set, by id: never added
	// again, and dropped from the members files' at every start.
	removed map[uint64]Member
}

// New returns an empty table.
func New() *Table {
	return &Table{rows: map[string]Control{}, counts: map[string]map[string]int{}, members: map[uint64]Member{}, removed: map[uint64]Member{}}
}

// Added implements consensus.Membership.
func (t *Table) Added(index, id uint64, info []byte) { t.Join(index, id, info) }

// Join records member id, whom the configuration change at index added,
// from the change's context (EncodeMember). A context that does not
// decode, or names another id, or a member known already, changes
// nothing; it returns the member and whether it was new.
func (t *Table) Join(index, id uint64, info []byte) (Member, bool) {
	if index > t.index {
		t.index = index
	}
	m, ok := memberOf(id, info)
	if !ok || m.Addr == "" || m.Fingerprint == "" {
		return Member{}, false
	}
	if _, ok := t.members[id]; ok {
		return Member{}, false
	}
	if _, ok := t.removed[id]; ok {
		return Member{}, false
	}
	t.members[id] = m
	return m, true
}

// Admits implements consensus.Membership: a member removed is not added
// again (under its name, which gives its id).
func (t *Table) Admits(id uint64) bool {
	_, gone := t.removed[id]
	return !gone
}

// Removed implements consensus.Membership.
func (t *Table) Removed(index, id uint64, info []byte) { t.Remove(index, id, info) }

// Remove records that the configuration change at index removed member
// id, named in the change's context (EncodeMember), and drops the
// controls it held: what it had not sent of their changes is lost with
// it. A context that does not decode or names another id changes
// nothing; it returns the member and whether it was removed.
func (t *Table) Remove(index, id uint64, info []byte) (Member, bool) {
	if index > t.index {
		t.index = index
	}
	r, ok := memberOf(id, info)
	if !ok {
		return Member{}, false
	}
	if _, ok := t.removed[id]; ok {
		return Member{}, false
	}
	delete(t.members, id)
	t.removed[id] = r
	for _, c := range t.Held(r.Name) {
		delete(t.rows, c.Path)
		t.count(c.Path, c.Holder, -1)
	}
	return r, true
}

// Gone returns the members removed from the set, by id.
func (t *Table) Gone() []Member { return sortedMembers(t.removed) }

// Members returns the members added since the set began, by id.
func (t *Table) Members() []Member { return sortedMembers(t.members) }

func sortedMembers(ms map[uint64]Member) []Member {
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func toSetMembers(ms []Member) []*proto.SetMember {
	var out []*proto.SetMember
	for _, m := range ms {
		out = append(out, toSetMember(m))
	}
	return out
}

// Index returns the log index of the last entry applied.
func (t *Table) Index() uint64 { return t.index }

// Len returns the number of rows.
func (t *Table) Len() int { return len(t.rows) }

// Controller returns the control covering p: p's own row, or the nearest
// ancestor controlled deeply.
func (t *Table) Controller(p string) (Control, bool) {
	if c, ok := t.rows[p]; ok {
		return c, true
	}
	for _, a := range ancestors(p) {
		if c, ok := t.rows[a]; ok && c.Deep {
			return c, true
		}
	}
	return Control{}, false
}

// Held returns the rows member holds, sorted by path.
func (t *Table) Held(member string) []Control {
	var out []Control
	for _, c := range t.rows {
		if c.Holder == member {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Rows returns every row, sorted by path.
func (t *Table) Rows() []Control {
	out := make([]Control, 0, len(t.rows))
	for _, c := range t.rows {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Apply applies the log entry at index, an encoded proto.ControlCmd, and
// returns its encoded proto.ControlResult. An entry that does not decode,
// or names paths that are not clean, is refused with a reason, the same way
// at every member.
func (t *Table) Apply(index uint64, data []byte) []byte {
	res := t.apply(index, data)
	out, err := pb.Marshal(res)
	if err != nil {
		panic(err) // a message we built always marshals
	}
	return out
}

func (t *Table) apply(index uint64, data []byte) *proto.ControlResult {
	if index > t.index {
		t.index = index
	}
	var cmd proto.ControlCmd
	if err := pb.Unmarshal(data, &cmd); err != nil {
		return refused("malformed command")
	}
	switch c := cmd.Cmd.(type) {
	case *proto.ControlCmd_Grant:
		return t.grant(index, c.Grant)
	case *proto.ControlCmd_Release:
		return t.release(c.Release)
	}
	return refused("unknown command")
}

func refused(reason string, cs ...Control) *proto.ControlResult {
	return &proto.ControlResult{Reason: reason, Controls: toProto(cs)}
}

// clean reports whether p is a path in the one spelling ferry.CleanPath gives.
func clean(p string) bool {
	c, err := ferry.CleanPath(p)
	return err == nil && c == p
}

func (t *Table) grant(index uint64, g *proto.Grant) *proto.ControlResult {
	s := g.GetServer()
	if s == "" || len(g.GetPaths()) == 0 || len(g.GetPaths()) > 2 {
		return refused("a grant names a member and one or two paths")
	}
	for _, m := range t.removed {
		if m.Name == s {
			return refused("member " + s + " was removed from the set")
		}
	}
	for _, p := range g.Paths {
		if !clean(p) {
			return refused(fmt.Sprintf("path %q is not clean", p))
		}
		if c, ok := t.rows[p]; ok && c.Holder != s {
			return refused("controlled by "+c.Holder, c)
		}
		for _, a := range ancestors(p) {
			if c, ok := t.rows[a]; ok && c.Deep && c.Holder != s {
				return refused("controlled by "+c.Holder, c)
			}
		}
	}
	var granted []Control
	for _, p := range g.Paths {
		c, ok := t.rows[p]
		if !ok {
			if a, ok := t.Controller(p); ok {
				granted = append(granted, a) // under our own deep control
				continue
			}
		}
		deep := g.Deep && !t.othersBelow(p, s)
		switch {
		case ok:
			if deep && !c.Deep {
				c.Deep = true // the same holder widens; its epoch stands
				t.rows[p] = c
			}
		default:
			c = Control{Path: p, Holder: s, Deep: deep, Epoch: index}
			t.rows[p] = c
			t.count(p, s, 1)
		}
		granted = append(granted, c)
	}
	return &proto.ControlResult{Ok: true, Controls: toProto(granted)}
}

func (t *Table) release(r *proto.Release) *proto.ControlResult {
	c, ok := t.rows[r.GetPath()]
	if !ok || c.Holder != r.GetServer() || c.Epoch != r.GetEpoch() {
		return refused("not held under that epoch")
	}
	delete(t.rows, c.Path)
	t.count(c.Path, c.Holder, -1)
	return &proto.ControlResult{Ok: true, Controls: toProto([]Control{c})}
}

// othersBelow reports whether a member other than s controls a path
// strictly below p.
func (t *Table) othersBelow(p, s string) bool {
	for m, n := range t.counts[p] {
		if m != s && n > 0 {
			return true
		}
	}
	return false
}

// count adds d to member's ancestry counter in every ancestor of p.
func (t *Table) count(p, member string, d int) {
	for _, a := range ancestors(p) {
		m := t.counts[a]
		if m == nil {
			m = map[string]int{}
			t.counts[a] = m
		}
		m[member] += d
		if m[member] == 0 {
			delete(m, member)
			if len(m) == 0 {
				delete(t.counts, a)
			}
		}
	}
}

// ancestors returns p's proper ancestors, nearest first; "/" has none.
func ancestors(p string) []string {
	var out []string
	for p != "/" && p != "." && p != "" {
		p = path.Dir(p)
		out = append(out, p)
	}
	return out
}

// Check verifies the table's invariants: no two members control
// overlapping objects (a deep control and another member's control below
// it), and every ancestry counter equals a recount of the rows.
func (t *Table) Check() error {
	want := map[string]map[string]int{}
	for p, c := range t.rows {
		if c.Path != p || c.Holder == "" {
			return fmt.Errorf("row %q is %+v", p, c)
		}
		for _, a := range ancestors(p) {
			if want[a] == nil {
				want[a] = map[string]int{}
			}
			want[a][c.Holder]++
			if o, ok := t.rows[a]; ok && o.Deep && o.Holder != c.Holder {
				return fmt.Errorf("%s controls %s deeply, %s controls %s below it", o.Holder, a, c.Holder, p)
			}
		}
	}
	if len(want) != len(t.counts) {
		return fmt.Errorf("counters on %d directories, recount %d", len(t.counts), len(want))
	}
	for a, m := range want {
		for s, n := range m {
			if t.counts[a][s] != n {
				return fmt.Errorf("counter of %s at %s is %d, recount %d", s, a, t.counts[a][s], n)
			}
		}
		if len(m) != len(t.counts[a]) {
			return fmt.Errorf("counters at %s name %d members, recount %d", a, len(t.counts[a]), len(m))
		}
	}
	return nil
}

// Snapshot returns the table encoded, rows sorted, so that equal tables
// encode alike.
func (t *Table) Snapshot() []byte {
	snap := &proto.ControlSnapshot{Controls: toProto(t.Rows()), Index: t.index,
		Members: toSetMembers(t.Members()), Removed: toSetMembers(t.Gone())}
	out, err := pb.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		panic(err)
	}
	return out
}

// Restore replaces the table with a snapshot's.
func (t *Table) Restore(data []byte) error {
	var s proto.ControlSnapshot
	if err := pb.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("control: snapshot: %w", err)
	}
	n := New()
	for _, c := range s.Controls {
		if !clean(c.Path) || c.Holder == "" {
			return fmt.Errorf("control: snapshot: bad row %v", c)
		}
		if _, dup := n.rows[c.Path]; dup {
			return fmt.Errorf("control: snapshot: %s twice", c.Path)
		}
		n.rows[c.Path] = Control{Path: c.Path, Holder: c.Holder, Deep: c.Deep, Epoch: c.Epoch}
		n.count(c.Path, c.Holder, 1)
	}
	if err := n.Check(); err != nil {
		return fmt.Errorf("control: snapshot: %w", err)
	}
	for _, m := range s.Removed {
		if m.Id == 0 || m.Name == "" {
			return fmt.Errorf("control: snapshot: bad member removed %v", m)
		}
		// Its controls went when it was removed: none is in the rows.
		n.removed[m.Id] = fromSetMember(m)
	}
	for _, m := range s.Members {
		info, _ := pb.Marshal(m)
		if _, ok := n.Join(0, m.Id, info); !ok {
			return fmt.Errorf("control: snapshot: bad member %v", m)
		}
	}
	n.index = s.Index
	*t = *n
	return nil
}

// Sum returns a hash of the table's state, for comparing members.
func (t *Table) Sum() [32]byte { return sha256.Sum256(t.Snapshot()) }

func toProto(cs []Control) []*proto.Control {
	out := make([]*proto.Control, len(cs))
	for i, c := range cs {
		out[i] = &proto.Control{Path: c.Path, Holder: c.Holder, Deep: c.Deep, Epoch: c.Epoch}
	}
	return out
}

// FromProto converts a result's controls.
func FromProto(cs []*proto.Control) []Control {
	out := make([]Control, len(cs))
	for i, c := range cs {
		out[i] = Control{Path: c.GetPath(), Holder: c.GetHolder(), Deep: c.GetDeep(), Epoch: c.GetEpoch()}
	}
	return out
}

// GrantCmd encodes a grant of paths to member.
func GrantCmd(member string, deep bool, paths ...string) []byte {
	return marshal(&proto.ControlCmd{Cmd: &proto.ControlCmd_Grant{Grant: &proto.Grant{Server: member, Paths: paths, Deep: deep}}})
}

// ReleaseCmd encodes a release of c.
func ReleaseCmd(c Control) []byte {
	return marshal(&proto.ControlCmd{Cmd: &proto.ControlCmd_Release{Release: &proto.Release{Server: c.Holder, Path: c.Path, Epoch: c.Epoch}}})
}

func marshal(m pb.Message) []byte {
	out, err := pb.Marshal(m)
	if err != nil {
		panic(err)
	}
	return out
}

// Result is what a command did: for a grant, the control now covering each
// path; for a refusal, the reason and the control in the way, if any.
type Result struct {
	OK       bool
	Controls []Control
	Reason   string
}

// DecodeResult decodes what Apply returned.
func DecodeResult(data []byte) (Result, error) {
	var r proto.ControlResult
	if err := pb.Unmarshal(data, &r); err != nil {
		return Result{}, fmt.Errorf("control: result: %w", err)
	}
	return Result{OK: r.Ok, Controls: FromProto(r.Controls), Reason: r.Reason}, nil
}

// Granted returns the member a command asks a grant for, if it is a grant:
// a set's leader moves toward the member granted most.
func Granted(data []byte) (string, bool) {
	var cmd proto.ControlCmd
	if err := pb.Unmarshal(data, &cmd); err != nil {
		return "", false
	}
	g, ok := cmd.Cmd.(*proto.ControlCmd_Grant)
	if !ok {
		return "", false
	}
	return g.Grant.GetServer(), true
}
