package main

import (
	"reflect"
	"strings"
	"testing"
)

const metricsText = `# HELP ferry_calls_total Calls answered, by operation.
# TYPE ferry_calls_total counter
ferry_calls_total{op="get"} 12
ferry_conn_readahead_bytes{addr="10.77.1.1:40000",user="root"} 262144
ferry_conn_readahead_bytes{addr="10.77.1.1:40002",user="ro\"ot"} 1.048576e+06
ferry_conn_readahead_target_bytes{addr="10.77.1.1:40000",user="root"} 262144
ferry_conn_readahead_target_bytes{addr="10.77.1.1:40002",user="ro\"ot"} 4.194304e+06
ferry_conn_rtt_seconds{addr="10.77.1.1:40000",user="root"} 0.05
ferry_payload_bytes_total{dir="in"} 100
ferry_payload_bytes_total{dir="out"} 5.36870912e+08
ferry_readahead_bytes 1.310720e+06
ferry_readahead_cancelled_total 3
ferry_readahead_orphaned_bytes 0
ferry_readahead_streams 2
`

func TestParseMetrics(t *testing.T) {
	got, err := parseMetrics(strings.NewReader(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot{
		held: 1310720, cancelled: 3, streams: 2,
		conns: map[string]connRA{
			"10.77.1.1:40000": {held: 262144, target: 262144},
			"10.77.1.1:40002": {held: 1048576, target: 4194304},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseMetrics:\ngot  %+v\nwant %+v", got, want)
	}
	if _, err := parseMetrics(strings.NewReader("ferry_readahead_bytes{addr=\"x\" 1\n")); err == nil {
		t.Error("unterminated labels parsed without error")
	}
}

func TestParseSample(t *testing.T) {
	for _, tc := range []struct {
		line   string
		name   string
		labels map[string]string
		value  float64
		bad    bool
	}{
		{line: "a 1", name: "a", labels: map[string]string{}, value: 1},
		{line: "a 1 1700000000000", name: "a", labels: map[string]string{}, value: 1},
		{line: `a{x="1",y="two words"} 2.5`, name: "a", labels: map[string]string{"x": "1", "y": "two words"}, value: 2.5},
		{line: `a{x="q\"\\\n"} 3`, name: "a", labels: map[string]string{"x": "q\"\\\n"}, value: 3},
		{line: `a{x="1",} 4`, name: "a", labels: map[string]string{"x": "1"}, value: 4},
		{line: "a", bad: true},
		{line: "a x", bad: true},
		{line: `a{x="1"`, bad: true},
		{line: `a{x=1} 2`, bad: true},
		{line: `a{x="1} 2`, bad: true},
	} {
		name, labels, value, err := parseSample(tc.line)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSample(%q) = %q %v %v, want an error", tc.line, name, labels, value)
			}
			continue
		}
		if err != nil || name != tc.name || !reflect.DeepEqual(labels, tc.labels) || value != tc.value {
			t.Errorf("parseSample(%q) = %q %v %v %v, want %q %v %v", tc.line, name, labels, value, err, tc.name, tc.labels, tc.value)
		}
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "262144", want: 262144},
		{in: "256KiB", want: 256 << 10},
		{in: "4MiB", want: 4 << 20},
		{in: "4mib", want: 4 << 20},
		{in: "4 MiB", want: 4 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: "32M", want: 32 << 20},
		{in: "2MB", want: 2 << 20},
		{in: "0", want: 0},
		{in: "", bad: true},
		{in: "MiB", bad: true},
		{in: "-1MiB", bad: true},
		{in: "1.5MiB", bad: true},
		{in: "4TiB", bad: true},
	} {
		got, err := parseSize(tc.in)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
	for _, n := range []int64{1, 1000, 1 << 10, 3 << 20, 1<<20 + 1, 5 << 30} {
		if got, err := parseSize(fmtSize(n)); err != nil || got != n {
			t.Errorf("parseSize(fmtSize(%d) = %q) = %d, %v", n, fmtSize(n), got, err)
		}
	}
}
