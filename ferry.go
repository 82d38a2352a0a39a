// Package ferry is the vocabulary of the Ferry network file system: the Dir
// entry, paths, error kinds, and the Tree and Finder interfaces that every
// layer (a directory on disk, the server, the remote client, caches, the FUSE
// adaptor) implements so that layers stack.
//
// Every call takes a context and returns at once with a Future, a Stream or a
// reader to receive from later, so a caller can have many calls in flight on
// a slow link and consume replies as they arrive (the ZX idea). Paths are
// rooted and slash-separated ("/a/b"); each layer cleans them with CleanPath.
package ferry

import (
	"context"
	"io"
	"strings"
)

// Whole, as the offset of a Put, replaces the file's whole content atomically:
// readers see the old content or the new one, never a mix, and a failed Put
// leaves the old content.
const Whole int64 = -1

// CtlPath is the control file each server and layer serves: reading it
// reports the state of the layer and those below, writing a line to it runs a
// command ("pass CMD" forwards CMD one layer down).
const CtlPath = "/Ctl"

// IsCtl reports whether p names the control file. Layers ask it of
// every call's path: one without the name is answered with no cleaning.
func IsCtl(p string) bool {
	if !strings.Contains(p, "Ctl") {
		return false
	}
	c, err := CleanPath(p)
	return err == nil && c == CtlPath
}

// Controller is what a layer reports and obeys through the control file
// (internal/ctl stacks them).
type Controller interface {
	// Status returns the layer's state as text, one "key: value" a line.
	Status(ctx context.Context) string
	// Command runs one command line, split into words. It fails with
	// KindInvalid for a command it does not know.
	Command(ctx context.Context, args []string) error
}

// Tree is a file tree. Implementations are safe for concurrent use.
//
// Errors are *Error values whose Kind says what went wrong; a Tree never
// classifies errors by their text.
type Tree interface {
	// Stat returns the entry at path. It fails with KindNotExist if there is
	// none. A symbolic link is described, not followed.
	Stat(ctx context.Context, path string) *Future[Dir]

	// Get returns a reader for count bytes of the file at path starting at
	// off; count < 0 reads to the end. The call returns at once: errors
	// (KindNotExist, KindIsDir for a directory, ...) come from the first Read.
	// Reading past the end gives io.EOF. The caller must Close the reader;
	// closing it early cancels the transfer.
	Get(ctx context.Context, path string, off, count int64) io.ReadCloser

	// Put creates or updates the entry at path in one call and returns the
	// resulting entry. d gives the type (TypeFile if absent, TypeDir,
	// TypeSymlink with AttrTarget, a pipe, a socket, or a device with
	// AttrRdev) and any of mode, mtime, atime, uid and gid to set.
	// For a file, data (which may be nil) is written at off, in place, or with
	// off == Whole it replaces the content atomically. Putting a directory
	// that exists updates its attributes. The parent must exist
	// (KindNotExist otherwise). Decorations in d are ignored.
	Put(ctx context.Context, path string, d Dir, off int64, data io.Reader) *Future[Dir]

	// Move renames from to to, replacing a file or an empty directory at to,
	// and returns the entry at its new path.
	Move(ctx context.Context, from, to string) *Future[Dir]

	// Link makes to a new name for the entry at from, a hard link that
	// shares its content and attributes, and returns the entry at to. It
	// fails with KindExist if to exists, and with the kind the server's
	// file system gives where it has no hard links or from is a directory.
	Link(ctx context.Context, from, to string) *Future[Dir]

	// Remove removes a file, a link or an empty directory (KindNotEmpty
	// otherwise).
	Remove(ctx context.Context, path string) *Future[struct{}]

	// RemoveAll removes path and everything below it. It succeeds if path
	// does not exist.
	RemoveAll(ctx context.Context, path string) *Future[struct{}]

	// Wstat changes the attributes of the entry at path that d names: mode,
	// mtime, atime, uid, gid, and size, which truncates or extends a file.
	// Other attributes are ignored. It returns the resulting entry.
	Wstat(ctx context.Context, path string, d Dir) *Future[Dir]
}

// Entry is one item of a Find or FindGet stream.
type Entry struct {
	// Dir is the entry found; nil for a data item of FindGet.
	Dir Dir
	// Data is, in FindGet, the next piece of the last entry's content. It is
	// owned by the receiver.
	Data []byte
	// Err, if not nil, says that the entry at Dir's path could not be read
	// (an unreadable directory, a file that vanished); the walk goes on.
	Err error
}

// Finder searches a subtree on the side that holds it, so a whole walk costs
// one request.
type Finder interface {
	// Find walks the subtree at path depth-first in name order and streams
	// the entries for which the predicate (see internal/pred; "" matches
	// everything) holds. Depth counts from path, which has depth 0. Entries
	// that could not be read are reported in line and the walk goes on; the
	// stream's Err is set only if the walk could not go on at all.
	Find(ctx context.Context, path, pred string) *Stream[Entry]

	// FindGet is Find that also streams the content of each regular file
	// found: its Entry is followed by data Entries holding the whole file.
	FindGet(ctx context.Context, path, pred string) *Stream[Entry]
}

// FS is a Tree that can also search itself: what every layer implements.
type FS interface {
	Tree
	Finder
}

// Space is how much room the file system holding a tree has, as statfs(2)
// reports it, in bytes and in files.
type Space struct {
	Total, Free, Avail int64 // Bytes; Avail is what an unprivileged writer may use.
	Files, FilesFree   int64
}

// Spacer is a tree that can say how much room the file system holding it
// has, so that df on a mount tells the truth.
type Spacer interface {
	Space(ctx context.Context, path string) *Future[Space]
}

// CurrentGetter is a tree that can serve a file's content from what it
// kept of an earlier read of the same version, with no call, when its
// caller vouches that d is the file's current entry (a cache that holds
// the watch's lease knows it is). Otherwise GetCurrent is Get of d's path.
type CurrentGetter interface {
	GetCurrent(ctx context.Context, d Dir, off, count int64) io.ReadCloser
}

// Batcher is a tree that stores many whole files on one stream of its
// own: a tree's worth of puts (ferry put, ferry sync) then costs about
// what one put of them all would, rather than a call each.
type Batcher interface {
	Batch(ctx context.Context) Batch
}

// Batch stores whole files on a Batcher's stream. It is safe for
// concurrent use; Close it once its puts have returned.
type Batch interface {
	// Replace replaces the file at path, or makes it, with src's content
	// and d's attributes, as a Put at Whole does, sending only what the
	// tree lacks.
	Replace(ctx context.Context, path string, d Dir, src *io.SectionReader) *Future[Dir]
	// Put is Replace for a file the tree most likely lacks (a new
	// tree's): a small one goes with its data at once, without asking
	// first what the tree holds.
	Put(ctx context.Context, path string, d Dir, src *io.SectionReader) *Future[Dir]
	Close() error
}

// Unwrapper is a layer over another FS: Unwrap returns the one below, so
// that what the layers below can do is found through it (see As).
type Unwrapper interface {
	Unwrap() FS
}

// As returns the first layer of the stack from fs down that implements T,
// following Unwrap: a layer finds the capabilities below it (chunks, the
// index, watches) this way, never by asserting the type of the layer right
// below, so any layer can be put in between. A layer that must see every
// use of a capability implements it itself.
func As[T any](fs FS) (T, bool) {
	for fs != nil {
		if t, ok := fs.(T); ok {
			return t, true
		}
		u, ok := fs.(Unwrapper)
		if !ok {
			break
		}
		fs = u.Unwrap()
	}
	var zero T
	return zero, false
}

// Event reports that the entry at Path changed: created, written, removed,
// renamed or given new attributes, by anyone.
type Event struct {
	// Path is the entry that changed. For a rename there is one Event for
	// the old path and one for the new.
	Path string
	// Lost, if true, says that events were dropped (an overflow, or a
	// watch that had to be rebuilt): everything at or below Path may have
	// changed, and a cache must drop it.
	Lost bool
	// Gone, if true, says the entry at Path is known to be gone, or to be
	// of another type now. Without it a directory there may still be
	// there, with only what it holds changed, and a layer above may keep
	// its name: forgetting a directory's name breaks the programs working
	// in it. Caches set it on the events they pass up.
	Gone bool
	// Attrs, if true, says only the attributes of the entry at Path
	// changed: what it holds is as it was.
	Attrs bool
	// Recall, if true, asks for the write lease over Path back (see
	// WriteLeaser): the receiver stores every change under Path it kept
	// back, in order, stops keeping changes there back, and then calls
	// Ack.
	Recall bool
	// Ack, if not nil, must be called once the receiver no longer trusts
	// what it holds for Path (or below it, if Lost): the change was made
	// by another client, whose call waits for it (a callback break).
	Ack func()
}

// WriteGrant is the answer to a request for a write lease.
type WriteGrant int

const (
	// WriteRefused: no lease was given.
	WriteRefused WriteGrant = iota
	// WriteDeep lends the whole subtree.
	WriteDeep
	// WriteShallow lends the directory and the files directly in it, not
	// the directories in it nor what they hold: another client holds a
	// lease below (the replication paper's shallow control).
	WriteShallow
)

// WriteLeaser is a tree whose server can lend its client a subtree to
// change on its own: while the client holds a write lease over a subtree it
// may keep its changes there to itself and store them later, in order,
// because the server recalls the lease (an Event with Recall, through the
// client's Watch of a path above it) before any other client's call there
// is served, and that call waits for the client to store what it kept
// back. A lease ends with the watch that holds it, or when it runs out
// without renewal; the server then serves the other client without the
// changes not stored.
type WriteLeaser interface {
	// WriteLease asks for a write lease over the subtree at path, held
	// with the caller's Watch of a path above it, and reports what was
	// given: nothing while another client holds one at path or a deep one
	// above it, nor without such a watch; a shallow lease while another
	// client holds one below it.
	WriteLease(ctx context.Context, path string) (WriteGrant, error)
	// ReleaseWrite gives the write lease over path back, once everything
	// changed under it is stored.
	ReleaseWrite(ctx context.Context, path string) error
}

// Grouper is a tree that applies changes together: the changes made
// through one Group take effect when it commits, all of them in the order
// made, and none of them if the group is dropped or its maker dies first.
// A cache that keeps changes back stores them in groups, so that the tree
// below always shows a state the cache's own tree was in, never a later
// change without an earlier one.
type Grouper interface {
	Group() Group
}

// Group is a set of changes being made (see Grouper). Each call records
// its change and returns at once; its Future resolves when Commit has
// applied the group, or failed.
type Group interface {
	Put(ctx context.Context, path string, d Dir, off int64, data io.Reader) *Future[Dir]
	Move(ctx context.Context, from, to string) *Future[Dir]
	Remove(ctx context.Context, path string) *Future[struct{}]
	Wstat(ctx context.Context, path string, d Dir) *Future[Dir]
	// Commit applies the changes made through the group and resolves
	// their Futures. A group is committed once.
	Commit(ctx context.Context) error
}

// Watcher reports changes to a subtree as they happen, so a cache can keep
// entries for as long as its watch lasts and drop them when they change. The
// open watch is the cache's lease: when the stream ends, for any reason, the
// cache can no longer trust what it holds.
type Watcher interface {
	// Watch streams an Event for each change at or below path from the
	// moment the call is made until ctx is cancelled or the stream closed.
	// Events may be coalesced and may arrive for changes the caller made
	// itself. The first Event is a Lost event for path, sent once the watch
	// is in place: changes after it are not missed.
	Watch(ctx context.Context, path string) *Stream[Event]
}
