package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryfs/ferry"
)

// TestUploadStaleStream: a stream whose handler starts only after the
// client asked PutStatus and resumed on a new stream (its connection broke
// while its first message was on the way) must not take the upload over
// and truncate what the newer stream wrote; the newer resume goes on.
func TestUploadStaleStream(t *testing.T) {
	u := newUploads(t.TempDir())
	ctx := context.Background()
	const key = "user/0123456789abcdef"
	write := func(at, n int64) {
		t.Helper()
		up, f, err := u.take(ctx, key, at, func() {})
		if err != nil {
			t.Fatalf("take at %d: %v", at, err)
		}
		if _, err := f.WriteAt(make([]byte, n), at); err != nil {
			t.Fatal(err)
		}
		f.Close()
		u.release(key, up, at+n)
	}
	status := func(want int64) {
		t.Helper()
		have, d, err := u.status(ctx, key)
		if err != nil || d != nil || have != want {
			t.Fatalf("status = %d, %v, %v; want %d bytes held", have, d, err, want)
		}
	}
	write(0, 100) // The first stream, cut after 100 bytes.
	status(100)
	write(100, 50) // The resume, cut again.
	status(150)
	// The first resume's twin, stale, from 100: refused.
	if _, _, err := u.take(ctx, key, 100, func() {}); ferry.KindOf(err) != ferry.KindCanceled {
		t.Errorf("a stale stream's take: %v, want kind canceled", err)
	}
	// Resuming beyond what is held is refused too.
	if _, _, err := u.take(ctx, key, 200, func() {}); ferry.KindOf(err) != ferry.KindInvalid {
		t.Errorf("take beyond what is held: %v, want kind invalid", err)
	}
	write(150, 10) // The current resume goes on from what status said.
	up := u.active[key]
	if fi, err := os.Stat(up.file); err != nil || fi.Size() != 160 {
		t.Errorf("staged file: %v, %v; want 160 bytes", fi, err)
	}
}

// TestUploadSurvivesRestart: what an upload staged stays for a server
// started later on the same staging directory (after a crash): PutStatus
// reports it and the upload resumes from there; what waited longer than
// uploadIdle is dropped at start.
func TestUploadSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	const key = "user/0123456789abcdef"
	u := newUploads(dir)
	up, f, err := u.take(ctx, key, 0, func() {})
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(make([]byte, 1000), 0)
	f.Close()
	u.release(key, up, 1000)
	// An old leftover of another upload.
	old := filepath.Join(dir, "upload-old")
	os.WriteFile(old, []byte("x"), 0o600)
	past := time.Now().Add(-2 * uploadIdle)
	os.Chtimes(old, past, past)

	// The server restarts.
	u = newUploads(dir)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an upload idle for %v was kept: %v", 2*uploadIdle, err)
	}
	have, d, err := u.status(ctx, key)
	if err != nil || d != nil || have != 1000 {
		t.Fatalf("status after a restart = %d, %v, %v; want 1000 bytes held", have, d, err)
	}
	up, f, err = u.take(ctx, key, 1000, func() {})
	if err != nil {
		t.Fatalf("resuming after a restart: %v", err)
	}
	f.Close()
	u.release(key, up, 1000)
}
