"""How much CPU the probe's client spends per 1,000 streamed tokens, and how many tok/s one core sustains.

The simulator runs in its own process (so it does not share the client's core); the client measures with
``time.process_time()`` around one ``measure()`` call. Two stream shapes:

* ``base``: one token per SSE event (SGLang's default ``stream_interval`` 1, no speculation) - the worst
  case for a client, since every token is an HTTP chunk and a JSON document with cumulative output.
* ``spec``: a speculative server with ~3.5 tokens per verify step, which SGLang sends as one event.

Usage: .venv/bin/python benchmarks/probe_client_cpu.py [--concurrency 64] [--output-tokens 256] [--requests 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

import aiohttp

from specdec_operator.api import Workload
from specdec_operator.probe.client import measure
from specdec_operator.simulator import SimulatorProcess

PROFILES = {
    # A fast fake GPU: the client, not the server, must be the limit.
    "base": {"step_ms": [[1, 0.5], [256, 2.0]], "speculative": None},
    "spec": {
        "step_ms": [[1, 1.0], [256, 6.0]],
        "speculative": {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": 3.5},
    },
}


def simulator_process(kind: str, tmp: str) -> SimulatorProcess:
    profile = {
        "name": f"cpu-{kind}",
        "load_seconds": 0,
        "max_running_requests": 1024,
        "prefill_tokens_per_s": 1e7,
        "jitter": 0.0,
        "errors": {},
        **PROFILES[kind],
    }
    path = os.path.join(tmp, f"{kind}.json")
    with open(path, "w") as f:
        json.dump(profile, f)
    return SimulatorProcess(path, "--seed", "1")


async def run(url: str, workload: Workload) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=workload.concurrency + 8)) as session:
        # Warm-up (connection pool, JIT-free but allocator and caches).
        await measure(session, url, Workload(name="warm", concurrency=8, input_tokens=16, output_tokens=16, requests=16), rng=random.Random(0))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        m = await measure(session, url, workload, rng=random.Random(1))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "tokens": m.output_tokens,
        "events": len(m.itl_pairs) + m.requests,
        "wall_s": round(wall, 3),
        "client_cpu_s": round(cpu, 3),
        "tok_s": round(m.output_tokens / wall),
        "client_cpu_ms_per_1000_tokens": round(1000 * cpu / m.output_tokens * 1000, 2),
        "client_tok_s_per_core": round(m.output_tokens / cpu),
        "client_core_utilisation": round(cpu / wall, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=256)
    args = parser.parse_args()
    workload = Workload(
        name="cpu", concurrency=args.concurrency, input_tokens=args.input_tokens, output_tokens=args.output_tokens, requests=args.requests
    )
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("base", "spec"):
            with simulator_process(kind, tmp) as url:
                result = asyncio.run(run(url, workload))
            print(json.dumps({"stream": kind, "concurrency": args.concurrency, "output_tokens": args.output_tokens, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
