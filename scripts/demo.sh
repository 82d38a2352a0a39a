#!/usr/bin/env bash
# demo.sh builds ferry, serves a copy of a real source tree on loopback and
# uses it from the native client: the main job of Ferry in one minute.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
go build -o bin/ferry ./cmd/ferry
ferry=$PWD/bin/ferry

work=$(mktemp -d)
server_pid=""
cleanup() {
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
export FERRY_HOME=$work/home # Keys and lists of this demo only.
mkdir -p "$work/served"
cp -r "$(go env GOROOT)/src/net/http" "$work/served/http"
echo "hello from ferry" >"$work/served/hello.txt"

run() { echo; echo "\$ ferry $*"; "$ferry" "$@"; }

# The log exists before the server opens it: the loop below reads it at
# once, and under set -e a read of a missing file would end the demo.
: >"$work/serve.log"
"$ferry" serve "$work/served" --listen 127.0.0.1:0 2>"$work/serve.log" &
server_pid=$!
for _ in $(seq 100); do
	addr=$(sed -n 's/.* on \(127[^ ]*\).*/\1/p' "$work/serve.log")
	[ -n "$addr" ] && break
	sleep 0.1
done
[ -n "$addr" ] || { cat "$work/serve.log"; exit 1; }
cat "$work/serve.log"

run ls -l "$addr:/"
run cat "$addr:/hello.txt"
echo; echo "\$ ferry find $addr:/http 'name~*_test.go & size>40k'   # one request for the whole walk"
"$ferry" find "$addr:/http" 'name~*_test.go & size>40k'
echo; echo "\$ ferry find $addr:/ type=f | wc -l"
"$ferry" find "$addr:/" type=f | wc -l
run get "$addr:/http" "$work/copy"
diff -r "$work/served/http" "$work/copy" && echo "(the downloaded tree is identical)"
run put "$work/copy" "$addr:/http-uploaded"
diff -r "$work/copy" "$work/served/http-uploaded" && echo "(the uploaded tree is identical)"
run rm -r "$addr:/http-uploaded" 'name~*_test.go'
run mv "$addr:/hello.txt" /greeting.txt
run stat "$addr:/greeting.txt"
run ctl "$addr"
echo; echo "demo done: see README.md for more"
