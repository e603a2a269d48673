#!/usr/bin/env bash
# Builds the control-plane binaries the tests, the demo and the benchmarks run against:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd, from the Go
# module proxy (no release downloads are needed). Results are cached outside the repository,
# keyed by version, and reused.
#
# Prints the directory holding the binaries on its last line of stdout.
#
# Overrides:
#   RPW_ASSETS=/dir          use binaries already in /dir (all five names), build nothing
#   KUBEBUILDER_ASSETS=/dir  same, for directories prepared for controller-runtime's envtest
#   RPW_KUBE_VERSION         first Kubernetes version to try (default v1.37.2)
#   RPW_ETCD_VERSION         etcd version (default v3.6.16)
#   RPW_CACHE                cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)
KUBE_VERSIONS=("${RPW_KUBE_VERSION:-v1.37.2}" v1.36.3 v1.35.4)
ETCD_VERSION="${RPW_ETCD_VERSION:-v3.6.16}"
CACHE="${RPW_CACHE:-$HOME/.cache/resize-preemption-webhook}"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

have_all() {
  local dir=$1 b
  for b in "${BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
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

# Module and build caches live beside the binaries so a warm machine rebuilds nothing.
export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}"
export GOCACHE="${GOCACHE:-$CACHE/gocache}"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

build_etcd() {
  local out=$1
  [[ -x "$out/etcd" ]] && return 0
  local work="$CACHE/work/etcd-$ETCD_VERSION"
  mkdir -p "$work" "$out"
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
}

build_kube() {
  local version=$1 out=$2
  local minor=${version#v1.}; minor=${minor%%.*}
  local staging="v0.${minor}.${version##*.}"
  local work="$CACHE/work/kubernetes-$version"
  mkdir -p "$work" "$out"
  log "kubernetes $version: reading its go.mod"
  local gomod
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -f "$gomod" ]] || { log "cannot fetch k8s.io/kubernetes@$version"; return 1; }
  local goline
  goline=$(grep -E '^go [0-9]' "$gomod" | head -1)
  {
    echo "module rpw.local/kube"
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
  log "kubernetes $version: resolving modules (first time: several minutes)"
  (cd "$work" && go mod tidy -e >&2)
  local ld="-s -w"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$out/$b" ]] && continue
    log "kubernetes $version: compiling $b"
    local start=$SECONDS
    (cd "$work" && go build -trimpath -ldflags="$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$out/$b.tmp" "$out/$b"
    log "kubernetes $version: $b done in $((SECONDS - start)) s"
  done
}

for version in "${KUBE_VERSIONS[@]}"; do
  out="$CACHE/bin/kube-$version-etcd-$ETCD_VERSION"
  if have_all "$out"; then
    echo "$out"
    exit 0
  fi
  if build_kube "$version" "$out" && build_etcd "$out"; then
    echo "$version" > "$out/VERSION"
    log "binaries ready in $out"
    echo "$out"
    exit 0
  fi
  log "kubernetes $version failed; trying the next version"
done
log "no Kubernetes version could be built; see the messages above"
exit 1
