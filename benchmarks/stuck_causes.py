#!/usr/bin/env python3
"""Time from `apply` to each stuck cause's reason in status, on the real node (results: docs/benchmarks/stuck-causes.md).

The causes and their SpeculativeServers are tests/support/stuck_causes.py's (the ones tests/cluster/test_realnode_stuck.py
asserts): a hostPath `type: Directory` that does not exist (VolumeNotMounted, from the kubelet's FailedMount Event),
a server image from a registry that does not resolve (ImageNotPulled), 16 GPUs on a 12-GPU node (Unschedulable,
from the scheduler), a speculative and a base server that exit at start (CrashLoop, with their last log lines),
and a validator image that cannot be pulled (ImageNotPulled of the init container, the base serving). All six
are applied at once, as in the test; each run uses new namespaces and new operator processes.

For each cause and run: seconds from the create call's return to the first status read (every 0.2 s) whose
condition (BaseReady or SpeculativeReady) has the cause's reason, to status.waitingFor naming it, and to the end
of the wait (phase Failed or RolledBack; spec.progressDeadlineSeconds is 60, the API's minimum).

Starts its own cluster with the real node (hack/devcluster, removed afterwards) and needs root, containerd, runc,
the node tools (`make tools REAL_NODE=1`) and the simulator image (built here by `make images-local
IMAGES=simulator`; a cache hit when unchanged).

Usage: .venv/bin/python benchmarks/stuck_causes.py [--repeat 3] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from hack import devcluster
from tests.support import stuck_causes as sc

MEASURES = (("reason_at", "reason in the condition"), ("waiting_at", "waitingFor names it"), ("ended_at", "wait ended"))


def one_run(api: Any, kubeconfig: str, models: Path, absent: Path, workdir: Path, run: int) -> dict[str, dict[str, Any]]:
    suffix = f"-r{run}"
    causes = [sc.in_namespace(c, suffix) for c in sc.CAUSES]
    ops = sc.operators(kubeconfig, workdir / f"run{run}", suffix)
    for namespace in ops:
        api["core"].create_namespace({"metadata": {"name": namespace}})
    for namespace in ops:
        deadline = time.monotonic() + 30
        while not api["core"].list_namespaced_service_account(namespace).items and time.monotonic() < deadline:
            time.sleep(0.2)
    for op in ops.values():
        op.start()
    time.sleep(3)  # the operators list and watch before the first create (their start is not what is measured)
    try:
        seen = sc.apply_and_record(api["custom"], causes, [sc.server_cr(c, models, absent) for c in causes])
    finally:
        for namespace in ops:  # the operators remove the finalizers, then the namespaces go
            for cause in [c for c in causes if c.namespace == namespace]:
                api["custom"].delete_namespaced_custom_object(sc.GROUP, sc.VERSION, namespace, sc.PLURAL, cause.name)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(api["core"].list_namespaced_pod(ns).items for ns in ops):
            time.sleep(1)
        for op in ops.values():
            op.stop()
        for namespace in ops:
            api["core"].delete_namespace(namespace)
    out = {}
    for cause in causes:
        record = seen[cause.name]
        out[f"{cause.name}/{cause.reason}"] = {
            "reason_at": record.reason_at,
            "waiting_at": record.waiting_at,
            "ended_at": record.ended_at,
            "phase": record.final.get("phase"),
            "final_reason": record.final.get("reason"),
            "condition_message": record.condition.get("message"),
            "waiting_for": record.waiting_for,
        }
    return out


def summary(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key in runs[0]:
        row: dict[str, Any] = {}
        for measure, _ in MEASURES:
            values = [r[key][measure] for r in runs if r[key][measure] is not None]
            missed = len(runs) - len(values)
            row[measure] = {"median": statistics.median(values), "min": min(values), "max": max(values), "missed": missed} if values else None
        row["outcomes"] = sorted({f"{r[key]['phase']} ({r[key]['final_reason']})" for r in runs})
        out[key] = row
    return out


def markdown(command: str, machine: dict[str, Any], timings: dict[str, float], rows: dict[str, dict[str, Any]], runs: int) -> str:
    def cell(value: dict[str, Any] | None) -> str:
        if value is None:
            return "never"
        missed = f", missed {value['missed']}" if value["missed"] else ""
        return f"{value['median']:.1f} s [{value['min']:.1f}, {value['max']:.1f}{missed}]"

    lines = [
        "# Stuck causes on the real node: time from apply to the reason in status",
        "",
        f"Produced by `{command}` ({runs} runs; the raw numbers: stuck-causes.json).",
        f"Machine: {machine['cpus']} CPUs, load average {machine['load']} at the start, {machine['node']}.",
        "Each cell: median [min, max] over the runs, seconds from the create call of the SpeculativeServer (all six",
        "applied at once) to the first status read (every 0.2 s) that shows it. The end of a wait is the phase it ends in",
        "(spec.progressDeadlineSeconds 60, the minimum; a crash-looping speculative server is given up after 3 restarts).",
        "",
        "| cause (SpeculativeServer/reason) | reason in the condition | waitingFor names it | wait ended | outcome |",
        "|---|---|---|---|---|",
    ]
    for key, row in rows.items():
        lines.append(f"| {key} | {cell(row['reason_at'])} | {cell(row['waiting_at'])} | {cell(row['ended_at'])} | {', '.join(row['outcomes'])} |")
    lines += ["", "Set-up of the run (not in the numbers above):", ""]
    lines += [f"- {label}: {seconds:.1f} s" for label, seconds in timings.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="write stuck-causes.json and stuck-causes.md into this directory")
    args = parser.parse_args(argv)
    from kubernetes import client, config

    name = f"bench-stuck-{os.getpid()}"
    load = os.getloadavg()
    try:
        cluster, timings = sc.start_real_node(name, log=lambda m: print(m, file=sys.stderr))
    except sc.SetupError as error:
        print(f"stuck_causes: {error}", file=sys.stderr)
        return 2
    models, absent = sc.models_dir()
    runs = []
    try:
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api = {"core": client.CoreV1Api(api_client), "custom": client.CustomObjectsApi(api_client)}
        with tempfile.TemporaryDirectory(prefix="specdec-stuck-bench-") as workdir:
            for run in range(args.repeat):
                runs.append(one_run(api, str(cluster.kubeconfig), models, absent, Path(workdir), run))
                print(f"run {run + 1}/{args.repeat}: " + json.dumps({k: v["reason_at"] for k, v in runs[-1].items()}), file=sys.stderr)
        api_client.close()
    finally:
        devcluster.down(name, purge=True)
    rows = summary(runs)
    command = "python benchmarks/stuck_causes.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = {
        "cpus": os.cpu_count(),
        "load": f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        "node": f"kubelet v1.35 + containerd 1.6 on {platform.platform()}",
    }
    text = markdown(command.strip(), machine, timings, rows, len(runs))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        raw = {"command": command.strip(), "machine": machine, "setup_seconds": timings, "summary": rows, "runs": runs}
        (args.out / "stuck-causes.json").write_text(json.dumps(raw, indent=2) + "\n")
        (args.out / "stuck-causes.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
