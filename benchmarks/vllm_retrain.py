"""The retraining loop on vLLM's CPU build (issue 36, item 5): a traffic shift makes a drafter's acceptance fall, and a
drafter retrained from the captured traffic by the training Job's own stages makes it recover.

    .venv/bin/python benchmarks/vllm_retrain.py --out docs/benchmarks/vllm-retrain.json

1. The copy target serves on vLLM with an EAGLE-3 drafter trained on free traffic only (tests/support/retrain_models.py),
   behind the capture proxy (`specdec capture`, every request sampled: sampleShare 1.0).
2. Free traffic (its kind): acceptance before the shift. Then the traffic shifts to copy prompts: the captured ones
   (the training data) and a fixed evaluation set, sent to the server directly (not captured): acceptance after it.
3. The training Job's pod as the operator renders it (trainjob.training_job: gather, regenerate, capture, train,
   export, validate, evaluate, publish) runs here as processes through hack/job_pod.py, its /capture the proxy's
   directory, its base Service the serving server (greedy speculative decoding answers what the base does), with
   tests/support/retrain_loop.EXTRA_ARGS appended (the tiny drafter's learning rate and batch; answers of 48 tokens).
4. The server stops; a server of the published revision starts; the evaluation set and free traffic again.

One vLLM server at a time, pinned to one core, at nice 10; the stages at nice 10. Acceptance is vLLM's own counters.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.capture_latency import CaptureProcess
from tests.support.copy_workloads import copy_workload
from tests.support.retrain_loop import SPEC_TOKENS, chat_acceptance, run_training_pod, training_pod
from tests.support.retrain_models import DRAFTER, TARGET, free_prompts, retrain_models
from tests.support.vllm_servers import START_DEADLINE_S, VllmServer

NICE = 10


def serve(name: str, models: Path, drafter: Path, logs: Path) -> VllmServer:
    """One vLLM server of the copy target with `drafter`, at nice 10, once it answers /health."""
    server = VllmServer(name, models / TARGET, logs / f"{name}.log", drafter=drafter, core="0", num_speculative_tokens=SPEC_TOKENS)
    server.start()
    os.setpriority(os.PRIO_PGRP, server.proc.pid, NICE)  # before the engine core forks: it inherits the nice level
    deadline = time.monotonic() + START_DEADLINE_S
    try:
        while not server.poll_ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM server {name} not ready after {START_DEADLINE_S:.0f}s; its log ({server.log}) ends:\n{server.log_tail()}")
            time.sleep(1)
    except BaseException:
        server.stop()
        raise
    return server


def shift_and_capture(server: VllmServer, capture_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Free traffic, then copy traffic, through the proxy; the evaluation set direct. Acceptance of each."""
    out: dict[str, Any] = {}
    with CaptureProcess(server.url, str(capture_dir), 1.0, False) as proxy:
        out["before_shift_free"] = chat_acceptance(proxy, server.url, free_prompts(args.free, seed=100))
        out["after_shift_captured_copy"] = chat_acceptance(proxy, server.url, copy_workload(args.captured, seed=1))
    out["after_shift_copy"] = chat_acceptance(server.url, server.url, copy_workload(args.evaluate, seed=2))
    out["captured_records"] = sum(len(p.read_text().splitlines()) for p in capture_dir.glob("capture-*.jsonl"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/vllm-retrain.json"))
    parser.add_argument("--free", type=int, default=8, help="free requests before the shift")
    parser.add_argument("--captured", type=int, default=40, help="copy requests captured after the shift (the training data)")
    parser.add_argument("--evaluate", type=int, default=8, help="copy requests of the evaluation set (not captured)")
    parser.add_argument("--max-steps", type=int, default=200, help="spec.retraining.training.budget.maxSteps")
    parser.add_argument("--keep", type=Path, default=None, help="keep the work directory here (logs, capture, revision)")
    args = parser.parse_args()
    started = time.monotonic()
    models = retrain_models()
    work = Path(tempfile.mkdtemp(prefix="vllm-retrain-"))
    capture_dir, revisions, logs = work / "capture", work / "revisions", work / "logs"
    for d in (capture_dir, revisions, logs):
        d.mkdir()
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg(), "platform": platform.platform()}}
    report["settings"] = vars(args) | {"out": str(args.out), "keep": str(args.keep) if args.keep else None}
    pod = training_pod("shift", "bench", args.max_steps)
    old = serve("old", models, models / DRAFTER, logs)
    try:
        report["old_ready_s"] = round(old.ready_s or 0, 1)
        report["traffic"] = shift_and_capture(old, capture_dir, args)
        report["job"] = run_training_pod(pod, work, models, capture_dir, revisions, old.url)
    finally:
        old.stop()
    revision = revisions / "shift-train-1"
    report["revision_published"] = (revision / "COMPLETE").is_file()
    if report["revision_published"]:
        new = serve("new", models, revision, logs)
        try:
            report["new_ready_s"] = round(new.ready_s or 0, 1)
            report["traffic"]["new_drafter_copy"] = chat_acceptance(new.url, new.url, copy_workload(args.evaluate, seed=2))
            report["traffic"]["new_drafter_free"] = chat_acceptance(new.url, new.url, free_prompts(args.free, seed=100))
        finally:
            new.stop()
    t = report["traffic"]
    report["summary"] = {
        "acceptance_before_shift": t["before_shift_free"]["acceptance_length"],
        "acceptance_after_shift": t["after_shift_copy"]["acceptance_length"],
        "acceptance_new_drafter": t.get("new_drafter_copy", {}).get("acceptance_length"),
        "acceptance_new_drafter_free": t.get("new_drafter_free", {}).get("acceptance_length"),
        "job_cpu_seconds": report["job"]["cpuSeconds"],
        "job_seconds": report["job"]["seconds"],
        "job_outcome": report["job"]["outcome"],
    }
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    if args.keep:
        shutil.copytree(work, args.keep, dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["revision_published"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
