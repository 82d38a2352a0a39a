# Ferry's entry points. See README.md.
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: demo test setup build install bench bench-quick fuzz exercise killloop

build:
	go build -ldflags "-X github.com/ferryfs/ferry/internal/cli.commit=$$(git rev-parse --short=12 HEAD 2>/dev/null)" -o bin/ferry ./cmd/ferry

setup:
	scripts/setup.sh

# install puts ferry in $(PREFIX)/bin (default /usr/local) with
# /sbin/mount.ferry (for /etc/fstab and mount -t ferry), man pages, shell
# completion and a systemd unit for the server; DESTDIR stages it.
install: build
	scripts/install.sh bin/ferry

# demo serves a directory on loopback and uses it from the native client.
demo:
	scripts/setup.sh demo
	scripts/demo.sh

# test runs every test, with the race detector, after installing what the
# tests need. Tests that need root, TUN or namespaces fail under CI=true
# rather than skip.
test: setup
	go vet ./...
	go test -race -timeout 20m ./...

# exercise runs the mount's exerciser long: random file operations on the
# default and the write-back mount, compared step by step with a local
# disk (make test runs 300 of them). SEED=N repeats a run.
exercise: setup
	go test -race -timeout 60m -run '^TestExerciser$$' ./internal/fusefs -v -exercise.ops $${OPS:-50000} -exercise.seed $${SEED:-0}

# killloop kills the server during one upload LOOPS times (make test
# kills it 3 times): the upload completes, nothing is torn, no temporary
# file is left, and the restarted servers resume it.
killloop: setup
	go test -race -timeout 60m -run '^TestKillDuringUpload$$' ./cmd/ferry -v -kill.loops $${LOOPS:-50}

# fuzz runs each fuzz target for a short while.
fuzz:
	scripts/fuzz.sh 30s

bench-quick: setup
	go run ./bench -profile smoke

bench: setup
	go run ./bench -profile full
