"""How fast is `specdec validate`, and how many bytes does it read, on a Kimi-sized pair?

Builds (in a temporary directory, sparse files, a few MiB of real disk):
- a 61-layer Kimi-K2.5 INT4 target (the VL wrapper, text_config, compressed-tensors) whose
  model.safetensors.index.json lists the real tensor layout (61 layers x 384 experts, ~140k names)
  over 64 shards;
- a Kimi-sized EAGLE-3 drafter (hidden 7168, 32k draft vocabulary) whose model.safetensors header
  declares ~2 GB of tensors over a sparse data area;
and times validation in-process (median of repeated runs, page cache warm) and end to end as the
init container runs it (`python -m specdec_operator.cli validate`, interpreter start-up included).
It also times the NEXTN path on a DeepSeek-V3 target, the one case that must read the target's
(multi-MiB) index to find the MTP layers.

Usage: python benchmarks/validate_speed.py [--runs 50] [--cli-runs 10]
Goal: under 200 ms and under 1 MB read per pair.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: model directories
sys.path.insert(0, str(ROOT / "operator"))

from specdec_operator import validator
from specdec_operator.validator.modelmeta import MetaReader
from tests.support import model_dirs as md


def time_in_process(args: argparse.Namespace, runs: int) -> tuple[list[float], int, validator.ValidationReport]:
    samples: list[float] = []
    bytes_read = 0
    report = None
    for _ in range(runs):
        reader = MetaReader()
        start = time.perf_counter()
        report, reader = validator.run(args, reader)
        samples.append(time.perf_counter() - start)
        bytes_read = reader.bytes_read
    assert report is not None
    return samples, bytes_read, report


def time_cli(argv: list[str], runs: int) -> tuple[list[float], int]:
    """Wall time of whole `specdec validate` processes, and their peak RSS (KiB) from wait4."""
    samples: list[float] = []
    max_rss_kib = 0
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdec_operator.cli", "validate", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        samples.append(time.perf_counter() - start)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"validate failed: {err.decode()}")
        max_rss_kib = max(max_rss_kib, usage.ru_maxrss)
    return samples, max_rss_kib


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def disk_usage(path: Path) -> tuple[int, int]:
    apparent = allocated = 0
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def build(root: Path) -> None:
    """Write the fixtures (run in a child process so the timing parent stays small: a forked child's
    peak RSS starts at its parent's)."""
    md.make_target(root / "Kimi-K2.5", md.kimi_k25(), tokenizer_config=md.KIMI_TOKENIZER, shards=64, experts=None)
    md.make_drafter(root / "Kimi-K2.5-eagle3", md.kimi_drafter_config(), provenance=md.provenance(), tokenizer_config=md.KIMI_TOKENIZER)
    md.make_target(root / "DeepSeek-V3", md.DEEPSEEK_V3, shards=163, experts=None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cli-runs", type=int, default=10)
    parser.add_argument("--build", metavar="DIR", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.build:
        build(Path(opts.build))
        return 0

    with tempfile.TemporaryDirectory(prefix="validate-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--build", tmp], check=True)
        build_s = time.perf_counter() - t0
        target, drafter, deepseek = root / "Kimi-K2.5", root / "Kimi-K2.5-eagle3", root / "DeepSeek-V3"
        index_bytes = (target / "model.safetensors.index.json").stat().st_size
        ds_index_bytes = (deepseek / "model.safetensors.index.json").stat().st_size
        d_apparent, d_alloc = disk_usage(drafter)

        cases = [
            ("EAGLE3: Kimi-K2.5 INT4 target + Kimi-sized drafter", str(target), str(drafter), "EAGLE3"),
            ("NEXTN: DeepSeek-V3 target (reads its index for MTP layers)", str(deepseek), str(deepseek), "NEXTN"),
        ]
        print(f"sglang tables: {validator.SGLANG_VERSION}; python {sys.version.split()[0]}; built fixtures in {build_s:.1f} s")
        print(
            f"target index: {index_bytes / 2**20:.1f} MiB, 64 shards; DeepSeek-V3 index: {ds_index_bytes / 2**20:.1f} MiB, "
            f"163 shards; drafter: {d_apparent / 2**30:.2f} GiB declared, {d_alloc / 2**10:.0f} KiB on disk"
        )
        print()
        print("| case | in-process median | p95 | CLI median (process) | CLI p95 | CLI peak RSS | bytes read | files | verdict |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, t, d, algo in cases:
            argv = ["--target", t, "--drafter", d, "--algorithm", algo]
            cli_samples, max_rss = time_cli(argv, opts.cli_runs)  # before in-process runs grow this process
            args = validator.build_parser().parse_args(argv)
            samples, nbytes, report = time_in_process(args, opts.runs)
            reader = MetaReader()
            validator.run(args, reader)
            verdict = "compatible" if report.compatible else "incompatible"
            print(
                f"| {name} | {ms(samples, 0.5):.2f} ms | {ms(samples, 0.95):.2f} ms | "
                f"{ms(cli_samples, 0.5):.0f} ms | {ms(cli_samples, 0.95):.0f} ms | {max_rss / 1024:.1f} MiB | {nbytes:,} B | "
                f"{reader.files_read} | {verdict} |"
            )
        baseline: list[float] = []
        for _ in range(opts.cli_runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            baseline.append(time.perf_counter() - start)
        print()
        print(f"interpreter start-up alone (`python -c pass`): median {ms(baseline, 0.5):.0f} ms, p95 {ms(baseline, 0.95):.0f} ms")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
