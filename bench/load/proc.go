package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/PID/stat. Linux fixes it at
// 100 for that interface on every architecture this runs on, whatever the
// kernel's own tick.
const userHZ = 100

// procStat is what /proc says of a process at one moment.
type procStat struct {
	cpu time.Duration // user and system time so far
	rss int64         // resident set now, bytes
	hwm int64         // the largest resident set so far, bytes
}

// readProc reads /proc/PID/stat and /proc/PID/status.
func readProc(pid int) (procStat, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("reading process %d: %w", pid, err)
	}
	cpu, err := parseStatCPU(string(stat))
	if err != nil {
		return procStat{}, fmt.Errorf("process %d: %w", pid, err)
	}
	f, err := os.Open(dir + "/status")
	if err != nil {
		return procStat{}, fmt.Errorf("reading process %d: %w", pid, err)
	}
	defer f.Close()
	rss, hwm, err := parseStatusMem(f)
	if err != nil {
		return procStat{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return procStat{cpu: cpu, rss: rss, hwm: hwm}, nil
}

// parseStatCPU returns utime+stime from the text of /proc/PID/stat. The
// command name (field 2) may hold spaces and parentheses, so the fields
// are counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad stat %q", stat)
	}
	// After the name: state (field 3) ... utime (14), stime (15).
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad CPU time in stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// parseStatusMem returns VmRSS and VmHWM, in bytes, from /proc/PID/status.
func parseStatusMem(r io.Reader) (rss, hwm int64, err error) {
	sc := bufio.NewScanner(r)
	found := 0
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("bad %s line %q", k, sc.Text())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bad %s: %w", k, err)
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			hwm = n << 10
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("VmRSS or VmHWM missing from status")
	}
	return rss, hwm, nil
}

// machine describes this machine for the report: cores, memory, kernel.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "unknown memory"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && k == "MemTotal" {
				if f := strings.Fields(v); len(f) == 2 {
					if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
						mem = fmt.Sprintf("%.1f GiB memory", float64(kb)/(1<<20))
					}
				}
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("nproc %d (%s), %s%s, %s", runtime.NumCPU(), cpu, mem, kernel, runtime.Version())
}

// loadavg returns the load averages of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// nproc is the number of CPUs this process may use.
func nproc() int { return runtime.NumCPU() }
