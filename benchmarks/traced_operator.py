"""Run `specdec run` so that its memory can be explained: SIGUSR1 writes a report to OUTPUT_FILE.

Used by `benchmarks/scale.py --memory-report FILE [--trace-allocations]`:

    python benchmarks/traced_operator.py OUTPUT_FILE run --all-namespaces ...

Each SIGUSR1 appends a census of the live Python objects (count and shallow size per type, the 40 largest) and
RSS. SIGUSR2 starts tracemalloc; from then on the report also lists the 40 largest sites of memory allocated
since and still alive (tracebacks of 6 frames). Tracing is not started at launch because tracing Kopf's start-up
took minutes, and it slows a loaded operator several-fold (a 200-resource run did not settle in 15 minutes), so
timings of a traced run say nothing; the census costs a pause of about a second per report and nothing else.
"""

from __future__ import annotations

import gc
import signal
import sys
import time
import tracemalloc
from collections import Counter


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def census(out) -> None:
    counts: Counter = Counter()
    sizes: Counter = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}"
        counts[name] += 1
        try:
            sizes[name] += sys.getsizeof(obj)
        except TypeError:
            pass
    out.write(f"--- census: {sum(counts.values())} objects tracked by the GC, {sum(sizes.values()) / 2**20:.1f} MiB shallow\n")
    for name, size in sizes.most_common(40):
        out.write(f"{size / 2**20:8.2f} MiB {counts[name]:9d} {name}\n")


def allocation_sites(out) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("traceback")
    out.write(f"--- allocation sites: {sum(s.size for s in stats) / 2**20:.1f} MiB traced in {len(stats)} sites\n")
    for stat in stats[:40]:
        out.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} blocks\n")
        for line in stat.traceback.format(limit=6, most_recent_first=True):
            out.write(f"    {line}\n")


def main() -> int:
    output, argv = sys.argv[1], sys.argv[2:]

    def start(*_: object) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(6)

    def report(*_: object) -> None:
        with open(output, "a") as out:
            out.write(f"=== {time.strftime('%H:%M:%S')}: RSS {_rss_mb():.1f} MiB\n")
            census(out)
            if tracemalloc.is_tracing():
                allocation_sites(out)

    signal.signal(signal.SIGUSR2, start)
    signal.signal(signal.SIGUSR1, report)
    from specdec_operator.cli import main as specdec

    return specdec(argv)


if __name__ == "__main__":
    sys.exit(main())
