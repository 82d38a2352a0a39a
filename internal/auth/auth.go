// Package auth gives Ferry's connections their identities: ed25519 key pairs
// kept on disk, self-signed certificates for TLS 1.3, fingerprints, pinning of
// server keys on first use (like SSH's known_hosts), and the server's lists of
// authorized client keys and tokens.
//
// Files, all in one home directory (FERRY_HOME, by default ~/.config/ferry):
//
//	server.key        the server's private key (PEM, mode 0600)
//	client.key        this user's client key (PEM, mode 0600)
//	known_hosts       "ADDR FINGERPRINT" lines: pinned server keys
//	authorized_keys   "FINGERPRINT USER" lines: clients the server admits
//	tokens            "TOKEN USER" lines: bearer tokens the server admits
//
// Lines starting with # and blank lines are ignored in the lists.
package auth

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ferryfs/ferry"
)

// File names in the home directory.
const (
	ServerKeyFile      = "server.key"
	ClientKeyFile      = "client.key"
	KnownHostsFile     = "known_hosts"
	AuthorizedKeysFile = "authorized_keys"
	TokensFile         = "tokens"
)

// Home returns the directory Ferry keeps its keys and lists in: $FERRY_HOME,
// else $XDG_CONFIG_HOME/ferry, else ~/.config/ferry.
func Home() string {
	if h := os.Getenv("FERRY_HOME"); h != "" {
		return h
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "ferry")
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return ".ferry"
	}
	return filepath.Join(h, ".config", "ferry")
}

// Fingerprint returns the SSH-style fingerprint of a public key:
// "SHA256:" and the unpadded base64 of the key's SHA-256.
func Fingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// LoadOrCreateKey reads the ed25519 private key in file, creating it (and its
// directory) on first use. created reports whether it was made now.
func LoadOrCreateKey(file string) (key ed25519.PrivateKey, created bool, err error) {
	const op = "auth.LoadOrCreateKey"
	b, err := os.ReadFile(file)
	if err == nil {
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, false, ferry.E(op, file, ferry.KindInvalid, "no PEM block in key file")
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, false, ferry.E(op, file, ferry.KindInvalid, err)
		}
		ek, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, false, ferry.E(op, file, ferry.KindInvalid, "not an ed25519 key")
		}
		return ek, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, ferry.E(op, file, err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, ferry.E(op, file, err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, false, ferry.E(op, file, err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return nil, false, ferry.E(op, file, err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	// A server and a client started together on a fresh home would each
	// make a key: the first one in place wins, and the other loads it.
	if err := createFile(file, data, 0o600); errors.Is(err, os.ErrExist) {
		key, _, err := LoadOrCreateKey(file)
		return key, false, err
	} else if err != nil {
		return nil, false, ferry.E(op, file, err)
	}
	return priv, true, nil
}

// createFile writes data beside file and links it into place, so that a
// crash leaves no file or the whole one, and a file already there is never
// replaced: it then fails with an error that is os.ErrExist.
func createFile(file string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(file), ".tmp-"+filepath.Base(file))
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Link(f.Name(), file)
}

// Certificate makes a self-signed TLS certificate for key. Peers do not
// verify it against authorities: they compare the key's fingerprint.
func Certificate(key ed25519.PrivateKey) (tls.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ferry"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(100 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"ferry"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, ferry.E("auth.Certificate", "", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// peerKey returns the ed25519 key of the leaf certificate in raw.
func peerKey(raw [][]byte) (ed25519.PublicKey, error) {
	if len(raw) == 0 {
		return nil, errors.New("peer sent no certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, err
	}
	k, ok := c.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, errors.New("peer key is not ed25519")
	}
	return k, nil
}

// ServerTLS returns the server's TLS 1.3 configuration. It asks every client
// for a certificate but admits clients without one too, so that token clients
// can connect; Identify decides who a connection is.
func ServerTLS(key ed25519.PrivateKey) (*tls.Config, error) {
	cert, err := Certificate(key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequestClientCert,
		NextProtos:   []string{"h2"},
	}, nil
}

// ClientTLS returns a client's TLS 1.3 configuration for the server at addr.
// It presents key (if not nil) and checks the server's key against the
// pinned one in hosts, pinning it on first use.
func ClientTLS(key ed25519.PrivateKey, hosts *KnownHosts, addr string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is self-signed; VerifyPeerCertificate checks the key.
		InsecureSkipVerify: true,
		NextProtos:         []string{"h2"},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			k, err := peerKey(raw)
			if err != nil {
				return ferry.E("auth.ClientTLS", addr, ferry.KindAuth, err)
			}
			return hosts.Check(addr, Fingerprint(k))
		},
	}
	if key != nil {
		cert, err := Certificate(key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// KnownHosts is the client's list of pinned server keys.
type KnownHosts struct {
	File string
	// Pinned, if not nil, is told of each key pinned on first use.
	Pinned func(addr, fingerprint string)
	mu     sync.Mutex
}

// Check admits the server at addr with the key fingerprint fp if that is
// the key pinned for addr, pins it if addr has none, and fails with KindAuth
// if addr has another.
func (h *KnownHosts) Check(addr, fp string) error {
	const op = "auth.KnownHosts"
	h.mu.Lock()
	defer h.mu.Unlock()
	lines, err := readList(h.File)
	if err != nil {
		return ferry.E(op, h.File, err)
	}
	for _, l := range lines {
		if l[0] == addr {
			if subtle.ConstantTimeCompare([]byte(l[1]), []byte(fp)) == 1 {
				return nil
			}
			return ferry.E(op, addr, ferry.KindAuth, fmt.Sprintf(
				"the server's key changed: it is %s, but %s pinned %s; if the change is expected, remove the line for %s from %s",
				fp, h.File, l[1], addr, h.File))
		}
	}
	if err := appendLine(h.File, addr+" "+fp); err != nil {
		return ferry.E(op, h.File, err)
	}
	if h.Pinned != nil {
		h.Pinned(addr, fp)
	}
	return nil
}

// Known reports whether a key is pinned for addr.
func (h *KnownHosts) Known(addr string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	lines, err := readList(h.File)
	if err != nil {
		return false
	}
	for _, l := range lines {
		if l[0] == addr {
			return true
		}
	}
	return false
}

// readList reads a whitespace-separated list file; a missing file is empty.
// Lines with fewer than two fields are skipped.
func readList(file string) ([][]string, error) {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Fields(line); len(fields) >= 2 {
			out = append(out, fields)
		}
	}
	return out, sc.Err()
}

func appendLine(file, line string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Authorizer is the server's list of admitted clients: key fingerprints and
// bearer tokens, each with a user name. It rereads its files when they
// change, so keys can be added while the server runs.
type Authorizer struct {
	KeysFile, TokensFile string
}

// Authorize adds the key fingerprint fp for user to the keys file unless it
// is there already.
func (a *Authorizer) Authorize(fp, user string) error {
	lines, err := readList(a.KeysFile)
	if err != nil {
		return ferry.E("auth.Authorize", a.KeysFile, err)
	}
	for _, l := range lines {
		if l[0] == fp {
			return nil
		}
	}
	return appendLine(a.KeysFile, fp+" "+user)
}

// Identify returns the user of a connection that presented the certificate
// chain raw (may be empty) or, failing that, the bearer token (may be
// empty). It fails with KindAuth, naming the fingerprint, for a stranger.
func (a *Authorizer) Identify(raw [][]byte, token string) (string, error) {
	const op = "auth.Identify"
	fp := ""
	if len(raw) > 0 {
		k, err := peerKey(raw)
		if err != nil {
			return "", ferry.E(op, "", ferry.KindAuth, err)
		}
		fp = Fingerprint(k)
		keys, err := readList(a.KeysFile)
		if err != nil {
			return "", ferry.E(op, a.KeysFile, ferry.KindIO, err)
		}
		for _, l := range keys {
			if l[0] == fp {
				return l[1], nil
			}
		}
	}
	if token != "" {
		toks, err := readList(a.TokensFile)
		if err != nil {
			return "", ferry.E(op, a.TokensFile, ferry.KindIO, err)
		}
		for _, l := range toks {
			if subtle.ConstantTimeCompare([]byte(l[0]), []byte(token)) == 1 {
				return l[1], nil
			}
		}
		return "", ferry.E(op, "", ferry.KindAuth, "unknown token")
	}
	if fp == "" {
		return "", ferry.E(op, "", ferry.KindAuth, "the client presented neither a key nor a token")
	}
	return "", ferry.E(op, "", ferry.KindAuth, fmt.Sprintf(
		"unknown client key %s: the server's administrator can admit it with `ferry authorize %s USER`", fp, fp))
}

// NewToken returns a fresh random bearer token.
func NewToken() string {
	var b [24]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// PeerTLS returns the TLS 1.3 configuration of a connection between two
// members of a replica set: each side presents key and admits the other
// only if admit accepts its key's fingerprint. server is true for the
// listening side.
func PeerTLS(key ed25519.PrivateKey, server bool, admit func(fp string) error) (*tls.Config, error) {
	cert, err := Certificate(key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		// The chains are self-signed; VerifyPeerCertificate checks the key.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			k, err := peerKey(raw)
			if err != nil {
				return ferry.E("auth.PeerTLS", "", ferry.KindAuth, err)
			}
			return admit(Fingerprint(k))
		},
	}
	if server {
		cfg.ClientAuth = tls.RequireAnyClientCert
	}
	return cfg, nil
}

// PeerFingerprint returns the key fingerprint the other side of a TLS
// connection presented.
func PeerFingerprint(st tls.ConnectionState) (string, error) {
	var raw [][]byte
	for _, c := range st.PeerCertificates {
		raw = append(raw, c.Raw)
	}
	k, err := peerKey(raw)
	if err != nil {
		return "", ferry.E("auth.PeerFingerprint", "", ferry.KindAuth, err)
	}
	return Fingerprint(k), nil
}
