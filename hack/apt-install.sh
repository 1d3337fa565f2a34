#!/usr/bin/env bash
# Installs Debian packages for make's preparations, one apt-get at a time on this machine.
#
#   hack/apt-install.sh WHO PACKAGE...     (WHO names the caller in messages: node-deps, vllm-cpu)
#
# `make test` runs node-deps and vllm-cpu side by side (make -j4); on a machine that has neither's packages both
# called apt-get at once and the second failed at once on apt's own lock (/var/lib/apt/lists/lock, issue 33). Every
# caller goes through this script: it holds one machine-wide flock around `apt-get update` and `apt-get install`,
# and installs only what is still missing once it has the lock (the caller before it may have installed it). apt's own
# lock timeout covers an apt-get this project did not start (unattended-upgrades).
set -euo pipefail
who=${1:?usage: hack/apt-install.sh WHO PACKAGE...}
shift
(( $# )) || exit 0
if [[ "$(id -u)" != 0 ]]; then
  echo "$who: missing $*: run as root, or: sudo apt-get install $*" >&2
  exit 1
fi
lock=${SPECDEC_APT_LOCK:-/var/lock/specdec-operator-apt.lock}
exec 8>"$lock"
if ! flock -n 8; then
  echo "$who: waiting for another apt-get of make's preparations ($lock)" >&2
  flock 8
fi
missing=()
for pkg in "$@"; do
  [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" == "install ok installed" ]] || missing+=("$pkg")
done
(( ${#missing[@]} )) || exit 0
echo "$who: apt-get install ${missing[*]}" >&2
start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600)
apt-get "${apt_opts[@]}" update -qq
apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "$who: installed in $(( $(date +%s) - start ))s" >&2
