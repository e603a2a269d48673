#!/usr/bin/env bash
# The SBOM of the webhook's image (`make sbom`): the image as `make image` builds it, as an
# OCI archive, read by syft (the tool the release workflow's anchore/sbom-action runs; built
# by scripts/build-syft.sh) into SPDX JSON. tests/e2e/test_sbom.py checks that it lists every
# package requirements-runtime.lock pins, at its version.
#
#   SBOM=FILE   where it goes (default dist/resize-preemption-webhook-<version>.spdx.json)
#
# Prints the SBOM's path on its last line of stdout.
set -euo pipefail

LOG_PREFIX=sbom
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n1)
SBOM="${SBOM:-$ROOT/dist/resize-preemption-webhook-$VERSION.spdx.json}"
syft="$("$ROOT/scripts/build-syft.sh" | tail -n1)/syft"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
IMAGE_ARCHIVE="$scratch/image.tar" "$ROOT/scripts/build-image.sh" >/dev/null
mkdir -p "$(dirname "$SBOM")"
log "reading the image with syft"
# No update check: the SBOM is made from the archive alone.
SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan --quiet "oci-archive:$scratch/image.tar" \
  --output "spdx-json=$SBOM.tmp"
mv "$SBOM.tmp" "$SBOM"
log "SBOM: $SBOM"
echo "$SBOM"
