#!/usr/bin/env bash
# Builds the Vertical Pod Autoscaler's updater, the only VPA component the local cluster
# runs (docs/vpa.md says why there is no recommender and no admission controller), from the
# Go module proxy, and copies the module's own CRD manifest beside it. Cached outside the
# repository, keyed by version, and reused, like scripts/build-control-plane.sh.
#
# Prints the directory holding vpa-updater and vpa-v1-crd-gen.yaml on its last line of stdout.
#
# Overrides:
#   RPW_VPA_VERSION   VPA module version (default v1.8.1: the first release with the
#                     InPlace update mode beside InPlaceOrRecreate)
#   RPW_CACHE         cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

VPA_VERSION="${RPW_VPA_VERSION:-v1.8.1}"
MODULE=k8s.io/autoscaler/vertical-pod-autoscaler
CACHE="${RPW_CACHE:-$HOME/.cache/resize-preemption-webhook}"
OUT="$CACHE/bin/vpa-$VPA_VERSION"
CRD=deploy/vpa-v1-crd-gen.yaml

log() { printf '[build-vpa] %s\n' "$*" >&2; }

if [[ -x "$OUT/vpa-updater" && -f "$OUT/$(basename "$CRD")" ]]; then
  echo "$OUT"
  exit 0
fi

export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}"
export GOCACHE="${GOCACHE:-$CACHE/gocache}"
export CGO_ENABLED=0
# Built inside the module's own (read-only) directory, as its main module: its go.mod and
# go.sum then pick exactly the dependencies VPA released. `go install module@version` would
# do the same but refuses a go.mod with exclude directives, which VPA's has.
export GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$OUT"
# One build at a time; a second one waits, then finds it built.
exec 9>"$OUT.lock"
flock 9

log "vpa $VPA_VERSION: fetching $MODULE"
dir=$(go mod download -json "$MODULE@$VPA_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
if [[ ! -f "$dir/$CRD" ]]; then
  log "cannot fetch $MODULE@$VPA_VERSION (or it has no $CRD); set RPW_VPA_VERSION"
  exit 1
fi
install -m 0644 "$dir/$CRD" "$OUT/$(basename "$CRD")"

if [[ ! -x "$OUT/vpa-updater" ]]; then
  log "vpa $VPA_VERSION: compiling the updater (first time: a few minutes)"
  start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags='-s -w' -o "$OUT/vpa-updater.tmp" ./pkg/updater >&2)
  mv "$OUT/vpa-updater.tmp" "$OUT/vpa-updater"
  log "vpa $VPA_VERSION: updater done in $((SECONDS - start)) s"
fi
echo "$VPA_VERSION" > "$OUT/VERSION"
log "vpa ready in $OUT"
echo "$OUT"
