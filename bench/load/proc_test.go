package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want time.Duration
		bad  bool
	}{
		{stat: "1234 (ferry) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 12 0 100 0 0", want: 3250 * time.Millisecond},
		// A name with spaces and parentheses: fields count from the last ')'.
		{stat: "1234 (a) b (c)) R 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 1 0 0", want: 30 * time.Millisecond},
		{stat: "1234 ferry S 1", bad: true},
		{stat: "1234 (ferry) S 1 2 3", bad: true},
		{stat: "1234 (ferry) S 1 1234 1234 0 -1 4194560 100 0 0 0 x 75 0", bad: true},
	} {
		got, err := parseStatCPU(tc.stat)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("parseStatCPU(%q) = %v, %v; want %v, error %v", tc.stat, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseStatusMem(t *testing.T) {
	status := "Name:\tferry\nVmPeak:\t 2000000 kB\nVmHWM:\t  300000 kB\nVmRSS:\t  250000 kB\nThreads:\t12\n"
	rss, hwm, err := parseStatusMem(strings.NewReader(status))
	if err != nil || rss != 250000<<10 || hwm != 300000<<10 {
		t.Errorf("parseStatusMem = %d, %d, %v; want %d, %d", rss, hwm, err, 250000<<10, 300000<<10)
	}
	// A kernel thread has neither.
	if _, _, err := parseStatusMem(strings.NewReader("Name:\tkthreadd\n")); err == nil {
		t.Error("status without VmRSS parsed without error")
	}
	if _, _, err := parseStatusMem(strings.NewReader("VmRSS:\t12 MB\nVmHWM:\t12 kB\n")); err == nil {
		t.Error("VmRSS in MB parsed without error")
	}
}

// TestReadProc reads this process, which certainly has CPU time and memory.
func TestReadProc(t *testing.T) {
	p, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.rss <= 0 || p.hwm < p.rss || p.cpu < 0 {
		t.Errorf("readProc(self) = %+v: want a resident set within its peak", p)
	}
	if _, err := readProc(-1); err == nil {
		t.Error("readProc(-1) succeeded")
	}
}
