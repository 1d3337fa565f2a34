#!/usr/bin/env bash
# Build (once) the binaries of the local control plane into a cache outside the checkout:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl   (group `kube`: one Kubernetes release)
#   kwok                                                               (group `kube`: fake kubelets)
#   etcd                                                               (group `etcd`: the apiserver's store)
#   helm                                                               (group `helm`: chart tests, manifests)
#   lws-controller                (group `lws`, only when asked)      (the LeaderWorkerSet controller: devcluster --lws)
#   kubelet, kube-proxy, coredns  (group `node`, only when asked)     (the real node: devcluster --real-node)
#   registry                      (group `registry`, only when asked) (the CNCF distribution registry: the release test)
# Versions are pinned in hack/versions.env; the Go consumer modules that build them live in hack/go/.
# Groups kube, etcd, helm, lws and registry come from ONE module (hack/go/kube) and, when several are wanted, from one `go build`:
# they share most of their packages (client-go, apimachinery, grpc, ...), so together they compile about 3,100
# packages where four modules compiled 5,600. Group node is a module of its own (a kubelet one minor older).
#
# Idempotent: each group of binaries carries a stamp (a hash of the pinned versions and of its go.mod/go.sum);
# when the stamp matches nothing is built and the script returns in milliseconds.
# Binaries the user already has are reused (symlinked) when their major.minor matches the pin: looked up in
# $KUBEBUILDER_ASSETS, the setup-envtest store and $PATH.
#
# Environment:
#   SPECDEC_TOOLS_DIR   where the binaries go (default ~/.cache/specdec-operator/bin)
#   SPECDEC_TOOLS_REUSE 0 to never reuse binaries found on the machine (default 1)
#   SPECDEC_TOOLS_FORCE 1 to rebuild even when the stamps match
# Usage: hack/tools.sh [--print-dir | --check] [GROUP...]
#   --print-dir  print the tools directory and exit
#   --check      exit 0 when every binary is present and stamped, 1 otherwise (builds nothing)
#   GROUP...     which groups (default: kube etcd helm; `node` adds the real node's kubelet, kube-proxy, coredns;
#                `lws` the LeaderWorkerSet controller and its CRD, from the sigs.k8s.io/lws module: hack/go/kube;
#                `registry` the CNCF distribution registry, hack/go/kube/registry: `make release`'s test pushes to it)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="${SPECDEC_TOOLS_DIR:-$HOME/.cache/specdec-operator/bin}"
REUSE="${SPECDEC_TOOLS_REUSE:-1}"
FORCE="${SPECDEC_TOOLS_FORCE:-0}"

# versions.env is KEY=VALUE lines; read it without executing it.
while IFS='=' read -r key value; do
  [[ "$key" =~ ^[A-Z_]+$ ]] && printf -v "$key" '%s' "$value"
done < <(grep -E '^[A-Z_]+=' "$HACK_DIR/versions.env")
: "${KUBERNETES_VERSION:?missing in hack/versions.env}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${HELM_VERSION:?}"
: "${NODE_KUBERNETES_VERSION:?missing in hack/versions.env}" "${COREDNS_VERSION:?missing in hack/versions.env}"
: "${LWS_VERSION:?missing in hack/versions.env}" "${DISTRIBUTION_VERSION:?missing in hack/versions.env}"

KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
ETCD_BINS=(etcd)
HELM_BINS=(helm)
NODE_BINS=(kubelet kube-proxy coredns pause)
LWS_BINS=(lws-controller)
REGISTRY_BINS=(registry)
# Beside the controller, group lws leaves the release's LeaderWorkerSet CRD in the tools directory.
LWS_CRD_FILE=leaderworkerset.x-k8s.io_leaderworkersets.yaml

log() { printf 'tools: %s\n' "$*" >&2; }
die() { printf 'tools: error: %s\n' "$*" >&2; exit 1; }

CHECK_ONLY=0
GROUPS_WANTED=()
for arg in "$@"; do
  case "$arg" in
    --print-dir) echo "$TOOLS_DIR"; exit 0 ;;
    --check) CHECK_ONLY=1 ;;
    kube|etcd|helm|node|lws|registry) GROUPS_WANTED+=("$arg") ;;
    *) die "unknown argument '$arg' (use --print-dir, --check, or groups among: kube etcd helm node lws registry)" ;;
  esac
done
(( ${#GROUPS_WANTED[@]} )) || GROUPS_WANTED=(kube etcd helm)

# stamp_of GROUP: what the group's binaries were built from. A change to any pin or module file rebuilds it.
stamp_of() {
  local group="$1"
  {
    case "$group" in
      kube) echo "$KUBERNETES_VERSION $KWOK_VERSION" ;;
      etcd) echo "$ETCD_VERSION" ;;
      helm) echo "$HELM_VERSION" ;;
      node) echo "$NODE_KUBERNETES_VERSION $COREDNS_VERSION" ;;
      lws) echo "$LWS_VERSION" ;;
      registry) echo "$DISTRIBUTION_VERSION" ;;
    esac
    cat "$HACK_DIR/go/$(module_of "$group")/go.mod" "$HACK_DIR/go/$(module_of "$group")/go.sum"
    # The node module has main packages of its own (coredns' plugin set, pause).
    [[ "$group" == node ]] && cat "$HACK_DIR"/go/node/*/*.go
    # ... and so has group registry (the storage drivers it links).
    [[ "$group" == registry ]] && cat "$HACK_DIR"/go/kube/registry/*.go
    true
  } | sha256sum | cut -c1-16
}

# module_of GROUP: the consumer module under hack/go/ that builds the group.
module_of() {
  case "$1" in
    node) echo node ;;
    *) echo kube ;;
  esac
}

# pkgs_of GROUP: the main packages a group builds (the order matches bins_of).
pkgs_of() {
  case "$1" in
    kube) echo k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
               k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
               sigs.k8s.io/kwok/cmd/kwok ;;
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    helm) echo helm.sh/helm/v4/cmd/helm ;;
    node) echo k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy specdec.io/hack/node/coredns specdec.io/hack/node/pause ;;
    lws) echo sigs.k8s.io/lws/cmd ;;
    registry) echo specdec.io/hack/kube/registry ;;
  esac
}

bins_of() {
  case "$1" in
    kube) echo "${KUBE_BINS[@]}" ;;
    etcd) echo "${ETCD_BINS[@]}" ;;
    helm) echo "${HELM_BINS[@]}" ;;
    node) echo "${NODE_BINS[@]}" ;;
    lws) echo "${LWS_BINS[@]}" ;;
    registry) echo "${REGISTRY_BINS[@]}" ;;
  esac
}

group_is_current() {
  local group="$1" bin
  [[ "$FORCE" == 1 ]] && return 1
  [[ -f "$TOOLS_DIR/.stamp-$group" ]] || return 1
  [[ "$(cat "$TOOLS_DIR/.stamp-$group")" == "$(stamp_of "$group")" ]] || return 1
  for bin in $(bins_of "$group"); do [[ -x "$TOOLS_DIR/$bin" ]] || return 1; done
  [[ "$group" != lws || -f "$TOOLS_DIR/$LWS_CRD_FILE" ]] || return 1
  return 0
}

# ---------------------------------------------------------------------------------------------------------
# Reuse of binaries already on the machine.
# version_of BIN PATH: the version a binary reports, as vMAJOR.MINOR.PATCH (empty when unknown).
version_of() {
  local bin="$1" path="$2" out=""
  case "$bin" in
    kube-apiserver|kube-controller-manager|kube-scheduler) out="$(timeout 10 "$path" --version 2>/dev/null || true)" ;;
    kubectl) out="$(timeout 10 "$path" version --client 2>/dev/null || true)" ;;
    etcd) out="$(timeout 10 "$path" --version 2>/dev/null | head -1 || true)" ;;
    kwok) out="$(timeout 10 "$path" --version 2>/dev/null || true)" ;;
    helm) out="$(timeout 10 "$path" version --template '{{.Version}}' 2>/dev/null || true)" ;;
  esac
  grep -oE 'v?[0-9]+\.[0-9]+\.[0-9]+' <<<"$out" | head -1 | sed 's/^v*/v/'
}

minor_of() { grep -oE '^v[0-9]+\.[0-9]+' <<<"$1"; }

pin_of() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) echo "$KUBERNETES_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
  esac
}

# find_existing BIN: print the path of a binary on this machine whose major.minor matches the pin.
find_existing() {
  local bin="$1" want candidate dir have
  want="$(minor_of "$(pin_of "$bin")")"
  local -a dirs=()
  [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && dirs+=("$KUBEBUILDER_ASSETS")
  # setup-envtest store (Linux and macOS locations), newest first.
  local store
  for store in "$HOME/.local/share/kubebuilder-envtest/k8s" "$HOME/Library/Application Support/io.kubebuilder.envtest/k8s"; do
    [[ -d "$store" ]] || continue
    while IFS= read -r dir; do dirs+=("$dir"); done < <(ls -1d "$store"/*/ 2>/dev/null | sort -rV)
  done
  IFS=':' read -r -a path_dirs <<<"${PATH:-}"
  dirs+=("${path_dirs[@]}")
  for dir in "${dirs[@]}"; do
    candidate="${dir%/}/$bin"
    [[ -x "$candidate" && ! -d "$candidate" ]] || continue
    # Never "reuse" our own output directory.
    [[ "$(cd "$(dirname "$candidate")" && pwd -P)" == "$(mkdir -p "$TOOLS_DIR" && cd "$TOOLS_DIR" && pwd -P)" ]] && continue
    have="$(version_of "$bin" "$candidate")"
    if [[ -n "$have" && "$(minor_of "$have")" == "$want" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# try_reuse GROUP: when every binary of the group is found on the machine, link them in and stamp the group.
try_reuse() {
  local group="$1" bin found
  local -a links=()
  [[ "$REUSE" == 1 ]] || return 1
  # Built here always: the kubelet must be exactly the pinned minor; the registry is ours (two storage drivers).
  [[ "$group" == node || "$group" == lws || "$group" == registry ]] && return 1
  for bin in $(bins_of "$group"); do
    found="$(find_existing "$bin")" || return 1
    links+=("$bin=$found")
  done
  for entry in "${links[@]}"; do
    bin="${entry%%=*}"; found="${entry#*=}"
    ln -sfn "$found" "$TOOLS_DIR/$bin"
    log "reusing $found ($(version_of "$bin" "$found")) for $bin"
  done
  stamp_of "$group" >"$TOOLS_DIR/.stamp-$group"
  return 0
}

# ---------------------------------------------------------------------------------------------------------
# Building.
check_go() {
  command -v go >/dev/null 2>&1 || die "go is not installed; install Go >= 1.26 (https://go.dev/dl/) and rerun make tools"
  local v
  v="$(go env GOVERSION | sed 's/^go//')"
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  if (( major < 1 || (major == 1 && minor < 26) )); then
    die "go $v is too old: Kubernetes $KUBERNETES_VERSION needs Go >= 1.26; install a newer Go and rerun make tools"
  fi
}

# ldflags_of GROUP: the version stamps of a group's binaries (a -X of a package a binary does not link is ignored, so
# the flags of several groups built by one `go build` can be joined).
ldflags_of() {
  local group="$1" kv="$KUBERNETES_VERSION" kmaj kmin pkgpath flags=""
  [[ "$group" == node ]] && kv="$NODE_KUBERNETES_VERSION"
  kmaj="$(cut -d. -f1 <<<"${kv#v}")"; kmin="$(cut -d. -f2 <<<"${kv#v}")"
  case "$group" in
    kube|node)
      # The same stamps Kubernetes' own hack/lib/version.sh sets; without them the binaries say v0.0.0 and
      # kubectl/the apiserver report a skew.
      for pkgpath in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkgpath.gitVersion=$kv -X $pkgpath.gitMajor=$kmaj -X $pkgpath.gitMinor=$kmin"
        flags+=" -X $pkgpath.gitTreeState=clean -X $pkgpath.buildDate=1970-01-01T00:00:00Z"
      done
      if [[ "$group" == kube ]]; then
        flags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${kv#v}"
      else
        flags+=" -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}"
      fi
      ;;
    etcd) flags=" -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}" ;;
    helm) flags=" -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v4/internal/version.gitTreeState=clean" ;;
    lws) flags=" -X sigs.k8s.io/lws/pkg/version.GitVersion=${LWS_VERSION} -X sigs.k8s.io/lws/pkg/version.BuildDate=1970-01-01T00:00:00Z" ;;
    registry) flags=" -X github.com/distribution/distribution/v3/version.version=${DISTRIBUTION_VERSION}" ;;
  esac
  echo "$flags"
}

# build_unit MODULE LOG GROUP...: build every binary of the groups (all from hack/go/MODULE) with one `go build` into a
# scratch directory, then move them into place and stamp each group.
build_unit() {
  local module="$1" logfile="$2" ldflags="-s -w" group bin
  shift 2
  local -a groups=("$@") pkgs=() more=() nice=()
  for group in "${groups[@]}"; do
    read -r -a more <<<"$(pkgs_of "$group")"
    pkgs+=("${more[@]}")
    ldflags+="$(ldflags_of "$group")"
  done
  # The node module builds beside the main one at lower priority, so that it fills its gaps (e.g. the
  # single-threaded link of kube-apiserver) instead of slowing it down.
  [[ "$module" == kube ]] || nice=(nice -n 10)
  local scratch
  scratch="$(mktemp -d "$TOOLS_DIR/.build-$module.XXXXXX")"
  (
    cd "$HACK_DIR/go/$module"
    # Static binaries: no C toolchain needed, and they run on any Linux of the same architecture.
    # -mod=readonly: go.sum in hack/go/ is the lock file; -v lists each package as it compiles (progress).
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false" \
      "${nice[@]}" go build -v -ldflags "$ldflags" -o "$scratch/" "${pkgs[@]}"
  ) >"$logfile" 2>&1 || { rm -rf "$scratch"; return 1; }
  # go names the binary of go.etcd.io/etcd/server/v3 after the element before the major-version suffix ...
  if [[ -e "$scratch/server" ]]; then mv "$scratch/server" "$scratch/etcd"; fi
  # ... and sigs.k8s.io/lws/cmd after its last element. The release's CRD comes from the same module (the file its
  # own install manifests are made from), so the controller and its CRD are always of one version.
  if [[ " ${groups[*]} " == *" lws "* ]]; then
    mv "$scratch/cmd" "$scratch/lws-controller"
    local module_dir
    module_dir="$(cd "$HACK_DIR/go/$module" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/lws)" \
      && cp "$module_dir/config/crd/bases/$LWS_CRD_FILE" "$scratch/$LWS_CRD_FILE" && chmod 0644 "$scratch/$LWS_CRD_FILE" \
      || { rm -rf "$scratch"; echo "the LeaderWorkerSet CRD (config/crd/bases/$LWS_CRD_FILE) is not in sigs.k8s.io/lws@$LWS_VERSION" >>"$logfile"; return 1; }
    mv -f "$scratch/$LWS_CRD_FILE" "$TOOLS_DIR/$LWS_CRD_FILE"
  fi
  for group in "${groups[@]}"; do
    for bin in $(bins_of "$group"); do
      [[ -x "$scratch/$bin" ]] || { rm -rf "$scratch"; echo "expected binary $bin was not produced" >>"$logfile"; return 1; }
      mv -f "$scratch/$bin" "$TOOLS_DIR/$bin"
    done
  done
  rm -rf "$scratch"
  for group in "${groups[@]}"; do stamp_of "$group" >"$TOOLS_DIR/.stamp-$group"; done
}

# check_pins: the Go modules must require what hack/versions.env pins (both are edited by hand).
check_pins() {
  local file pin
  for entry in "kube:k8s.io/kubernetes $KUBERNETES_VERSION" "kube:sigs.k8s.io/kwok $KWOK_VERSION" \
               "kube:go.etcd.io/etcd/server/v3 $ETCD_VERSION" "kube:helm.sh/helm/v4 $HELM_VERSION" \
               "kube:sigs.k8s.io/lws $LWS_VERSION" "kube:github.com/distribution/distribution/v3 $DISTRIBUTION_VERSION" \
               "node:k8s.io/kubernetes $NODE_KUBERNETES_VERSION" "node:github.com/coredns/coredns $COREDNS_VERSION"; do
    file="$HACK_DIR/go/${entry%%:*}/go.mod"; pin="${entry#*:}"
    grep -qE "^[[:space:]]*(require[[:space:]]+)?${pin//./\\.}([[:space:]]|$)" "$file" \
      || die "hack/versions.env pins '${pin}' but $file does not require it: update both (then go mod tidy there)"
  done
}

# progress: one line every 30 seconds per running build (packages compiled so far, out of the total).
progress() {
  local group="$1" logfile="$2" total="$3" start="$4" pid="$5" n
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null || break
    n="$(grep -cvE '^(#|go: )' "$logfile" 2>/dev/null || true)"
    log "$group: ${n:-0}/$total packages compiled, $(( $(date +%s) - start ))s elapsed"
  done
}

main() {
  mkdir -p "$TOOLS_DIR"
  local -a todo=()
  local group
  for group in "${GROUPS_WANTED[@]}"; do
    group_is_current "$group" && continue
    todo+=("$group")
  done
  if (( ${#todo[@]} == 0 )); then
    [[ "$CHECK_ONLY" == 1 ]] || log "up to date in $TOOLS_DIR (Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION)"
    return 0
  fi
  if [[ "$CHECK_ONLY" == 1 ]]; then
    log "missing or outdated in $TOOLS_DIR: ${todo[*]} (run: make tools)"
    return 1
  fi

  local -a build=()
  for group in "${todo[@]}"; do
    if [[ "$FORCE" != 1 ]] && try_reuse "$group"; then continue; fi
    build+=("$group")
  done
  (( ${#build[@]} == 0 )) && { log "up to date in $TOOLS_DIR"; return 0; }

  check_go
  local start
  start="$(date +%s)"
  log "building ${build[*]} into $TOOLS_DIR (Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION)"
  log "a cold build takes about 10 minutes on 2 cores (more with a slow network); later runs reuse the binaries"
  check_pins
  log "resolving packages (on an empty module cache this downloads about 1 GB of Go modules)"

  # One build per module (groups of one module share one `go build`); the modules build at once.
  local -A unit_groups=()
  local -a units=()
  for group in "${build[@]}"; do
    local module
    module="$(module_of "$group")"
    [[ -n "${unit_groups[$module]:-}" ]] || units+=("$module")
    unit_groups[$module]+=" $group"
  done
  local -A pids=() logs=() progress_pids=()
  local unit
  for unit in "${units[@]}"; do
    logs[$unit]="$TOOLS_DIR/.build-$unit.log"
    local total listing pkgs=""
    for group in ${unit_groups[$unit]}; do pkgs+=" $(pkgs_of "$group")"; done
    # `go list -deps` downloads exactly the modules the build needs (no test-only dependencies) and counts the
    # packages for the progress lines.
    if ! listing="$(cd "$HACK_DIR/go/$unit" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -deps $pkgs 2>"${logs[$unit]}")"; then
      tail -n 5 "${logs[$unit]}" >&2
      die "resolving hack/go/$unit failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    fi
    total="$(wc -l <<<"$listing")"
    log "$unit (hack/go/$unit:${unit_groups[$unit]}): modules ready after $(( $(date +%s) - start ))s"
    ( build_unit "$unit" "${logs[$unit]}" ${unit_groups[$unit]} && echo $(( $(date +%s) - start )) >"$TOOLS_DIR/.done-$unit" ) &
    pids[$unit]=$!
    progress "$unit" "${logs[$unit]}" "$total" "$start" "${pids[$unit]}" &
    progress_pids[$unit]=$!
    log "$unit: compiling $total packages (log: ${logs[$unit]})"
  done
  local failed=()
  for unit in "${units[@]}"; do
    if wait "${pids[$unit]}"; then
      local bins=""
      for group in ${unit_groups[$unit]}; do bins+=" $(bins_of "$group")"; done
      log "$unit: built$bins ($(cat "$TOOLS_DIR/.done-$unit" 2>/dev/null || echo ?)s after start)"
      rm -f "$TOOLS_DIR/.done-$unit"
      rm -f "${logs[$unit]}"
    else
      failed+=("${unit_groups[$unit]# }")
      log "$unit: FAILED after $(( $(date +%s) - start ))s; last lines of ${logs[$unit]}:"
      tail -n 25 "${logs[$unit]}" >&2 || true
    fi
    kill "${progress_pids[$unit]}" 2>/dev/null || true
    wait "${progress_pids[$unit]}" 2>/dev/null || true
  done
  (( ${#failed[@]} == 0 )) || die "could not build: ${failed[*]} (see the logs above)"
  log "all tools built in $(( $(date +%s) - start ))s into $TOOLS_DIR"
}

main
