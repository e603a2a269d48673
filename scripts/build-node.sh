#!/usr/bin/env bash
# Builds the stack of a real node from the Go module proxy (no release downloads): the
# kubelet of the control plane's Kubernetes version, containerd with its shim and ctr, runc
# with seccomp, and the CNI plugins a local bridge network needs. Debian packages are used
# only for runc's build dependency (libseccomp-dev). Results are cached outside the
# repository, keyed by the versions and by this build recipe, and reused.
#
# Prints the directory on its last line of stdout. It holds kubelet, containerd, ctr,
# containerd-shim-runc-v2, runc, cni/{bridge,host-local,loopback,portmap} and VERSIONS
# (one `name version` per line).
#
# Overrides:
#   RPW_NODE_ASSETS=/dir   use a directory prepared with the same layout, build nothing
#   RPW_KUBE_VERSION       kubelet version (default v1.37.2, the control plane's)
#   RPW_CACHE              cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

LOG_PREFIX=build-node
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"

KUBE_VERSION="${RPW_KUBE_VERSION:-v1.37.2}"
CONTAINERD_VERSION=v2.3.7
RUNC_VERSION=v1.5.3
CNI_VERSION=v1.10.0
CONTAINERD_MODULE=github.com/containerd/containerd/v2
RUNC_MODULE=github.com/opencontainers/runc
CNI_MODULE=github.com/containernetworking/plugins
EXECUTABLES=(kubelet containerd ctr containerd-shim-runc-v2 runc
  cni/bridge cni/host-local cni/loopback cni/portmap)
# package directory of each CNI plugin inside its module
declare -A CNI_PLUGINS=([bridge]=plugins/main/bridge [host-local]=plugins/ipam/host-local
  [loopback]=plugins/main/loopback [portmap]=plugins/meta/portmap)

have_all() {
  local dir=$1 name
  for name in "${EXECUTABLES[@]}"; do [[ -x "$dir/$name" ]] || return 1; done
  [[ -f "$dir/VERSIONS" ]]
}

versions() {
  printf '%s %s\n' kubelet "$KUBE_VERSION" containerd "$CONTAINERD_VERSION" \
    runc "$RUNC_VERSION" cni-plugins "$CNI_VERSION"
}

# The cache key: the versions and the recipe (this script and the functions it sources), so
# that a changed build flag never reuses a stale binary.
cache_key() {
  { versions; cat "$HERE/build-node.sh" "$HERE/lib.sh"; } | sha1sum | cut -c1-12
}

if [[ -n "${RPW_NODE_ASSETS:-}" ]]; then
  if have_all "$RPW_NODE_ASSETS"; then
    log "using the node stack in $RPW_NODE_ASSETS"
    echo "$RPW_NODE_ASSETS"
    exit 0
  fi
  log "RPW_NODE_ASSETS=$RPW_NODE_ASSETS lacks one of: ${EXECUTABLES[*]} VERSIONS"
  exit 1
fi

OUT="$CACHE/bin/node-$KUBE_VERSION-$(cache_key)"
if have_all "$OUT"; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { log "no go on PATH: install Go 1.21 or later (it fetches the toolchain each module asks for)"; exit 1; }
go_env
mkdir -p "$OUT/cni"
# One build at a time: a second one waits, then finds everything built.
exec 9>"$OUT.lock"
flock 9

# released_module_dir MODULE VERSION: the module's own directory in the module cache. The
# pieces other than the kubelet are built there, as the main module, with -mod=readonly: their
# go.mod and go.sum then pick exactly the dependencies of the release.
released_module_dir() {
  local dir
  dir=$(module_dir "$1" "$2") || true
  [[ -n "$dir" && -d "$dir" ]] || { log "cannot fetch $1@$2 from the Go module proxy"; return 1; }
  echo "$dir"
}

# compile WHAT DIR OUTPUT GO-BUILD-ARGS...: one go build into OUTPUT (atomically), skipped
# when OUTPUT exists.
compile() {
  local what=$1 dir=$2 output=$3
  shift 3
  [[ -x "$output" ]] && return 0
  log "$what: compiling"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -o "$output.tmp" "$@" >&2) || { log "$what: build failed"; return 1; }
  mv "$output.tmp" "$output"
  log "$what: done in $((SECONDS - start)) s"
}

build_kubelet() {
  [[ -x "$OUT/kubelet" ]] && return 0
  local work="$CACHE/work/kubelet-$KUBE_VERSION"
  mkdir -p "$work"
  write_wrapper_gomod "$work" rpw.local/kubelet "$KUBE_VERSION" || return 1
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
GO
  log "kubelet $KUBE_VERSION: resolving modules"
  (cd "$work" && go mod tidy -e >&2) || { log "kubelet $KUBE_VERSION: go mod tidy failed"; return 1; }
  compile "kubelet $KUBE_VERSION" "$work" "$OUT/kubelet" \
    -ldflags="$(version_ldflags "$KUBE_VERSION")" k8s.io/kubernetes/cmd/kubelet
}

build_containerd() {
  local dir
  dir=$(released_module_dir "$CONTAINERD_MODULE" "$CONTAINERD_VERSION") || return 1
  local ld="-s -w -X $CONTAINERD_MODULE/version.Version=$CONTAINERD_VERSION"
  ld+=" -X $CONTAINERD_MODULE/version.Package=$CONTAINERD_MODULE"
  local name
  for name in containerd ctr containerd-shim-runc-v2; do
    GOFLAGS="-mod=readonly -buildvcs=false" compile "$name $CONTAINERD_VERSION" "$dir" "$OUT/$name" \
      -ldflags="$ld" "./cmd/$name" || return 1
  done
}

# runc needs cgo (its nsenter is C) and the seccomp tag: the kubelet asks for the
# RuntimeDefault profile, which a runc without seccomp refuses for every container.
build_runc() {
  [[ -x "$OUT/runc" ]] && return 0
  apt_install libseccomp-dev || { log "runc needs libseccomp-dev"; return 1; }
  local dir
  dir=$(released_module_dir "$RUNC_MODULE" "$RUNC_VERSION") || return 1
  CGO_ENABLED=1 GOFLAGS="-mod=readonly -buildvcs=false" compile "runc $RUNC_VERSION" "$dir" "$OUT/runc" \
    -tags seccomp -ldflags="-s -w -X main.version=${RUNC_VERSION#v}" .
}

build_cni() {
  local dir
  dir=$(released_module_dir "$CNI_MODULE" "$CNI_VERSION") || return 1
  local ld="-s -w -X $CNI_MODULE/pkg/utils/buildversion.BuildVersion=$CNI_VERSION"
  local name
  for name in "${!CNI_PLUGINS[@]}"; do
    GOFLAGS="-mod=readonly -buildvcs=false" compile "CNI $name $CNI_VERSION" "$dir" "$OUT/cni/$name" \
      -ldflags="$ld" "./${CNI_PLUGINS[$name]}" || return 1
  done
}

for piece in cni runc containerd kubelet; do
  if ! "build_$piece"; then
    log "the node stack could not be built ($piece failed; see the messages above)"
    exit 1
  fi
done
versions > "$OUT/VERSIONS"
log "node stack ready in $OUT"
echo "$OUT"
