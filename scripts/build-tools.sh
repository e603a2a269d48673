#!/usr/bin/env bash
# Builds the operator tools the chart tests run: helm, from the Go module proxy (no release
# downloads). Cached outside the repository, keyed by version, and reused, like
# scripts/build-control-plane.sh.
#
# Prints the directory holding the tools on its last line of stdout.
#
# Overrides:
#   RPW_HELM=/path/to/helm   use this helm binary, build nothing
#   RPW_HELM_VERSION         helm version (default v4.3.2: Helm 4 removes webhook
#                            configurations first on uninstall, Helm 3 last)
#   RPW_CACHE                cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

HELM_VERSION="${RPW_HELM_VERSION:-v4.3.2}"
CACHE="${RPW_CACHE:-$HOME/.cache/resize-preemption-webhook}"
OUT="$CACHE/bin/helm-$HELM_VERSION"

log() { printf '[build-tools] %s\n' "$*" >&2; }

if [[ -n "${RPW_HELM:-}" ]]; then
  if [[ -x "$RPW_HELM" ]]; then
    log "using helm from $RPW_HELM"
    dirname "$RPW_HELM"
    exit 0
  fi
  log "RPW_HELM=$RPW_HELM is not executable; building instead"
fi

if [[ -x "$OUT/helm" ]]; then
  echo "$OUT"
  exit 0
fi

export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}"
export GOCACHE="${GOCACHE:-$CACHE/gocache}"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

major=${HELM_VERSION%%.*}
work="$CACHE/work/helm-$HELM_VERSION"
mkdir -p "$work" "$OUT"
# One build at a time; a second one waits, then finds helm built.
exec 9>"$OUT.lock"
flock 9
if [[ -x "$OUT/helm" ]]; then
  echo "$OUT"
  exit 0
fi
cat > "$work/go.mod" <<MOD
module rpw.local/helm

go 1.24
MOD
cat > "$work/tools.go" <<GO
//go:build tools

package tools

import _ "helm.sh/helm/$major/cmd/helm"
GO
log "helm $HELM_VERSION: resolving modules"
(cd "$work" && go get "helm.sh/helm/$major@$HELM_VERSION" >&2 && go mod tidy -e >&2)
log "helm $HELM_VERSION: compiling"
# helm reports its version from these variables; a module build leaves them empty.
ld="-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
ld+=" -X helm.sh/helm/$major/internal/version.gitTreeState=clean"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/helm.tmp" "helm.sh/helm/$major/cmd/helm" >&2)
mv "$OUT/helm.tmp" "$OUT/helm"
log "helm ready in $OUT"
echo "$OUT"
