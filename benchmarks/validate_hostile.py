"""Time and memory of `specdec validate` on hostile model directories.

Every case of tests/support/hostile_dirs.py (truncated safetensors headers, a header claiming 2^60 bytes, a
100 MB config.json, symlink loops, FIFOs, /dev/zero, non-UTF-8 names, ...) plus a few whole-directory
cases is built in a temporary directory, then validated by the real CLI in a fresh process per run.
Printed per case: exit status, whether stderr was exactly one line, wall time (median of --runs) and
the process's peak RSS (wait4). Fixtures are built in a child process so that the measuring parent
stays small (a forked child's peak RSS starts at its parent's).

Usage: python benchmarks/validate_hostile.py [--runs 5]
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
sys.path.insert(0, str(ROOT))  # tests.support: the hostile cases, model directories
sys.path.insert(0, str(ROOT / "operator"))

EXTRA_CASES = ("drafter-dir-symlink-loop", "non-utf8-dir-name", "full-moe-model-as-drafter", "24k-tensors-3-shards")


def build(root: Path) -> None:
    from tests.support import hostile_dirs as hd
    from tests.support import model_dirs as md

    md.make_target(root / "target", md.kimi_k25(), tokenizer_config=md.KIMI_TOKENIZER)
    for name, (breaker, _) in hd.CASES.items():
        breaker(hd.good_drafter(root / "cases" / name))
    os.symlink(root / "loop-b", root / "cases" / "drafter-dir-symlink-loop")
    os.symlink(root / "cases" / "drafter-dir-symlink-loop", root / "loop-b")
    os.mkdir(os.fsencode(root / "cases") + b"/non-utf8-dir-name-\xff\xfe")
    md.make_target(root / "cases" / "full-moe-model-as-drafter", md.KIMI_K2, shards=64, experts=None)
    hd.spread_over_shards(hd.good_drafter(root / "cases" / "24k-tensors-3-shards"))


def run_once(target: Path, drafter: bytes) -> tuple[int, float, int, bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    argv = [os.fsencode(sys.executable), b"-m", b"specdec_operator.cli", b"validate", b"--target", os.fsencode(target), b"--drafter", drafter]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()  # both small: stderr is one line
    _, status, usage = os.wait4(proc.pid, 0)  # reap it ourselves to get its rusage
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code == 1:  # incompatible: the report is on stdout; show its first error
        lines = [ln.strip() for ln in out.decode("utf-8", "replace").splitlines() if ln.strip().startswith("error")]
        err = (lines[0] if lines else "").encode()
    return code, time.perf_counter() - start, usage.ru_maxrss, err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--build", metavar="DIR", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.build:
        build(Path(opts.build))
        return 0

    from tests.support import hostile_dirs as hd

    with tempfile.TemporaryDirectory(prefix="validate-hostile-") as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, __file__, "--build", tmp], check=True)
        names = [*hd.CASES, *EXTRA_CASES]
        paths = {n: os.fsencode(root / "cases" / n) for n in names}
        paths["non-utf8-dir-name"] = os.fsencode(root / "cases") + b"/non-utf8-dir-name-\xff\xfe"
        print(f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; {opts.runs} runs per case")
        print()
        print("| case | exit | one line | median wall | max wall | peak RSS | message |")
        print("|---|---|---|---|---|---|---|")
        worst_wall = worst_rss = 0.0
        for name in names:
            walls, rss, codes, err = [], 0, set(), b""
            for _ in range(opts.runs):
                code, wall, maxrss, err = run_once(root / "target", paths[name])
                walls.append(wall)
                rss = max(rss, maxrss)
                codes.add(code)
            text = err.decode("utf-8", "replace").strip()
            one_line = len(text.splitlines()) == 1 and "Traceback" not in text
            walls.sort()
            worst_wall, worst_rss = max(worst_wall, walls[-1]), max(worst_rss, rss)
            shown = text.replace(tmp, "$TMP").replace("|", "\\|")
            shown = shown if len(shown) <= 110 else shown[:107] + "..."
            print(
                f"| {name} | {','.join(map(str, sorted(codes)))} | {'yes' if one_line else 'NO'} | "
                f"{1000 * walls[len(walls) // 2]:.0f} ms | {1000 * walls[-1]:.0f} ms | {rss / 1024:.1f} MiB | {shown} |"
            )
        print()
        print(f"worst case: {1000 * worst_wall:.0f} ms wall, {worst_rss / 1024:.1f} MiB peak RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
