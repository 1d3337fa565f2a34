#!/usr/bin/env bash
# A fresh machine's `.ci/run`, as close as one machine allows, with the CPU sampled beside it (the figures in
# docs/development.md). A fresh clone of this checkout's commit, run with an empty HOME: no Go module or build cache,
# no tools, no pip/uv cache, no vLLM venv, no real-engine models. What the machine has outside HOME stays (apt
# packages, Go, Python): `make test` installs the apt ones itself where they are missing.
#
#   hack/fresh-ci.sh [REV]     (default HEAD; FRESH_ROOT, default /tmp/fresh, is emptied first)
#
# Writes $FRESH_ROOT/ci.log (the run's output), $FRESH_ROOT/vmstat.log (`vmstat -t 10`: us+sy is the busy share of all
# cores) and $FRESH_ROOT/result (exit code, wall seconds, commit). It takes the whole machine for 40-60 minutes on
# 2 cores: run nothing else beside it.
set -u
rev=${1:-HEAD}
root=${FRESH_ROOT:-/tmp/fresh}
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rm -rf "$root"; mkdir -p "$root/home"
git clone -q "$src" "$root/repo" && cd "$root/repo" && git checkout -q "$rev" || exit 1
start=$(date +%s)
vmstat -n -t 10 >"$root/vmstat.log" 2>&1 & sampler=$!
HOME="$root/home" .ci/run >"$root/ci.log" 2>&1
rc=$?
kill "$sampler"
echo "rc=$rc wall=$(( $(date +%s) - start ))s rev=$(git rev-parse --short HEAD)" | tee -a "$root/ci.log" >"$root/result"
cat "$root/result"
