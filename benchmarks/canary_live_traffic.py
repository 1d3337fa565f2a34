"""What a fleet's canary probe measures when its base comparison keeps serving its share of live traffic.

In a fleet (spec.replicas >= 2) the canary (one speculative server) is out of the stable Service while it is
probed, and the probe's comparison is a base server that stays in it (docs/operator.md, "The canary"): the base
server then answers the probe's requests and live requests at once, the canary the probe's only. This script runs
the operator's probe (probe.run_probe, the default confidence) between two simulators of the shipped llama31-8b
profiles while --live concurrent clients stream requests to the base simulator alone (a base server's share of
the fleet's traffic), or to both simulators alike (the canary in the stable Service too, each with its share),
and prints the measured speedup with its interval for each live load.

Usage: .venv/bin/python benchmarks/canary_live_traffic.py [--live 0 4 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack

import aiohttp

from specdec_operator.api import Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.simulator import SimulatorServer, load_profile

WORKLOADS = [
    Workload(name="single-stream", concurrency=1, input_tokens=256, output_tokens=64, requests=4),
    Workload(name="concurrent-16", concurrency=16, input_tokens=256, output_tokens=64, requests=32),
]
TIME_SCALE = 4.0


async def live_client(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    body = {"text": "hello " * 256, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
    while not stop.is_set():
        try:
            async with session.post(f"{url}/generate", data=json.dumps(body), headers={"Content-Type": "application/json"}) as response:
                await response.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)


async def one(live: int, seed: int, both: bool) -> tuple[float | None, float | None, float | None, int, str]:
    async with AsyncExitStack() as stack:
        base = stack.enter_async_context(SimulatorServer(load_profile("llama31-8b-base"), time_scale=TIME_SCALE, seed=seed, load_seconds=0))
        spec = stack.enter_async_context(SimulatorServer(load_profile("llama31-8b-eagle3"), time_scale=TIME_SCALE, seed=seed + 1, load_seconds=0))
        base_url, spec_url = await base, await spec
        session = await stack.enter_async_context(aiohttp.ClientSession())
        stop = asyncio.Event()
        targets = [base_url, spec_url] if both else [base_url]
        clients = [asyncio.create_task(live_client(session, url, stop)) for url in targets for _ in range(live)]
        try:
            result = await run_probe(base_url, spec_url, WORKLOADS, max_rounds=6, seed=seed)
        finally:
            stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
        return result.speedup, result.speedup_low, result.speedup_high, result.rounds, str(result.decision)


def _f(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--live", type=int, nargs="+", default=[0, 4, 16])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"llama31-8b-base vs llama31-8b-eagle3 simulators, time scale {TIME_SCALE}, workloads {[w.name for w in WORKLOADS]}")
    print("live clients per server           speedup [interval]        rounds  decision")
    for live in args.live:
        for both in (False, True) if live else (False,):
            where = "base and canary" if both else "base only"
            for run in range(args.runs):
                started = time.perf_counter()
                speedup, low, high, rounds, decision = asyncio.run(one(live, 11 + run, both))
                elapsed = time.perf_counter() - started
                print(
                    f"  {live:3d} on {where:15s} (run {run + 1})  {_f(speedup)} [{_f(low)}, {_f(high)}]   {rounds:3d}    {decision}  ({elapsed:.0f} s)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
