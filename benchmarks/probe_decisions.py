"""GPU-seconds to a decision, interval widths at a decision, and the error guarantees, on the simulator.

Real HTTP against simulators in child processes (``specdec simulate``), the probe's defaults otherwise
(``max_rounds`` 6, ``min_speedup`` 1.0, confidence 0.998). Ratios do not depend on the time scale; GPU
time does: GPU-seconds = probe wall time x time scale x (GPUs of the base + GPUs of the candidate).

Parts:

* ``seed``: the seed's profiles (Kimi-K2.5 TP 8 base against its custom drafter, the public Kimi-K2
  drafter and itself; 16 GPUs) and the Llama pair (2 GPUs), the workloads of ``probe_fidelity.py --part
  decisions``; profiles get ``stream_interval`` 8 so a higher time scale stays within the host.
* ``heldout``: the operator's own workloads (hack/demo.py and the e2e tests: ``chat:1:128:64:4`` weight 3,
  ``batch-32:32:128:64:64``) at time scale 5, as the cluster tests run them, both policies, against the
  Llama drafter, an equal server and a 5 %-slower one.
* ``errors``: ``--runs`` seeded probes (seeds 100, 101, ...) of two equal servers (5 % step jitter, probe_null.py's
  profile, workload small:4:16:128:16), of a server 5 % slower and of one 10 % faster (the power that the early
  stops cost; ``--case '5% faster'`` runs a smaller gain): how many promote. Both simulators of a probe are
  in-process ``SimulatorServer``s (the same model and HTTP protocol as ``specdec simulate``, real HTTP on
  localhost) at time scale 4, ``--parallel`` probes (5) at a time on one event loop, so 100 runs of a case take
  minutes on two shared cores.

The same script measures the method before and after a change: run it with ``PYTHONPATH`` pointing at the
other checkout's ``operator/``. ``--table FILE.json ...`` prints docs/probe.md's tables from saved rows.

Usage: .venv/bin/python benchmarks/probe_decisions.py [--part seed|heldout|errors|all] [--runs 100] [--repeats N]
       [--label after] [--json FILE]; ... --table FILE.json ... prints the markdown tables of docs/probe.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from importlib import resources
from typing import Any

from specdec_operator.api import Prompts, Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.simulator import SimulatorProcess, SimulatorServer, profile_from_dict

# Random token ids, as every run recorded under docs/benchmarks/ (the "before" method knew no other traffic): the
# statistics are compared on the same traffic, and prompt-dependent acceptance is not their subject.
RANDOM = Prompts(source="Random")
SEED_WORKLOADS = [
    Workload(prompts=RANDOM, name="single-stream", concurrency=1, input_tokens=512, output_tokens=256, requests=2),
    Workload(prompts=RANDOM, name="concurrent-128", concurrency=128, input_tokens=512, output_tokens=256, requests=128),
]
LLAMA_WORKLOADS = [
    Workload(prompts=RANDOM, name="single-stream", concurrency=1, input_tokens=512, output_tokens=256, requests=2),
    Workload(prompts=RANDOM, name="concurrent-64", concurrency=64, input_tokens=512, output_tokens=256, requests=128),
]
DEMO_WORKLOADS = [
    Workload(prompts=RANDOM, name="chat", concurrency=1, input_tokens=128, output_tokens=64, requests=4, weight=3),
    Workload(prompts=RANDOM, name="batch-32", concurrency=32, input_tokens=128, output_tokens=64, requests=64, weight=1),
]
EQUAL = {
    "name": "equal",
    "load_seconds": 0,
    "max_running_requests": 256,
    "prefill_tokens_per_s": 200000,
    "step_ms": [[1, 10.0], [8, 14.0]],
    "speculative": None,
    "jitter": 0.05,
    "errors": {},
    "stream_interval": 8,
}
SMALL = [Workload(prompts=RANDOM, name="small", concurrency=4, input_tokens=16, output_tokens=128, requests=16)]
# A short workload: 16 requests x 24 tokens at 8 tokens per event and concurrency 4 are 4 time blocks per
# measurement, below stats.MIN_BLOCKS (8), so the probe falls back to the round-level interval, as on the heldout
# batch-32 workload. docs/probe.md ("Fewer blocks: tried, not kept") has its runs with MIN_BLOCKS lowered to 4.
FEW_BLOCKS = [Workload(prompts=RANDOM, name="few-blocks", concurrency=4, input_tokens=16, output_tokens=24, requests=16)]
ERROR_WORKLOADS = {"small": SMALL, "few-blocks": FEW_BLOCKS}


def slower(profile: dict, loss: float) -> dict:
    """The same server with every step 1/(1 - loss) longer: throughput ``loss`` lower."""
    out = dict(profile, name=f"{profile['name']}-minus-{round(loss * 100)}pct")
    out["step_ms"] = [[b, ms / (1.0 - loss)] for b, ms in profile["step_ms"]]
    return out


def faster(profile: dict, gain: float) -> dict:
    """The same server with every step 1/(1 + gain) as long: throughput ``gain`` higher."""
    out = dict(profile, name=f"{profile['name']}-plus-{round(gain * 100)}pct")
    out["step_ms"] = [[b, ms / (1.0 + gain)] for b, ms in profile["step_ms"]]
    return out


def profile_file(tmp: str, name: str, stream_interval: int | None = None, loss: float = 0.0) -> str:
    """A shipped profile, optionally with another stream_interval or slower, written to a file in ``tmp``."""
    data = json.loads((resources.files("specdec_operator.simulator") / "profiles" / f"{name}.json").read_text())
    if stream_interval is not None:
        data["stream_interval"] = stream_interval
    if loss:
        data = slower(data, loss)
    path = os.path.join(tmp, f"{data['name']}-{stream_interval}.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def widths(result: Any) -> dict[str, float | None]:
    """Per reported interval: max(high / estimate, estimate / low); the goal is at most 2."""
    out: dict[str, float | None] = {}
    rows = [(w.name, w.speedup, w.speedup_low, w.speedup_high) for w in result.workloads]
    if result.policy == "weighted":
        rows.append(("weighted", result.speedup, result.speedup_low, result.speedup_high))
    for name, est, lo, hi in rows:
        if est is None:
            continue
        if not lo or hi is None or not math.isfinite(hi):
            out[name] = math.inf
        else:
            out[name] = round(max(hi / est, est / lo), 3)
    return out


def summary(result: Any, wall: float, scale: float, gpus: int) -> dict:
    d = result.to_dict()
    return {
        "decision": d["decision"],
        "reason": d["reason"],
        "rounds": d["rounds"],
        "speedups": {w["name"]: [w["speedup"], w["speedup_low"], w["speedup_high"]] for w in d["workloads"] if w["speedup"] is not None},
        "weighted": [d["speedup"], d["speedup_low"], d["speedup_high"]] if d["policy"] == "weighted" else None,
        "width": widths(result),
        "wall_s": round(wall, 2),
        "time_scale": scale,
        "gpus": gpus,
        "gpu_s": round(wall * scale * gpus, 1),
    }


async def _decision(base: str, cand: str, workloads: list[Workload], scale: float, gpus: int, policy: str = "all", seed: int = 1) -> dict:
    with ExitStack() as stack:
        base_url = stack.enter_context(SimulatorProcess(base, "--time-scale", str(scale), "--load-seconds", "0", "--seed", str(seed)))
        cand_url = stack.enter_context(SimulatorProcess(cand, "--time-scale", str(scale), "--load-seconds", "0", "--seed", str(seed + 1)))
        trace: list[dict] = []
        t = time.perf_counter()
        result = await run_probe(base_url, cand_url, workloads, seed=seed, policy=policy, on_round=lambda r: trace.append(round_row(r)))
        wall = time.perf_counter() - t
    return {**summary(result, wall, scale, gpus), "trace": trace}


def round_row(result: Any) -> dict:
    """The intervals after one round (``on_round``): per workload [estimate, low, high] and the weighted one."""
    row: dict = {"round": result.rounds}
    for w in result.workloads:
        if w.speedup is not None:
            row[w.name] = [round(w.speedup, 4), round(w.speedup_low or 0.0, 4), None if w.speedup_high is None else round(w.speedup_high, 4)]
    if result.policy == "weighted" and result.speedup is not None:
        row["weighted"] = [
            round(result.speedup, 4),
            round(result.speedup_low or 0.0, 4),
            None if result.speedup_high is None else round(result.speedup_high, 4),
        ]
    return row


def seed_part(label: str, out: list[dict], repeats: int = 1) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kimi = profile_file(tmp, "sglang-base-kimi-k25", 8)
        cases = [
            ("kimi base -> custom drafter", kimi, profile_file(tmp, "kimi-k25-custom-eagle3", 8), SEED_WORKLOADS, 4.0, 16),
            ("kimi base -> public drafter", kimi, profile_file(tmp, "kimi-k2-public-eagle3", 8), SEED_WORKLOADS, 4.0, 16),
            ("kimi base -> kimi base", kimi, profile_file(tmp, "sglang-base-kimi-k25", 8), SEED_WORKLOADS, 4.0, 16),
            ("llama base -> eagle3", profile_file(tmp, "llama31-8b-base", 8), profile_file(tmp, "llama31-8b-eagle3", 8), LLAMA_WORKLOADS, 2.0, 2),
        ]
        for rep, (name, base, cand, wls, scale, gpus) in ((r, c) for r in range(repeats) for c in cases):
            seed = 1 + 10 * rep
            row = {"label": label, "part": "seed", "case": name, "seed": seed, **asyncio.run(_decision(base, cand, wls, scale, gpus, seed=seed))}
            out.append(row)
            print(json.dumps(row), flush=True)


def heldout_part(label: str, out: list[dict], repeats: int = 1) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = profile_file(tmp, "llama31-8b-base", 8)
        cases = [
            ("llama base -> eagle3", profile_file(tmp, "llama31-8b-eagle3", 8)),
            ("llama base -> llama base", base),
            ("llama base -> 5% slower", profile_file(tmp, "llama31-8b-base", 8, loss=0.05)),
        ]
        for rep, policy, (name, cand) in ((r, p, c) for r in range(repeats) for p in ("weighted", "all") for c in cases):
            seed = 1 + 10 * rep
            row = {
                "label": label,
                "part": "heldout",
                "case": name,
                "policy": policy,
                "seed": seed,
                **asyncio.run(_decision(base, cand, DEMO_WORKLOADS, 5.0, 2, policy, seed=seed)),
            }
            out.append(row)
            print(json.dumps(row), flush=True)


async def _small(seed: int, candidate: dict, workloads: list[Workload] = SMALL) -> Any:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(SimulatorServer(profile_from_dict(EQUAL), time_scale=4, seed=seed, load_seconds=0))
        b = await stack.enter_async_context(SimulatorServer(profile_from_dict(candidate), time_scale=4, seed=seed + 1000, load_seconds=0))
        t = time.perf_counter()
        result = await run_probe(a, b, workloads, seed=seed)
        return result, time.perf_counter() - t


ERROR_CASES = ("equal servers", "5% slower", "10% faster")


def errors_part(label: str, runs: int, out: list[dict], parallel: int = 5, only: tuple[str, ...] = ERROR_CASES, workload: str = "small") -> None:
    workloads = ERROR_WORKLOADS[workload]
    suffix = "" if workload == "small" else f" ({workload})"
    cases = (
        ("equal servers", EQUAL),
        ("5% slower", slower(EQUAL, 0.05)),
        ("10% faster", faster(EQUAL, 0.10)),
        ("5% faster", faster(EQUAL, 0.05)),
    )
    for name, candidate in cases:
        if name not in only:
            continue
        results = []
        t = time.perf_counter()
        seeds = list(range(100, 100 + runs))

        async def batch(chunk: list[int], candidate: dict = candidate) -> list:
            return await asyncio.gather(*(_small(s, candidate, workloads) for s in chunk))

        for start in range(0, len(seeds), parallel):
            results += asyncio.run(batch(seeds[start : start + parallel]))
        rounds = [r.rounds for r, _ in results]
        gpu_s = [w * 4 * 2 for _, w in results]
        row = {
            "label": label,
            "part": "errors",
            "case": name + suffix,
            "runs": len(results),
            "reasons": dict(collections.Counter(str(r.reason) for r, _ in results)),
            "promoted": sum(str(r.decision) == "promote" for r, _ in results),
            "mean_rounds": round(sum(rounds) / len(rounds), 2),
            "mean_gpu_s": round(sum(gpu_s) / len(gpu_s), 2),
            "max_width": max((v for r, _ in results for v in widths(r).values() if v is not None), default=None),
            "wider_than_2": sum(any(v is not None and v > 2.0 for v in widths(r).values()) for r, _ in results),
            "wall_s": round(time.perf_counter() - t, 1),
            "per_run": [
                {
                    "seed": s,
                    "decision": str(r.decision),
                    "reason": str(r.reason),
                    "rounds": r.rounds,
                    "gpu_s": round(w * 4 * 2, 1),
                    "width": widths(r),
                }
                for s, (r, w) in zip(seeds, results)
            ],
        }
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "per_run"}), flush=True)


def _fmt_width(v: float | None) -> str:
    return "-" if v is None else ("inf" if not math.isfinite(v) else f"{v:.2f}")


def tables(paths: list[str]) -> None:
    """Markdown tables (docs/probe.md) from the JSON rows of earlier runs: before/after per case and the totals."""
    rows = [row for path in paths for row in json.load(open(path))]
    errors = [r for r in rows if r["part"] == "errors"]
    if errors:
        print("| case | method | runs | promoted | reasons | mean rounds | mean GPU-s | widest interval | decisions wider than 2x |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in sorted(errors, key=lambda r: (r["case"], r["label"] != "before")):
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items(), key=lambda kv: -kv[1]))
            wider = r.get("wider_than_2", "-")
            print(
                f"| {r['case']} | {r['label']} | {r['runs']} | {r['promoted']} | {reasons} | {r['mean_rounds']} | {r['mean_gpu_s']} "
                f"| {_fmt_width(r['max_width'])} | {wider} |"
            )
        print()
    cases: dict[tuple, dict[str, list[dict]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        if r["part"] in ("seed", "heldout"):
            cases[(r["part"], r["case"], r.get("policy") or "all")][r["label"]].append(r)
    if not cases:
        return
    print(
        "| part | case | policy | method | runs | decisions (rounds) | mean GPU-s | widest interval at the decision | runs with one wider than 2x |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    for key in sorted(cases):
        for label in sorted(cases[key], key=lambda lb: lb != "before"):
            runs = cases[key][label]
            gpu = sum(r["gpu_s"] for r in runs) / len(runs)
            totals[(key[0], label)] += gpu
            widest = max((v for r in runs for v in r["width"].values()), default=None)
            wider = sum(any(v > 2.0 for v in r["width"].values()) for r in runs)
            decisions = ", ".join(f"{r['reason']} ({r['rounds']})" for r in runs)
            print(f"| {key[0]} | {key[1]} | {key[2]} | {label} | {len(runs)} | {decisions} | {gpu:.1f} | {_fmt_width(widest)} | {wider} |")
    print()
    for part in ("seed", "heldout"):
        if (part, "before") not in totals:
            continue
        b = totals[(part, "before")]
        others = [(label, a) for (p, label), a in totals.items() if p == part and label != "before"]
        changes = ", ".join(f"{label} {a:.1f} ({100 * (a - b) / b:+.0f} %)" for label, a in others)
        print(f"{part}: GPU-s summed over the cases' means: before {b:.1f}, {changes}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["seed", "heldout", "errors", "all"], default="all")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--label", default="after")
    parser.add_argument("--repeats", type=int, default=1, help="seed and heldout parts: runs of each case (seeds 1, 11, 21, ...)")
    parser.add_argument("--case", action="append", help="errors part: only this case (repeatable; also '5%% faster', not run by default)")
    parser.add_argument("--workload", choices=sorted(ERROR_WORKLOADS), default="small", help="errors part: the probe's workload")
    parser.add_argument("--parallel", type=int, default=5, help="errors part: probes at a time in the one process")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print docs/probe.md's tables from earlier runs' JSON rows and exit")
    args = parser.parse_args()
    if args.table:
        tables(args.table)
        return 0
    rows: list[dict] = []
    if args.part in ("seed", "all"):
        seed_part(args.label, rows, args.repeats)
    if args.part in ("heldout", "all"):
        heldout_part(args.label, rows, args.repeats)
    if args.part in ("errors", "all"):
        errors_part(args.label, args.runs, rows, args.parallel, tuple(args.case or ERROR_CASES), args.workload)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
