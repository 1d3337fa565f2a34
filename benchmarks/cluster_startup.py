#!/usr/bin/env python3
"""Time the local control plane's lifecycle with the tools already built (results: docs/development.md).

Measures, for a throwaway cluster name: `hack/tools.sh` when everything is built, `up` of a new cluster
(certificates generated), `up` after `down` (certificates and ports kept), `up` of a running cluster, and `down`.
Prints one line per measurement (median and range over --repeat runs) and the machine's load average, because on a
shared 2-core machine the numbers move with it.

    python3 benchmarks/cluster_startup.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
import devcluster


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    args = parser.parse_args(argv)
    missing = devcluster.missing_tools()
    if missing:
        print(f"cluster_startup: tools missing ({', '.join(missing)}): run `make tools`", file=sys.stderr)
        return 2

    name = f"bench-{os.getpid()}"
    results: dict[str, list[float]] = {}

    def record(label: str, seconds: float) -> None:
        results.setdefault(label, []).append(seconds)

    try:
        for _ in range(args.repeat):
            record("hack/tools.sh (all built)", timed(lambda: subprocess.run([str(REPO / "hack" / "tools.sh")], check=True, capture_output=True)))
            devcluster.down(name, purge=True)
            record("up, new cluster (PKI generated)", timed(lambda: devcluster.up(name, tie_to_parent=True)))
            record("up, already running", timed(lambda: devcluster.up(name, tie_to_parent=True)))
            record("down", timed(lambda: devcluster.down(name)))
            record("up after down (PKI, ports kept)", timed(lambda: devcluster.up(name, tie_to_parent=True)))
    finally:
        devcluster.down(name, purge=True)

    load = os.getloadavg()
    print(f"# {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {args.repeat} runs")
    for label, values in results.items():
        print(f"{label:<36} median {statistics.median(values):6.2f} s   min {min(values):6.2f} s   max {max(values):6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
