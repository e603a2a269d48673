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
#   PLATFORMS              linux/amd64, linux/arm64 or both, comma-separated: the image for
#                          each, and with two an OCI image index (manifest list) naming both,
#                          written as one OCI archive. Unset: the tool's own platform, one
#                          image. A platform other than the machine's is built under QEMU
#                          (Debian's qemu-user-static and a binfmt_misc handler, set up here
#                          when missing: scripts/lib.sh, ensure_emulation).
#
# The stand-in (scripts/stand_in_base.py) is the base made from Debian 12's packages, in a
# buildah storage under the cache (IMAGE_STORE, default $RPW_CACHE/images), the one the real
# node's images are built in. An image built on it carries the label
# org.opencontainers.image.base.name=localhost/stand-in/python:3.11-slim-bookworm: it is no
# release build. It is written as an OCI archive, IMAGE_ARCHIVE or one under the store,
# cached under a key of its inputs (the source, the base, the labels, the flags). The
# machine's own CAs (RPW_LOCAL_CAS, default /usr/local/share/ca-certificates) go into the
# stand-in's trust store (docs/real-node.md, "The stand-in base"). Each architecture has its
# own stand-in and its own archive, each cached under its inputs; the index of several is
# cached under theirs.
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
# The platforms asked for, in their order, each once; none: the tool's own (one image).
platforms=()
if [[ -n "${PLATFORMS:-}" ]]; then
  IFS=, read -ra asked <<< "$PLATFORMS,"
  for platform in "${asked[@]}"; do
    case "$platform" in
      linux/amd64 | linux/arm64) ;;
      *) log "PLATFORMS=$PLATFORMS: ${platform:-an empty entry} is not a platform built here; want linux/amd64, linux/arm64 or both, comma-separated"; exit 2 ;;
    esac
    [[ " ${platforms[*]} " == *" $platform "* ]] || platforms+=("$platform")
  done
fi

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

# How build names what it builds: a tag, or for several platforms with podman or buildah,
# the manifest list it adds each platform's image to.
naming=(--tag "$IMAGE")

# build TOOL... -- FLAGS...: the Dockerfile with the labels, tagged IMAGE.
build() {
  local -a with=()
  while [[ $1 != -- ]]; do with+=("$1"); shift; done
  shift
  "${with[@]}" build "$@" "${extra[@]}" \
    --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE" \
    "${naming[@]}" --file "$ROOT/Dockerfile" "$ROOT" >&2
}

# upstream_build: the Dockerfile built by the tool on its base, for PLATFORMS when set (the
# tool's own platform else), and its OCI archive when IMAGE_ARCHIVE is set. Several
# platforms make an index: podman and buildah a manifest list named IMAGE, pushed with
# every image; docker with buildx straight into the archive, since its image store may hold
# one platform of an image only.
upstream_build() {
  local joined
  joined=$(IFS=,; echo "${platforms[*]}")
  if ((${#platforms[@]} < 2)); then
    build "${tool[@]}" -- ${joined:+--platform "$joined"}
    if [[ -n "${IMAGE_ARCHIVE:-}" ]]; then
      mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
      archive "$IMAGE_ARCHIVE"
    fi
  elif [[ "$(basename "${tool[0]}")" == docker ]]; then
    if [[ -z "${IMAGE_ARCHIVE:-}" ]]; then
      log "PLATFORMS=$PLATFORMS with docker: give IMAGE_ARCHIVE=FILE, docker's image store holds one platform of an image"
      exit 2
    fi
    mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
    build "${tool[@]}" buildx -- --platform "$joined" --output "type=oci,dest=$IMAGE_ARCHIVE"
  else
    # A list of that name from an earlier build would keep its images beside the new ones.
    "${tool[@]}" manifest rm "$IMAGE" >/dev/null 2>&1 || true
    naming=(--manifest "$IMAGE")
    build "${tool[@]}" -- --platform "$joined"
    if [[ -n "${IMAGE_ARCHIVE:-}" ]]; then
      mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
      "${tool[@]}" manifest push --all --format oci "$IMAGE" "oci-archive:$IMAGE_ARCHIVE:$IMAGE" >&2
    fi
  fi
  [[ -z "${IMAGE_ARCHIVE:-}" ]] || log "OCI archive: $IMAGE_ARCHIVE"
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

# stand_in_key [ARCH]: the key of the image built on the stand-in (for ARCH, a Debian
# architecture; by default the machine's own, whose key takes no architecture argument).
stand_in_key() {
  python3 "$ROOT/scripts/stand_in_base.py" key --source-root "$ROOT" --local-cas "$cas" \
    --field "image=$IMAGE" --field "version=$VERSION" --field "revision=$REVISION" \
    --field "source=$SOURCE" --field "flags=${BUILD_FLAGS:-}" ${1:+--arch "$1"}
}

# prune DIR: the three most recent archives in DIR are kept.
prune() {
  find "$1" -maxdepth 1 -name '*.tar' -printf '%T@ %p\n' | sort -rn |
    tail -n +4 | cut -d' ' -f2- | xargs -r rm -f
}

# stand_in_image CACHED [ARCH]: the image built on the stand-in (for ARCH, another
# architecture than the machine's: in that stand-in's own storage, its RUN steps under QEMU)
# and written to the OCI archive CACHED, unless it is there already.
stand_in_image() {
  local cached=$1 arch=${2:-}
  if [[ -f "$cached" ]]; then
    log "$IMAGE${arch:+ for linux/$arch}: built already from these inputs ($cached)"
    return 0
  fi
  local -a on=()
  local root=$store
  if [[ -n "$arch" ]]; then
    ensure_emulation "$arch" || exit 1
    python3 "$ROOT/scripts/stand_in_base.py" ensure --store "$store" --from "$FROM_IMAGE" \
      --local-cas "$cas" --arch "$arch"
    root=$(python3 "$ROOT/scripts/stand_in_base.py" storage --store "$store" --arch "$arch")
    on=(--platform "linux/$arch")
  fi
  tool=(buildah --root "$root/storage" --runroot "$root/run" --storage-driver overlay)
  mkdir -p "$(dirname "$cached")"
  log "$IMAGE${arch:+ for linux/$arch} (version $VERSION, revision $REVISION) with buildah on the stand-in base"
  local id partial="$cached.partial.$$"
  leftovers+=("$cached.$$.id" "$partial")
  build "${tool[@]}" -- --pull=never --isolation chroot --network host --layers=false \
    "${on[@]}" --label "$mark" --iidfile "$cached.$$.id"
  id=$(<"$cached.$$.id")
  "${tool[@]}" push --quiet --format oci "$id" "oci-archive:$partial:$IMAGE" >&2
  mv "$partial" "$cached"
  # The image lives on in its archive; a concurrent build may hold the name by now.
  "${tool[@]}" rmi "$id" >/dev/null 2>&1 || true
  prune "$(dirname "$cached")"
}

# on_stand_in: the build on the stand-in base, in the store's buildah storage, never
# pulling; its archive is cached under the key of everything it is made from. With
# PLATFORMS, each platform's image is built (the machine's own cached as without PLATFORMS,
# another's under make-image/platforms/), then the index of them all, cached under their keys.
on_stand_in() {
  if [[ $(id -u) -ne 0 ]]; then
    log "the stand-in base is built as root (mmdebstrap, buildah's overlay storage): run as root, or where $FROM_IMAGE can be pulled"
    exit 1
  fi
  apt_install buildah mmdebstrap || exit 1
  store="${IMAGE_STORE:-$CACHE/images}" cas="${RPW_LOCAL_CAS:-/usr/local/share/ca-certificates}"
  python3 "$ROOT/scripts/stand_in_base.py" ensure --store "$store" --from "$FROM_IMAGE" --local-cas "$cas"
  mark=$(python3 "$ROOT/scripts/stand_in_base.py" label)
  local native cached
  native=$(dpkg --print-architecture)
  if ((${#platforms[@]} == 0)) || [[ "${platforms[*]}" == "linux/$native" ]]; then
    cached="$store/make-image/$(stand_in_key).tar"
    stand_in_image "$cached"
  else
    local platform arch key archives=() keys=()
    for platform in "${platforms[@]}"; do
      arch=${platform#linux/}
      if [[ "$arch" == "$native" ]]; then
        key=$(stand_in_key)
        archives+=("$store/make-image/$key.tar:")
      else
        key=$(stand_in_key "$arch")
        archives+=("$store/make-image/platforms/$key.tar:$arch")
      fi
      keys+=("$platform=$key")
    done
    if ((${#platforms[@]} == 1)); then
      cached=${archives[0]%:*}
      stand_in_image "$cached" "${archives[0]##*:}"
    else
      # The index is made of its platforms' images: its key is theirs, in their order.
      cached="$store/make-image/index-$(printf '%s\n' "${keys[@]}" | sha256sum | cut -c1-16).tar"
      if [[ -f "$cached" ]]; then
        log "$IMAGE for ${platforms[*]}: built already from these inputs ($cached)"
      else
        local entry
        for entry in "${archives[@]}"; do
          stand_in_image "${entry%:*}" "${entry##*:}"
        done
        stand_in_index "$cached" "${archives[@]%:*}"
      fi
    fi
  fi
  local file="${IMAGE_ARCHIVE:-$cached}"
  place "$cached" "$file"
  log "OCI archive: $file"
}

# stand_in_index CACHED ARCHIVE...: the OCI image index naming the image of each archive,
# with its platform, written with every image's blobs as one OCI archive, CACHED, whose
# index.json names it IMAGE.
stand_in_index() {
  local cached=$1 archive
  shift
  tool=(buildah --root "$store/storage" --runroot "$store/run" --storage-driver overlay)
  # A name of this build's own: the list is an entry of the shared storage until removed.
  local list="localhost/make-image-index-$$:latest" partial="$cached.partial.$$"
  leftovers+=("$partial")
  log "$IMAGE for ${platforms[*]}: the image index"
  "${tool[@]}" manifest create "$list" >/dev/null
  for archive in "$@"; do
    "${tool[@]}" manifest add "$list" "oci-archive:$archive" >/dev/null
  done
  "${tool[@]}" manifest push --all --quiet --format oci "$list" "oci-archive:$partial:$IMAGE" >&2
  "${tool[@]}" manifest rm "$list" >/dev/null 2>&1 || true
  mv "$partial" "$cached"
  prune "$(dirname "$cached")"
}

case "$BASE" in
  stand-in)
    on_stand_in
    ;;
  auto | upstream)
    if has_base; then
      log "$IMAGE (version $VERSION, revision $REVISION) with ${tool[0]}"
      upstream_build
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
