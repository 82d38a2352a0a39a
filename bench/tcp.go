package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// tcpPort is where the tcp system's sender listens in the server namespace.
const tcpPort = 7078

// tcpSystem is the floor of the file workloads: one cold TCP connection
// that carries a one-byte request and the file's bytes and nothing else,
// with the namespaces' kernel settings (BBR, autotuned buffers), like nc.
// Its wall time includes what any tool over one fresh TCP connection pays
// (the handshake, a request, the congestion controller's start-up) and
// nothing a protocol adds, so a ratio to it is what Ferry's own layers
// cost. iperf3's ceiling, measured after its first second, leaves the
// start-up out. It is a reference, not a peer: ratios are never to it.
type tcpSystem struct {
	cmd *exec.Cmd
}

func (t *tcpSystem) name() string { return "tcp" }

func (t *tcpSystem) setup(ctx context.Context, e *env) (err error) {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	addr := netip.AddrPortFrom(e.srvAddr, tcpPort)
	t.cmd, err = startServer(ctx, e, "tcp sender", addr, exe, tcpcatCmd, "serve", addr.String(), filepath.Join(e.srv, bigName), e.in)
	return err
}

func (t *tcpSystem) reset(ctx context.Context, e *env) error { return nil }

func (t *tcpSystem) teardown(e *env) {
	stopServer(t.cmd)
	t.cmd = nil
}

func (t *tcpSystem) script(w workload, e *env) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNotMeasured, err)
	}
	addr := netip.AddrPortFrom(e.srvAddr, tcpPort).String()
	switch w.name {
	case "get-file":
		return fmt.Sprintf("%s %s get %s %s", q(exe), tcpcatCmd, addr, q(filepath.Join(e.out, bigName))), nil
	case "read-file":
		return fmt.Sprintf("%s %s get %s /dev/null", q(exe), tcpcatCmd, addr), nil
	case "put-file":
		return fmt.Sprintf("%s %s put %s %s", q(exe), tcpcatCmd, addr, q(e.h.data.putBig)), nil
	}
	return "", notApplicable("one TCP stream of one file is the floor of the file workloads only")
}

// tcpcatCmd is the first argument that makes the bench binary the tcp
// system's sender or receiver instead of the harness.
const tcpcatCmd = "tcpcat"

// tcpcat is the bench binary run as `tcpcat serve ADDR FILE DIR`, `tcpcat
// get ADDR OUT` or `tcpcat put ADDR FILE`. The server answers a request
// byte 'g' with FILE's bytes, and 'p' followed by a name and a newline by
// storing the rest of the stream as DIR/name (through a temporary file)
// and answering one byte once it is stored.
func tcpcat(args []string) error {
	switch {
	case len(args) == 4 && args[0] == "serve":
		l, err := net.Listen("tcp", args[1])
		if err != nil {
			return err
		}
		return tcpServe(l, args[2], args[3])
	case len(args) == 3 && args[0] == "get":
		return tcpGet(args[1], args[2])
	case len(args) == 3 && args[0] == "put":
		return tcpPut(args[1], args[2])
	}
	return fmt.Errorf("usage: %s serve ADDR FILE DIR | get ADDR OUT | put ADDR FILE", tcpcatCmd)
}

// tcpServe answers the connections l accepts until it is closed.
func tcpServe(l net.Listener, file, dir string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			if err := tcpAnswer(c.(*net.TCPConn), file, dir); err != nil {
				fmt.Fprintf(os.Stderr, "tcpcat: %v\n", err)
			}
		}()
	}
}

func tcpAnswer(c *net.TCPConn, file, dir string) error {
	r := bufio.NewReader(c)
	op, err := r.ReadByte()
	if err != nil {
		return err
	}
	switch op {
	case 'g':
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(c, f) // sendfile(2)
		return err
	case 'p':
		name, err := r.ReadString('\n')
		name = strings.TrimSuffix(name, "\n")
		if err != nil || name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			return fmt.Errorf("bad put name %q: %v", name, err)
		}
		f, err := os.CreateTemp(dir, ".tcpcat-")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
			return err
		}
		_, err = c.Write([]byte{1})
		return err
	}
	return fmt.Errorf("unknown request %q", op)
}

func tcpGet(addr, out string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'g'}); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, c); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func tcpPut(addr, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("p" + filepath.Base(file) + "\n")); err != nil {
		return err
	}
	if _, err := io.Copy(c, f); err != nil {
		return err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return errors.New("the server did not confirm the file")
	}
	return nil
}
