package replica

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/servertest"
)

// TestJoinRunningSet adds a third member to a set of two while both
// change the tree: the new member starts on a stale copy of its own (a
// file it shares, one the set removed, a file where the set has a
// directory), copies what differs from one member, fetching only the
// chunks it lacks, goes on with the updates made meanwhile, and ends with
// the same tree as the others. It then serves: its change reaches the
// others, and a member that restarts still knows it.
func TestJoinRunningSet(t *testing.T) {
	ts := newTestSet(t, "a", "b")
	s := newSitesWith(t, &sites{testSet: ts, chunked: true}, 200*time.Millisecond)
	big := make([]byte, 10<<20) // more chunks than one ChunkRefs of a client call lists
	rand.NewChaCha8([32]byte{7}).Read(big)
	put(t, s.fs["a"], "/big", string(big))
	mkdir := func(name, p string) {
		t.Helper()
		_, err := s.fs[name].Put(context.Background(), p, ferry.Dir{ferry.AttrType: ferry.TypeDir, ferry.AttrMode: "0750"}, ferry.Whole, nil).Wait()
		must(t, err)
	}
	for _, p := range []string{"/src", "/src/util", "/many", "/w"} {
		mkdir("a", p)
	}
	mkdir("a", "/w/a")
	mkdir("b", "/w/b")
	_, err := s.fs["b"].Put(context.Background(), "/src/link", ferry.Dir{ferry.AttrType: ferry.TypeSymlink, ferry.AttrTarget: "main.c"}, ferry.Whole, nil).Wait()
	must(t, err)
	put(t, s.fs["a"], "/src/main.c", "int main() { return 0; }\n")
	put(t, s.fs["b"], "/src/util/u.c", "void u(void) {}\n")
	put(t, s.fs["b"], "/doc", "the set's doc\n")
	for i := range 40 {
		put(t, s.fs["a"], fmt.Sprintf("/many/f%02d", i), strings.Repeat(fmt.Sprint(i), 100+i))
	}
	s.quiet(t)

	// The new member's copy: stale, in part shared.
	c, set := s.joiner(t, "c", 0, func(dir string) {
		must(t, os.WriteFile(filepath.Join(dir, "big"), big, 0o644))
		must(t, os.WriteFile(filepath.Join(dir, "gone"), []byte("removed from the set"), 0o644))
		must(t, os.WriteFile(filepath.Join(dir, "src"), []byte("a file where the set has a directory"), 0o644))
	})

	// Both members change the tree while c joins.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := fmt.Sprintf("/w/%s/f%d", name, i%7)
				if _, err := s.fs[name].Put(ctx, p, nil, -1, strings.NewReader(fmt.Sprintf("%s %d", name, i))).Wait(); err != nil {
					t.Errorf("put %s at %s: %v", p, name, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if err := s.sets["b"].Command(ctx, []string{"add", "c", c.Addr, c.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	if err := set.waitReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // changes after the join, too
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	s.same(t)
	t.Logf("c fetched %d bytes, applied %d updates, %d fenced", set.stats.fetchedBytes.Load(), set.stats.applied.Load(), set.stats.fenced.Load())
	if fetched := set.stats.fetchedBytes.Load(); fetched >= int64(len(big)) {
		t.Errorf("c fetched %d bytes, though it held the big file's %d", fetched, len(big))
	}
	for name, m := range ts.sets {
		if cs := m.node.Conf(); !slices.Contains(cs.Voters, c.ID) || len(cs.Voters) != 3 {
			t.Errorf("%s: configuration %+v, want c a voter of three", name, cs)
		}
	}
	if st := s.sets["a"].Status(ctx); !strings.Contains(st, "member: c "+c.Addr) {
		t.Errorf("a's status does not show c:\n%s", st)
	}

	// c serves: its change reaches the others; a restarted member still
	// knows c from the log.
	put(t, s.fs["c"], "/from-c", "made at the new member")
	if got := get(t, s.fs["a"], "/from-c"); got != "made at the new member" {
		t.Fatalf("a reads %q", got)
	}
	s.restartReaches(t, "a", "c")
	s.same(t)
}

// restartReaches restarts member name and checks that a change made
// there reaches member reader.
func (s *sites) restartReaches(t *testing.T, name, reader string) {
	t.Helper()
	s.stop(name)
	s.restart(t, name)
	put(t, s.fs[name], "/restarted-"+name, name+" again")
	if got := get(t, s.fs[reader], "/restarted-"+name); got != name+" again" {
		t.Fatalf("%s reads %q after %s restarted", reader, got, name)
	}
}

// joiner starts member name, new to the set and oneWay from the others,
// on a copy that seed makes in its directory, and returns it, not yet
// added.
func (s *sites) joiner(t *testing.T, name string, oneWay time.Duration, seed func(dir string)) (Member, *Set) {
	ts := s.testSet
	m := Member{Name: name, Addr: servertest.FreeAddr(t), ID: memberID(name)}
	listen := ""
	if oneWay > 0 {
		listen, m.Addr = m.Addr, servertest.DelayProxy(t, m.Addr, oneWay)
	}
	k := newKey(t)
	m.Fingerprint = auth.Fingerprint(k.Public().(ed25519.PublicKey))
	ts.keys[name] = k
	s.dirs[name], s.spools[name], s.index[name] = t.TempDir(), filepath.Join(t.TempDir(), "spool"), t.TempDir()
	seed(s.dirs[name])
	set, err := Open(Config{Members: append(slices.Clone(ts.members), m), Key: k, LogDir: filepath.Join(ts.dir, name),
		Tick: 20 * time.Millisecond, Join: true, Listen: listen})
	if err != nil {
		t.Fatal(err)
	}
	ts.sets[name] = set
	s.layer(t, name)
	return m, set
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRemoveMember: with a member gone, a change whose grant every member
// must apply waits; removing the member at another lets it through, drops
// the controls it held, and a member restarted from a members file that
// still names it leaves it out.
func TestRemoveMember(t *testing.T) {
	s := newSites(t, 200*time.Millisecond)
	put(t, s.fs["c"], "/c-held", "c's")
	if err := s.sets["c"].Command(context.Background(), []string{"grant", "/c-kept", "deep"}); err != nil {
		t.Fatal(err)
	}
	s.quiet(t)
	s.stop("c")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := s.fs["a"].Put(ctx, "/after", nil, ferry.Whole, strings.NewReader("after c left")).Wait()
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a change went through without c applying its grant: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.sets["b"].Command(ctx, []string{"remove", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c, ok := s.sets["a"].Controller("/c-kept/x"); ok {
		t.Errorf("c's control stands after it left: %+v", c)
	}
	if st := s.sets["a"].Status(ctx); strings.Contains(st, "member: c ") {
		t.Errorf("a still lists c:\n%s", st)
	}
	s.restartReaches(t, "a", "b")
	if st := s.sets["a"].Status(ctx); strings.Contains(st, "member: c ") {
		t.Errorf("a, restarted with a members file naming c, lists it:\n%s", st)
	}
	if err := s.sets["b"].Command(ctx, []string{"add", "c", "127.0.0.1:1", s.sets["b"].self.Fingerprint + "x"}); err == nil {
		t.Error("c, removed, was added again under its name")
	}
	s.quiet(t)
}
