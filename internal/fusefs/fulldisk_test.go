package fusefs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/fstest"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/servertest"
	"github.com/ferryfs/ferry/internal/testenv"
)

// smallDisk mounts a tmpfs of size bytes on a new temporary directory
// until the test ends.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	needFUSE(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		testenv.Require(t, "cannot mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the tmpfs: %v", err)
		}
	})
	return dir
}

// TestFullDisk: on a server whose disk is full, a file too big for it
// fails with ENOSPC, both through a mount (on close) and through the
// native client, with no server path in the message; the mount shows no
// file the server does not have, and the served tree keeps no temporary
// file; smaller files still go through.
func TestFullDisk(t *testing.T) {
	onDiskServers(t, nil, func(t *testing.T, disk string, client *remote.Client, mnt string) {
		big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
		err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o644)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("writing 4 MiB on a 2 MiB disk through the mount: %v, want ENOSPC", err)
		}
		if _, err := os.Stat(filepath.Join(mnt, "big")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the mount after the failed write: stat big says %v, want no such file", err)
		}
		_, err = client.Put(context.Background(), "/big2", ferry.Dir{}, ferry.Whole, bytes.NewReader(big)).Wait()
		if ferry.KindOf(err) != ferry.KindNoSpace {
			t.Errorf("Put of 4 MiB on a 2 MiB disk: %v, want kind %v", err, ferry.KindNoSpace)
		}
		if err != nil && strings.Contains(err.Error(), disk) {
			t.Errorf("the client's error names the server's directory: %v", err)
		}
		for _, e := range fstest.Leftovers(disk) {
			t.Errorf("the served tree holds %s after the failed writes", e)
		}
		small := []byte("still room for this\n")
		if err := os.WriteFile(filepath.Join(mnt, "small"), small, 0o644); err != nil {
			t.Fatalf("a small file after the failures: %v", err)
		}
		if got := readFile(t, filepath.Join(disk, "small")); got != string(small) {
			t.Errorf("the server has %q, want %q", got, small)
		}
	})
}

// TestReadOnlyDisk: on a server whose disk takes no writes, writes fail
// with EROFS, through a mount and through the native client, with no
// server path in the message, while reads go on.
func TestReadOnlyDisk(t *testing.T) {
	onDiskServers(t, func(t *testing.T, disk string) {
		if err := os.WriteFile(filepath.Join(disk, "f"), []byte("kept\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("", disk, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			t.Fatalf("remounting the tmpfs read-only: %v", err)
		}
	}, func(t *testing.T, disk string, client *remote.Client, mnt string) {
		if got := readFile(t, filepath.Join(mnt, "f")); got != "kept\n" {
			t.Errorf("reading through the mount: %q", got)
		}
		writes := map[string]func() error{
			"a new file through the mount":  func() error { return os.WriteFile(filepath.Join(mnt, "new"), []byte("x"), 0o644) },
			"a rewrite through the mount":   func() error { return os.WriteFile(filepath.Join(mnt, "f"), []byte("y"), 0o644) },
			"a directory through the mount": func() error { return os.Mkdir(filepath.Join(mnt, "d"), 0o755) },
			"removing through the mount":    func() error { return os.Remove(filepath.Join(mnt, "f")) },
		}
		for what, write := range writes {
			if err := write(); !errors.Is(err, syscall.EROFS) {
				t.Errorf("%s: %v, want EROFS", what, err)
			}
		}
		_, err := client.Put(context.Background(), "/new2", ferry.Dir{}, ferry.Whole, bytes.NewReader(bytes.Repeat([]byte("z"), 200<<10))).Wait()
		if ferry.KindOf(err) != ferry.KindReadOnly {
			t.Errorf("a native Put: %v, want kind %v", err, ferry.KindReadOnly)
		}
		if err != nil && strings.Contains(err.Error(), disk) {
			t.Errorf("the client's error names the server's directory: %v", err)
		}
		if got := readFile(t, filepath.Join(mnt, "f")); got != "kept\n" {
			t.Errorf("after the failed writes the mount reads %q", got)
		}
		if _, err := os.Stat(filepath.Join(mnt, "new")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the mount shows a file never stored: %v", err)
		}
	})
}

// onDiskServers runs test against a plain and a chunked server, each over
// a tmpfs of 2 MiB that prepare (if not nil) readies first, with a client
// of the server and a mount of that client.
func onDiskServers(t *testing.T, prepare func(t *testing.T, disk string), test func(t *testing.T, disk string, client *remote.Client, mnt string)) {
	for _, chunks := range []bool{false, true} {
		name := "plain"
		if chunks {
			name = "chunked"
		}
		t.Run(name, func(t *testing.T) {
			disk := smallDisk(t, "2m")
			if prepare != nil {
				prepare(t, disk)
			}
			var srv *servertest.Server
			if chunks {
				srv = servertest.StartChunked(t, disk)
			} else {
				srv = servertest.Start(t, disk)
			}
			client := srv.Client(t, "root")
			mnt, _ := mountFS(t, client, Options{})
			test(t, disk, client, mnt)
		})
	}
}
