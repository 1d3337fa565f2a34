"""What a decision cost, before and after (issue 32, item 5): GPU-seconds of the demo's decisions and core-seconds of
the real-engine tier's, by one formula for every checkout: the GPUs (or cores) the two probed servers declare times
the probe's time.

  sps FILE [FILE ...]     a table from `kubectl get sps -o json` of make demo's namespace (hack/demo.py --keep): per
                          resource, the probed GPUs (2 x resources.gpus x resources.nodes), the probe's time from its
                          startedAt/finishedAt (a load-aware decision: its plain probe's too), GPU-seconds by the
                          formula, status.probe.gpuSeconds where the operator wrote it, and in simulated GPU time
                          (the demo's simulators run --time-scale times faster than the profile's GPUs)
  vllm --old DIR          `specdec probe --engine vllm` of the real-engine tier's servers (vLLM's CPU build, one
                          core each: tests/support/vllm_servers.py), the old checkout's (DIR/operator on PYTHONPATH)
                          and this one's in alternation, the same command each time; core-seconds = 2 cores x the
                          probe's wall_seconds, and this checkout's own core_seconds (--base-cores 1 --speculative-cores 1)

Usage:
  .venv/bin/python benchmarks/decision_cost.py sps before.json after.json --labels before after
  .venv/bin/python benchmarks/decision_cost.py vllm --old /tmp/old --repeat 2 --out docs/benchmarks/probe-gpu-seconds-vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# hack/demo.py's time scales: how much faster than the profile's GPUs each case's simulators run.
DEMO_TIME_SCALE = {"kimi-k25": 5.0, "kimi-k25-public-drafter": 5.0, "llama31-8b": 10.0, "llama31-8b-wide-drafter": 5.0}


def _seconds(probe: dict[str, Any]) -> float | None:
    start, end = probe.get("startedAt"), probe.get("finishedAt")
    if not start or not end:
        return None
    parse = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def decision_row(item: dict[str, Any]) -> dict[str, Any] | None:
    """One decided resource: its probes' time and GPU-seconds by the formula (None: no probe ran)."""
    spec, st = item.get("spec") or {}, item.get("status") or {}
    probe = st.get("probe") or {}
    if not probe.get("decision") or not probe.get("startedAt"):
        return None
    resources = spec.get("resources") or {}
    gpus = 2 * int(resources.get("gpus", 8)) * int(resources.get("nodes", 1))
    plain = (probe.get("loadAware") or {}).get("plainProbe")
    probes = [p for p in (plain, probe) if p]
    seconds = [_seconds(p) for p in probes]
    total = sum(s for s in seconds if s is not None)
    name = item["metadata"]["name"]
    scale = DEMO_TIME_SCALE.get(name, 1.0)
    return {
        "name": name,
        "phase": st.get("phase"),
        "reason": probe.get("reason"),
        "rounds": [p.get("rounds") for p in probes],
        "probed_gpus": gpus,
        "probe_seconds": seconds,
        "gpu_seconds_formula": gpus * total,
        "gpu_seconds_status": probe.get("gpuSeconds"),
        "time_scale": scale,
        "simulated_gpu_hours": round(gpus * total * scale / 3600, 2),
    }


def sps(files: list[str], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, path in zip(labels, files):
        items = json.loads(Path(path).read_text())["items"]
        # The demo's four probed decisions (the wrong drafter never runs; the fleet's walk is another story).
        out[label] = [row for item in items if item["metadata"]["name"] in DEMO_TIME_SCALE and (row := decision_row(item)) is not None]
    return out


def render_sps(report: dict[str, Any]) -> str:
    lines = [
        "| run | resource | decision | rounds (plain, adaptive) | probe s | probed GPUs | GPU-seconds (formula) | status.probe.gpuSeconds | simulated GPU-hours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in report.items():
        for r in rows:
            status = "-" if r["gpu_seconds_status"] is None else f"{r['gpu_seconds_status']:,.1f}"
            secs = " + ".join(f"{s:g}" for s in r["probe_seconds"] if s is not None)
            lines.append(
                f"| {label} | {r['name']} | {r['phase']} ({r['reason']}) | {', '.join(str(x) for x in r['rounds'])} | {secs} | "
                f"{r['probed_gpus']} | {r['gpu_seconds_formula']:,.0f} | {status} | {r['simulated_gpu_hours']:.2f} |"
            )
        total = sum(r["gpu_seconds_formula"] for r in rows)
        hours = sum(r["simulated_gpu_hours"] for r in rows)
        lines.append(f"| {label} | **all {len(rows)}** | | | | | **{total:,.0f}** | | **{hours:.2f}** |")
    return "\n".join(lines) + "\n"


# --- the real-engine tier ----------------------------------------------------------------------------------------


def _probe(pythonpath: Path, base: str, speculative: str, extra: list[str], work: Path, tag: str) -> dict[str, Any]:
    from tests.support.real_engine import BUILD

    cmd = [sys.executable, "-m", "specdec_operator.cli", "probe", "--engine", "vllm", "--base", base, "--speculative", speculative, "--json"]
    cmd += ["--workload", f"single-stream:1:64:{BUILD['max_new_tokens']}:16", "--max-rounds", "10", "--accept-length-floor", "2.0", "--quiet"]
    cmd += extra
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    (work / f"probe-{tag}.log").write_text(proc.stdout + proc.stderr)
    row: dict[str, Any] = {"command": " ".join(cmd[2:]), "pythonpath": str(pythonpath), "exit": proc.returncode}
    row["process_seconds"] = round(time.monotonic() - t0, 1)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["stderr"] = proc.stderr.strip()[-1500:]
        return row
    keep = ("decision", "reason", "rounds", "speedup", "speedup_low", "speedup_high", "accept_length", "wall_seconds", "gpu_seconds", "core_seconds")
    row.update({k: result.get(k) for k in keep})
    row["core_seconds_formula"] = round(2 * result["wall_seconds"], 3) if result.get("wall_seconds") is not None else None
    return row


def vllm(old: Path, repeat: int, work: Path, models_dir: Path | None = None, new: Path = REPO) -> dict[str, Any]:
    from tests.support.real_engine import RealEngineModels, real_engine_models
    from tests.support.vllm_servers import VllmServer, start_servers

    work.mkdir(parents=True, exist_ok=True)
    # --models: a finished build of the tier's models (its key is a hash of the pipeline's sources, which other work
    # may change meanwhile; the comparison needs the same servers for both checkouts, not the newest build).
    models = RealEngineModels(models_dir) if models_dir is not None else real_engine_models()
    target = models.target("a")
    wanted = [
        VllmServer("base", target, work / "base.log", core="0"),
        VllmServer("matched", target, work / "matched.log", drafter=models.drafter("a", "vllm"), core="1"),
        VllmServer("other-target", target, work / "other-target.log", drafter=models.drafter("b", "vllm"), core="1"),
    ]
    servers = {s.name: s for s in start_servers(wanted)}
    report: dict[str, Any] = {"servers": {n: {"core": s.core, "ready_s": round(s.ready_s or 0, 1)} for n, s in servers.items()}, "probes": []}
    declared = ["--base-gpus", "0", "--speculative-gpus", "0", "--base-cores", "1", "--speculative-cores", "1"]
    try:
        for i in range(repeat):
            for pair in ("matched", "other-target"):
                # Alternate which checkout goes first, so drift on the machine hits both.
                order = [("before", old / "operator", []), ("after", new / "operator", declared)]
                for label, path, extra in order if i % 2 == 0 else order[::-1]:
                    row = _probe(path, servers["base"].url, servers[pair].url, extra, work, f"{label}-{pair}-{i}")
                    row.update({"run": label, "pair": f"base vs {pair}", "repeat": i})
                    report["probes"].append(row)
                    print(
                        json.dumps({k: row.get(k) for k in ("run", "pair", "decision", "reason", "rounds", "wall_seconds", "core_seconds")}),
                        flush=True,
                    )
    finally:
        for s in wanted:
            s.stop()
    return report


def render_vllm(report: dict[str, Any]) -> str:
    lines = [
        "| run | pair | repeat | decision | rounds | speedup [interval] | probe s | core-seconds (2 x s) | core_seconds printed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["probes"]:
        interval = f"{r.get('speedup')} [{r.get('speedup_low')}, {r.get('speedup_high')}]"
        printed = "-" if r.get("core_seconds") is None else f"{r['core_seconds']:.1f}"
        wall = r.get("wall_seconds")
        formula = r.get("core_seconds_formula")
        lines.append(
            f"| {r['run']} | {r['pair']} | {r['repeat']} | {r.get('decision')} ({r.get('reason')}) | {r.get('rounds')} | {interval} | "
            f"{'-' if wall is None else f'{wall:.1f}'} | {'-' if formula is None else f'{formula:.1f}'} | {printed} |"
        )
    for run in ("before", "after"):
        for pair in sorted({r["pair"] for r in report["probes"]}):
            rows = [r for r in report["probes"] if r["run"] == run and r["pair"] == pair and r.get("core_seconds_formula") is not None]
            if rows:
                mean = sum(r["core_seconds_formula"] for r in rows) / len(rows)
                lines.append(f"| {run} | {pair} | mean of {len(rows)} | | | | | **{mean:.1f}** | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sps")
    s.add_argument("files", nargs="+")
    s.add_argument("--labels", nargs="+")
    s.add_argument("--out")
    v = sub.add_parser("vllm")
    v.add_argument("--old", required=True, type=Path, help="the old checkout (its operator/ goes on PYTHONPATH)")
    v.add_argument("--new", type=Path, default=REPO, help="the new checkout (default this one; e.g. `git archive HEAD operator` unpacked)")
    v.add_argument("--repeat", type=int, default=2)
    v.add_argument("--work", type=Path, default=Path("/tmp/decision-cost-vllm"))
    v.add_argument("--out")
    v.add_argument("--models", type=Path, help="a built real-engine directory (default: the current pipeline's, built if missing)")
    r = sub.add_parser("render")
    r.add_argument("json")
    args = ap.parse_args()
    if args.cmd == "render":
        report = json.loads(Path(args.json).read_text())
        print(render_vllm(report) if "probes" in report else render_sps(report), end="")
        return 0
    if args.cmd == "sps":
        labels = args.labels or [Path(f).stem for f in args.files]
        report = sps(args.files, labels)
        text = render_sps(report)
    else:
        report = vllm(args.old, args.repeat, args.work, args.models, args.new)
        text = render_vllm(report)
    report_out = (
        {**report, "command": " ".join([Path(sys.executable).name, *sys.argv])} if isinstance(report, dict) and "probes" in report else report
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report_out, indent=1) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
