#!/bin/bash
# unpack-fuse.sh FERRY TARBALL [ROUNDS]: tar xzf of TARBALL into a Ferry
# mount of a server on loopback (no emulated delay), into go-fuse's own
# loopback example (a bare passthrough file system), and into the local
# disk, ROUNDS times (default 6), one line per round, in seconds. It
# separates what FUSE itself costs an unpack on this machine from what
# Ferry adds. Needs root (direct mounts); builds the example from the
# module cache. PORT (default 7098) is the server's, on 127.0.0.1.
set -eu
B=$(realpath "$1"); TAR=$(realpath "$2"); ROUNDS=${3:-6}
W=$(mktemp -d)
cleanup() {
	"$B" umount "$W/mnt" 2>/dev/null || true
	umount "$W/lbmnt" 2>/dev/null || true
	[ -n "${SP:-}" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null
	[ -n "${LP:-}" ] && wait "$LP" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
cd "$(dirname "$0")/.."
FUSE=$(go list -m -f '{{.Dir}}' github.com/hanwen/go-fuse/v2)
go build -o "$W/loopback" "$FUSE/example/loopback"
mkdir -p "$W/lbsrc" "$W/lbmnt" "$W/srv" "$W/mnt" "$W/local" "$W/home"
"$W/loopback" -q -directmount "$W/lbmnt" "$W/lbsrc" & LP=$!
ADDR=127.0.0.1:${PORT:-7098}
FERRY_HOME=$W/home "$B" serve --listen "$ADDR" "$W/srv" > "$W/serve.log" 2>&1 & SP=$!
sleep 1
FERRY_HOME=$W/home "$B" mount "$ADDR:/" "$W/mnt" > /dev/null
t() { local s e; s=$(date +%s.%N); tar xzf "$TAR" -C "$1"; e=$(date +%s.%N); echo "$e - $s" | bc; }
for i in $(seq "$ROUNDS"); do
	mkdir "$W/mnt/r$i" "$W/lbmnt/r$i" "$W/local/r$i"
	echo "ferry $(t "$W/mnt/r$i") go-fuse-loopback $(t "$W/lbmnt/r$i") local $(t "$W/local/r$i")"
done
