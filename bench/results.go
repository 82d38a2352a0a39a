package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ferryfs/ferry/internal/netem"
)

// resultsFormat is the version of the results file's layout; a file of
// another version is refused rather than misread.
const resultsFormat = 1

// resultsFile is the JSON form of -results FILE: everything measured so far
// by one or more invocations, so that the condition matrix can be measured
// in parts and the report made from all of them.
type resultsFile struct {
	Format      int             `json:"format"`
	Inputs      inputs          `json:"inputs"`
	CC          string          `json:"congestion_control,omitempty"`
	Invocations []invocation    `json:"invocations"`
	Ceilings    []ceilingRecord `json:"ceilings,omitempty"`
	Cells       []cellRecord    `json:"cells,omitempty"`
}

// inputs are what a result depends on besides its link condition and the
// Ferry commit: results made with different inputs do not belong in one
// table, so a results file holds results of one set of inputs only.
type inputs struct {
	BigSize        int64        `json:"big"`
	Tree           string       `json:"tree"`
	Modules        int          `json:"modules"`
	DocSize        int          `json:"doc_size"`
	Repo           string       `json:"repo"`
	UpgradeDir     string       `json:"upgrade_dir"`
	Incompressible bool         `json:"incompressible"`
	Rate           int64        `json:"rate"`
	Runs           int          `json:"runs"`
	Timeout        jsonDuration `json:"timeout"`
}

// inputsOf returns the inputs of a run with options o.
func inputsOf(o *options) inputs {
	return inputs{
		BigSize: o.bigSize, Tree: o.tree, Modules: o.modules, DocSize: o.docSize,
		Repo: o.repo, UpgradeDir: o.upgradeDir, Incompressible: o.incompressible,
		Rate: o.rate, Runs: o.runs, Timeout: jsonDuration(o.timeout),
	}
}

// diff names the inputs in which the file's, in, and this run's differ,
// each with both values; it uses reflection so that a new input cannot be
// left out of the comparison.
func (in inputs) diff(run inputs) []string {
	var d []string
	a, b := reflect.ValueOf(in), reflect.ValueOf(run)
	for i := range a.NumField() {
		if x, y := a.Field(i).Interface(), b.Field(i).Interface(); x != y {
			name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("json"), ",")
			d = append(d, fmt.Sprintf("%s %v in the file, %v in this run", name, x, y))
		}
	}
	return d
}

// invocation is one `go run ./bench` that added results to the file, for
// the report's header.
type invocation struct {
	Command   string    `json:"command"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished,omitzero"` // zero: interrupted, or still running
	LoadStart string    `json:"load_start,omitempty"`
	LoadEnd   string    `json:"load_end,omitempty"`
}

// condRecord is a condition in the file.
type condRecord struct {
	RTT  jsonDuration `json:"rtt"`
	Loss float64      `json:"loss"`
	Rate int64        `json:"rate"`
}

func recordCond(c condition) condRecord {
	return condRecord{RTT: jsonDuration(c.RTT), Loss: c.Loss, Rate: c.Rate}
}

func (c condRecord) condition() condition {
	return condition{RTT: time.Duration(c.RTT), Loss: c.Loss, Rate: c.Rate}
}

// cellRecord is a cell in the file. Times holds every run, fastest first,
// so that the median can be recomputed.
type cellRecord struct {
	Workload string `json:"workload"`
	System   string `json:"system"`
	condRecord
	Commit string         `json:"commit,omitempty"`
	Times  []jsonDuration `json:"times,omitempty"`
	Median jsonDuration   `json:"median,omitzero"`
	Up     *netem.Stats   `json:"up,omitempty"`
	Down   *netem.Stats   `json:"down,omitempty"`
	Error  *errorRecord   `json:"error,omitempty"`
}

// ceilingRecord is a condition's iperf3 ceiling in the file.
type ceilingRecord struct {
	condRecord
	Up    float64      `json:"up_bps"`
	Down  float64      `json:"down_bps"`
	Error *errorRecord `json:"error,omitempty"`
}

// errorRecord is why a cell has no time: the class the report words it by
// and the message as it was.
type errorRecord struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

// errorClass is a class of errors the report tells apart, by the sentinel
// its errors wrap.
type errorClass struct {
	name     string
	sentinel error
}

// errorClasses returns the classes in the order they are tested: errSkipped
// wraps errTimeout, so it comes first. An error of none of them is
// "failed".
func errorClasses() []errorClass {
	return []errorClass{
		{"skipped", errSkipped},
		{"timeout", errTimeout},
		{"not-applicable", errNotApplicable},
		{"not-measured", errNotMeasured},
		{"unavailable", errUnavailable},
	}
}

const failedClass = "failed"

func recordError(err error) *errorRecord {
	if err == nil {
		return nil
	}
	for _, c := range errorClasses() {
		if errors.Is(err, c.sentinel) {
			return &errorRecord{Class: c.name, Message: err.Error()}
		}
	}
	return &errorRecord{Class: failedClass, Message: err.Error()}
}

// decode returns the error e records: its message as it was, wrapping its
// class's sentinel so that errors.Is sees what the report needs.
func (e *errorRecord) decode() (error, error) {
	if e == nil {
		return nil, nil
	}
	if e.Class == failedClass {
		return &storedError{msg: e.Message}, nil
	}
	for _, c := range errorClasses() {
		if c.name == e.Class {
			return &storedError{msg: e.Message, class: c.sentinel}, nil
		}
	}
	return nil, fmt.Errorf("unknown error class %q", e.Class)
}

// storedError is an error read back from a results file.
type storedError struct {
	msg   string
	class error // nil for a plain failure
}

func (e *storedError) Error() string { return e.msg }
func (e *storedError) Unwrap() error { return e.class }

// errSkipped marks a cell that was not run because the same system and
// workload timed out at a shorter round trip with the same loss and rate:
// a longer round trip only makes it slower. It wraps errTimeout, so the
// skip rule carries on to longer round trips still.
var errSkipped = fmt.Errorf("%w: over the limit at a shorter round trip", errTimeout)

// skipped returns the error of a cell skipped because of the timeout at
// condition at.
func skipped(at condition) error {
	return fmt.Errorf("%w (timed out at %s), not run", errSkipped, at.column())
}

// jsonDuration is a time.Duration written as Go writes durations
// ("1.5s"), which reads back exactly and is readable.
type jsonDuration time.Duration

func (d jsonDuration) String() string { return time.Duration(d).String() }

func (d jsonDuration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

func (d *jsonDuration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = jsonDuration(v)
	return err
}

// loadResults reads the results file at path, or returns nil if there is
// none yet. It refuses a file made with inputs other than in.
func loadResults(path string, in inputs) (*resultsFile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f resultsFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("results file %s: %w", path, err)
	}
	if f.Format != resultsFormat {
		return nil, fmt.Errorf("results file %s has format %d, this harness writes %d: use another -results file", path, f.Format, resultsFormat)
	}
	if d := f.Inputs.diff(in); len(d) > 0 {
		return nil, fmt.Errorf("results file %s was made with other inputs (%s): its results and this run's would not be comparable; use another -results file, or the inputs it was made with", path, strings.Join(d, "; "))
	}
	return &f, nil
}

// writeFileAtomic replaces the file at path with b by writing a temporary
// file beside it and renaming it over, so that an interruption leaves
// either the old file or the new one.
func writeFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // After the rename, nothing is there.
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ferryCommit returns the commit of the repository at root that the run
// builds Ferry from, with "-dirty" if files outside bench/ have uncommitted
// changes, or "" if git cannot tell. bench/ is left out because the
// harness's own reports live there and change with every run, and the
// Ferry binary is not built from it.
func ferryCommit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench").Output()
	if err == nil && len(strings.TrimSpace(string(st))) > 0 {
		commit += "-dirty"
	}
	return commit
}

// compareConds orders conditions by rate, loss and round trip: the
// report's columns, and the order in which the skip rule needs them run.
func compareConds(a, b condition) int {
	switch {
	case a.Rate != b.Rate:
		return cmp.Compare(a.Rate, b.Rate)
	case a.Loss != b.Loss:
		return cmp.Compare(a.Loss, b.Loss)
	}
	return cmp.Compare(a.RTT, b.RTT)
}

// sortedRecords returns the file's cells in a stable order, so that a
// rewritten file differs from the last only by what changed.
func sortedRecords(cells []cellRecord) []cellRecord {
	slices.SortFunc(cells, func(a, b cellRecord) int {
		if c := compareConds(a.condition(), b.condition()); c != 0 {
			return c
		}
		if c := strings.Compare(a.Workload, b.Workload); c != 0 {
			return c
		}
		return strings.Compare(a.System, b.System)
	})
	return cells
}

// resultsFile returns everything r holds in the file's form.
func (r *report) resultsFile() *resultsFile {
	f := &resultsFile{Format: resultsFormat, Inputs: inputsOf(r.opts), CC: r.cc, Invocations: r.invocations()}
	for c, ce := range r.ceilings {
		f.Ceilings = append(f.Ceilings, ceilingRecord{condRecord: recordCond(c), Up: ce.up, Down: ce.down, Error: recordError(ce.err)})
	}
	slices.SortFunc(f.Ceilings, func(a, b ceilingRecord) int { return compareConds(a.condition(), b.condition()) })
	for k, x := range r.cells {
		rec := cellRecord{Workload: k.workload, System: k.system, condRecord: recordCond(k.cond), Commit: x.commit, Median: jsonDuration(x.median), Error: recordError(x.err)}
		for _, t := range x.times {
			rec.Times = append(rec.Times, jsonDuration(t))
		}
		if x.err == nil {
			rec.Up, rec.Down = &x.up, &x.down
		}
		f.Cells = append(f.Cells, rec)
	}
	f.Cells = sortedRecords(f.Cells)
	return f
}

// load adds the results of f to r, as if r had measured them, and keeps
// f's invocations for the report's header.
func (r *report) load(f *resultsFile) error {
	r.earlier = f.Invocations
	if r.cc == "" {
		r.cc = f.CC
	}
	for _, rec := range f.Ceilings {
		err, derr := rec.Error.decode()
		if derr != nil {
			return derr
		}
		r.putCeiling(rec.condition(), ceiling{up: rec.Up, down: rec.Down, err: err})
	}
	for _, rec := range f.Cells {
		x, err := rec.cell()
		if err != nil {
			return fmt.Errorf("%s %s at %s: %w", rec.System, rec.Workload, rec.condition().column(), err)
		}
		r.put(cellKey{rec.Workload, rec.System, rec.condition()}, x)
	}
	return nil
}

// cell returns the cell rec records.
func (rec cellRecord) cell() (cell, error) {
	err, derr := rec.Error.decode()
	if derr != nil {
		return cell{}, derr
	}
	x := cell{median: time.Duration(rec.Median), commit: rec.Commit, err: err}
	for _, t := range rec.Times {
		x.times = append(x.times, time.Duration(t))
	}
	if rec.Up != nil {
		x.up = *rec.Up
	}
	if rec.Down != nil {
		x.down = *rec.Down
	}
	return x, nil
}

// save writes everything r holds to its results file, if it has one.
func (r *report) save() error {
	if r.results == "" {
		return nil
	}
	r.added = true
	b, err := json.MarshalIndent(r.resultsFile(), "", "\t")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(r.results, append(b, '\n')); err != nil {
		return fmt.Errorf("results file: %w", err)
	}
	return nil
}
