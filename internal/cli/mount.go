package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/auth"
	"github.com/ferryfs/ferry/internal/cache"
	"github.com/ferryfs/ferry/internal/ctl"
	"github.com/ferryfs/ferry/internal/fusefs"
	"github.com/ferryfs/ferry/internal/pred"
	"github.com/ferryfs/ferry/internal/remote"
	"github.com/ferryfs/ferry/internal/store"
	"github.com/ferryfs/ferry/internal/transport"
)

// mountReadyTimeout bounds how long a background mount may take to come up.
const mountReadyTimeout = time.Minute

func mountCmd() *cobra.Command {
	var (
		foreground, allowOther, debug bool
		writeBack, readOnly           bool
		kernelOpens                   bool
		options                       []string
		logFile, contents             string
		readyFd                       int
		ttl, timeout                  time.Duration
		depth                         int
		memory                        = sizeFlag(defaultMountMemory)
	)
	c := &cobra.Command{
		Use:   "mount HOST[:PORT]:PATH MOUNTPOINT",
		Short: "Mount a remote tree on MOUNTPOINT with FUSE",
		// The mount holds its chunk cache for long: the commands run
		// beside it use it through the mount.
		Annotations: map[string]string{shareCache: ""},
		Long: `Mount the tree at PATH on the server HOST as a file system at MOUNTPOINT, so
that any program can work in it.

Examples:

    ferry mount host:/src ~/src        # in the background; returns once mounted
    ferry mount --foreground host:/src ~/src
    ferry umount ~/src

In /etc/fstab (make install links mount.ferry, the helper mount(8) runs):

    host:/src  /mnt/src  ferry  _netdev,allow_other,timeout=30s,home=/etc/ferry  0  0

Options there: ro, rw, allow_other, default_permissions, uid=, gid=, writeback, and
timeout=, memory=, ttl=, log=, cache=, cache-max=, prefetch-depth=,
token=, bulk-conns= as the flags of the same names; home= is the
FERRY_HOME that holds the client key. fstab's own options (_netdev,
noauto, nofail, x-systemd.*, ...) are left to mount and systemd.

By default the command starts itself again in the background, waits until
the file system is mounted and exits 0 (or prints why it failed and exits
1). The background process logs to --log (default $FERRY_HOME/mount-PATH.log,
PATH the mount point's, slashes made dashes) and
unmounts cleanly on SIGTERM or SIGINT, or when ferry umount or
fusermount3 -u unmounts it.

Metadata is fetched a subtree at a time (one request lists a directory and
the ones below it, --prefetch-depth deep) and kept while the server's watch
reports changes; without a watch it is trusted for --ttl. A file open for
writing is buffered in a temporary file and stored whole and atomically
after it is closed or synced (close-to-open consistency: see write-back
below). Reading one small file of a directory fetches
the directory's small files (up to 64 KiB each) in the same request, so
that grep or a compiler does not wait a round trip per file. A program
seen going through a tree (grep -r, git status) gets the rest of the tree
streamed in the order it reads, files up to 1 MiB, each once; the
stream stops 5 s after the program stops reading, and holds at most
16 MiB ahead of it. What it brings is kept in the chunk cache on disk
(--cache), up to half of --cache-max, least recently used dropped
first, with a record of which version of each file it holds: a second
walk of a tree much larger than --memory, in this mount or a later one
of the same server, sends no data of the files unchanged since
(--contents memory keeps them in a quarter of --memory, for this mount
only). Bigger files move by chunks through the same cache; while the
watch holds, one read before is read again from the cache with no
round trip, and one up to 16 MiB that a program reads at scattered
offsets (git a pack) is fetched whole, once, at its second read past
its start. The
mount's memory stays within --memory: a quarter of it holds metadata,
and the Go heap is collected sooner as the whole nears it.

Once the watch is in place the kernel opens, creates and closes files
without asking the mount (on a write-back mount; --kernel-opens=false
turns it off), so a warm grep -r asks the mount about once per
directory; another client's change still reaches the reader before that
client's call returns. With no close to hear, a file written is stored
before the mount's next change of another kind, before another client's
call recalls the write lease, on fsync or sync, or a second after the
last write. And since the mount cannot tell whether a descriptor is open
on a file, a file whose last name is removed, or which a rename
replaces, is renamed to a hidden name in its directory (.ferry-gone-N,
as NFS clients keep such files), where a descriptor open on it reads and
writes on; it is removed once the kernel forgets the file, when its
directory is removed, or at unmount. One difference from a local disk
remains: a file replaced by another client (or on the server's disk)
while a descriptor is open on it here is the new file to that
descriptor once the mount holds no buffer of the old one.

By default (--writeback), close returns at once: the file is copied into memory
and stored in the background, and so are new directories, removals,
renames and changes of mode, times and owners (from the first when the
server says it may give files away, as one run by root does; else once it
has taken one from this mount), in the order the programs made them; fsync
waits until the file is stored. A file's store waits a second first
(sooner when anything needs it): a file written again meanwhile is
stored once, and one created and removed meanwhile (configure's
conftest files) never crosses the wire. A build that writes many
small files then no longer waits a round trip per file. The mount takes
a write lease from the server over the directory it changes (one round
trip per directory, kept while in use, given back after 1 s idle):
another client's call there makes the server recall it, and waits until
this mount has stored what it kept back, so close-to-open holds between
clients. --writeback=false makes close wait until the server has the
file. Unmounting waits (up to a minute) for what is not yet stored.

Limitations:

  - Hard links work where the server's file system has them; a file with
    several names is written in place on close (not atomically). One open
    for writing whose name is removed is stored under another of its
    names that the mount knows; if it knows none, what was written before
    the removal is stored then, and a later close (with write-back, the
    later write) fails with EIO. FIFOs,
    sockets and devices are names on the server: a FIFO connects programs
    on one client only. Extended attributes of the user namespace only
    (user.*); no ACLs; no file locks across clients.
  - Inode numbers are this mount's, stable per path for the mount's life;
    only the names of a hard-linked file share the server's number.
  - Writing to a file sends the whole file on each close or fsync, and
    opening an existing file for writing fetches it whole first: fine for
    source files and documents, slow for appending to large logs.
  - A file created here reaches the server on its first close or fsync;
    until then other clients do not see it, and O_EXCL is checked only
    against what this mount knows.
  - With write-back, a failure to store a file shows up only in the
    log, in fsync, and in the next close of the file; changes not stored
    when the mount process dies are lost, and those that were stored
    need not be a prefix of what was done. A change made directly on the
    server's disk recalls the write lease over it, but what the mount
    stores after it may overwrite it. A server too old to lend
    write leases gets write-behind without them: other clients may then
    not see a file for a moment after close returned.
  - A file open for reading only is read by name: if another file is
    renamed over it while it is open, reads the kernel has not cached
    read the new file.
  - rename with RENAME_NOREPLACE is checked, then done, in two steps;
    RENAME_EXCHANGE is not supported.
  - Without a watch from the server, changes made by others show up
    after at most --ttl (and at the next open of a file).
  - While the server cannot be reached, calls wait for it to come back
    for up to --timeout, then fail with EIO (a close then has not stored
    the file); so does a call whose link has gone silent without breaking
    the connection, once nothing has arrived for --timeout. A full disk on
    the server is ENOSPC (a quota EDQUOT), and a new file whose close
    failed so is gone from the mount, as from the server.
  - Permissions are checked by the local kernel against the server's
    owners and modes (default_permissions), or against the owner and
    group -o uid=N,gid=N shows for every file (as sshfs does, for a user
    whose number differs from the server's); the server itself acts with
    its own rights.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if memory < minMountMemory {
				return ferry.E("mount", "", ferry.KindInvalid, fmt.Sprintf("--memory %d is below the least a mount needs, %d MiB", memory, minMountMemory>>20))
			}
			var uid, gid *uint32
			for _, o := range options {
				name, value, _ := strings.Cut(o, "=")
				switch {
				case o == "ro":
					readOnly = true
				case o == "rw":
					readOnly = false
				case o == "allow_other":
					allowOther = true
				case o == "default_permissions":
					// Always: the kernel checks the server's modes.
				case name == "uid" || name == "gid":
					n, err := strconv.ParseUint(value, 10, 32)
					if err != nil {
						return ferry.E("mount", o, ferry.KindInvalid, "uid= and gid= take a number")
					}
					id := uint32(n)
					if name == "uid" {
						uid = &id
					} else {
						gid = &id
					}
				default:
					return ferry.E("mount", o, ferry.KindInvalid, "unknown mount option (known: ro, rw, allow_other, default_permissions, uid=N, gid=N)")
				}
			}
			if contents != "disk" && contents != "memory" {
				return ferry.E("mount", contents, ferry.KindInvalid, "--contents takes disk or memory")
			}
			if err := notMounted(args[1]); err != nil {
				return err
			}
			if !foreground {
				return mountBackground(cmd, args[1], logFile)
			}
			return mountForeground(cmd, args[0], args[1], readyFd, fusefs.Options{
				Uid:         uid,
				Gid:         gid,
				ReadOnly:    readOnly,
				AllowOther:  allowOther,
				Debug:       debug,
				TTL:         ttl,
				Cache:       cache.Options{PrefetchDepth: depth},
				WriteBack:   writeBack,
				KernelOpens: kernelOpens,
				CallTimeout: timeout,
			}, int64(memory), contents == "disk")
		},
	}
	c.Flags().BoolVarP(&foreground, "foreground", "f", false, "stay in the foreground and log to stderr")
	c.Flags().BoolVar(&allowOther, "allow-other", os.Geteuid() == 0, "let other users use the mount (default when run by root)")
	c.Flags().BoolVar(&readOnly, "read-only", false, "mount read-only: every change fails with EROFS, and opens ask the mount nothing")
	c.Flags().StringSliceVarP(&options, "options", "o", nil, "mount options, as mount(8) takes them: ro, rw, allow_other, default_permissions, uid=N and gid=N (show every file as owned by N, as sshfs does)")
	c.Flags().BoolVar(&debug, "debug", false, "log every FUSE request")
	c.Flags().StringVar(&logFile, "log", "", "log file of the background process (default $FERRY_HOME/mount-PATH.log for the mount point PATH)")
	c.Flags().DurationVar(&ttl, "ttl", time.Second, "how long metadata is trusted without a watch from the server")
	c.Flags().BoolVar(&kernelOpens, "kernel-opens", true, "with --writeback, let the kernel open and close files without asking the mount, as on a --read-only mount (a file replaced by another client while open here is the new file to its descriptor once the mount holds no buffer of the old one)")
	c.Flags().BoolVar(&writeBack, "writeback", true, "let close return before the file is stored, under write leases that keep close-to-open (--writeback=false: close waits for the server); fsync still waits")
	c.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long a call waits for the server (reconnecting meanwhile) before it fails with EIO")
	c.Flags().IntVar(&depth, "prefetch-depth", 16, "how many levels below a directory its first use fetches")
	c.Flags().Var(&memory, "memory", "the mount's memory budget, a quarter of it for metadata, and a quarter for file contents fetched ahead with --contents memory (128M, 512M, 1G)")
	c.Flags().StringVar(&contents, "contents", "disk", "where file contents fetched ahead are held: disk (in the chunk cache, up to half of --cache-max) or memory (a quarter of --memory); memory without a chunk cache")
	c.Flags().IntVar(&readyFd, "ready-fd", 0, "descriptor on which to report readiness (used by the background start)")
	c.Flags().MarkHidden("ready-fd")
	return c
}

// defaultMountMemory is the default of ferry mount --memory, and
// mountNonHeap what the mount holds resident outside the Go heap.
const (
	defaultMountMemory = 512 << 20
	minMountMemory     = 64 << 20
	mountNonHeap       = 40 << 20
)

// sizeFlag is a flag of a number of bytes, written as pred.ParseSize
// reads them.
type sizeFlag int64

func (s *sizeFlag) String() string { return strconv.FormatInt(int64(*s), 10) }
func (s *sizeFlag) Type() string   { return "size" }
func (s *sizeFlag) Set(v string) error {
	n, err := pred.ParseSize(v)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("bad size %q: want more than 0", v)
	}
	*s = sizeFlag(n)
	return nil
}

// mountBackground starts this command again in the foreground, detached
// in a session of its own, and waits for it to report that the file system
// is mounted.
func mountBackground(cmd *cobra.Command, mountpoint, logFile string) error {
	const op = "mount"
	exe, err := os.Executable()
	if err != nil {
		return ferry.E(op, "", ferry.KindIO, err)
	}
	if logFile == "" {
		if err := os.MkdirAll(auth.Home(), 0o700); err != nil {
			return ferry.E(op, auth.Home(), err)
		}
		logFile = filepath.Join(auth.Home(), mountLog(mountpoint))
	}
	logf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return ferry.E(op, logFile, err)
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return ferry.E(op, "", ferry.KindIO, err)
	}
	defer r.Close()
	child := exec.Command(exe, append(os.Args[1:], "--foreground", "--ready-fd", "3")...)
	child.Stdout, child.Stderr = logf, logf
	child.ExtraFiles = []*os.File{w}
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		w.Close()
		return ferry.E(op, exe, ferry.KindIO, err)
	}
	w.Close()
	// The child writes "ok" once mounted, or the reason it failed; if it
	// dies first, the pipe closes with nothing said.
	msg := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		msg <- strings.TrimSpace(line)
	}()
	select {
	case m := <-msg:
		if m == "ok" {
			child.Process.Release()
			return nil
		}
		child.Wait()
		if m == "" {
			m = "the mount process exited; see " + logFile
		}
		return ferry.E(op, "", ferry.KindIO, m)
	case <-time.After(mountReadyTimeout):
		child.Process.Kill()
		child.Wait()
		return ferry.E(op, "", ferry.KindUnavailable, "the file system was not mounted in time; see "+logFile)
	}
}

// mountForeground mounts and serves until unmounted or signalled.
func mountForeground(cmd *cobra.Command, target, mountpoint string, readyFd int, opt fusefs.Options, memory int64, onDisk bool) error {
	var ready io.WriteCloser
	if readyFd > 0 {
		ready = os.NewFile(uintptr(readyFd), "ready")
		defer ready.Close()
	}
	fail := func(err error) error {
		if ready != nil {
			fmt.Fprintln(ready, strings.ReplaceAll(err.Error(), "\n", " "))
		}
		return err
	}
	t, err := ParseTarget(target)
	if err != nil {
		return fail(err)
	}
	level := new(slog.LevelVar)
	if opt.Debug {
		level.Set(slog.LevelDebug)
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	// The process is the mount's alone: its heap is kept within the
	// budget by collecting sooner as it nears it, leaving room for what
	// is resident besides (the program's text, about 26 MiB, stacks and
	// the chunk cache's buffers).
	debug.SetMemoryLimit(max(memory-mountNonHeap, memory/2))
	// A quarter for file contents fetched ahead of their reads, a quarter
	// for the metadata cache, the rest for the transport's buffers, the
	// chunk cache's pending writes (see mountShares), write buffers and
	// the heap's slack. The metadata's share holds a tree of 16,000
	// entries at 128M: smaller, it made warm walks of such a tree pay a
	// Find per directory (bench/REPORT-bigtree.md).
	opt.Cache.Memory = memory / 4
	opt.Cache.MetaEntries = int(max(memory/4/cache.MetaEntrySize, 1024))
	window, _ := mountShares(memory)
	c, err := dial(cmd, t.Addr, func(c *remote.Config) {
		c.Window = window
		c.Log = log
		if onDisk {
			// The cache layer holds the contents it fetches ahead in
			// the chunk cache too: a tree larger than the memory
			// budget stays cached for the next walk.
			opt.Cache.Disk = c.Cache
		}
	})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	opt.Root = t.Path
	opt.Log = log
	opt.FsName = "ferry:" + target
	// The mount's control file shows the client's layer and the server's
	// below its own.
	opt.Control = func(mount, cache ferry.Controller) ferry.FS {
		return ctl.New("mount", ctl.New("cache", ctl.New("client", c, c), cache), mount)
	}
	srv, err := fusefs.Mount(mountpoint, c, opt)
	if err != nil {
		return fail(err)
	}
	// The log names the pid before the starter is told: it returns at
	// once, and whoever started it may read the log to find the pid.
	log.Info("serving", "target", target, "mountpoint", srv.Mountpoint(), "pid", os.Getpid())
	if ready != nil {
		fmt.Fprintln(ready, "ok")
		ready.Close()
		ready = nil
	}
	done := make(chan struct{})
	go func() {
		srv.Wait()
		close(done)
	}()
	select {
	case <-done:
		log.Info("unmounted", "mountpoint", srv.Mountpoint())
	case <-cmd.Context().Done():
		log.Info("signalled: unmounting", "mountpoint", srv.Mountpoint())
		if err := srv.Unmount(); err != nil {
			return err
		}
	}
	return nil
}

func umountCmd() *cobra.Command {
	var lazy bool
	c := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a tree mounted with ferry mount",
		Long: `Unmount the Ferry file system at MOUNTPOINT; its ferry mount process then
exits. Files are stored on the server when they are closed, so nothing is
pending once no program has a file open there.

Examples:

    ferry umount ~/src
    ferry umount --lazy ~/src   # detach now, release once no longer busy

Limitations: it fails with "device or resource busy" while programs use
the mount, unless --lazy.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return umount(args[0], lazy)
		},
	}
	c.Flags().BoolVarP(&lazy, "lazy", "z", false, "detach at once even if busy")
	return c
}

// umount unmounts with umount2 when permitted (root), else with
// fusermount3 -u, which lets a user unmount what they mounted.
func umount(mountpoint string, lazy bool) error {
	const op = "umount"
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return ferry.E(op, mountpoint, ferry.KindInvalid, err)
	}
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	var pids []int
	if self, err := os.Executable(); err == nil {
		pids = MountProcesses(self, mp)
	}
	err = syscall.Unmount(mp, flags)
	if err == nil {
		return awaitExit(op, mp, pids, lazy)
	}
	switch {
	case errors.Is(err, syscall.EBUSY):
		return ferry.E(op, mp, ferry.KindIO, "busy: a program has a file open or works in a directory there (fuser -vm "+mp+" names them); close them, or ferry umount --lazy to detach now and finish once they are done")
	case errors.Is(err, syscall.EINVAL):
		return ferry.E(op, mp, ferry.KindInvalid, "nothing is mounted there")
	case !errors.Is(err, syscall.EPERM):
		return ferry.E(op, mp, err)
	}
	for _, prog := range []string{"fusermount3", "fusermount"} {
		path, lerr := exec.LookPath(prog)
		if lerr != nil {
			continue
		}
		args := []string{"-u"}
		if lazy {
			args = append(args, "-z")
		}
		out, rerr := exec.Command(path, append(args, mp)...).CombinedOutput()
		if rerr != nil {
			msg := strings.TrimSpace(string(out)) + " (" + prog + " exit " + exitCode(rerr) + ")"
			if strings.Contains(msg, "busy") {
				msg += "; close the programs using it, or ferry umount --lazy"
			}
			return ferry.E(op, mp, ferry.KindIO, msg)
		}
		return awaitExit(op, mp, pids, lazy)
	}
	return ferry.E(op, mp, err)
}

// running reports whether the process pid is running: it exists and is not
// a zombie waiting for its parent.
func running(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	_, rest, ok := strings.Cut(string(stat), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}

// umountWait bounds how long umount waits for the mount's process to exit:
// it first stores what write-back holds, for up to a minute.
const umountWait = 75 * time.Second

// MountProcesses returns the pids of the processes of the program exe
// serving a ferry mount at the absolute path mp in the foreground (as
// ferry mount's background process does), found by their command lines.
func MountProcesses(exe, mp string) []int {
	dirs, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		their, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe"))
		if err != nil || filepath.Base(their) != filepath.Base(exe) {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !slices.Contains(args, "mount") || !slices.Contains(args, "--foreground") {
			continue
		}
		cwd, _ := os.Readlink(filepath.Join("/proc", d.Name(), "cwd"))
		for _, a := range args {
			if !filepath.IsAbs(a) {
				a = filepath.Join(cwd, a)
			}
			if filepath.Clean(a) == mp {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// awaitExit waits until the processes pids have exited, so that umount
// returns once the mount is wholly gone: a process still running could
// reconnect to the next server started at its address. A lazy unmount
// does not wait: the process exits once the last program lets go.
func awaitExit(op, mp string, pids []int, lazy bool) error {
	if lazy {
		return nil
	}
	deadline := time.Now().Add(umountWait)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				return ferry.E(op, mp, ferry.KindIO, fmt.Sprintf("unmounted, but its process %d is still running after %v", pid, umountWait))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func exitCode(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return strconv.Itoa(ee.ExitCode())
	}
	return err.Error()
}

// notMounted refuses a mount point that does not exist or is no
// directory, and one that something is mounted on already: a second
// mount would stack on the first and hide it.
func notMounted(mountpoint string) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return ferry.E("mount", mountpoint, ferry.KindInvalid, err)
	}
	// Said here, before FUSE's helper says only that it failed.
	switch fi, err := os.Stat(abs); {
	case os.IsNotExist(err):
		return ferry.E("mount", abs, ferry.KindNotExist, "the mount point does not exist (mkdir it first)")
	case err != nil:
		return ferry.E("mount", abs, err)
	case !fi.IsDir():
		return ferry.E("mount", abs, ferry.KindNotDir, "the mount point is not a directory")
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil // Nothing to tell by; the kernel decides.
	}
	for _, l := range strings.Split(string(b), "\n") {
		// The mount point is the fifth field, with spaces and the like
		// escaped in octal.
		if f := strings.Fields(l); len(f) > 4 && unescapeMountinfo(f[4]) == abs {
			return ferry.E("mount", abs, ferry.KindExist, "something is mounted there already (ferry umount it first)")
		}
	}
	return nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a path
// in /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountLog names the default log of the mount at mountpoint: one a mount
// point, so two mounts do not interleave their lines ("/home/a/src" logs
// to mount-home-a-src.log).
func mountLog(mountpoint string) string {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		abs = mountpoint
	}
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r < 0x20 {
			return '-'
		}
		return r
	}, strings.Trim(abs, "/"))
	if name == "" {
		name = "root"
	}
	return "mount-" + name + ".log"
}

// mountShares divides a mount's memory budget for what the server may send
// ahead of a reader (a stream's flow-control window: a sixteenth) and for
// the chunk cache's writes waiting in memory (two memtables: a sixteenth
// together), each at least 2 MiB and at most the default.
func mountShares(memory int64) (window int32, memtable int64) {
	window = int32(min(max(memory/16, 2<<20), transport.StreamWindow))
	memtable = min(max(memory/32, 2<<20), store.DefaultCacheMemTable)
	return window, memtable
}
