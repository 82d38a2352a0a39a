package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ferryfs/ferry"
)

// ctlName is the control file's name at the top of the mount (ferry.CtlPath
// in the tree). A file of that name at the top of the mounted directory is
// shadowed, as ctl's layers shadow it.
const ctlName = "Ctl"

// isCtl reports whether name in n is the mount's control file.
func (n *node) isCtl(name string) bool {
	return n.s.ctl != nil && n == n.s.root && name == ctlName
}

// Status implements ferry.Controller: the mount's layer of the control file.
func (s *Server) Status(context.Context) string {
	var b strings.Builder
	fmt.Fprintf(&b, "root: %s\n", s.opt.Root)
	fmt.Fprintf(&b, "timeout: %s\n", s.opt.CallTimeout)
	fmt.Fprintf(&b, "ttl: %s\nlease.ttl: %s\n", s.opt.TTL, s.opt.LeaseTTL)
	fmt.Fprintf(&b, "readdirs: %d\n", s.readdirs.Load())
	// The process's memory, beside the budget it was given (--memory
	// bounds the whole process: the contents above, the Go heap's limit,
	// what lies outside the heap).
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fmt.Fprintf(&b, "memory.heap: %d in use, %d from the system, limit %d\n", m.HeapInuse, m.Sys, debug.SetMemoryLimit(-1))
	if rss, err := residentBytes(); err == nil {
		fmt.Fprintf(&b, "memory.resident: %d\n", rss)
	}
	return b.String()
}

// residentBytes is the process's resident memory, from /proc.
func residentBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// Command implements ferry.Controller. "sync" has nothing to do here (the
// control layer then syncs the cache and every layer below); "drop"
// forgets every cached entry and file in the cache and in the kernel.
func (s *Server) Command(ctx context.Context, args []string) error {
	const op = "fusefs.Command"
	switch args[0] {
	case "sync":
		return nil
	case "drop":
		s.cache.Drop()
		s.notifyTree(s.opt.Root)
		return nil
	}
	return ferry.E(op, ferry.CtlPath, ferry.KindInvalid, "the mount knows no command "+args[0]+" (sync, drop; \"pass CMD\" for the layers below)")
}

// ctlNode is the mount's control file: reading it shows the state of the
// mount and of every layer below; lines written to it and closed are run as
// commands (see internal/ctl), each as it is written.
type ctlNode struct {
	fs.Inode
	s *Server

	// When the kernel opens files by itself (kernelFS) and so reads the
	// control file through its page cache, the text is made at a Getattr
	// (which every read asks for first) and kept for ctlFresh, so that a
	// reader's several reads see one text; its size is the text's and
	// its mtime when it was made, which drops the pages of the last. So
	// from the start on a mount where the kernel may come to open files
	// by itself: the first open it is told it need not make may be this
	// file's, with the size the lookup gave.
	mu   sync.Mutex
	text []byte
	at   time.Time
}

// ctlFresh is how long the control file's text made for the kernel's page
// cache is kept.
const ctlFresh = 200 * time.Millisecond

var (
	_ fs.NodeGetattrer = (*ctlNode)(nil)
	_ fs.NodeSetattrer = (*ctlNode)(nil)
	_ fs.NodeOpener    = (*ctlNode)(nil)
	_ fs.NodeReader    = (*ctlNode)(nil)
	_ fs.NodeWriter    = (*ctlNode)(nil)
)

// ctlAttr fills the control file's attributes.
func ctlAttr(out *fuse.Attr) {
	out.Mode = syscall.S_IFREG | 0o644
	out.Nlink = 1
	out.Size = 0
	t := uint64(time.Now().Unix())
	out.Mtime, out.Ctime, out.Atime = t, t, t
}

// Getattr implements fs.NodeGetattrer. The size is 0: the text is made at
// each open and read with direct I/O, as /proc's files are; unless the
// kernel may open files by itself (see ctlNode).
func (c *ctlNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if c.s.kernelOpens() {
		out.SetTimeout(time.Nanosecond) // 0 would take the mount's default.
	}
	return c.attr(ctx, &out.Attr)
}

// attr fills the control file's attributes; when the kernel reads it
// through its page cache, with a text made for it (see ctlNode).
func (c *ctlNode) attr(ctx context.Context, out *fuse.Attr) syscall.Errno {
	ctlAttr(out)
	if !c.s.kernelOpens() {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > ctlFresh {
		text, e := c.s.ctlText(ctx)
		if e != 0 {
			return e
		}
		c.text, c.at = text, time.Now()
	}
	out.Size = uint64(len(c.text))
	out.Mtime, out.Mtimensec = uint64(c.at.Unix()), uint32(c.at.Nanosecond())
	return 0
}

// Read implements fs.NodeReader: through the descriptor's handle, or for a
// read the kernel makes with none, from the text made at its Getattr.
func (c *ctlNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if r, ok := f.(fs.FileReader); ok {
		return r.Read(ctx, dest, off)
	}
	c.mu.Lock()
	text := c.text
	c.mu.Unlock()
	return readAt(text, dest, off), 0
}

// Write implements fs.NodeWriter: through the descriptor's handle, or,
// for a write the kernel makes with none (it opens files by itself, and
// no close will be heard), as lines run at once, the last one too.
func (c *ctlNode) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if w, ok := f.(fs.FileWriter); ok {
		return w.Write(ctx, data, off)
	}
	if len(data) > maxCommands {
		return 0, syscall.EFBIG
	}
	e := c.s.runCommands(ctx, string(data))
	// The kernel wrote the lines into its pages of the file: the next
	// read must find the state made anew, with a new mtime (which drops
	// those pages), and the pages go now too, once the write has let
	// go of them.
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
	go c.NotifyContent(0, 0)
	if e != 0 {
		return 0, e
	}
	return uint32(len(data)), 0
}

// Setattr implements fs.NodeSetattrer: a truncation (echo CMD > Ctl) is
// taken and does nothing.
func (c *ctlNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctlAttr(&out.Attr)
	return 0
}

// Open implements fs.NodeOpener.
func (c *ctlNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &ctlHandle{s: c.s}, fuse.FOPEN_DIRECT_IO, 0
}

// ctlHandle is one open of the control file.
type ctlHandle struct {
	s    *Server
	mu   sync.Mutex
	text []byte // The state, made at the first read.
	made bool
	cmds bytes.Buffer // What was written after the last newline.
}

var (
	_ fs.FileReader  = (*ctlHandle)(nil)
	_ fs.FileWriter  = (*ctlHandle)(nil)
	_ fs.FileFlusher = (*ctlHandle)(nil)
)

// Read implements fs.FileReader.
func (h *ctlHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.made {
		text, e := h.s.ctlText(ctx)
		if e != 0 {
			return nil, e
		}
		h.text, h.made = text, true
	}
	return readAt(h.text, dest, off), 0
}

// ctlText returns the control file's text: the state of every layer.
func (s *Server) ctlText(ctx context.Context) ([]byte, syscall.Errno) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	r := s.ctl.Get(cctx, ferry.CtlPath, 0, -1)
	text, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		return nil, errno(err)
	}
	return text, 0
}

// readAt returns what a read of len(dest) bytes at off finds in b.
func readAt(b, dest []byte, off int64) fuse.ReadResult {
	if off >= int64(len(b)) {
		return fuse.ReadResultData(nil)
	}
	return fuse.ReadResultData(b[off:min(off+int64(len(dest)), int64(len(b)))])
}

// maxCommands bounds an unfinished line, as ctl bounds a Put.
const maxCommands = 64 << 10

// Write implements fs.FileWriter: each whole line is run as it is written,
// so that a failing command fails the write(2) (a shell reports that; it
// does not report a failed close). A last line without a newline runs at
// close.
func (h *ctlHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmds.Len()+len(data) > maxCommands {
		return 0, syscall.EFBIG
	}
	h.cmds.Write(data)
	i := bytes.LastIndexByte(h.cmds.Bytes(), '\n')
	if i < 0 {
		return uint32(len(data)), 0
	}
	lines := string(h.cmds.Next(i + 1))
	if e := h.s.runCommands(ctx, lines); e != 0 {
		return 0, e
	}
	return uint32(len(data)), 0
}

// Flush implements fs.FileFlusher: close(2) runs a last line left without
// a newline.
func (h *ctlHandle) Flush(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmds.Len() == 0 {
		return 0
	}
	lines := h.cmds.String()
	h.cmds.Reset()
	return h.s.runCommands(ctx, lines)
}

// runCommands runs the command lines through the control layers.
func (s *Server) runCommands(ctx context.Context, lines string) syscall.Errno {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.ctl.Put(cctx, ferry.CtlPath, nil, 0, strings.NewReader(lines)).Wait(); err != nil {
		s.log.Warn("a command written to the control file failed", "commands", strings.TrimSpace(lines), "err", err)
		return errno(err)
	}
	return 0
}

// ctlLookup returns the control file's node, made at the first lookup.
func (n *node) ctlLookup(ctx context.Context, out *fuse.EntryOut) *fs.Inode {
	s := n.s
	s.ctlOnce.Do(func() {
		s.ctlInode = n.NewPersistentInode(ctx, &ctlNode{s: s}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: s.inos.number("\x00"+ctlName, false)})
	})
	if s.kernelOpens() {
		// Each read asks for the attributes first (see ctlNode); 0
		// would take the mount's default.
		out.SetAttrTimeout(time.Nanosecond)
	}
	s.ctlInode.Operations().(*ctlNode).attr(ctx, &out.Attr)
	out.Ino = s.ctlInode.StableAttr().Ino
	return s.ctlInode
}
