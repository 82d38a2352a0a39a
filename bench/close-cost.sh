#!/bin/bash
# close-cost.sh FERRY TARBALL [ROUNDS]: tar xzf of TARBALL into a Ferry
# mount of a server on loopback, then a second (warm) grep -r of what was
# unpacked, one line per round, in seconds. It shows what the mount pays
# a close(2) (a FLUSH request each); run it with two binaries, alternating,
# to compare them. Needs root. PORT (default 7099) is the server's.
set -eu
B=$(realpath "$1"); TAR=$(realpath "$2"); ROUNDS=${3:-5}
W=$(mktemp -d)
cleanup() {
	"$B" umount "$W/mnt" 2>/dev/null || true
	[ -n "${SP:-}" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/srv" "$W/mnt" "$W/home"
ADDR=127.0.0.1:${PORT:-7099}
FERRY_HOME=$W/home "$B" serve --listen "$ADDR" "$W/srv" > "$W/serve.log" 2>&1 & SP=$!
sleep 1
FERRY_HOME=$W/home "$B" mount "$ADDR:/" "$W/mnt" > /dev/null
for i in $(seq "$ROUNDS"); do
	mkdir "$W/mnt/r$i"
	s=$(date +%s.%N); tar xzf "$TAR" -C "$W/mnt/r$i"; e=$(date +%s.%N); u=$(echo "$e - $s" | bc)
	grep -r zzzqqq "$W/mnt/r$i" > /dev/null || true
	s=$(date +%s.%N); grep -r zzzqqq "$W/mnt/r$i" > /dev/null || true; e=$(date +%s.%N); g=$(echo "$e - $s" | bc)
	echo "unpack $u grep $g"
done
