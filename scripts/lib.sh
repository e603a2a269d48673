# Shell functions shared by the build scripts (sourced, never run). Each script sets
# LOG_PREFIX before sourcing; everything here logs to stderr, so that a script's stdout stays
# the one directory it prints.

CACHE="${RPW_CACHE:-$HOME/.cache/resize-preemption-webhook}"

log() { printf '[%s] %s\n' "${LOG_PREFIX:-build}" "$*" >&2; }

# go_env: module and build caches beside the binaries, so that a warm machine rebuilds nothing.
go_env() {
  export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}"
  export GOCACHE="${GOCACHE:-$CACHE/gocache}"
  export GOFLAGS="-mod=mod -buildvcs=false"
  export CGO_ENABLED=0
}

# apt_install PACKAGE...: installs Debian packages that are not installed yet (build
# dependencies and image tools, never the node stack itself), noninteractively, with sudo
# only when not root.
apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  if ! command -v apt-get >/dev/null; then
    log "missing ${missing[*]} and no apt-get: install them (Debian 12 package names) by hand"
    return 1
  fi
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  log "installing Debian's ${missing[*]}"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || {
    log "apt-get could not install ${missing[*]}"
    return 1
  }
}

# ensure_emulation ARCH: the machine runs programs of ARCH (a Debian architecture) through
# QEMU, for building on a foreign platform (mmdebstrap's package scripts, buildah's RUN
# steps): Debian's qemu-user-static, binfmt_misc mounted, and its handler for ARCH
# registered from the package's binfmt.d file. That file asks for the F flag: the kernel
# opens the interpreter once, at registration, so it runs inside chroots too, where its path
# does not exist. arch-test (which mmdebstrap asks before a foreign bootstrap) then runs a
# program of ARCH to confirm it. Nothing for the machine's own architecture; as root (mount,
# register). One line and status 1 when it cannot be.
ensure_emulation() {
  local arch=$1 qemu dir=/proc/sys/fs/binfmt_misc
  [[ "$arch" == "$(dpkg --print-architecture)" ]] && return 0
  case "$arch" in
    arm64) qemu=aarch64 ;;
    amd64) qemu=x86_64 ;;
    *) log "no emulation of $arch is known here"; return 1 ;;
  esac
  apt_install qemu-user-static arch-test || { log "qemu-user-static and arch-test are needed to build for $arch"; return 1; }
  if [[ ! -e "$dir/register" ]] && ! mount -t binfmt_misc binfmt_misc "$dir" 2>/dev/null; then
    log "binfmt_misc is not mounted at $dir and cannot be (as root, with a kernel that has it): $arch programs cannot run here"
    return 1
  fi
  local handler="$dir/qemu-$qemu" conf="/usr/lib/binfmt.d/qemu-$qemu.conf"
  if [[ ! -e "$handler" ]]; then
    if [[ ! -f "$conf" ]]; then
      log "qemu-user-static has no $conf: cannot register the $arch handler"
      return 1
    fi
    # A concurrent build may register it first: the kernel then refuses this one.
    if ! grep -v '^#' "$conf" > "$dir/register" 2>/dev/null && [[ ! -e "$handler" ]]; then
      log "cannot register $conf with binfmt_misc ($dir/register refused it)"
      return 1
    fi
    log "registered $handler: $arch programs run through qemu-$qemu"
  fi
  if ! grep -qx enabled "$handler"; then
    log "$handler is disabled (echo 1 > $handler enables it)"
    return 1
  fi
  if ! grep -q '^flags:.*F' "$handler"; then
    log "$handler is registered without the F flag, so it cannot run in a chroot: remove it (echo -1 > $handler) and build again"
    return 1
  fi
  if [[ "$(arch-test "$arch" 2>&1)" != "$arch: ok" ]]; then
    log "$handler is registered, yet a program of $arch does not run (arch-test $arch)"
    return 1
  fi
}

# module_dir MODULE VERSION: the directory of MODULE@VERSION in the module cache (downloaded
# on first use), or nothing when the proxy does not serve it.
module_dir() {
  go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}

# write_wrapper_gomod DIR MODULE VERSION: a module requiring k8s.io/kubernetes VERSION with
# its staging modules replaced by their published versions. Kept when it exists already
# (go mod tidy has filled in the rest then).
write_wrapper_gomod() {
  local work=$1 module=$2 version=$3
  [[ -f "$work/go.mod" ]] && grep -q "^module $module\$" "$work/go.mod" && return 0
  local minor=${version#v1.}; minor=${minor%%.*}
  local staging="v0.${minor}.${version##*.}"
  log "kubernetes $version: reading its go.mod"
  local gomod
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -f "$gomod" ]] || { log "cannot fetch k8s.io/kubernetes@$version"; return 1; }
  local goline
  goline=$(grep -E '^go [0-9]' "$gomod" | head -1)
  {
    echo "module $module"
    echo
    echo "$goline"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "replace ("
    # Every staging module k8s.io/kubernetes points at ./staging is published on its own
    # with the matching v0.x tag.
    grep -E '^\s*k8s.io/\S+ => ./staging' "$gomod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$work/go.mod"
}

version_ldflags() {
  local version=$1
  local minor=${version#v1.}; minor=${minor%%.*}
  local ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}
