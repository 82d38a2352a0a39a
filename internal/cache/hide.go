package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path"
	"strings"

	"github.com/ferryfs/ferry"
)

// HiddenPrefix starts the names Hide gives. Front ends show no such name:
// a listing leaves them out and a lookup does not find them.
const HiddenPrefix = ".ferry-gone-"

// Hidden reports whether name is one Hide gives.
func Hidden(name string) bool { return strings.HasPrefix(name, HiddenPrefix) }

// Hide renames the file p to a fresh hidden name in its directory and
// returns that name. A front end that cannot tell whether a descriptor is
// open on a file (a mount whose kernel opens files by itself) hides the
// file rather than remove it, as NFS clients rename such a file to
// ".nfsXXXX": the descriptor reads and writes on under the hidden name, and
// the front end removes it once no descriptor can be open. The name is
// made of 64 random bits, so no file is there: under a write lease the
// rename goes in the background even where the cache has not listed the
// directory.
func (c *FS) Hide(ctx context.Context, p string) (string, error) {
	var b [8]byte
	rand.Read(b[:])
	hidden := path.Join(path.Dir(p), HiddenPrefix+hex.EncodeToString(b[:]))
	if _, err := c.move(ctx, p, hidden, true).Wait(); err != nil {
		return "", err
	}
	return hidden, nil
}

// MoveHiding renames from to to, as Move does, but hides the file it
// replaces at to first (see Hide) and returns its hidden name. If the
// rename fails the file is put back, and the name returned is empty
// unless that failed too.
func (c *FS) MoveHiding(ctx context.Context, from, to string) (string, ferry.Dir, error) {
	hidden, err := c.Hide(ctx, to)
	if err != nil {
		return "", nil, err
	}
	d, err := c.move(ctx, from, to, true).Wait()
	if err != nil {
		// The rename failed: the file replaced is put back.
		if _, berr := c.move(ctx, hidden, to, true).Wait(); berr != nil {
			return hidden, nil, err
		}
		return "", nil, err
	}
	return hidden, d, nil
}
