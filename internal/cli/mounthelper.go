package cli

import (
	"strings"

	"github.com/ferryfs/ferry"
)

// MountHelper turns the arguments mount(8) gives a helper named
// mount.ferry (SPEC DIR [-sfnv] [-o OPTIONS] [-t TYPE] [-N NS]) into those
// of ferry mount, so that a line of /etc/fstab such as
//
//	host:/src  /mnt/src  ferry  _netdev,allow_other,timeout=30s  0  0
//
// and mount -t ferry work. It returns the arguments, the FERRY_HOME to run
// with (home=DIR; "" to keep the environment's), and run false for a fake
// mount (-f), which does nothing. Options of fstab and of the kernel that
// do not concern Ferry are dropped; an unknown option is an error unless
// -s (sloppy) was given.
func MountHelper(in []string) (args []string, home string, run bool, err error) {
	const op = "mount.ferry"
	var pos, opts []string
	sloppy, fake := false, false
	for i := 0; i < len(in); i++ {
		a := in[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		switch a {
		case "-o", "-t", "-N":
			if i+1 == len(in) {
				return nil, "", false, ferry.E(op, a, ferry.KindInvalid, "needs a value")
			}
			i++
			if a == "-o" {
				opts = append(opts, strings.Split(in[i], ",")...)
			}
			continue
		}
		// Single-letter flags, possibly together (-sv).
		for _, c := range a[1:] {
			switch c {
			case 's':
				sloppy = true
			case 'f':
				fake = true
			case 'n', 'v':
			default:
				return nil, "", false, ferry.E(op, a, ferry.KindInvalid, "unknown flag")
			}
		}
	}
	if len(pos) != 2 {
		return nil, "", false, ferry.E(op, "", ferry.KindInvalid, "usage: mount.ferry HOST[:PORT]:PATH DIR [-sfnv] [-o OPTIONS]")
	}
	args = []string{"mount"}
	var kernel []string
	for _, o := range opts {
		name, value, hasValue := strings.Cut(o, "=")
		switch {
		case o == "":
		case o == "ro" || o == "rw" || o == "allow_other" || o == "default_permissions" || hasValue && (name == "uid" || name == "gid"):
			kernel = append(kernel, o)
		case o == "writeback":
			args = append(args, "--writeback")
		case hasValue && mountValueFlags[name]:
			args = append(args, "--"+name+"="+value)
		case hasValue && name == "home":
			home = value
		case ignoredMountOption(name):
		case sloppy:
		default:
			return nil, "", false, ferry.E(op, o, ferry.KindInvalid, "unknown mount option")
		}
	}
	if len(kernel) > 0 {
		args = append(args, "-o", strings.Join(kernel, ","))
	}
	return append(args, pos[0], pos[1]), home, !fake, nil
}

// mountValueFlags are the flags of ferry mount an fstab option name=value
// sets.
var mountValueFlags = map[string]bool{
	"timeout": true, "memory": true, "ttl": true, "log": true, "prefetch-depth": true,
	"cache": true, "cache-max": true, "token": true, "bulk-conns": true,
}

// ignoredMountOption reports whether name is an option of fstab, mount(8)
// or the kernel that means nothing to Ferry (or that a FUSE mount has
// anyway: nosuid, nodev).
func ignoredMountOption(name string) bool {
	switch name {
	case "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
		"_netdev", "nofail", "exec", "noexec", "suid", "nosuid", "dev", "nodev",
		"async", "atime", "noatime", "relatime", "strictatime", "nodiratime", "comment":
		return true
	}
	return strings.HasPrefix(name, "x-")
}
