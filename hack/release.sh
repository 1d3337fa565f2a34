#!/usr/bin/env bash
# `make release`: publish what a team mirrors, to the registry named by REGISTRY:
#   images   $REGISTRY/specdec-operator:TAG, $REGISTRY/sglang-simulator:TAG (and $REGISTRY/drafter-training:TAG when
#            RELEASE_IMAGES names `training`), pushed from the local builds of `make images` / `make images-local`;
#   chart    oci://$REGISTRY/charts/specdec-operator, version from Chart.yaml (`helm push` of the packaged chart),
#            whose image.repository is $REGISTRY/specdec-operator: installed from the mirror, it pulls the operator
#            (and so the validator init container, the same image) from the mirror too;
#   plugin   files under $RELEASE_DIST: the wheel (pip install specdec_operator-VERSION-py3-none-any.whl: the `specdec`
#            and `kubectl-specdec` commands, no checkout needed), the krew archive kubectl-specdec-VERSION.tar.gz and
#            its krew manifest krew/specdec.yaml (with the archive's sha256).
# What was pushed is written to $RELEASE_DIST/release.txt: each reference with its digest (mirror or pin by digest).
#
# Usage: hack/release.sh [all | images | chart | plugin]...   (default: all; `plugin` needs no REGISTRY)
# Environment:
#   REGISTRY            where to push, HOST[:PORT]/PATH (e.g. registry.example.com/ml/specdec); required but for `plugin`
#   RELEASE_IMAGES      which images (default: operator simulator; `training` needs the image built from its CUDA base)
#   RELEASE_PLAIN_HTTP  1: the registry speaks plain HTTP (buildah --tls-verify=false, helm --plain-http), e.g. a
#                       registry on 127.0.0.1 in a test; never for a real mirror
#   RELEASE_DIST        where the files go (default dist/release)
#   RELEASE_URL         where the krew archive will be downloadable from (the manifest's uri), default the GitHub
#                       release of this version
#   IMAGE_BUILDER       docker | buildah, as for hack/build-image.sh (default: docker when `docker info` answers)
# Credentials are the tools' own: `buildah login` / `docker login` and `helm registry login` before releasing.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
IMAGES_DIR="${SPECDEC_IMAGES_DIR:-${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec-operator}/images}"
TOOLS_DIR="${SPECDEC_TOOLS_DIR:-$HOME/.cache/specdec-operator/bin}"
DIST="${RELEASE_DIST:-$REPO_DIR/dist/release}"
PLAIN_HTTP="${RELEASE_PLAIN_HTTP:-0}"
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3

log() { printf 'release: %s\n' "$*" >&2; }
die() { printf 'release: error: %s\n' "$*" >&2; exit 1; }

env_value() { grep -E "^$1=" "$REPO_DIR/images/images.env" | head -1 | cut -d= -f2-; }
chart_field() { grep -E "^$1:" "$REPO_DIR/charts/specdec-operator/Chart.yaml" | head -1 | sed -E "s/^$1:[[:space:]]*\"?([^\"]*)\"?.*/\\1/"; }

VERSION="$(grep -E '^version = ' "$REPO_DIR/pyproject.toml" | head -1 | cut -d'"' -f2)"
CHART_VERSION="$(chart_field version)"
RELEASE_URL="${RELEASE_URL:-https://github.com/specdec/specdec-operator/releases/download/v$VERSION}"

need_registry() {
  [[ -n "${REGISTRY:-}" ]] || die "REGISTRY is not set: name the registry to push to, e.g. make release REGISTRY=registry.example.com/ml/specdec"
  [[ "$REGISTRY" != *://* ]] || die "REGISTRY=$REGISTRY: give HOST[:PORT]/PATH without a scheme (RELEASE_PLAIN_HTTP=1 for a plain-HTTP registry)"
  [[ "$REGISTRY" == */* ]] || die "REGISTRY=$REGISTRY: give HOST[:PORT]/PATH (the chart goes to PATH/charts, beside the images)"
  REGISTRY="${REGISTRY%/}"
}

builder() {
  case "${IMAGE_BUILDER:-}" in
    docker|buildah) echo "$IMAGE_BUILDER"; return ;;
    "") ;;
    *) die "IMAGE_BUILDER must be docker or buildah, not '$IMAGE_BUILDER'" ;;
  esac
  if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then echo docker; return; fi
  command -v buildah >/dev/null 2>&1 && { echo buildah; return; }
  die "no image tool: neither a Docker engine (docker info) nor buildah"
}

# The same storage hack/build-image.sh builds into (its layer cache lives there).
BUILDAH=(buildah --root "$IMAGES_DIR/storage" --runroot "$IMAGES_DIR/run" --storage-driver overlay)

helm_bin() {
  if [[ -x "$TOOLS_DIR/helm" ]]; then echo "$TOOLS_DIR/helm"; return; fi
  command -v helm >/dev/null 2>&1 && { command -v helm; return; }
  die "helm not found in $TOOLS_DIR or on PATH (make tools)"
}

record() { mkdir -p "$DIST"; printf '%s\n' "$1" >>"$DIST/release.txt"; }

# push_image LOCAL REMOTE: push one locally built image; prints REMOTE@DIGEST.
push_image() {
  local local_ref="$1" remote="$2" tool digest
  tool="$(builder)"
  if [[ "$tool" == docker ]]; then
    docker image inspect "$local_ref" >/dev/null 2>&1 || return 3
    docker tag "$local_ref" "$remote"
    docker push --quiet "$remote" >/dev/null
    digest="$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$remote" | grep -F "${remote%:*}@" | head -1 | cut -d@ -f2)"
  else
    "${BUILDAH[@]}" inspect --type image "$local_ref" >/dev/null 2>&1 || return 3
    local digestfile
    digestfile="$(mktemp)"
    "${BUILDAH[@]}" push --quiet --retry 2 --digestfile "$digestfile" \
      $([[ "$PLAIN_HTTP" == 1 ]] && echo --tls-verify=false) "$local_ref" "docker://$remote" >/dev/null
    digest="$(cat "$digestfile")"
    rm -f "$digestfile"
  fi
  [[ "$digest" == sha256:* ]] || die "pushed $remote but could not read its digest"
  echo "$remote@$digest"
}

release_images() {
  need_registry
  local image repo tag remote pushed
  for image in ${RELEASE_IMAGES:-operator simulator}; do
    case "$image" in
      operator) repo="$(env_value OPERATOR_IMAGE)"; tag="$(env_value OPERATOR_TAG)" ;;
      simulator) repo="$(env_value SIMULATOR_IMAGE)"; tag="$(env_value SIMULATOR_TAG)" ;;
      training) repo="$(env_value TRAINING_IMAGE)"; tag="$(env_value TRAINING_TAG)" ;;
      *) die "unknown image '$image' in RELEASE_IMAGES (operator simulator training)" ;;
    esac
    remote="$REGISTRY/${repo##*/}:$tag"
    local start; start="$(date +%s)"
    if pushed="$(push_image "$repo:$tag" "$remote")"; then
      record "image $pushed"
      log "pushed $pushed in $(( $(date +%s) - start ))s"
    else
      local rc=$?
      (( rc == 3 )) || exit "$rc"
      if [[ "$image" == training ]]; then
        die "$repo:$tag is not built here: the training image needs its CUDA base ($(env_value TRAINING_BASE_IMAGE), several GB; make images IMAGES=training where it is pullable)"
      fi
      die "$repo:$tag is not built here: make images IMAGES=$image (or make images-local where no registry is reachable), or leave RELEASE_BUILD unset"
    fi
  done
}

# The chart as released: the checkout's chart with image.repository set to the mirror. The rewrite is checked, so a
# change of values.yaml's layout fails here rather than publishing a chart that pulls from the wrong place.
release_chart() {
  need_registry
  local helm work source repo
  helm="$(helm_bin)"
  source="$(env_value OPERATOR_IMAGE)"
  repo="$REGISTRY/${source##*/}"
  work="$WORK/chart"
  mkdir -p "$work"
  cp -r "$REPO_DIR/charts/specdec-operator" "$work/specdec-operator"
  grep -qxF "  repository: $source" "$work/specdec-operator/values.yaml" \
    || die "charts/specdec-operator/values.yaml has no line '  repository: $source' to point at the mirror"
  sed -i "s#^  repository: $source\$#  repository: $repo#" "$work/specdec-operator/values.yaml"
  "$helm" lint --quiet "$work/specdec-operator" >/dev/null || die "helm lint of the released chart failed"
  mkdir -p "$DIST"
  "$helm" package "$work/specdec-operator" --destination "$DIST" >/dev/null
  local package="$DIST/specdec-operator-$CHART_VERSION.tgz" out digest
  [[ -s "$package" ]] || die "helm package wrote no $package"
  out="$("$helm" push "$package" "oci://$REGISTRY/charts" $([[ "$PLAIN_HTTP" == 1 ]] && echo --plain-http) 2>&1)" \
    || die "helm push to oci://$REGISTRY/charts failed: $out"
  digest="$(grep -oE 'sha256:[0-9a-f]{64}' <<<"$out" | head -1)"
  [[ -n "$digest" ]] || die "helm push printed no digest: $out"
  record "chart oci://$REGISTRY/charts/specdec-operator:$CHART_VERSION@$digest"
  log "pushed oci://$REGISTRY/charts/specdec-operator:$CHART_VERSION@$digest (image.repository: $repo)"
}

# The wheel, from a copy of exactly the files the images build it from (no build/ or egg-info in the checkout).
build_wheel() {
  local context="$1" out="$2" isolation=()
  mkdir -p "$context" "$out"
  cp "$REPO_DIR/pyproject.toml" "$REPO_DIR/README.md" "$context/"
  local dir
  for dir in operator drafter_training; do
    (cd "$REPO_DIR" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - "$dir") | tar -xf - -C "$context"
  done
  "$PYTHON" -c 'import setuptools' 2>/dev/null && isolation=(--no-build-isolation)
  "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps "${isolation[@]}" --wheel-dir "$out" "$context" >&2
}

release_plugin() {
  local work wheel archive sha
  work="$WORK/plugin"
  mkdir -p "$work"
  build_wheel "$work/context" "$work/wheel"
  wheel="specdec_operator-$VERSION-py3-none-any.whl"
  [[ -f "$work/wheel/$wheel" ]] || die "pip wheel did not write $wheel"
  mkdir -p "$DIST/krew"
  cp "$work/wheel/$wheel" "$DIST/$wheel"
  # The krew archive: the launcher (krew links it as kubectl-specdec) and the wheel it installs on its first run.
  mkdir -p "$work/plugin"
  sed -e "s/@VERSION@/$VERSION/g" -e "s/@WHEEL@/$wheel/g" "$HACK_DIR/release/kubectl-specdec" >"$work/plugin/kubectl-specdec"
  chmod 0755 "$work/plugin/kubectl-specdec"
  cp "$work/wheel/$wheel" "$work/plugin/"
  archive="$DIST/kubectl-specdec-$VERSION.tar.gz"
  # Reproducible: fixed owner, order and times, gzip without a name or time.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/plugin" -cf - kubectl-specdec "$wheel" | gzip -9n >"$archive"
  sha="$(sha256sum "$archive" | cut -d' ' -f1)"
  sed -e "s/@VERSION@/$VERSION/g" -e "s#@URI@#$RELEASE_URL/kubectl-specdec-$VERSION.tar.gz#g" -e "s/@SHA256@/$sha/g" \
    "$HACK_DIR/release/krew-specdec.yaml" >"$DIST/krew/specdec.yaml"
  record "plugin $DIST/$wheel sha256:$(sha256sum "$DIST/$wheel" | cut -d' ' -f1)"
  record "plugin $archive sha256:$sha"
  log "wrote $DIST/$wheel, $archive and $DIST/krew/specdec.yaml (sha256 $sha, uri $RELEASE_URL/kubectl-specdec-$VERSION.tar.gz)"
}

steps=("$@")
(( ${#steps[@]} )) || steps=(all)
for step in "${steps[@]}"; do
  case "$step" in
    all|images|chart|plugin) ;;
    *) die "unknown step '$step' (all, images, chart, plugin)" ;;
  esac
done
[[ " ${steps[*]} " == *" plugin "* && ${#steps[@]} == 1 ]] || need_registry
mkdir -p "$DIST"
: >"$DIST/release.txt"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for step in "${steps[@]}"; do
  case "$step" in
    all) release_images; release_chart; release_plugin ;;
    images) release_images ;;
    chart) release_chart ;;
    plugin) release_plugin ;;
  esac
done
log "done: $DIST/release.txt"
cat "$DIST/release.txt"
