#!/usr/bin/env bash
# Builds the webhook's image from the Dockerfile (`make image`), with its OCI labels: version
# (pyproject.toml), revision (the git commit, "-dirty" with uncommitted changes) and source
# (the git remote, without credentials). Prints the image's reference on its last line.
#
#   IMAGE=REPOSITORY:TAG   default localhost/resize-preemption-webhook:<version>, the local
#                          name the chart and deploy/base use (docs/deploy.md "The image")
#   CONTAINER_TOOL         docker, podman or buildah, with arguments (default: docker when
#                          its daemon answers, else podman, else buildah)
#   BUILD_FLAGS            more arguments for `build` (e.g. --pull=never)
#   REVISION, SOURCE       override the labels
#
# The real node's image is built by this same script (harness/images.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n1)
IMAGE="${IMAGE:-localhost/resize-preemption-webhook:$VERSION}"

if [[ -z "${REVISION:-}" ]]; then
  REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  if [[ "$REVISION" != unknown && -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]]; then
    REVISION="$REVISION-dirty"
  fi
fi
if [[ -z "${SOURCE+set}" ]]; then
  SOURCE=$(git -C "$ROOT" config --get remote.origin.url 2>/dev/null | sed 's#//[^/@]*@#//#' || true)
fi

if [[ -z "${CONTAINER_TOOL:-}" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    CONTAINER_TOOL=docker
  elif command -v podman >/dev/null; then
    CONTAINER_TOOL=podman
  elif command -v buildah >/dev/null; then
    CONTAINER_TOOL=buildah
  else
    echo "build-image: no docker daemon, podman or buildah here (CONTAINER_TOOL=...)" >&2
    exit 1
  fi
fi
read -ra tool <<< "$CONTAINER_TOOL"
read -ra extra <<< "${BUILD_FLAGS:-}"

echo "build-image: $IMAGE (version $VERSION, revision $REVISION) with ${tool[0]}" >&2
"${tool[@]}" build "${extra[@]}" \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE" \
  --tag "$IMAGE" --file "$ROOT/Dockerfile" "$ROOT" >&2
echo "$IMAGE"
