package history

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name string
		ops  []Op
		ok   bool
	}{
		{"read after write", []Op{
			{Client: 0, File: "/f", Write: true, Value: "1", Call: at(0), Return: at(10)},
			{Client: 1, File: "/f", Value: "1", Call: at(20), Return: at(30)},
		}, true},
		{"stale read after write returned", []Op{
			{Client: 0, File: "/f", Write: true, Value: "1", Call: at(0), Return: at(10)},
			{Client: 1, File: "/f", Value: "", Call: at(20), Return: at(30)},
		}, false},
		{"concurrent read may see either", []Op{
			{Client: 0, File: "/f", Write: true, Value: "1", Call: at(0), Return: at(30)},
			{Client: 1, File: "/f", Value: "", Call: at(10), Return: at(20)},
		}, true},
		{"files are apart", []Op{
			{Client: 0, File: "/f", Write: true, Value: "1", Call: at(0), Return: at(10)},
			{Client: 1, File: "/g", Value: "", Call: at(20), Return: at(30)},
		}, true},
	}
	for _, tt := range tests {
		var r Recorder
		for _, op := range tt.ops {
			r.Add(op)
		}
		if err := r.Check(time.Second, t.TempDir()); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestCheckDir(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	op := func(client int, kind DirKind, name, to string, ok bool, names []string, call, ret int) DirOp {
		return DirOp{Client: client, Dir: "/d", Kind: kind, Name: name, To: to, OK: ok, Names: names, Call: at(call), Return: at(ret)}
	}
	tests := []struct {
		name string
		ops  []DirOp
		ok   bool
	}{
		{"list after add", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			op(1, List, "", "", false, []string{"a"}, 20, 30),
		}, true},
		{"stale list after add returned", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			op(1, List, "", "", false, nil, 20, 30),
		}, false},
		{"rename then list", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			op(0, Add, "b", "", false, nil, 10, 20),
			op(1, Rename, "a", "b", true, nil, 30, 40),
			op(2, List, "", "", false, []string{"b"}, 50, 60),
		}, true},
		{"a list shows a rename half done", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			op(1, Rename, "a", "c", true, nil, 20, 60),
			op(2, List, "", "", false, []string{"a", "c"}, 30, 40),
		}, false},
		{"remove of a name never there reports it missing", []DirOp{
			op(0, Remove, "a", "", false, nil, 0, 10),
			op(1, Add, "a", "", false, nil, 20, 30),
			op(0, Remove, "a", "", true, nil, 40, 50),
			op(1, Remove, "a", "", true, nil, 60, 70),
		}, false},
		{"two concurrent removes: one finds it", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			op(1, Remove, "a", "", false, nil, 20, 50),
			op(2, Remove, "a", "", true, nil, 30, 40),
		}, true},
		{"directories are apart", []DirOp{
			op(0, Add, "a", "", false, nil, 0, 10),
			{Client: 1, Dir: "/e", Kind: List, Call: at(20), Return: at(30)},
		}, true},
	}
	for _, tt := range tests {
		var r DirRecorder
		for _, op := range tt.ops {
			r.Add(op)
		}
		if err := r.Check(time.Second, t.TempDir()); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}
