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

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_PREFIX=build-tools
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
# shellcheck source=scripts/go-tool.sh
source "$HERE/go-tool.sh"

HELM_VERSION="${RPW_HELM_VERSION:-v4.3.2}"
OUT="$CACHE/bin/helm-$HELM_VERSION"
use_prebuilt RPW_HELM
print_if_built "$OUT" helm
go_env
build_lock "$OUT" helm

major=${HELM_VERSION%%.*}
work="$CACHE/work/helm-$HELM_VERSION"
tool_module "$work" helm "helm.sh/helm/$major" "$HELM_VERSION" "helm.sh/helm/$major/cmd/helm"
log "helm $HELM_VERSION: compiling"
# helm reports its version from these variables; a module build leaves them empty.
ld="-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
ld+=" -X helm.sh/helm/$major/internal/version.gitTreeState=clean"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/helm.tmp" "helm.sh/helm/$major/cmd/helm" >&2)
mv "$OUT/helm.tmp" "$OUT/helm"
log "helm ready in $OUT"
echo "$OUT"
