package server

import (
	"testing"
	"time"
)

// TestAuthLimit: an address may fail authBurst times at once, then once
// per authEvery; other addresses are not affected.
func TestAuthLimit(t *testing.T) {
	now := time.Unix(1e9, 0)
	l := newAuthLimit(func() time.Time { return now })
	for i := range authBurst {
		if !l.allowed("10.0.0.1") {
			t.Fatalf("refused after %d failures, want %d allowed", i, authBurst)
		}
		l.failed("10.0.0.1")
	}
	if l.allowed("10.0.0.1") {
		t.Errorf("allowed after %d failures at once", authBurst)
	}
	if !l.allowed("10.0.0.2") {
		t.Errorf("another address is refused")
	}
	now = now.Add(authEvery)
	if !l.allowed("10.0.0.1") {
		t.Errorf("still refused after %v", authEvery)
	}
	l.failed("10.0.0.1")
	if l.allowed("10.0.0.1") {
		t.Errorf("allowed a second failure within %v", authEvery)
	}
	now = now.Add(authBurst * authEvery)
	for i := range authBurst {
		if !l.allowed("10.0.0.1") {
			t.Fatalf("refused after %d failures once all were forgiven", i)
		}
		l.failed("10.0.0.1")
	}
}
