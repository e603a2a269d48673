#!/usr/bin/env bash
# Builds the control-plane binaries the tests, the demo and the benchmarks run against:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd, from the Go
# module proxy (no release downloads are needed), and rpw-node, the hollow kubelet of the
# same Kubernetes version (sources in harness/node). Results are cached outside the
# repository, keyed by version (rpw-node also by its sources), and reused.
#
# Prints the directory holding the binaries on its last line of stdout.
#
# Overrides:
#   RPW_ASSETS=/dir          use binaries already in /dir (all six names), build nothing
#   KUBEBUILDER_ASSETS=/dir  same, for directories prepared for controller-runtime's envtest
#   RPW_KUBE_VERSION         first Kubernetes version to try (default v1.37.2)
#   RPW_KUBE_NO_FALLBACK=1   build RPW_KUBE_VERSION or fail, never an other version (make matrix)
#   RPW_ETCD_VERSION         etcd version (default v3.6.16)
#   RPW_CACHE                cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd rpw-node)
NODE_SOURCES="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/harness/node"
KUBE_VERSIONS=("${RPW_KUBE_VERSION:-v1.37.2}" v1.36.3 v1.35.4)
[[ -n "${RPW_KUBE_NO_FALLBACK:-}" ]] && KUBE_VERSIONS=("${KUBE_VERSIONS[0]}")
ETCD_VERSION="${RPW_ETCD_VERSION:-v3.6.16}"
LOG_PREFIX=build-control-plane
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

node_sources_id() {
  cat "$NODE_SOURCES"/*.go | sha1sum | cut -c1-16
}

have_all() {
  local dir=$1 b
  for b in "${BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
  # A node binary built from other sources than the checkout's is stale.
  [[ "$(cat "$dir/rpw-node.sources" 2>/dev/null)" == "$(node_sources_id)" ]]
}

for override in "${RPW_ASSETS:-}" "${KUBEBUILDER_ASSETS:-}"; do
  if [[ -n "$override" ]]; then
    if have_all "$override"; then
      log "using binaries from $override"
      echo "$override"
      exit 0
    fi
    log "$override lacks one of: ${BINARIES[*]}; building instead"
  fi
done

go_env

build_etcd() {
  local out=$1
  [[ -x "$out/etcd" ]] && return 0
  local work="$CACHE/work/etcd-$ETCD_VERSION"
  mkdir -p "$work" "$out"
  # Builds of two Kubernetes versions share this work directory.
  exec 8>"$work.lock"
  flock 8
  cat > "$work/go.mod" <<MOD
module rpw.local/etcd

go 1.24
MOD
  cat > "$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "etcd $ETCD_VERSION: resolving modules"
  (cd "$work" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && go mod tidy >&2)
  log "etcd $ETCD_VERSION: compiling"
  (cd "$work" && go build -trimpath -ldflags='-s -w' -o "$out/etcd.tmp" . >&2)
  mv "$out/etcd.tmp" "$out/etcd"
  exec 8>&-
}

# build_node VERSION OUT: the hollow kubelet of harness/node, in a wrapper module of its own
# (it needs a few modules the control plane does not), linked against the same
# k8s.io/kubernetes VERSION.
build_node() {
  local version=$1 out=$2
  local id
  id=$(node_sources_id)
  [[ -x "$out/rpw-node" && "$(cat "$out/rpw-node.sources" 2>/dev/null)" == "$id" ]] && return 0
  local work="$CACHE/work/node-$version"
  mkdir -p "$work" "$out"
  write_wrapper_gomod "$work" rpw.local/node "$version" || return 1
  # An older kubelet's Go API differs in a few places, held by harness/node/compat_1_<minor>.go
  # (compat_1_37.go: v1.37 and later). Only that one is copied, so that go mod tidy never sees
  # another version's imports, and its build tag is set.
  local minor=${version#v1.}; minor=${minor%%.*}
  local compat=compat_1_37.go tags=()
  if ((minor < 37)); then
    compat=compat_1_$minor.go
    tags=(-tags "kube1_$minor")
  fi
  [[ -f "$NODE_SOURCES/$compat" ]] || { log "rpw-node $version: no $compat, version not supported"; return 1; }
  rm -f "$work"/*.go
  local src
  for src in "$NODE_SOURCES"/*.go; do
    [[ "$(basename "$src")" == compat_* ]] || cp "$src" "$work/"
  done
  cp "$NODE_SOURCES/$compat" "$work/"
  log "rpw-node $version: resolving modules"
  (cd "$work" && go mod tidy -e >&2)
  log "rpw-node $version: compiling (first time: a few minutes)"
  local start=$SECONDS
  (cd "$work" && go build "${tags[@]}" -trimpath -ldflags="$(version_ldflags "$version")" -o "$out/rpw-node.tmp" . >&2) || return 1
  mv "$out/rpw-node.tmp" "$out/rpw-node"
  echo "$id" > "$out/rpw-node.sources"
  log "rpw-node $version: done in $((SECONDS - start)) s"
}

build_kube() {
  local version=$1 out=$2
  local work="$CACHE/work/kubernetes-$version"
  mkdir -p "$work" "$out"
  write_wrapper_gomod "$work" rpw.local/kube "$version" || return 1
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  local b need=0
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$out/$b" ]] || need=1
  done
  ((need)) || return 0
  log "kubernetes $version: resolving modules (first time: several minutes)"
  (cd "$work" && go mod tidy -e >&2)
  local ld
  ld=$(version_ldflags "$version")
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$out/$b" ]] && continue
    log "kubernetes $version: compiling $b"
    local start=$SECONDS
    (cd "$work" && go build -trimpath -ldflags="$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$out/$b.tmp" "$out/$b"
    log "kubernetes $version: $b done in $((SECONDS - start)) s"
  done
}

# One build of a version at a time: two at once overwrite each other's .tmp files, and the
# loser would fall back to an older version. A second build of it waits for the lock, then
# finds the binaries built. Builds of different versions share nothing but etcd's work
# directory (its own lock) and Go's caches (safe to share), so one never waits for another:
# a half-hour build of an older version keeps no session from the binaries it has.
mkdir -p "$CACHE/bin"
for version in "${KUBE_VERSIONS[@]}"; do
  out="$CACHE/bin/kube-$version-etcd-$ETCD_VERSION"
  if have_all "$out"; then
    echo "$out"
    exit 0
  fi
  exec 9>"$CACHE/bin/control-plane-$version.lock"
  flock 9
  if have_all "$out"; then
    echo "$out"
    exit 0
  fi
  if build_kube "$version" "$out" && build_etcd "$out" && build_node "$version" "$out"; then
    echo "$version" > "$out/VERSION"
    log "binaries ready in $out"
    echo "$out"
    exit 0
  fi
  exec 9>&-
  log "kubernetes $version failed; trying the next version"
done
log "no Kubernetes version could be built; see the messages above"
exit 1
