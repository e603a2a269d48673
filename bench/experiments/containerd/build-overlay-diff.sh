#!/usr/bin/env bash
# Builds the real node's stack with one change to containerd, for the checkpoint experiment
# (bench/experiments/containerd_overlay_diff.py) only: walking-overlay.patch (beside this
# script) makes containerd's walking differ read an overlay container's changes from its
# upper directory (continuity's fs.DiffDirChanges) instead of walking the image and the
# container's root side by side. The tests, the demo and the chart run stock containerd.
#
# Prints, on its last line of stdout, a node stack directory for RPW_NODE_ASSETS: the stock
# stack of scripts/build-node.sh (hard links), its containerd built from the same version's
# module source with the patch. Cached, keyed by that version, the patch and this script.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LOG_PREFIX=build-overlay-diff
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

stock=$(bash "$ROOT/scripts/build-node.sh" | tail -1)
version=$(awk '$1 == "containerd" { print $2 }' "$stock/VERSIONS")
[[ -n "$version" ]] || { log "$stock/VERSIONS names no containerd version"; exit 1; }
key=$({ echo "$version"; cat "$HERE/walking-overlay.patch" "$0"; } | sha1sum | cut -c1-12)
out="$CACHE/bin/node-overlay-diff-$key"
if [[ -x "$out/containerd" ]]; then
  echo "$out"
  exit 0
fi

go_env
module=github.com/containerd/containerd/v2
source_dir=$(module_dir "$module" "$version")
[[ -d "$source_dir" ]] || { log "cannot fetch $module@$version from the Go module proxy"; exit 1; }
work="$CACHE/work/containerd-overlay-diff-$key"
rm -rf "$work" "$out.tmp"
cp -r "$source_dir" "$work"
chmod -R u+w "$work"
patch --quiet -d "$work" -p1 < "$HERE/walking-overlay.patch"
cp -al "$stock" "$out.tmp"
rm "$out.tmp/containerd"
log "containerd $version with the overlay diff: compiling"
ld="-s -w -X $module/version.Version=$version+overlay-diff -X $module/version.Package=$module"
(cd "$work" && GOFLAGS="-mod=readonly -buildvcs=false" \
  go build -trimpath -ldflags="$ld" -o "$out.tmp/containerd" ./cmd/containerd >&2)
rm -rf "$work"
mv "$out.tmp" "$out"
echo "$out"
