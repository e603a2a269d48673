#!/usr/bin/env bash
# Builds the images a real node runs, without a registry, as OCI archives containerd
# imports: the sandbox (the Kubernetes module's pause.c), a workload image (Debian's static
# busybox) and the product's own image from the unchanged Dockerfile on a stand-in base made
# from Debian 12 packages. Installs the tools it needs from Debian (buildah, mmdebstrap,
# busybox-static, gcc); harness/images.py does the building and the caching by inputs.
#
# Prints the directory holding images.tsv (`reference<TAB>file<TAB>role` per line) and the
# archives on its last line of stdout.
#
# Overrides:
#   RPW_IMAGES=/dir        use a directory prepared with the same layout, build nothing
#   RPW_KUBE_VERSION       the Kubernetes module pause.c comes from (default v1.37.2)
#   RPW_CACHE              cache root (default ~/.cache/resize-preemption-webhook)
set -euo pipefail

LOG_PREFIX=build-images
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"

KUBE_VERSION="${RPW_KUBE_VERSION:-v1.37.2}"
BUSYBOX=/bin/busybox

if [[ -n "${RPW_IMAGES:-}" ]]; then
  if [[ -f "$RPW_IMAGES/images.tsv" ]]; then
    log "using the images in $RPW_IMAGES"
    echo "$RPW_IMAGES"
    exit 0
  fi
  log "RPW_IMAGES=$RPW_IMAGES holds no images.tsv"
  exit 1
fi

apt_install buildah mmdebstrap busybox-static gcc libc6-dev || {
  log "the image tools could not be installed"
  exit 1
}

go_env
kube_dir=$(module_dir k8s.io/kubernetes "$KUBE_VERSION") || true
pause_c="$kube_dir/build/pause/linux/pause.c"
if [[ ! -f "$pause_c" ]]; then
  log "no build/pause/linux/pause.c in k8s.io/kubernetes@$KUBE_VERSION (cannot fetch the module?)"
  exit 1
fi
pause_tag=$(sed -n 's/^TAG ?= *//p' "$kube_dir/build/pause/Makefile")

cd "$ROOT"
exec "${PYTHON:-python3}" -m harness.images build \
  --cache "$CACHE/images" --source-root "$ROOT" \
  --pause-c "$pause_c" --pause-version "v${pause_tag:-unknown}" \
  --busybox "$BUSYBOX" --busybox-version "$(dpkg-query -W -f='${Version}' busybox-static)"
