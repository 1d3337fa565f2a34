#!/usr/bin/env python3
"""How long one drift-monitor round takes for a fleet: ProbeScheduler.scrape over N speculative pods.

Each pod is an HTTP server on loopback answering /metrics with a real simulator's exposition (the
llama31-8b-eagle3 profile after some traffic, ~120 series) after --latency seconds (a remote pod's network and
exposition time). The operator's own code scrapes them with --max-concurrent-scrapes at 1 (one pod after the
other), 8 and 32, and the round's wall time and the process CPU per pod scraped are printed (the CPU includes the
in-process servers' side). Results: docs/benchmarks/fleet-scrape.txt.

    python3 benchmarks/fleet_scrape.py [--pods 40] [--latency 0.05] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from aiohttp import web

from specdec_operator.controller.config import Endpoints, OperatorConfig
from specdec_operator.controller.probescheduler import ProbeScheduler
from specdec_operator.simulator import SimulatorServer, load_profile


async def exposition() -> str:
    """A real simulator's /metrics after a few requests."""
    import aiohttp

    server = SimulatorServer(load_profile("llama31-8b-eagle3"), port=0, time_scale=50.0, seed=1, load_seconds=0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                body = {"text": "hello " * 16, "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}
                async with session.post(server.url + "/generate", json=body) as resp:
                    await resp.read()
            async with session.get(server.url + "/metrics") as resp:
                return await resp.text()
    finally:
        await server.stop()


async def main(pods: int, latency: float, repeat: int) -> None:
    text = await exposition()

    async def metrics(_request: web.Request) -> web.Response:
        await asyncio.sleep(latency)
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{pod}/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    mapping = {f"bench/pod/fleet-spec-{i}": f"http://127.0.0.1:{port}/{i}" for i in range(pods)}
    names = {f"fleet-spec-{i}": None for i in range(pods)}
    print(f"{pods} pods, {latency * 1000:.0f} ms per /metrics answer, {len(text.splitlines())} exposition lines, load {os.getloadavg()[0]:.2f}")
    for bound in (1, 8, 32):
        scheduler = ProbeScheduler(OperatorConfig(endpoints=Endpoints(mapping), max_concurrent_scrapes=bound))
        walls, cpus = [], []
        try:
            await scheduler.scrape(("bench", "fleet"), names)  # warm the connection pool
            for _ in range(repeat):
                wall, cpu = time.perf_counter(), time.process_time()
                samples = await scheduler.scrape(("bench", "fleet"), names)
                walls.append(time.perf_counter() - wall)
                cpus.append((time.process_time() - cpu) / pods)
                assert all(s.error is None and s.accept_length for s in samples.values()), samples
        finally:
            await scheduler.close()
        print(
            f"  --max-concurrent-scrapes {bound:>2}: round {statistics.median(walls) * 1000:7.1f} ms "
            f"(range {min(walls) * 1000:.1f}-{max(walls) * 1000:.1f}), CPU {statistics.median(cpus) * 1000:.2f} ms per pod"
        )
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.pods, args.latency, args.repeat))
