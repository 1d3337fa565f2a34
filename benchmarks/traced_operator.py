"""Run `specdec run` under tracemalloc; SIGUSR1 writes where the live memory was allocated.

Used by `benchmarks/scale.py --trace-memory` to find what the operator's RSS is made of:

    python benchmarks/traced_operator.py OUTPUT_FILE run --all-namespaces ...

SIGUSR2 starts tracing (the benchmark sends it right before it creates the resources: tracing Kopf's start-up
as well slowed it down by minutes); each SIGUSR1 then appends the 40 largest sites of memory allocated since
and still alive (grouped by traceback of 6 frames) to OUTPUT_FILE: what the resources cost. tracemalloc slows
allocation down and adds its own memory, so RSS and timings of a traced run are not comparable with an
untraced one.
"""

from __future__ import annotations

import signal
import sys
import time
import tracemalloc


def main() -> int:
    output, argv = sys.argv[1], sys.argv[2:]

    def start(*_: object) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(6)

    def dump(*_: object) -> None:
        if not tracemalloc.is_tracing():
            return
        snapshot = tracemalloc.take_snapshot().filter_traces([
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
        ])
        stats = snapshot.statistics("traceback")
        total = sum(s.size for s in stats)
        with open(output, "a") as out:
            out.write(f"=== {time.strftime('%H:%M:%S')}: {total / 2**20:.1f} MiB traced in {len(stats)} sites\n")
            for stat in stats[:40]:
                out.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} blocks\n")
                for line in stat.traceback.format(limit=6, most_recent_first=True):
                    out.write(f"    {line}\n")
            by_file = snapshot.statistics("filename")
            out.write("--- by file\n")
            for stat in by_file[:25]:
                out.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} {stat.traceback[0].filename}\n")

    signal.signal(signal.SIGUSR2, start)
    signal.signal(signal.SIGUSR1, dump)
    from specdec_operator.cli import main as specdec

    return specdec(argv)


if __name__ == "__main__":
    sys.exit(main())
