package auth

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ferryfs/ferry"
)

func TestKeyKeptAcrossLoads(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sub", "k")
	k1, created, err := LoadOrCreateKey(file)
	if err != nil || !created {
		t.Fatalf("first load: %v, created=%v", err, created)
	}
	k2, created, err := LoadOrCreateKey(file)
	if err != nil || created || !k1.Equal(k2) {
		t.Errorf("second load: %v, created=%v, same key %v", err, created, k1.Equal(k2))
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestIdentify(t *testing.T) {
	dir := t.TempDir()
	a := &Authorizer{KeysFile: filepath.Join(dir, "keys"), TokensFile: filepath.Join(dir, "toks")}
	k, _, _ := LoadOrCreateKey(filepath.Join(dir, "k"))
	cert, _ := Certificate(k)
	if _, err := a.Identify(cert.Certificate, ""); ferry.KindOf(err) != ferry.KindAuth {
		t.Errorf("unknown key: %v, want an auth error", err)
	}
	a.Authorize(Fingerprint(k.Public().(ed25519.PublicKey)), "ann")
	a.Authorize(Fingerprint(k.Public().(ed25519.PublicKey)), "ann") // Idempotent.
	if b, _ := os.ReadFile(a.KeysFile); strings.Count(string(b), "\n") != 1 {
		t.Errorf("authorizing twice wrote %q", b)
	}
	if u, err := a.Identify(cert.Certificate, ""); err != nil || u != "ann" {
		t.Errorf("known key: %q, %v", u, err)
	}
}

// FuzzLoadKey: a key file holding anything at all is an invalid-key error,
// never a panic.
func FuzzLoadKey(f *testing.F) {
	seed := filepath.Join(f.TempDir(), "k")
	if _, _, err := LoadOrCreateKey(seed); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		file := filepath.Join(t.TempDir(), "k")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		key, _, err := LoadOrCreateKey(file)
		if err == nil && len(key) != ed25519.PrivateKeySize {
			t.Fatalf("loaded a key of %d bytes", len(key))
		}
		if err != nil && ferry.KindOf(err) != ferry.KindInvalid {
			t.Fatalf("error of kind %v: %v", ferry.KindOf(err), err)
		}
	})
}

// TestLoadOrCreateKeyRace: processes that start together on a fresh home
// (a server and its first client) all end up with the one key that was
// written, and only one of them reports making it.
func TestLoadOrCreateKeyRace(t *testing.T) {
	for range 20 {
		file := filepath.Join(t.TempDir(), "home", "key")
		const n = 8
		keys := make([]ed25519.PrivateKey, n)
		created := make([]bool, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys[i], created[i], errs[i] = LoadOrCreateKey(file)
			}()
		}
		wg.Wait()
		makers := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if !keys[i].Equal(keys[0]) {
				t.Fatalf("two keys made at once differ")
			}
			if created[i] {
				makers++
			}
		}
		if makers != 1 {
			t.Fatalf("%d callers report making the key, want 1", makers)
		}
		onDisk, _, err := LoadOrCreateKey(file)
		if err != nil || !onDisk.Equal(keys[0]) {
			t.Fatalf("the key on disk is not the one handed out: %v", err)
		}
	}
}
