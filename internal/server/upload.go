package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/callback"
	"github.com/ferryfs/ferry/internal/proto"
)

// Resumable uploads. A whole-file Put that names an upload is staged in a
// file of its own outside the served tree, per user, so that when its stream
// breaks, or the server restarts, what arrived is kept: the client asks
// PutStatus how much that is and sends only the rest. When the stream
// closes, the staged file is put into the tree atomically and the result
// is remembered a while, in case the reply was what the break lost.
const (
	// uploadIdle is how long a broken upload is kept for its client.
	uploadIdle = time.Hour
	// uploadDoneFor is how long the result of a committed upload is kept.
	uploadDoneFor = 10 * time.Minute
)

var uploadID = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

type uploads struct {
	dir    string
	mu     sync.Mutex
	active map[string]*upload
	done   map[string]doneUpload
	// resumed counts puts that resumed a broken upload.
	resumed int64
}

type upload struct {
	file string
	size int64 // Bytes staged.
	// reported is the size PutStatus last reported: the client resumes
	// from there, so a stream resuming from less is a stale one (its
	// handler started late) that must not truncate what a later stream
	// wrote.
	reported int64
	touched  time.Time
	// cancel stops the stream that is writing it; a resuming stream takes
	// over from a stream the server has not yet seen break. nil when no
	// stream holds it.
	cancel context.CancelFunc
	// committing is set once all data arrived: the stream then puts the
	// file into the tree and must not be stopped.
	committing bool
	free       chan struct{} // Closed when the holding stream lets go.
}

type doneUpload struct {
	dir ferry.Dir
	at  time.Time
}

// newUploads keeps the uploads staged in dir. What an earlier server
// staged there stays for its clients to resume (its files are named by
// their upload keys), unless it has waited longer than uploadIdle.
func newUploads(dir string) *uploads {
	u := &uploads{dir: dir, active: map[string]*upload{}, done: map[string]doneUpload{}}
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > uploadIdle {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	return u
}

// stagedFile is where the upload key is staged: a name from the key, so
// that a server started after a crash finds what an earlier one received.
func (u *uploads) stagedFile(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(u.dir, "upload-"+hex.EncodeToString(sum[:16]))
}

// adopt returns the upload of key an earlier server staged, if its file is
// there. Called with u.mu held.
func (u *uploads) adopt(key string) *upload {
	name := u.stagedFile(key)
	fi, err := os.Stat(name)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	up := &upload{file: name, size: fi.Size(), touched: fi.ModTime()}
	u.active[key] = up
	return up
}

// expire removes uploads left idle and results kept long enough. Called
// with u.mu held.
func (u *uploads) expire(now time.Time) {
	for k, up := range u.active {
		if up.cancel == nil && now.Sub(up.touched) > uploadIdle {
			os.Remove(up.file)
			delete(u.active, k)
		}
	}
	for k, d := range u.done {
		if now.Sub(d.at) > uploadDoneFor {
			delete(u.done, k)
		}
	}
}

// settled locks u and returns once no stream holds the upload key: a stream
// still receiving is stopped (the client has moved on from it, though the
// server may not yet have seen its connection break), and one committing is
// waited for. It returns with u.mu held unless it fails.
func (u *uploads) settled(ctx context.Context, key string) error {
	for {
		u.mu.Lock()
		up := u.active[key]
		if up == nil || up.cancel == nil {
			return nil
		}
		if !up.committing {
			up.cancel()
		}
		free := up.free
		u.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return ferry.E("server.Put", "", ferry.KindCanceled, ctx.Err())
		}
	}
}

// take makes the calling stream the writer of the upload key, creating it if
// new, and truncates what is staged to at. It fails with KindInvalid if at
// is beyond what the server holds, with KindCanceled if at is below what
// PutStatus last reported (a stale stream), and with KindExist if the
// upload was committed already.
func (u *uploads) take(ctx context.Context, key string, at int64, cancel context.CancelFunc) (*upload, *os.File, error) {
	const op = "server.Put"
	if err := u.settled(ctx, key); err != nil {
		return nil, nil, err
	}
	u.expire(time.Now())
	if _, ok := u.done[key]; ok {
		u.mu.Unlock()
		return nil, nil, ferry.E(op, "", ferry.KindExist, "the upload was committed already")
	}
	up := u.active[key]
	if up == nil {
		up = u.adopt(key)
	}
	if up == nil {
		f, err := os.OpenFile(u.stagedFile(key), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			u.mu.Unlock()
			return nil, nil, ferry.FromOS(op, "", err)
		}
		up = &upload{file: f.Name()}
		f.Close()
		u.active[key] = up
	}
	if at < 0 || at > up.size {
		u.mu.Unlock()
		return nil, nil, ferry.E(op, "", ferry.KindInvalid, "resume beyond what the server holds")
	}
	if at < up.reported {
		u.mu.Unlock()
		return nil, nil, ferry.E(op, "", ferry.KindCanceled, "a later resume of the upload superseded this stream")
	}
	if at > 0 {
		u.resumed++
	}
	up.cancel, up.free, up.touched, up.size = cancel, make(chan struct{}), time.Now(), at
	u.mu.Unlock()
	f, err := os.OpenFile(up.file, os.O_WRONLY, 0)
	if err == nil {
		err = f.Truncate(at)
	}
	if err != nil {
		u.release(key, up, at)
		return nil, nil, ferry.FromOS(op, "", err)
	}
	return up, f, nil
}

// committing marks the upload as complete and being put into the tree.
func (u *uploads) committing(up *upload, size int64) {
	u.mu.Lock()
	up.committing, up.size = true, size
	u.mu.Unlock()
}

// release ends the calling stream's hold on the upload, recording size.
func (u *uploads) release(key string, up *upload, size int64) {
	u.mu.Lock()
	up.size, up.touched, up.cancel = size, time.Now(), nil
	close(up.free)
	u.mu.Unlock()
}

// commit records the result of the upload key and removes its staging.
func (u *uploads) commit(key string, up *upload, d ferry.Dir) {
	u.mu.Lock()
	delete(u.active, key)
	u.done[key] = doneUpload{d, time.Now()}
	close(up.free)
	u.mu.Unlock()
	os.Remove(up.file)
}

// status reports an upload once settled: bytes held, or its committed entry.
func (u *uploads) status(ctx context.Context, key string) (int64, ferry.Dir, error) {
	if err := u.settled(ctx, key); err != nil {
		return 0, nil, err
	}
	defer u.mu.Unlock()
	if d, ok := u.done[key]; ok {
		return 0, d.dir, nil
	}
	up, ok := u.active[key]
	if !ok {
		up = u.adopt(key)
	}
	if up != nil {
		up.reported = up.size
		return up.size, nil, nil
	}
	return 0, nil, nil
}

// uploadKey scopes an upload id to the user of ctx's connection, so no one
// can resume, or learn of, another user's upload.
func (s *Server) uploadKey(ctx context.Context, id string) (string, error) {
	if !uploadID.MatchString(id) {
		return "", ferry.E("server.Put", "", ferry.KindInvalid, "malformed upload id")
	}
	user := ""
	if c, _ := ctx.Value(connKey{}).(*conn); c != nil {
		c.mu.Lock()
		user = c.user
		c.mu.Unlock()
	}
	return filepath.Join(user, id), nil
}

// putUpload serves a Put that names an upload.
func (h *handler) putUpload(first *proto.PutMsg, st grpc.ClientStreamingServer[proto.PutMsg, proto.DirReply]) error {
	const op = "server.Put"
	key, err := h.s.uploadKey(st.Context(), first.Upload)
	if err != nil {
		return h.done(opPut, err)
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	h.promise(ctx, first.Path)
	up, f, err := h.s.uploads.take(ctx, key, first.ResumeAt, cancel)
	if err != nil {
		return h.done(opPut, err)
	}
	size := first.ResumeAt
	var zbuf []byte
	m := first
	for {
		data, err := h.putData(m, &zbuf)
		if err != nil {
			f.Close()
			h.s.uploads.release(key, up, size)
			return h.done(opPut, err)
		}
		if len(data) > 0 {
			n, err := f.WriteAt(data, size)
			size += int64(n)
			if err != nil {
				f.Close()
				h.s.uploads.release(key, up, size)
				return h.done(opPut, ferry.FromOS(op, first.Path, err))
			}
		}
		m, err = st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			// The stream broke: keep what arrived for a resume.
			f.Close()
			h.s.uploads.release(key, up, size)
			return h.done(opPut, err)
		}
	}
	if err := f.Close(); err != nil {
		h.s.uploads.release(key, up, size)
		return h.done(opPut, ferry.FromOS(op, first.Path, err))
	}
	// All data arrived: commit even if the client's connection breaks now,
	// so that its PutStatus finds the result.
	h.s.uploads.committing(up, size)
	ctx, cancelCommit := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancelCommit()
	staged, err := os.Open(up.file)
	if err != nil {
		h.s.uploads.release(key, up, size)
		return h.done(opPut, ferry.FromOS(op, first.Path, err))
	}
	d, err := h.s.fs.Put(ctx, first.Path, proto.ToDir(first.Dir), ferry.Whole, staged).Wait()
	staged.Close()
	if err != nil {
		// The tree refused it (permission, no parent, a full disk): the
		// data cannot help a retry, so drop it.
		h.s.uploads.commit(key, up, nil)
		h.s.uploads.forget(key)
		return h.done(opPut, err)
	}
	h.s.uploads.commit(key, up, d)
	if err := h.changed(ctx, nil, callback.Change{Path: first.Path}); err != nil {
		return h.done(opPut, err)
	}
	return h.done(opPut, st.SendAndClose(proto.Reply(d, h.s.zstd)))
}

// forget drops the record of the upload key.
func (u *uploads) forget(key string) {
	u.mu.Lock()
	delete(u.done, key)
	u.mu.Unlock()
}

func (h *handler) PutStatus(ctx context.Context, r *proto.UploadReq) (*proto.UploadReply, error) {
	key, err := h.s.uploadKey(ctx, r.Upload)
	if err != nil {
		return nil, h.done(opPutStatus, err)
	}
	have, d, err := h.s.uploads.status(ctx, key)
	if err != nil {
		return nil, h.done(opPutStatus, err)
	}
	return &proto.UploadReply{Have: have, Committed: proto.FromDir(d)}, h.done(opPutStatus, nil)
}
