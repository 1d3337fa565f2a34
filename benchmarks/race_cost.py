"""GPU-seconds of a race of 4 candidates against 4 separate probes of the same candidates (issue 35, item 2).

Offline, through the operator's own probe path: probe/run.py ``run_probe`` against in-process SGLang simulators, each
probe decided by controller/probescheduler.py ``race_decide(family, bar)`` (reconcile/race.py ``decide`` with the
race's share of the error budget and its bar), each decision recorded, the bar and the winner taken by
reconcile/candidate_race.py (``recorded``, ``bar``, ``winner``) exactly as the operator does between its candidates'
probes. What the operator adds around the probes (re-rendering the slot, pods becoming Ready) is deploying, not
probing: it is the same per candidate in both ways and is costed from the profiles' load times below, not measured.
Why not through the operator on the control plane: the decisions and GPU-seconds would be the same code's, with the
API server, kwok and the operator's reconcile interval on the same 2 busy cores beside the simulators, which adds
noise to the one thing measured here (the probes' time) and takes ~4x the wall time per repetition.

The candidates: EAGLE-3, n-gram, a draft model (STANDALONE) and DFlash, each its Llama-3.1-8B-like profile on 1 GPU
(simulator/profiles/llama31-8b-*.json), in the race's order (spec.drafter first). Two workloads under AllWorkloads,
one stream each: ``chat`` (the probe's shipped prompts) and ``repetitive`` (tests/support/race_workloads.py: context
that repeats, share ~0.83). The profiles' truth: DFlash ~3.1x on both, EAGLE-3 ~2.2x, the draft model ~1.6x, n-gram
~3.1x on repetitive but ~0.9x on chat, so DFlash clearly wins.

  race      the 4 probes one after another, each at family 4 (confidence 1 - 0.002/4) with the bar: a candidate whose
            interval's high end falls below the best passing low end so far stops (CannotWin)
  separate  each candidate probed alone at family 1 (confidence 0.998), no bar; the best passing one is picked

GPU-seconds = the probe's GPUs (base + speculative: 2 x 1) x its wall seconds (probecost.py, as status.probe.gpuSeconds),
also in simulated GPU time (x --time-scale). The modes alternate in order between repetitions (race first on odd ones).

  errors    how often each way promotes a candidate that is not faster, on scripted rounds (probe/scripted.py, the same
            run_probe and decisions, no servers): all 4 candidates exactly at min speedup 1.0, --probes repetitions, at
            --confidence (the race's: each of its probes at 1 - (1 - confidence)/4, a separate probe at confidence)

  table     the measure files' runs as a Markdown table (per repetition and mode: winner, rounds and reason per
            candidate, GPU-seconds), and each mode's mean

Usage:
  .venv/bin/python benchmarks/race_cost.py measure --repeat 5 --out docs/benchmarks/race-cost-drafter-first.json
  .venv/bin/python benchmarks/race_cost.py measure --repeat 5 --order dflash,eagle3,standalone,ngram --out docs/benchmarks/race-cost-dflash-first.json
  .venv/bin/python benchmarks/race_cost.py errors --probes 2000 --out docs/benchmarks/race-cost-errors.json
  .venv/bin/python benchmarks/race_cost.py errors --probes 2000 --confidence 0.5 --out docs/benchmarks/race-cost-errors-0.5.json
  .venv/bin/python benchmarks/race_cost.py table docs/benchmarks/race-cost-*-first.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from specdec_operator.api import CandidateStatus, OutputCheck
from specdec_operator.controller.probescheduler import race_decide
from specdec_operator.probe.datasets import parse_dataset
from specdec_operator.probe.result import ProbeResult
from specdec_operator.probe.run import run_probe
from specdec_operator.probe.scripted import ScriptedProbe
from specdec_operator.probecost import unit_seconds
from specdec_operator.reconcile import candidate_race
from specdec_operator.simulator import SimulatorServer, load_profile
from tests.support import race_workloads as rw

CANDIDATES = {"eagle3": ("EAGLE3", "llama31-8b-eagle3"), "ngram": ("NGRAM", "llama31-8b-ngram")}
CANDIDATES |= {"standalone": ("STANDALONE", "llama31-8b-standalone"), "dflash": ("DFLASH", "llama31-8b-dflash")}
SERVER_GPUS = 1
PROBED_GPUS = 2 * SERVER_GPUS  # probecost.probed_gpus: the base and the speculative server
CONFIDENCE = 0.998
MAX_ROUNDS = 6


def workloads(requests: int) -> list[dict[str, Any]]:
    return [rw.workload("chat", "unused", requests), rw.workload("repetitive", "race-prompts", requests)]


def datasets() -> dict[str, Any]:
    text = "\n".join(json.dumps(p) for p in rw.repetitive_prompts())
    return {"repetitive": parse_dataset(text, source="race_workloads.repetitive_prompts", fmt="Chat")}


def row_of(name: str, result: ProbeResult) -> CandidateStatus:
    """The candidate's row of the race's table, as candidate_race records its lifecycle's decision."""
    status = result.to_status(name, gpu_seconds=unit_seconds(PROBED_GPUS, result.wall_seconds))
    return candidate_race.recorded(CandidateStatus(name=name, algorithm=CANDIDATES[name][0], state="Measuring", revision=name), status)


async def probe(
    base: str, url: str, family: int, bar: float | None, requests: int, seed: int, script: ScriptedProbe | None = None, confidence: float = CONFIDENCE
) -> ProbeResult:
    return await run_probe(
        base,
        url,
        workloads(requests),
        policy="AllWorkloads",
        min_speedup=1.0,
        max_rounds=MAX_ROUNDS,
        confidence=confidence,
        datasets=datasets(),
        output_check=OutputCheck() if script is None else None,
        decide=race_decide(family, bar),
        seed=seed,
        script=script,
    )


async def run_mode(
    mode: str,
    urls: dict[str, str],
    requests: int,
    seed: int,
    scripts: dict[str, ScriptedProbe] | None = None,
    order: list[str] | None = None,
    confidence: float = CONFIDENCE,
) -> list[CandidateStatus]:
    """The candidates' rows in ``order``: raced (family 4, the bar so far) or probed separately (family 1, no bar)."""
    order = order or list(CANDIDATES)
    table = [CandidateStatus(name=c, algorithm=CANDIDATES[c][0], state="Waiting", revision=c) for c in order]
    for i, name in enumerate(order):
        family, bar = (len(CANDIDATES), candidate_race.bar(table)) if mode == "race" else (1, None)
        result = await probe(urls["base"], urls[name], family, bar, requests, seed, scripts[name] if scripts else None, confidence)
        table[i] = row_of(name, result)
    return table


def summary(mode: str, table: list[CandidateStatus], time_scale: float) -> dict[str, Any]:
    win = candidate_race.winner(table)
    gpu = round(candidate_race.spent(table), 3)
    rows = [
        {
            "candidate": r.name,
            "state": r.state,
            "reason": r.reason,
            "rounds": r.rounds,
            "speedup": r.speedup,
            "workloads": {w.name: [w.speedup, w.speedup_low, w.speedup_high] for w in r.workloads or []},
            "accept_length": r.accept_length,
            "gpu_seconds": r.gpu_seconds,
        }
        for r in table
    ]
    return {
        "mode": mode,
        "winner": win.name if win else None,
        "gpu_seconds": gpu,
        "simulated_gpu_seconds": round(gpu * time_scale, 1),
        "candidates": rows,
    }


async def one_repetition(rep: int, time_scale: float, requests: int, order: list[str]) -> list[dict[str, Any]]:
    servers = {"base": SimulatorServer(load_profile("llama31-8b-base"), time_scale=time_scale, seed=rep, load_seconds=0)}
    servers |= {c: SimulatorServer(load_profile(p), time_scale=time_scale, seed=rep, load_seconds=0) for c, (_, p) in CANDIDATES.items()}
    urls = {name: await s.start() for name, s in servers.items()}
    try:
        out = []
        for mode in ("race", "separate") if rep % 2 else ("separate", "race"):
            started = time.monotonic()
            table = await run_mode(mode, urls, requests, seed=rep, order=order)
            out.append({"repetition": rep, "wall_seconds": round(time.monotonic() - started, 1), **summary(mode, table, time_scale)})
            print(json.dumps({k: v for k, v in out[-1].items() if k != "candidates"}), flush=True)
        return out
    finally:
        for s in servers.values():
            await s.stop()


def deploy_costs(candidates: int) -> dict[str, Any]:
    """GPU-seconds (simulated time) of loading servers around the probes, from the profiles' load_seconds: derived, not
    measured. The race loads each candidate into the slot beside the base that already serves production; separate
    probes as separate SpeculativeServers also load a base of their own per candidate (the operator's way to probe a
    drafter); separate probes one after another on one resource (spec.drafter changed each time) share its base."""
    base = load_profile("llama31-8b-base").load_seconds
    slot = sum(load_profile(p).load_seconds for _, p in CANDIDATES.values())
    return {
        "load_seconds": {"base": base, **{c: load_profile(p).load_seconds for c, (_, p) in CANDIDATES.items()}},
        "race_slot_loads": SERVER_GPUS * slot,
        "race_base_waiting_while_slot_loads": SERVER_GPUS * slot,
        "separate_resources_slot_loads": SERVER_GPUS * slot,
        "separate_resources_own_base_loads": SERVER_GPUS * base * candidates,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for rep in range(1, args.repeat + 1):
        runs += asyncio.run(one_repetition(rep, args.time_scale, args.requests, args.order))
    return {
        "what": "race of 4 candidates vs 4 separate probes, through run_probe and the operator's decisions (benchmarks/race_cost.py measure)",
        "time_scale": args.time_scale,
        "requests_per_round": args.requests,
        "order": args.order,
        "workloads": workloads(args.requests),
        "probed_gpus": PROBED_GPUS,
        "deploy_simulated_gpu_seconds": deploy_costs(len(CANDIDATES)),
        "runs": runs,
    }


async def scripted_errors(probes: int, noise: float, confidence: float) -> dict[str, Any]:
    """All 4 candidates at exactly min speedup (1.0): any promotion is a false one. Each repetition's candidates have
    their own seeded rounds, the same for both ways (a paired comparison)."""
    counts = {"race": 0, "separate": 0}
    per_probe = {"race": 0, "separate": 0}
    urls = {"base": "http://127.0.0.1:9", **{c: "http://127.0.0.1:9" for c in CANDIDATES}}
    for rep in range(probes):
        scripts = {c: ScriptedProbe(f"null/{rep}/{c}", 1.0, noise=noise, accept_length=2.5, seconds_per_round=0.0) for c in CANDIDATES}
        for mode in counts:
            table = await run_mode(mode, urls, 4, rep, scripts, confidence=confidence)
            counts[mode] += candidate_race.winner(table) is not None
            per_probe[mode] += sum(r.state in ("Passed", "Serving") for r in table)
    return {"repetitions": probes, "noise": noise, "confidence": confidence, "false_promotions": counts, "candidates_passing": per_probe}


def wilson_high(k: int, n: int, z: float = 1.96) -> float:
    """The 95 % upper bound of a rate from k of n (Wilson)."""
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return round((centre + spread) / (1 + z * z / n), 5)


def errors(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    found = asyncio.run(scripted_errors(args.probes, args.noise, args.confidence))
    n = found["repetitions"]
    found["upper_95"] = {m: wilson_high(k, n) for m, k in found["false_promotions"].items()}
    found["bound"] = {"race": round(1 - args.confidence, 4), "separate_best_of_4": round(1 - args.confidence**4, 4)}
    found["wall_seconds"] = round(time.monotonic() - started, 1)
    return found


def table(paths: list[Path]) -> str:
    """The runs of measure files as Markdown: one line per repetition and mode, then each mode's mean."""
    lines = []
    for path in paths:
        doc = json.loads(path.read_text())
        lines += [
            f"\n{path.name} (time scale {doc['time_scale']:g}):\n",
            "| rep | mode | winner | candidates: state (rounds) | GPU-s | simulated GPU-s |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        totals: dict[str, list[float]] = {}
        for run in doc["runs"]:
            cands = ", ".join(f"{c['candidate']} {c['reason']} ({c['rounds']})" for c in run["candidates"])
            lines.append(
                f"| {run['repetition']} | {run['mode']} | {run['winner']} | {cands} | {run['gpu_seconds']:.1f} | {run['simulated_gpu_seconds']:.0f} |"
            )
            totals.setdefault(run["mode"], []).append(run["gpu_seconds"])
        for mode, values in totals.items():
            mean = sum(values) / len(values)
            lines.append(f"| mean of {len(values)} | {mode} | | | {mean:.1f} | {mean * doc['time_scale']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="real-time probes against simulators: GPU-seconds and decisions")
    m.add_argument("--repeat", type=int, default=3)
    m.add_argument("--time-scale", type=float, default=2.0, help="simulated seconds per wall second (default 2)")
    m.add_argument("--requests", type=int, default=4, help="requests per workload and round (default 4)")
    m.add_argument("--order", type=lambda s: s.split(","), default=list(CANDIDATES), help="the race's order (default eagle3,ngram,standalone,dflash)")
    m.add_argument("--out", type=Path)
    e = sub.add_parser("errors", help="false promotions on scripted null rounds")
    e.add_argument("--probes", type=int, default=2000)
    e.add_argument("--noise", type=float, default=0.05)
    e.add_argument(
        "--confidence",
        type=float,
        default=CONFIDENCE,
        help="the race's confidence (default 0.998, the operator's); lower shows the effect in fewer probes",
    )
    e.add_argument("--out", type=Path)
    t = sub.add_parser("table", help="measure files as a Markdown table")
    t.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.files))
        return 0
    if args.command == "measure" and sorted(args.order) != sorted(CANDIDATES):
        parser.error(f"--order {','.join(args.order)}: name each of {', '.join(CANDIDATES)} once")
    doc = measure(args) if args.command == "measure" else errors(args)
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text if args.command == "errors" else f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
