// Package sshd sets up an sshd of a benchmark's or a test's own, to run
// ssh, scp, rsync and sshfs against beside Ferry: keys made for the run
// and a configuration that lets root in by that key only.
package sshd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Keys are a host key for sshd and a client key that root may log in
// with, in one directory. No password works.
type Keys struct {
	Dir, Host, Client, Authorized string
}

// MakeKeys generates Keys in dir, which it makes if need be.
func MakeKeys(ctx context.Context, dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	k := &Keys{
		Dir:        dir,
		Host:       filepath.Join(dir, "host_ed25519"),
		Client:     filepath.Join(dir, "id_ed25519"),
		Authorized: filepath.Join(dir, "authorized_keys"),
	}
	for _, f := range []string{k.Host, k.Client} {
		if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ferry", "-f", f).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ssh-keygen: %w: %s", err, out)
		}
	}
	pub, err := os.ReadFile(k.Client + ".pub")
	if err != nil {
		return nil, err
	}
	return k, os.WriteFile(k.Authorized, pub, 0o600)
}

// Config returns an sshd_config that listens on addr, port 22, only, with
// SFTP served in process, for an sshd started with -D -e -f.
func Config(addr string, k *Keys) []byte {
	return fmt.Appendf(nil, `# sshd of a run of its own, not the system's.
ListenAddress %s:22
HostKey %s
PidFile none
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
LogLevel ERROR
MaxStartups 100
MaxSessions 100
`, addr, k.Host, k.Authorized)
}

// Path returns sshd's path, and makes the privilege separation directory
// it wants.
func Path() (string, error) {
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		return "", err
	}
	if p, err := exec.LookPath("sshd"); err == nil {
		return p, nil
	}
	return "/usr/sbin/sshd", nil
}
