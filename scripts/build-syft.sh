#!/usr/bin/env bash
# Builds syft, the SBOM generator the release workflow runs (anchore/sbom-action), from the
# Go module proxy (no release downloads), for tests/e2e/test_sbom.py: the SBOM of the image
# `make image` builds, checked against requirements-runtime.lock. Cached outside the
# repository, keyed by version, and reused, like helm in scripts/build-tools.sh.
#
# Prints the directory holding `syft` on its last line of stdout.
#
# Overrides:
#   RPW_SYFT=/path/to/syft   use this binary, build nothing
#   RPW_SYFT_VERSION         syft version (default v1.57.2)
#   RPW_CACHE                cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_PREFIX=build-syft
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
# shellcheck source=scripts/go-tool.sh
source "$HERE/go-tool.sh"

VERSION="${RPW_SYFT_VERSION:-v1.57.2}"
OUT="$CACHE/bin/syft-$VERSION"
use_prebuilt RPW_SYFT
print_if_built "$OUT" syft
go_env
build_lock "$OUT" syft

module="github.com/anchore/syft"
work="$CACHE/work/syft-$VERSION"
tool_module "$work" syft "$module" "$VERSION" "$module/cmd/syft"
log "syft $VERSION: compiling"
# syft reports its version from this variable; a module build leaves it "[not provided]".
ld="-s -w -X main.version=${VERSION#v}"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/syft.tmp" "$module/cmd/syft" >&2)
mv "$OUT/syft.tmp" "$OUT/syft"
log "syft ready in $OUT"
echo "$OUT"
