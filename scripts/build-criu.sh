#!/usr/bin/env bash
# Builds CRIU, which containerd's checkpoint and restore run (through runc), from the
# upstream tarball of its Debian source package. Debian 12's own criu (3.17) fails
# `criu check` on recent kernels ("Unexpected rt vDSO area bounds"), and the next release's
# binary package needs a newer glibc than Debian 12's, so the source is built here against
# Debian 12's libraries. Debian's `criu` package is never installed: it would shadow this one
# on a PATH that lists /usr/sbin first.
#
# The tarball comes through apt's own source handling (signature and hash checked) from a
# private apt configuration holding one deb-src entry for the next Debian release; its URI is
# the machine's own Debian source URI, read at run time.
#
# Prints the directory on its last line of stdout: it holds `criu` and VERSIONS.
#
# Overrides:
#   RPW_CRIU_DIR=/dir      use a directory holding a working `criu`, build nothing
#   RPW_CACHE              cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

LOG_PREFIX=build-criu
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"

CRIU_VERSION=4.1.1
# The Debian release whose source package carries CRIU_VERSION.
CRIU_SUITE=trixie
BUILD_DEPS=(build-essential libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev pkg-config
  libgnutls28-dev libnftables-dev libaio-dev uuid-dev libdrm-dev xz-utils)

if [[ -n "${RPW_CRIU_DIR:-}" ]]; then
  if [[ -x "$RPW_CRIU_DIR/criu" ]]; then
    log "using the criu in $RPW_CRIU_DIR"
    echo "$RPW_CRIU_DIR"
    exit 0
  fi
  log "RPW_CRIU_DIR=$RPW_CRIU_DIR holds no executable criu"
  exit 1
fi

cache_key() {
  { echo "criu $CRIU_VERSION $CRIU_SUITE"; cat "$HERE/build-criu.sh" "$HERE/lib.sh"; } | sha1sum | cut -c1-12
}

OUT="$CACHE/bin/criu-$CRIU_VERSION-$(cache_key)"
if [[ -x "$OUT/criu" && -f "$OUT/VERSIONS" ]]; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$CACHE/bin"
# One build at a time: a second one waits, then finds it built.
exec 9>"$OUT.lock"
flock 9
if [[ -x "$OUT/criu" && -f "$OUT/VERSIONS" ]]; then
  echo "$OUT"
  exit 0
fi
start=$SECONDS

apt_install "${BUILD_DEPS[@]}" || { log "CRIU's build dependencies could not be installed"; exit 1; }

# debian_uri: the URI of the machine's Debian archive (not its security archive), from the
# deb822 sources or the one-line sources list.
debian_uri() {
  local uri
  uri=$( { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}';
           grep -hsE '^deb(-src)? ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{
             for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }'; } |
         grep -v -- '-security' | grep -E '/debian/?$' | head -1)
  [[ -n "$uri" ]] && echo "${uri%/}"
}

work="$CACHE/work/criu-$CRIU_VERSION"
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial" "$work/src"
uri=$(debian_uri) || { log "no Debian archive in this machine's apt sources"; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'deb-src [signed-by=%s] %s %s main\n' "$keyring" "$uri" "$CRIU_SUITE" > "$work/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt/archives"
  -o "APT::Sandbox::User=root" -qq)
log "CRIU $CRIU_VERSION: reading the $CRIU_SUITE source index"
apt-get "${apt_opts[@]}" update >&2 || { log "apt-get update of the $CRIU_SUITE sources failed"; exit 1; }
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only --tar-only criu >&2) || {
  log "apt-get source could not fetch criu $CRIU_VERSION"; exit 1; }
tarball=$(ls "$work/src"/criu_"$CRIU_VERSION".orig.tar.* 2>/dev/null | head -1)
[[ -f "$tarball" ]] || { log "no criu_$CRIU_VERSION.orig.tar.* fetched"; exit 1; }
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -mindepth 1 -type d -name 'criu*' | head -1)
log "CRIU $CRIU_VERSION: compiling"
make -C "$srcdir" -j"$(nproc)" criu >"$work/build.log" 2>&1 || {
  tail -30 "$work/build.log" >&2; log "CRIU $CRIU_VERSION: build failed (log in $work/build.log)"; exit 1; }
mkdir -p "$OUT.tmp"
install -m 0755 "$srcdir/criu/criu" "$OUT.tmp/criu"
"$OUT.tmp/criu" --version >&2
echo "criu $CRIU_VERSION" > "$OUT.tmp/VERSIONS"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
rm -rf "$work"
log "CRIU $CRIU_VERSION ready in $OUT ($((SECONDS - start)) s)"
echo "$OUT"
