#!/usr/bin/env bash
# Build one image from one of our Dockerfiles, with Docker/BuildKit when an engine answers and with buildah
# otherwise. Same Dockerfile, same tag, same build arguments either way: the Makefile passes `docker build`
# arguments and this script hands them to the builder it found.
#
# Usage: hack/build-image.sh -f DOCKERFILE [--build-arg K=V]... -t NAME:TAG CONTEXT
#        hack/build-image.sh --local-base     build the Debian base (mmdebstrap, no registry needed) and print its name
#
# Environment:
#   IMAGE_BUILDER       docker | buildah (default: docker when `docker info` answers, else buildah)
#   SPECDEC_IMAGES_DIR  where buildah's storage and the OCI archives live (default ~/.cache/specdec-operator/images)
#   LOCAL_BASE_IMAGE, LOCAL_BASE_SUITE   from images/images.env (the Makefile exports them)
#
# With buildah, every image is also written as an OCI archive, $SPECDEC_IMAGES_DIR/<name>_<tag>.oci.tar, which
# `ctr images import` loads into a containerd (hack/devcluster --real-node does, for its node).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
IMAGES_DIR="${SPECDEC_IMAGES_DIR:-${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec-operator}/images}"

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

env_value() { grep -E "^$1=" "$REPO_DIR/images/images.env" | head -1 | cut -d= -f2-; }

builder() {
  if [[ -n "${IMAGE_BUILDER:-}" ]]; then
    case "$IMAGE_BUILDER" in docker|buildah) echo "$IMAGE_BUILDER"; return ;; esac
    die "IMAGE_BUILDER must be docker or buildah, not '$IMAGE_BUILDER'"
  fi
  # `docker --version` answers without an engine (the client alone is installed here): ask the engine.
  if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then echo docker; return; fi
  if command -v buildah >/dev/null 2>&1; then echo buildah; return; fi
  die "no image builder: neither a Docker engine (docker info) nor buildah; install one (apt-get install buildah)"
}

# Our own buildah storage under the cache: nothing lands in /var/lib/containers, and it survives between runs
# (the layer cache makes a rebuild of unchanged sources take seconds).
BUILDAH=(buildah --root "$IMAGES_DIR/storage" --runroot "$IMAGES_DIR/run" --storage-driver overlay)

archive_of() { local ref="$1"; ref="${ref//\//_}"; echo "$IMAGES_DIR/${ref//:/_}.oci.tar"; }

export_archive() {
  local tag="$1" archive tmp
  archive="$(archive_of "$tag")"
  tmp="$archive.tmp"
  rm -f "$tmp"
  "${BUILDAH[@]}" push --quiet "$tag" "oci-archive:$tmp:$tag" >/dev/null
  mv -f "$tmp" "$archive"
  log "wrote $archive ($(du -h "$archive" | cut -f1))"
}

# The hosts' CA bundle, bind-mounted (read-only, never copied into a layer) so that pip can reach PyPI through
# a TLS-inspecting proxy whose CA only the host trusts. The same path as in Debian images.
ca_volume() {
  local bundle=/etc/ssl/certs/ca-certificates.crt
  [[ -r "$bundle" ]] && echo "--volume=$bundle:$bundle:ro"
}

build() {
  local tool tag="" dockerfile="" base="" arg prev=""
  for arg in "$@"; do
    [[ "$prev" == "-t" ]] && tag="$arg"
    [[ "$prev" == "-f" ]] && dockerfile="$arg"
    [[ "$prev" == "--build-arg" && "$arg" == BASE_IMAGE=* ]] && base="${arg#BASE_IMAGE=}"
    prev="$arg"
  done
  [[ -n "$tag" ]] || die "no -t NAME:TAG given"
  tool="$(builder)"
  local start; start="$(date +%s)"
  log "building $tag with $tool"
  if [[ "$tool" == docker ]]; then
    DOCKER_BUILDKIT=1 docker build "$@"
  else
    mkdir -p "$IMAGES_DIR"
    # The base must be here or pullable; say so in one line rather than in buildah's retry log.
    if [[ -n "$base" ]] && ! "${BUILDAH[@]}" inspect --type image "$base" >/dev/null 2>&1 \
       && ! timeout 120 "${BUILDAH[@]}" pull --quiet "$base" >/dev/null 2>&1; then
      die "base image $base is neither built here nor pullable (no registry reachable?): run make images-local"
    fi
    # chroot isolation: no nested user namespaces or cgroups needed; the host network, so pip reaches PyPI.
    # The VM's hard limits are below buildah's default ulimits.
    local -a extra=(--layers --isolation chroot --network host --format oci
                    --ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
    local ca; ca="$(ca_volume || true)"
    [[ -n "$ca" ]] && extra+=("$ca")
    # BuildKit reads <Dockerfile>.dockerignore by itself; buildah 1.28 is told.
    [[ -n "$dockerfile" && -f "$dockerfile.dockerignore" ]] && extra+=(--ignorefile "$dockerfile.dockerignore")
    "${BUILDAH[@]}" bud --quiet "${extra[@]}" "$@" >/dev/null
    export_archive "$tag"
  fi
  log "built $tag in $(( $(date +%s) - start ))s"
}

# The local base: Debian's python3 in a root filesystem made by mmdebstrap from Debian's packages (apt is the
# only thing this needs to reach), turned into an image by images/base/Dockerfile (FROM scratch, ADD rootfs).
local_base() {
  local name suite context rootfs
  name="${LOCAL_BASE_IMAGE:-$(env_value LOCAL_BASE_IMAGE)}"
  suite="${LOCAL_BASE_SUITE:-$(env_value LOCAL_BASE_SUITE)}"
  [[ -n "$name" && -n "$suite" ]] || die "LOCAL_BASE_IMAGE/LOCAL_BASE_SUITE missing in images/images.env"
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
  context="$IMAGES_DIR/base-context"
  rootfs="$context/rootfs.tar"
  mkdir -p "$context"
  # Rebuilt when the package list or suite changes (the list is part of the stamp), else reused.
  local packages="python3,python3-pip,python-is-python3,passwd,ca-certificates"
  local stamp="$suite $packages"
  if [[ ! -s "$rootfs" || "$(cat "$context/.stamp" 2>/dev/null)" != "$stamp" ]]; then
    local start; start="$(date +%s)"
    log "mmdebstrap --variant=apt $suite (packages: $packages)"
    # mmdebstrap picks its output format from the name: keep the .tar suffix on the temporary file.
    rm -rf "$context/rootfs.tmp.tar"
    mmdebstrap --quiet --variant=apt --include="$packages" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Retries "3"' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
      "$suite" "$context/rootfs.tmp.tar" >&2
    rm -rf "$rootfs"
    mv -f "$context/rootfs.tmp.tar" "$rootfs"
    echo "$stamp" >"$context/.stamp"
    log "root filesystem $(du -h "$rootfs" | cut -f1) in $(( $(date +%s) - start ))s"
  fi
  cp "$REPO_DIR/images/base/Dockerfile" "$context/Dockerfile"
  build -f "$context/Dockerfile" --build-arg "SUITE=$suite" -t "$name" "$context"
  echo "$name"
}

case "${1:-}" in
  --local-base) local_base ;;
  --archive-of) archive_of "${2:?usage: --archive-of NAME:TAG}" ;;
  ""|-h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) build "$@" ;;
esac
