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
