"""Equal servers: how often does the probe promote (or reject) two identical simulated servers?

Equal simulators with step jitter 5 %, a small workload, time scale 4, max_rounds 5 (the real-time setup that
tests/unit/test_probe.py's equal-servers test had before it moved to recorded rounds), repeated over many seeds, 5
probes at a time.

Usage: .venv/bin/python benchmarks/probe_null.py [--runs 200] [--confidence 0.998]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from contextlib import AsyncExitStack

from specdec_operator.api import Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.probe.run import DEFAULT_CONFIDENCE
from specdec_operator.simulator import SimulatorServer, profile_from_dict

EQUAL = profile_from_dict(
    {
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
)
WORKLOADS = [Workload(name="small", concurrency=4, input_tokens=16, output_tokens=32, requests=8)]


async def one(seed: int, confidence: float):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(SimulatorServer(EQUAL, time_scale=4, seed=seed, load_seconds=0))
        b = await stack.enter_async_context(SimulatorServer(EQUAL, time_scale=4, seed=seed + 1000, load_seconds=0))
        return await run_probe(a, b, WORKLOADS, seed=seed, max_rounds=5, confidence=confidence)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    args = parser.parse_args()
    t = time.perf_counter()
    results = []
    seeds = list(range(args.first_seed, args.first_seed + args.runs))

    async def batch(chunk):
        return await asyncio.gather(*(one(s, args.confidence) for s in chunk))

    for start in range(0, len(seeds), 5):
        results += asyncio.run(batch(seeds[start : start + 5]))
    print(
        json.dumps(
            {
                "runs": len(results),
                "confidence": args.confidence,
                "reasons": dict(collections.Counter(r.reason for r in results)),
                "wall_s": round(time.perf_counter() - t, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
