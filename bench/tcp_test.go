package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestTCPCat moves a file each way through the tcp system's sender over
// loopback and checks the bytes, and that a put naming a path outside the
// directory stores nothing.
func TestTCPCat(t *testing.T) {
	dir := t.TempDir()
	srvDir := filepath.Join(dir, "srv")
	in := filepath.Join(dir, "in")
	for _, d := range []string{srvDir, in} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("ferry tcp floor "), 1<<16)
	if err := os.WriteFile(filepath.Join(srvDir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- tcpServe(l, filepath.Join(srvDir, "big"), in) }()
	t.Cleanup(func() { l.Close(); <-served })
	addr := l.Addr().String()

	out := filepath.Join(dir, "out")
	if err := tcpGet(addr, out); err != nil {
		t.Fatalf("get: %v", err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, big) {
		t.Errorf("get: %d bytes, want the file's %d", len(got), len(big))
	}

	up := filepath.Join(dir, "up")
	if err := os.WriteFile(up, big[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tcpPut(addr, up); err != nil {
		t.Fatalf("put: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(in, "up")); !bytes.Equal(got, big[:1000]) {
		t.Errorf("put: stored %d bytes, want 1000", len(got))
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("p../escape\ndata"))
	c.(*net.TCPConn).CloseWrite()
	if n, _ := c.Read(make([]byte, 1)); n != 0 {
		t.Errorf("a put named ../escape was confirmed")
	}
	c.Close()
	if ents, _ := os.ReadDir(in); len(ents) != 1 {
		t.Errorf("the put directory holds %d entries, want only up", len(ents))
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); err == nil {
		t.Errorf("a put named ../escape stored a file outside the directory")
	}
}
