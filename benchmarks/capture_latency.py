"""What the capture proxy (spec.retraining.capture, docs/capture.md) costs a request: the latency it adds (p50 and p99,
whole requests and streamed answers' first byte) and its CPU per 1,000 requests.

The upstream is the SGLang simulator in a process of its own (a fast profile: the proxy, not the server, must show);
the proxy is `specdec capture` in another process (its CPU time is read from /proc). Each client request is sent
directly and through the proxy in turn, in alternating order, so both see the same machine load; the added latency is
the difference of the two distributions' percentiles, and the paired differences' median is printed beside it.

Usage: .venv/bin/python benchmarks/capture_latency.py [--requests 400] [--concurrency 1 16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

from specdec_operator.simulator import SimulatorProcess

PROFILE = {
    "name": "capture-bench",
    "load_seconds": 0,
    "max_running_requests": 1024,
    "prefill_tokens_per_s": 1e7,
    "jitter": 0.0,
    "errors": {},
    "step_ms": [[1, 0.5], [256, 2.0]],
    "speculative": None,
}
# (name, sample share, include responses): the default share, and every request kept with its answer (the worst case).
SETTINGS = [("default-share-0.01", 0.01, False), ("all-requests-with-answers", 1.0, True)]


class CaptureProcess:
    """`specdec capture --port 0` against ``upstream``; the URL from the line it prints once serving."""

    def __init__(self, upstream: str, directory: str, share: float, responses: bool) -> None:
        self.argv = [sys.executable, "-m", "specdec_operator.cli", "capture", "--upstream", upstream, "--dir", directory]
        self.argv += ["--sample-share", str(share), "--max-bytes", str(1 << 30), "--retention-hours", "1", "--port", "0", "--admin-port", "0"]
        self.argv += ["--host", "127.0.0.1", "--writer", "bench", "--seed", "1"] + (["--include-responses"] if responses else [])
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " at " not in line:
            raise RuntimeError(f"specdec capture did not start: {line!r}")
        return line.split(" at ")[1].split()[0]

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def body(i: int, stream: bool) -> dict[str, Any]:
    prompt = f"request {i}: " + " ".join(random.Random(i).choice(["alpha", "beta", "gamma", "delta"]) for _ in range(60))
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "temperature": 0, "stream": stream}


async def one(session: aiohttp.ClientSession, url: str, i: int, stream: bool) -> tuple[float, float]:
    """(seconds to the last byte, seconds to the first byte of the answer)."""
    started = time.perf_counter()
    first = None
    async with session.post(f"{url}/v1/chat/completions", json=body(i, stream)) as r:
        async for _ in r.content.iter_any():
            first = first if first is not None else time.perf_counter() - started
        r.raise_for_status()
    return time.perf_counter() - started, first or 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(direct: str, proxied: str, requests: int, concurrency: int, stream: bool, proxy: CaptureProcess) -> dict[str, Any]:
    times: dict[str, dict[int, tuple[float, float]]] = {"direct": {}, "proxied": {}}
    counter = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in counter:
            order = [("direct", direct), ("proxied", proxied)]
            if i % 2:
                order.reverse()
            for which, url in order:
                times[which][i] = await one(session, url, i, stream)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * concurrency + 4)) as session:
        for i in range(20):  # warm-up: connections, the simulator's and the proxy's first requests
            await one(session, direct, -i, stream)
            await one(session, proxied, -i, stream)
        cpu0 = proxy.cpu_seconds()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        cpu = proxy.cpu_seconds() - cpu0
    out: dict[str, Any] = {"requests": requests, "concurrency": concurrency, "stream": stream}
    for index, what in ((0, "total"), (1, "first_byte")):
        if what == "first_byte" and not stream:
            continue
        d = [times["direct"][i][index] * 1000 for i in range(requests)]
        p = [times["proxied"][i][index] * 1000 for i in range(requests)]
        out[what] = {
            "direct_p50_ms": round(pct(d, 0.5), 3),
            "proxied_p50_ms": round(pct(p, 0.5), 3),
            "added_p50_ms": round(pct(p, 0.5) - pct(d, 0.5), 3),
            "direct_p99_ms": round(pct(d, 0.99), 3),
            "proxied_p99_ms": round(pct(p, 0.99), 3),
            "added_p99_ms": round(pct(p, 0.99) - pct(d, 0.99), 3),
            # The median of each request's own difference (sent both ways at about the same moment).
            "added_paired_median_ms": round(statistics.median(b - a for a, b in zip(d, p, strict=True)), 3),
        }
    out["proxy_cpu_s"] = round(cpu, 3)
    out["proxy_cpu_s_per_1000_requests"] = round(1000 * cpu / requests, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    results = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile.json")
        with open(profile, "w") as f:
            json.dump(PROFILE, f)
        with SimulatorProcess(profile, "--seed", "1") as upstream:
            for name, share, responses in SETTINGS:
                directory = os.path.join(tmp, name)
                proxy = CaptureProcess(upstream, directory, share, responses)
                with proxy as proxied_url:
                    for concurrency in args.concurrency:
                        for stream in (False, True):
                            row = asyncio.run(measure(upstream, proxied_url, args.requests, concurrency, stream, proxy))
                            row = {"setting": name, "sample_share": share, "include_responses": responses, **row}
                            print(json.dumps(row), flush=True)
                            results.append(row)
    report = {
        "command": "benchmarks/capture_latency.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end",
        "seconds": round(time.time() - started, 1),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
