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
#   IMAGE_ARCHIVE=FILE     also write the image as an OCI archive (ctr images import,
#                          kind load image-archive, skopeo copy oci-archive:FILE ...)
#   BASE                   auto (default): the Dockerfile's base as the tool has it or pulls
#                          it, else the stand-in; stand-in: always the stand-in; upstream:
#                          never the stand-in (fails when the base cannot be pulled)
#
# The stand-in (scripts/stand_in_base.py) is the base made from Debian 12's packages, in a
# buildah storage under the cache (IMAGE_STORE, default $RPW_CACHE/images), the one the real
# node's images are built in. An image built on it carries the label
# org.opencontainers.image.base.name=localhost/stand-in/python:3.11-slim-bookworm: it is no
# release build. It is written as an OCI archive, IMAGE_ARCHIVE or one under the store,
# cached under a key of its inputs (the source, the base, the labels, the flags). The
# machine's own CAs (RPW_LOCAL_CAS, default /usr/local/share/ca-certificates) go into the
# stand-in's trust store (docs/real-node.md, "The stand-in base").
set -euo pipefail

LOG_PREFIX=build-image
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n1)
IMAGE="${IMAGE:-localhost/resize-preemption-webhook:$VERSION}"
FROM_IMAGE=$(sed -n 's/^FROM[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$ROOT/Dockerfile" | head -n1)
BASE="${BASE:-auto}"
case "$BASE" in
  auto | stand-in | upstream) ;;
  *) log "BASE=$BASE: want auto, stand-in or upstream"; exit 2 ;;
esac

if [[ -z "${REVISION:-}" ]]; then
  REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  if [[ "$REVISION" != unknown && -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]]; then
    REVISION="$REVISION-dirty"
  fi
fi
if [[ -z "${SOURCE+set}" ]]; then
  SOURCE=$(git -C "$ROOT" config --get remote.origin.url 2>/dev/null | sed 's#//[^/@]*@#//#' || true)
fi
read -ra extra <<< "${BUILD_FLAGS:-}"
# What an interrupted build leaves: its image ID file and its partial archive.
leftovers=()
trap 'rm -f "${leftovers[@]}"' EXIT

if [[ -z "${CONTAINER_TOOL:-}" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    CONTAINER_TOOL=docker
  elif command -v podman >/dev/null; then
    CONTAINER_TOOL=podman
  elif command -v buildah >/dev/null; then
    CONTAINER_TOOL=buildah
  fi
fi
read -ra tool <<< "${CONTAINER_TOOL:-}"

# has_base: the tool has the Dockerfile's base or pulls it.
has_base() {
  ((${#tool[@]})) || return 1
  case "$(basename "${tool[0]}")" in
    buildah) "${tool[@]}" inspect --type image "$FROM_IMAGE" >/dev/null 2>&1 ;;
    *) "${tool[@]}" image inspect "$FROM_IMAGE" >/dev/null 2>&1 ;;
  esac || "${tool[@]}" pull --quiet "$FROM_IMAGE" >/dev/null 2>&1
}

# build TOOL... -- FLAGS...: the Dockerfile with the labels, tagged IMAGE.
build() {
  local -a with=()
  while [[ $1 != -- ]]; do with+=("$1"); shift; done
  shift
  "${with[@]}" build "$@" "${extra[@]}" \
    --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE" \
    --tag "$IMAGE" --file "$ROOT/Dockerfile" "$ROOT" >&2
}

# archive FILE: the image built by the tool as an OCI archive naming it IMAGE.
archive() {
  case "$(basename "${tool[0]}")" in
    docker) "${tool[@]}" save --output "$1" "$IMAGE" ;;
    podman) "${tool[@]}" save --format oci-archive --output "$1" "$IMAGE" ;;
    *) "${tool[@]}" push --quiet --format oci "$IMAGE" "oci-archive:$1:$IMAGE" ;;
  esac >&2
}

# place CACHED FILE: the archive at FILE, a hard link when it can be.
place() {
  [[ "$1" -ef "$2" ]] && return 0
  mkdir -p "$(dirname "$2")"
  ln -f "$1" "$2" 2>/dev/null || { cp "$1" "$2.partial.$$" && mv "$2.partial.$$" "$2"; }
}

# on_stand_in: the build on the stand-in base, in the store's buildah storage, never
# pulling; its archive is cached under the key of everything it is made from.
on_stand_in() {
  if [[ $(id -u) -ne 0 ]]; then
    log "the stand-in base is built as root (mmdebstrap, buildah's overlay storage): run as root, or where $FROM_IMAGE can be pulled"
    exit 1
  fi
  apt_install buildah mmdebstrap || exit 1
  local store="${IMAGE_STORE:-$CACHE/images}" cas="${RPW_LOCAL_CAS:-/usr/local/share/ca-certificates}"
  python3 "$ROOT/scripts/stand_in_base.py" ensure --store "$store" --from "$FROM_IMAGE" --local-cas "$cas"
  local mark key
  mark=$(python3 "$ROOT/scripts/stand_in_base.py" label)
  key=$(python3 "$ROOT/scripts/stand_in_base.py" key --source-root "$ROOT" --local-cas "$cas" \
    --field "image=$IMAGE" --field "version=$VERSION" --field "revision=$REVISION" \
    --field "source=$SOURCE" --field "flags=${BUILD_FLAGS:-}")
  local cached="$store/make-image/$key.tar"
  tool=(buildah --root "$store/storage" --runroot "$store/run" --storage-driver overlay)
  if [[ -f "$cached" ]]; then
    log "$IMAGE: built already from these inputs ($cached)"
  else
    mkdir -p "$store/make-image"
    log "$IMAGE (version $VERSION, revision $REVISION) with buildah on the stand-in base"
    local id partial="$cached.partial.$$"
    leftovers+=("$cached.$$.id" "$partial")
    build "${tool[@]}" -- --pull=never --isolation chroot --network host --layers=false \
      --label "$mark" --iidfile "$cached.$$.id"
    id=$(<"$cached.$$.id")
    "${tool[@]}" push --quiet --format oci "$id" "oci-archive:$partial:$IMAGE" >&2
    mv "$partial" "$cached"
    # The image lives on in its archive; a concurrent build may hold the name by now.
    "${tool[@]}" rmi "$id" >/dev/null 2>&1 || true
    # The three most recent archives are kept.
    find "$store/make-image" -maxdepth 1 -name '*.tar' -printf '%T@ %p\n' | sort -rn |
      tail -n +4 | cut -d' ' -f2- | xargs -r rm -f
  fi
  local file="${IMAGE_ARCHIVE:-$cached}"
  place "$cached" "$file"
  log "OCI archive: $file"
}

case "$BASE" in
  stand-in)
    on_stand_in
    ;;
  auto | upstream)
    if has_base; then
      log "$IMAGE (version $VERSION, revision $REVISION) with ${tool[0]}"
      build "${tool[@]}" --
      if [[ -n "${IMAGE_ARCHIVE:-}" ]]; then
        mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
        archive "$IMAGE_ARCHIVE"
        log "OCI archive: $IMAGE_ARCHIVE"
      fi
    elif [[ "$BASE" == upstream ]]; then
      log "$FROM_IMAGE cannot be had with ${tool[0]:-no docker daemon, podman or buildah} (BASE=upstream)"
      exit 1
    else
      log "$FROM_IMAGE cannot be pulled here: building on its stand-in from Debian 12's packages, labelled not a release build (BASE=stand-in; docs/deploy.md \"The image\")"
      on_stand_in
    fi
    ;;
esac
echo "$IMAGE"
