#!/usr/bin/env bash
# setup.sh installs what Ferry's build, tests and demo need on a fresh
# Debian machine: Go on the PATH and the system packages below. It installs
# only what is missing, so it is cheap to run every time. "setup.sh demo"
# leaves out what only the tests need (pjdfstest, built with cargo).
set -euo pipefail
for_demo=false
[ "${1:-}" = demo ] && for_demo=true

# Packages: iproute2 and util-linux (ip netns, nsenter) for the link
# emulator's tests; kmod to load tcp_bbr; fuse3 for the FUSE mount; the
# programs the mount's tests run on it (git, make and gcc, tar, grep,
# diff, rsync).
packages=(iproute2 util-linux kmod fuse3 git make gcc libc6-dev tar grep diffutils rsync)

missing=()
for p in "${packages[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}" >&2
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	# Another apt (an unattended upgrade) may hold the lock a while.
	$sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null
fi

# pjdfstest, the POSIX conformance suite the FUSE mount's tests run, comes
# from crates.io and is built by cargo (a few minutes, once).
export PATH="$HOME/.cargo/bin:$PATH"
if ! $for_demo && ! command -v pjdfstest >/dev/null 2>&1; then
	if command -v cargo >/dev/null 2>&1; then
		echo "setup: installing pjdfstest with cargo" >&2
		cargo install --quiet --locked pjdfstest@0.2.2
	else
		echo "setup: cargo is missing, so pjdfstest cannot be installed (https://rustup.rs)" >&2
		exit 1
	fi
fi

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "setup: Go is at /usr/local/go/bin; add it to PATH" >&2
	else
		echo "setup: Go 1.26 or later is needed (https://go.dev/dl)" >&2
		exit 1
	fi
fi
