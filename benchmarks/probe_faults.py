"""Probe faults: seeded probes against simulators that fail in every way the probe must survive.

Each run probes a candidate that is truly ~2x faster than its base (so a probe that ignored the fault
would promote) while one of the two servers injects a fault: HTTP 500s, requests that never answer,
streams cut half-way, malformed JSON chunks, streams that stall past the client's deadline, a server that
dies mid-round, or a mix. The claim checked: zero promotions, and every run ends with a reason.

Usage: .venv/bin/python benchmarks/probe_faults.py [--runs 100] [--parallel 10]
(tests/unit/test_probe_faults.py runs the same campaign and asserts on it.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass

from specdec_operator.api import Prompts, Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.probe import ProbeResult
from specdec_operator.simulator import SimulatorServer, profile_from_dict

FAULTS = ["http_500", "timeout", "truncated_stream", "malformed_json", "stall", "die_mid_round", "mixed"]
# Random token ids: the campaign is about server faults, and /generate's meta_info carries the per-request acceptance
# (chat streams do not: the acceptance then comes from the server's metrics, which the faults also break).
WORKLOAD = Workload(name="faults", concurrency=2, input_tokens=8, output_tokens=16, requests=6, prompts=Prompts(source="Random"))
REQUEST_TIMEOUT = 1.5  # seconds a request may take
READ_TIMEOUT = 0.5  # seconds between two reads of a stream: a stall longer than this is past the deadline
# A lenient decision rule (95 %, 4 rounds) makes promotion as easy as it gets, so "zero promotions under
# faults" is the stronger claim; the control run (tests/unit/test_probe_faults.py) promotes with these settings.
PROBE_SETTINGS = {"max_rounds": 4, "confidence": 0.95, "request_timeout": REQUEST_TIMEOUT, "read_timeout": READ_TIMEOUT}


def _profile(name: str, step_ms: list, accept: float | None, errors: dict) -> dict:
    spec = None
    if accept is not None:
        spec = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
    return {
        "name": name,
        "load_seconds": 0,
        "max_running_requests": 64,
        "prefill_tokens_per_s": 100000,
        "step_ms": step_ms,
        "speculative": spec,
        "jitter": 0.01,
        "errors": errors,
        "stream_interval": 4,
    }


def fault_errors(kind: str, rng: random.Random) -> dict:
    """The profile's errors block for one fault kind (rates high enough to hit within a probe)."""
    rate = rng.uniform(0.4, 0.7)
    if kind == "http_500":
        return {"http_500_rate": rate}
    if kind == "timeout":
        return {"timeout_rate": rate}
    if kind == "truncated_stream":
        return {"truncated_stream_rate": rate}
    if kind == "malformed_json":
        return {"malformed_json_rate": rate}
    if kind == "stall":
        return {"stall_rate": rate, "stall_seconds": 3.0}
    if kind == "die_mid_round":
        return {"die_after_requests": rng.randint(1, WORKLOAD.requests * 2 - 1)}
    share = rate / 5
    return {
        "http_500_rate": share,
        "timeout_rate": share,
        "truncated_stream_rate": share,
        "malformed_json_rate": share,
        "stall_rate": share,
        "stall_seconds": 3.0,
    }


@dataclass
class RunOutcome:
    seed: int
    fault: str
    faulty: str  # base or candidate
    decision: str
    reason: str
    message: str
    seconds: float


async def one_run(seed: int) -> RunOutcome:
    rng = random.Random(seed)
    kind = FAULTS[seed % len(FAULTS)]
    faulty = "base" if (seed // len(FAULTS)) % 3 == 0 else "candidate"
    errors = fault_errors(kind, rng)
    base = _profile("base", [[1, 10.0], [64, 20.0]], None, errors if faulty == "base" else {})
    cand = _profile("candidate", [[1, 12.0], [64, 24.0]], 2.5, errors if faulty == "candidate" else {})
    t = time.perf_counter()
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(SimulatorServer(profile_from_dict(base), time_scale=4, seed=seed))
        c = await stack.enter_async_context(SimulatorServer(profile_from_dict(cand), time_scale=4, seed=seed + 10_000))
        result: ProbeResult = await run_probe(b, c, [WORKLOAD], seed=seed, timeout=60, **PROBE_SETTINGS)
    return RunOutcome(seed, kind, faulty, result.decision, result.reason, result.message, round(time.perf_counter() - t, 3))


async def campaign(runs: int = 100, parallel: int = 10, first_seed: int = 0) -> list[RunOutcome]:
    """Run ``runs`` seeded probes, ``parallel`` at a time, on the current event loop."""
    outcomes: list[RunOutcome] = []
    seeds = list(range(first_seed, first_seed + runs))
    for start in range(0, len(seeds), parallel):
        outcomes += await asyncio.gather(*(one_run(s) for s in seeds[start : start + parallel]))
    return outcomes


def summarize(outcomes: list[RunOutcome], wall: float) -> dict:
    by_fault: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    example: dict[str, str] = {}
    for o in outcomes:
        by_fault[o.fault][o.reason] += 1
        example.setdefault(o.fault, o.message[:160])
    return {
        "runs": len(outcomes),
        "promotions": sum(o.decision == "promote" for o in outcomes),
        "without_reason": sum(not o.reason for o in outcomes),
        "reasons": dict(collections.Counter(o.reason for o in outcomes)),
        "by_fault": {k: dict(v) for k, v in sorted(by_fault.items())},
        "example_messages": dict(sorted(example.items())),
        "slowest_run_s": max((o.seconds for o in outcomes), default=0.0),
        "wall_s": round(wall, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=10)
    args = parser.parse_args()
    t = time.perf_counter()
    outcomes = asyncio.run(campaign(args.runs, args.parallel))
    print(json.dumps(summarize(outcomes, time.perf_counter() - t), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
