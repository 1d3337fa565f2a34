"""The probe's settle between servers on vLLM's CPU build: the order effect with and without it (docs/probe.md, "The
settle between servers").

vLLM's shm broadcast reader busy-loops one core for 1 s after its last request. On a shared host the measurement that
follows the other server's shares a core with that spin; with the probe's alternating order (speculative first in odd
rounds, base first in even ones) that is the second measurement of every pair, so the rounds' ratios alternate. This
script shows it: it serves the retraining loop's tiny target (tests/support/retrain_models.py) as the base (core 0)
and with its free-trained drafter as the speculative server (core 1), measures how long each keeps a core busy after 8
requests (from /proc), then runs `specdec probe --engine vllm` with `--settle 1` (the engine's default) and `--settle 0`
in turn, each for --rounds rounds of the loop's single-stream workload (1 stream, 8 requests of 48 tokens on the free
prompts), at a confidence no interval reaches so that every run measures every round. Per run it prints the ratios and
the order effect: the mean log ratio of odd rounds minus that of even rounds (0 without one).

Usage (about 2 minutes to start the servers, then about a minute per run on a quiet 2-core machine):

    .venv/bin/python benchmarks/probe_settle.py --runs 3 --out docs/benchmarks/probe-settle.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from tests.support.retrain_models import DRAFTER, TARGET, free_prompts, retrain_models
from tests.support.vllm_servers import VllmServer, start_servers

WORKLOAD = "single-stream:1:64:48:8"


def idle_spin(server: VllmServer, prompts: list[dict[str, Any]]) -> list[float]:
    """Cores busy in each 100 ms for 2 s after 8 requests to ``server``."""
    for p in prompts[:8]:
        body = {"model": "default", "messages": p["messages"], "max_tokens": 48, "min_tokens": 48, "ignore_eos": True, "temperature": 0}
        req = urllib.request.Request(f"{server.url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
    busy, before = [], server.cpu_seconds()
    for _ in range(20):
        time.sleep(0.1)
        now = server.cpu_seconds()
        busy.append(round((now - before) / 0.1, 2))
        before = now
    return busy


def probe(base: str, spec: str, dataset: Path, settle: float, rounds: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specdec_operator.cli", "probe", "--engine", "vllm", "--base", base, "--speculative", spec]
    cmd += ["--workload", WORKLOAD, "--dataset", str(dataset), "--max-rounds", str(rounds), "--min-speedup", "1"]
    cmd += ["--confidence", "0.99999999", "--settle", str(settle), "--json", "--quiet"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "operator")})
    if proc.returncode != 0:
        raise SystemExit(f"specdec probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    w = json.loads(proc.stdout)["workloads"][0]
    logs = [math.log(r) for r in w["ratios"]]
    odd, even = logs[0::2], logs[1::2]
    return {
        "settle_s": settle,
        "seconds": round(time.monotonic() - started, 1),
        "ratios": w["ratios"],
        "order_effect": round(statistics.mean(odd) - statistics.mean(even), 3) if odd and even else None,
        "sd_log": round(statistics.stdev(logs), 3) if len(logs) > 1 else None,
        "base_tok_s": w["base_tok_s"],
        "speculative_tok_s": w["candidate_tok_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each setting, alternating (default 3)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per run (default 8)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args()
    models = retrain_models()
    work = Path(tempfile.mkdtemp(prefix="probe-settle-"))
    dataset = work / "free.jsonl"
    dataset.write_text("".join(json.dumps(p) + "\n" for p in free_prompts(32, seed=500)))
    base = VllmServer("base", models / TARGET, work / "base.log", core="0")
    spec = VllmServer("speculative", models / TARGET, work / "speculative.log", drafter=models / DRAFTER, core="1", num_speculative_tokens=3)
    start_servers([base, spec])
    out: dict[str, Any] = {"workload": WORKLOAD, "runs": [], "load_before": os.getloadavg()}
    try:
        prompts = free_prompts(8, seed=400)
        out["idle_spin_cores_per_100ms"] = {"base": idle_spin(base, prompts), "speculative": idle_spin(spec, prompts)}
        print(f"after 8 requests, cores busy per 100 ms: {out['idle_spin_cores_per_100ms']}", flush=True)
        for _ in range(args.runs):
            for settle in (1.0, 0.0):
                run = probe(base.url, spec.url, dataset, settle, args.rounds)
                out["runs"].append(run)
                print(json.dumps(run), flush=True)
    finally:
        base.stop()
        spec.stop()
    for settle in (1.0, 0.0):
        effects = [r["order_effect"] for r in out["runs"] if r["settle_s"] == settle and r["order_effect"] is not None]
        print(f"--settle {settle:g}: order effect (odd - even, log) per run {effects}, mean {statistics.mean(effects):+.3f}")
    out["load_after"] = os.getloadavg()
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
