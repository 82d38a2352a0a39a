package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryfs/ferry/internal/sshd"
)

// startSSHD starts an sshd of its own in the bed's server namespace,
// listening on the server address only, and writes the client's ssh_config
// with a Host "bench" that reaches it. The returned function stops it.
func startSSHD(ctx context.Context, e *env) (stop func(), err error) {
	k := e.h.keys
	tag := e.bed.ServerNS
	conf := filepath.Join(k.Dir, "sshd_config-"+tag)
	if err := os.WriteFile(conf, sshd.Config(e.srvAddr.String(), k), 0o600); err != nil {
		return nil, err
	}
	e.sshConfig = filepath.Join(k.Dir, "ssh_config-"+tag)
	err = os.WriteFile(e.sshConfig, []byte(fmt.Sprintf(`Host bench
  HostName %v
  User root
  IdentityFile %s
  IdentitiesOnly yes
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking no
  BatchMode yes
  LogLevel ERROR
  ControlMaster no
  ControlPath none
`, e.srvAddr, k.Client)), 0o600)
	if err != nil {
		return nil, err
	}
	bin, err := sshd.Path()
	if err != nil {
		return nil, err
	}
	cmd := e.command(context.Background(), e.bed.ServerNS, bin, "-D", "-e", "-f", conf)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	stop = func() {
		cmd.Cancel()
		cmd.Wait()
	}
	if err := waitPort(ctx, e, netip.AddrPortFrom(e.srvAddr, 22)); err != nil {
		stop()
		return nil, fmt.Errorf("sshd: %w", err)
	}
	return stop, nil
}

// waitPort waits until a TCP connection from the client namespace to addr
// succeeds.
func waitPort(ctx context.Context, e *env, addr netip.AddrPort) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := e.bed.Dial(dctx, e.bed.ClientNS, "tcp", addr.String())
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %v: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// iperf measures the link's TCP throughput in each direction with iperf3:
// the ceiling any file transfer can reach. The first second (start-up) is
// left out of the average.
func iperf(ctx context.Context, e *env) (up, down float64, err error) {
	srv := e.command(context.Background(), e.bed.ServerNS, "iperf3", "-s", "-B", e.srvAddr.String())
	srv.Stdout, srv.Stderr = e.log, e.log
	if err := srv.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { srv.Cancel(); srv.Wait() }()
	if err := waitPort(ctx, e, netip.AddrPortFrom(e.srvAddr, 5201)); err != nil {
		return 0, 0, err
	}
	t := e.h.o.iperfTime
	one := func(reverse bool) (float64, error) {
		args := []string{"-c", e.srvAddr.String(), "-J", "-O", "1", "-t", fmt.Sprint(int(t.Seconds()))}
		if reverse {
			args = append(args, "-R")
		}
		ctx, cancel := context.WithTimeout(ctx, t+time.Minute)
		defer cancel()
		cmd := e.command(ctx, e.bed.ClientNS, "iperf3", args...)
		cmd.Stderr = e.log
		out, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("iperf3: %w", err)
		}
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			return 0, fmt.Errorf("iperf3 output: %w", err)
		}
		if r.Error != "" {
			return 0, fmt.Errorf("iperf3: %s", r.Error)
		}
		return r.End.SumReceived.BitsPerSecond, nil
	}
	if up, err = one(false); err != nil {
		return 0, 0, err
	}
	down, err = one(true)
	return up, down, err
}
