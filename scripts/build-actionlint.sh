#!/usr/bin/env bash
# Builds actionlint, the linter of GitHub Actions workflows that `make test` runs on
# .github/workflows (tests/e2e/test_release_workflow_lint.py), from the Go module proxy (no
# release downloads). Cached outside the repository, keyed by version, and reused, like helm
# in scripts/build-tools.sh. With shellcheck on PATH it checks each step's `run:` script too.
#
# Prints the directory holding `actionlint` on its last line of stdout.
#
# Overrides:
#   RPW_ACTIONLINT=/path/to/actionlint   use this binary, build nothing
#   RPW_ACTIONLINT_VERSION               actionlint version (default v1.7.12)
#   RPW_CACHE                            cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_PREFIX=build-actionlint
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
# shellcheck source=scripts/go-tool.sh
source "$HERE/go-tool.sh"

VERSION="${RPW_ACTIONLINT_VERSION:-v1.7.12}"
OUT="$CACHE/bin/actionlint-$VERSION"
use_prebuilt RPW_ACTIONLINT
print_if_built "$OUT" actionlint
go_env
build_lock "$OUT" actionlint

module="github.com/rhysd/actionlint"
work="$CACHE/work/actionlint-$VERSION"
tool_module "$work" actionlint "$module" "$VERSION" "$module/cmd/actionlint"
log "actionlint $VERSION: compiling"
# actionlint reports its version from this variable; a module build leaves it empty.
ld="-s -w -X $module.version=$VERSION"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/actionlint.tmp" "$module/cmd/actionlint" >&2)
mv "$OUT/actionlint.tmp" "$OUT/actionlint"
log "actionlint ready in $OUT"
echo "$OUT"
