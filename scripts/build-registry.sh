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

VERSION="${RPW_REGISTRY_VERSION:-v3.1.2}"
CACHE="${RPW_CACHE:-$HOME/.cache/resize-preemption-webhook}"
OUT="$CACHE/bin/registry-$VERSION"

log() { printf '[build-registry] %s\n' "$*" >&2; }

if [[ -n "${RPW_REGISTRY:-}" ]]; then
  if [[ -x "$RPW_REGISTRY" ]]; then
    log "using the registry from $RPW_REGISTRY"
    dirname "$RPW_REGISTRY"
    exit 0
  fi
  log "RPW_REGISTRY=$RPW_REGISTRY is not executable; building instead"
fi

if [[ -x "$OUT/registry" && -x "$OUT/bcrypt-hash" ]]; then
  echo "$OUT"
  exit 0
fi

export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}"
export GOCACHE="${GOCACHE:-$CACHE/gocache}"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

module="github.com/distribution/distribution/v3"
work="$CACHE/work/registry-$VERSION"
mkdir -p "$work" "$OUT"
# One build at a time; a second one waits, then finds the registry built.
exec 9>"$OUT.lock"
flock 9
if [[ -x "$OUT/registry" && -x "$OUT/bcrypt-hash" ]]; then
  echo "$OUT"
  exit 0
fi
cat > "$work/go.mod" <<MOD
module rpw.local/registry

go 1.24
MOD
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
cat > "$work/tools.go" <<GO
//go:build tools

package tools

import _ "$module/cmd/registry"
GO
log "registry $VERSION: resolving modules"
(cd "$work" && go get "$module@$VERSION" >&2 && go mod tidy -e >&2)
log "registry $VERSION: compiling"
# The registry reports its version from this variable; a module build leaves it empty.
ld="-s -w -X $module/version.version=$VERSION"
(cd "$work" && go build -trimpath -ldflags="$ld" -o "$OUT/registry.tmp" "$module/cmd/registry" >&2)
(cd "$work" && go build -trimpath -ldflags="-s -w" -o "$OUT/bcrypt-hash" ./bcrypt-hash >&2)
mv "$OUT/registry.tmp" "$OUT/registry"
log "registry ready in $OUT"
echo "$OUT"
