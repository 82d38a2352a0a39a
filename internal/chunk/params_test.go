package chunk

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestMeasureParams compares candidate chunk sizes on real data on this
// machine. It is how Default was chosen; it runs only when asked:
//
//	FERRY_MEASURE=1 go test -run MeasureParams -v ./internal/chunk
//
// For each candidate it reports, per workload, the bytes a transfer would
// send (the chunks the receiver lacks plus a chunk list of refBytes per
// chunk) and the number of chunks (index entries) per MiB.
func TestMeasureParams(t *testing.T) {
	if os.Getenv("FERRY_MEASURE") == "" {
		t.Skip("set FERRY_MEASURE=1 to measure chunk parameters")
	}
	candidates := []Params{
		{Min: 1 << 10, Avg: 4 << 10, Max: 16 << 10},
		{Min: 2 << 10, Avg: 8 << 10, Max: 64 << 10},
		{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10},
		{Min: 8 << 10, Avg: 32 << 10, Max: 128 << 10},
		{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10},
	}
	mod := filepath.Join(os.Getenv("HOME"), "go/pkg/mod/github.com")
	upgrades := [][2]string{
		{mod + "/klauspost/compress@v1.16.0", mod + "/klauspost/compress@v1.20.3"},
		{mod + "/!data!dog/zstd@v1.4.5", mod + "/!data!dog/zstd@v1.5.7"},
		{mod + "/prometheus/procfs@v0.9.0", mod + "/prometheus/procfs@v0.10.1"},
		{mod + "/prometheus/client_golang@v1.15.0", mod + "/prometheus/client_golang@v1.16.0"},
		{mod + "/cockroachdb/pebble@v1.1.5", mod + "/cockroachdb/pebble/v2@v2.1.7"},
	}
	norm := "/usr/local/go/src/cmd/vendor/golang.org/x/text/unicode/norm/"
	versions := []string{norm + "tables9.0.0.go", norm + "tables10.0.0.go", norm + "tables11.0.0.go", norm + "tables12.0.0.go", norm + "tables13.0.0.go", norm + "tables15.0.0.go"}
	edited := []string{
		"/usr/local/go/src/net/http/h2_bundle.go",
		"/usr/local/go/src/cmd/compile/internal/ssa/rewriteAMD64.go",
		"/usr/local/go/src/encoding/json/v2/arshal_test.go",
		"/usr/local/go/src/cmd/vendor/golang.org/x/sys/windows/zerrors_windows.go",
	}
	for _, p := range candidates {
		var line []string
		// Tree upgrades: the new release's files against the old one's chunks.
		var sent, whole, changedFiles int64
		for _, u := range upgrades {
			old := treeChunks(t, u[0], p, nil)
			s, w, n := upgrade(t, u[0], u[1], p, old)
			sent += s
			whole += w
			changedFiles += n
		}
		line = append(line, fmt.Sprintf("upgrades %.2f MB of %.2f MB changed (%d files)", mb(sent), mb(whole), changedFiles))
		// Successive versions of one file.
		sent, whole = 0, 0
		for i := 1; i < len(versions); i++ {
			s, w := versionCost(t, versions[i-1], versions[i], p)
			sent += s
			whole += w
		}
		line = append(line, fmt.Sprintf("versions %.0f KB of %.0f KB", kb(sent), kb(whole)))
		// One-line edits of large source files.
		sent, whole = 0, 0
		rng := rand.New(rand.NewPCG(1, 1))
		const editsPerFile = 30
		for _, f := range edited {
			a := readFile(t, f)
			for k := 0; k < editsPerFile; k++ {
				b := editLine(a, rng, k%3)
				s, _ := cost(a, b, p)
				sent += s
				whole += int64(len(b))
			}
		}
		n := int64(len(edited) * editsPerFile)
		line = append(line, fmt.Sprintf("line edit %.1f KB per edit (file %.0f KB)", kb(sent/n), kb(whole/n)))
		// Index size: chunks per MiB over the Go source tree.
		var files, bytes int64
		count := map[Hash]bool{}
		var refs int64
		treeChunks(t, "/usr/local/go/src", p, func(r Ref) { refs++; bytes += int64(r.Len); count[r.Hash] = true })
		files = int64(len(count))
		line = append(line, fmt.Sprintf("go/src %d chunks (%.0f per MiB), %d distinct", refs, float64(refs)/mb(bytes), files))
		t.Logf("%d/%d/%d KiB: %s", p.Min>>10, p.Avg>>10, p.Max>>10, strings.Join(line, "; "))
	}
}

// refBytes is the wire cost of one chunk in a chunk list: a 32-byte hash and
// a length, with protobuf framing.
const refBytes = 38

func mb(n int64) float64 { return float64(n) / 1e6 }
func kb(n int64) float64 { return float64(n) / 1e3 }

func readFile(t *testing.T, name string) []byte {
	b, err := os.ReadFile(name)
	if err != nil {
		t.Skip(err)
	}
	return b
}

// treeChunks chunks every regular file under dir, calls fn for each chunk if
// fn is not nil, and returns the set of hashes.
func treeChunks(t *testing.T, dir string, p Params, fn func(Ref)) map[Hash]bool {
	set := map[Hash]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return Refs(f, p, func(r Ref, _ []byte) error {
			set[r.Hash] = true
			if fn != nil {
				fn(r)
			}
			return nil
		})
	})
	if err != nil {
		t.Skip(err)
	}
	return set
}

// upgrade returns what updating the tree at oldDir to newDir sends: for each
// file of newDir whose content differs from the file at the same path in
// oldDir, its chunk list and the chunks neither oldDir nor the transfer so
// far holds; and the whole size of those files.
func upgrade(t *testing.T, oldDir, newDir string, p Params, have map[Hash]bool) (sent, whole, files int64) {
	var names []string
	filepath.WalkDir(newDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			names = append(names, path)
		}
		return nil
	})
	sort.Strings(names)
	for _, name := range names {
		b := readFile(t, name)
		rel, _ := filepath.Rel(newDir, name)
		if a, err := os.ReadFile(filepath.Join(oldDir, rel)); err == nil && bytes.Equal(a, b) {
			continue
		}
		files++
		whole += int64(len(b))
		Refs(bytes.NewReader(b), p, func(r Ref, _ []byte) error {
			sent += refBytes
			if !have[r.Hash] {
				have[r.Hash] = true
				sent += int64(r.Len)
			}
			return nil
		})
	}
	return sent, whole, files
}

func versionCost(t *testing.T, a, b string, p Params) (sent, whole int64) {
	x, y := readFile(t, a), readFile(t, b)
	s, _ := cost(x, y, p)
	return s, int64(len(y))
}

// cost returns what sending b to a receiver that holds a sends: b's chunk
// list and the chunks of b that a lacks.
func cost(a, b []byte, p Params) (sent int64, chunks int) {
	have := map[Hash]bool{}
	Refs(bytes.NewReader(a), p, func(r Ref, _ []byte) error { have[r.Hash] = true; return nil })
	Refs(bytes.NewReader(b), p, func(r Ref, _ []byte) error {
		chunks++
		sent += refBytes
		if !have[r.Hash] {
			have[r.Hash] = true
			sent += int64(r.Len)
		}
		return nil
	})
	return sent, chunks
}

// editLine inserts, deletes or changes one line of b at random.
func editLine(b []byte, rng *rand.Rand, kind int) []byte {
	lines := bytes.SplitAfter(b, []byte("\n"))
	i := rng.IntN(len(lines))
	switch kind {
	case 0:
		lines = append(lines[:i:i], append([][]byte{[]byte("\t// An inserted line.\n")}, lines[i:]...)...)
	case 1:
		lines = append(lines[:i:i], lines[i+1:]...)
	default:
		lines[i] = append([]byte("\tx := 1 // changed\n"), nil...)
	}
	return bytes.Join(lines, nil)
}
