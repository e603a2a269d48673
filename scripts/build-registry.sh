#!/usr/bin/env bash
# Builds CNCF Distribution's registry (cmd/registry), the OCI registry the checkpoint tests
# push to, from the Go module proxy (no release downloads). Cached outside the repository,
# keyed by version, and reused, like helm in scripts/build-tools.sh.
#
# Beside it, `bcrypt-hash` (reads a password on stdin, prints its bcrypt hash): the registry's
# htpasswd file takes bcrypt hashes only, and this hashes with golang.org/x/crypto/bcrypt,
# the package the registry verifies them with, already in its module graph, so the tests
# need no password-hashing package of their own.
#
# Prints the directory holding `registry` and `bcrypt-hash` on its last line of stdout.
#
# Overrides:
#   RPW_REGISTRY=/path/to/registry   use this binary, build nothing
#   RPW_REGISTRY_VERSION             distribution version (default v3.1.2)
#   RPW_CACHE                        cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOG_PREFIX=build-registry
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
# shellcheck source=scripts/go-tool.sh
source "$HERE/go-tool.sh"

VERSION="${RPW_REGISTRY_VERSION:-v3.1.2}"
OUT="$CACHE/bin/registry-$VERSION"
use_prebuilt RPW_REGISTRY
print_if_built "$OUT" registry bcrypt-hash
go_env
build_lock "$OUT" registry bcrypt-hash

module="github.com/distribution/distribution/v3"
work="$CACHE/work/registry-$VERSION"
mkdir -p "$work/bcrypt-hash"
cat > "$work/bcrypt-hash/main.go" <<'GO'
// bcrypt-hash prints the bcrypt hash of the password on its standard input (one line).
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(os.Stderr, "bcrypt-hash: no password on stdin")
		os.Exit(2)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(strings.TrimRight(line, "\r\n")), bcrypt.DefaultCost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bcrypt-hash:", err)
		os.Exit(1)
	}
	fmt.Println(string(hash))
}
GO
tool_module "$work" registry "$module" "$VERSION" "$module/cmd/registry"
log "registry $VERSION: compiling"
# The registry reports its version from this variable; a module build leaves it empty.
ld="-s -w -X $module/version.version=$VERSION"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/registry.tmp" "$module/cmd/registry" >&2)
(cd "$work" && go build -trimpath -ldflags="-s -w" -o "$OUT/bcrypt-hash" ./bcrypt-hash >&2)
mv "$OUT/registry.tmp" "$OUT/registry"
log "registry ready in $OUT"
echo "$OUT"
