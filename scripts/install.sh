#!/usr/bin/env bash
# install.sh BIN: installs the ferry binary BIN with what a system needs to
# use it as sshfs and rclone are used: mount.ferry for /etc/fstab and
# mount -t ferry, man pages, shell completion, a templated systemd unit
# for the server and an example mount unit. DESTDIR (a staging root) and PREFIX (default /usr/local) as
# make install takes them.
set -euo pipefail
bin=${1:?usage: install.sh BIN}
root=${DESTDIR:-}
prefix=${PREFIX:-/usr/local}
src=$(cd "$(dirname "$0")" && pwd)

install -D -m 755 "$bin" "$root$prefix/bin/ferry"
# mount(8) runs /sbin/mount.TYPE; the link makes ferry act as that helper.
install -d "$root/sbin"
ln -sfn "$prefix/bin/ferry" "$root/sbin/mount.ferry"
install -d "$root$prefix/share/man/man1"
"$bin" man "$root$prefix/share/man/man1"
install -d "$root$prefix/share/bash-completion/completions" "$root$prefix/share/zsh/site-functions" "$root$prefix/share/fish/vendor_completions.d"
"$bin" completion bash > "$root$prefix/share/bash-completion/completions/ferry"
"$bin" completion zsh > "$root$prefix/share/zsh/site-functions/_ferry"
"$bin" completion fish > "$root$prefix/share/fish/vendor_completions.d/ferry.fish"
# The server's unit names the binary where PREFIX put it; the mount unit
# is an example, beside the documentation.
install -d "$root/etc/systemd/system" "$root$prefix/share/doc/ferry/examples"
sed "s|/usr/local/bin/ferry|$prefix/bin/ferry|" "$src/systemd/ferry-serve@.service" > "$root/etc/systemd/system/ferry-serve@.service"
install -m 644 "$src/systemd/mnt-src.mount" "$root$prefix/share/doc/ferry/examples/mnt-src.mount"
echo "installed ferry in $root$prefix (mount.ferry in $root/sbin, ferry-serve@.service in $root/etc/systemd/system)"
