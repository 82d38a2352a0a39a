package main

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

const (
	bigName  = "big.bin"
	treeName = "tree"
)

// dataset is the data every workload moves, made once per run from real
// files on this machine.
type dataset struct {
	srv, src string // the server's copy and the client's (hard links to it)

	bigSize int64
	bigFrom string // the Go installation, of which the big file (unless random) and part of the document are made
	// random is true when the big file is random bytes (-incompressible);
	// put-file then uploads putBig, another random file that prepare
	// makes afresh before every run, instead of the big file, whose
	// chunks the server holds.
	random              bool
	putBig              string
	treeFrom            string
	treeFiles, treeDirs int
	treeBytes           int64

	extra extraData // the data of the other workloads
}

// prepareData makes the server's tree: the big file, a copy of the source
// tree and an empty upload directory; and the client's local copy of both.
//
// The big file is the regular files under GOROOT concatenated in walk order
// (sources, binaries, test data) of the Go installation and repeated if need be: real data of mixed
// compressibility, not random bytes.
func prepareData(ctx context.Context, o *options, work string) (*dataset, error) {
	d := &dataset{
		srv:      filepath.Join(work, "srv"),
		src:      filepath.Join(work, "src"),
		bigSize:  o.bigSize,
		treeFrom: o.tree,
		random:   o.incompressible,
		extra:    extraData{cprojModules: o.modules, docSize: o.docSize, modDir: o.upgradeDir, repoFrom: o.repo},
	}
	goroot, err := output(ctx, "go", "env", "GOROOT")
	if err != nil {
		return nil, err
	}
	d.bigFrom = strings.TrimSpace(goroot)
	d.putBig = filepath.Join(d.src, bigName)
	if d.random {
		d.putBig = filepath.Join(d.src, "put", bigName)
	}
	for _, dir := range []string{d.srv, d.src, filepath.Dir(d.putBig), filepath.Join(d.srv, "in"), filepath.Join(work, "logs"), filepath.Join(work, "bin")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if d.random {
		log.Printf("making the %d MiB file of random bytes and copying %s", o.bigSize>>20, o.tree)
		err = writeRandom(filepath.Join(d.srv, bigName), o.bigSize)
	} else {
		log.Printf("making the %d MiB file from %s and copying %s", o.bigSize>>20, d.bigFrom, o.tree)
		err = makeBig(ctx, filepath.Join(d.srv, bigName), d.bigFrom, o.bigSize)
	}
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.tree); err != nil {
		return nil, fmt.Errorf("source tree: %w", err)
	}
	if _, err := output(ctx, "cp", "-a", o.tree, filepath.Join(d.srv, treeName)); err != nil {
		return nil, err
	}
	err = filepath.WalkDir(filepath.Join(d.srv, treeName), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			d.treeDirs++
		case e.Type().IsRegular():
			d.treeFiles++
			if i, err := e.Info(); err == nil {
				d.treeBytes += i.Size()
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The client's copy shares the server's inodes: no extra space, and
	// neither side ever writes to them (uploads land in srv/in).
	if _, err := output(ctx, "cp", "-al", filepath.Join(d.srv, bigName), filepath.Join(d.srv, treeName), d.src+"/"); err != nil {
		return nil, err
	}
	if err := prepareExtra(ctx, d, work); err != nil {
		return nil, err
	}
	return d, nil
}

// writeRandom writes size random bytes to path, different every time:
// data that neither compression nor a chunk index can shrink.
func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		f.Close()
		return err
	}
	if _, err := io.CopyN(f, rand.NewChaCha8(seed), size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func makeBig(ctx context.Context, path, from string, size int64) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	var n int64
	for pass := 0; n < size; pass++ {
		before := n
		err := filepath.WalkDir(from, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() || n >= size {
				if n >= size {
					return filepath.SkipAll
				}
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			m, err := io.Copy(out, io.LimitReader(f, size-n))
			n += m
			return err
		})
		if err != nil {
			return err
		}
		if n == before {
			return fmt.Errorf("no data under %s for the big file", from)
		}
	}
	return out.Close()
}

// packages are the Debian packages the peers need, with a binary that shows
// each is installed.
var packages = []struct{ pkg, bin string }{
	{"openssh-server", "sshd"},
	{"openssh-client", "scp"},
	{"sshfs", "sshfs"},
	{"fuse3", "fusermount3"},
	{"rsync", "rsync"},
	{"iperf3", "iperf3"},
	{"git", "git"},
	{"make", "make"},
	{"gcc", "cc"},
}

// installPackages installs with apt-get whatever the peers need and is
// missing, and matplotlib for the plots if asked for (its failure only
// costs the plots).
func installPackages(ctx context.Context, plots bool) error {
	var missing []string
	for _, p := range packages {
		if _, err := exec.LookPath(p.bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + p.bin); err != nil {
				missing = append(missing, p.pkg)
			}
		}
	}
	wantPlot := plots && exec.Command("/usr/bin/python3", "-c", "import matplotlib").Run() != nil
	if len(missing) == 0 && !wantPlot {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("missing packages %s and no apt-get to install them", strings.Join(missing, " "))
	}
	what := slices.Clone(missing)
	if wantPlot {
		what = append(what, "python3-matplotlib")
	}
	log.Printf("installing %s with apt-get", strings.Join(what, " "))
	if err := aptGet(ctx, "update"); err != nil {
		return err
	}
	if len(missing) > 0 {
		if err := aptGet(ctx, append([]string{"install", "-y", "--no-install-recommends"}, missing...)...); err != nil {
			return err
		}
	}
	if wantPlot {
		if err := aptGet(ctx, "install", "-y", "--no-install-recommends", "python3-matplotlib"); err != nil {
			log.Printf("no plots: %v", err)
		}
	}
	return nil
}

func aptGet(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, lastLines(string(out), 5))
	}
	return nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// checkTools fails early, with the list, if a peer's tool is missing.
func checkTools() error {
	var missing []string
	for _, b := range []string{"ssh", "scp", "ssh-keygen", "sshfs", "fusermount3", "rsync", "iperf3", "nsenter", "ip", "make", "cc", "diff", "git"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if _, err := exec.LookPath("sshd"); err != nil {
		if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
			missing = append(missing, "sshd")
		}
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (run without -install=false, or install them)", strings.Join(missing, ", "))
	}
	return nil
}
