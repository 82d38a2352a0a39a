// Package testenv holds the project's rule for tests that need something a
// machine may lack (root, /dev/fuse, TUN devices, network namespaces, a
// program): without it a test is skipped with the reason, except under CI
// (CI=true), where the lack is a failure, so that CI never passes by
// skipping.
package testenv

import (
	"os"
	"testing"
)

// Require skips t, or under CI fails it, if missing (what the test lacks)
// is not empty.
func Require(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("cannot run: %s (CI=true: not skipping)", missing)
	}
	t.Skipf("skipping: %s", missing)
}

// RequireErr is Require for an error that says what is missing; nil means
// nothing is.
func RequireErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		Require(t, err.Error())
	}
}
