"""The training Job of `make demo`'s retraining loop, simulated (issue 36, item 5): hack/job_runner.py's Execute.

The demo's cluster runs no containers; hack/job_runner.py plays the kubelet of the operator's training Jobs and runs
each container through an Execute. :class:`SimulatedExecute` stands in for `specdec-train`'s stages with the
simulator's drafter revisions (simulator/revisions.py): the conversations come from the real capture claim (the
records `specdec capture` wrote), what the drafter learns is the kinds of traffic among them, and the publish stage
writes a revision directory and the termination message of the contract (schema 1, docs/retraining.md) with the
offline figures the profiles give on the held-out conversations. Nothing is trained; everything the operator reads
is what a real Job would write.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from drafter_training.gather import RECENT_SHARE, sample_window
from hack.job_pod import ContainerRun, Ran
from specdec_operator.simulator import load_profile
from specdec_operator.simulator import revisions as rv
from specdec_operator.simulator.model import Profile
from specdec_operator.simulator.promptkind import classify

TRAINED_ON = "chat"  # what the demo's first drafter was trained on
DRAFTER_PROFILE, BASE_PROFILE = "llama31-8b-eagle3", "llama31-8b-base"
MAX_SAMPLES = 60  # budget.maxSamples when the command does not say
HELDOUT_EVERY = 10  # gather holds out about one conversation in ten (by a hash of its text), as specdec-train gather


def drafter(kinds: list[str] | tuple[str, ...]) -> Profile:
    return rv.trained_on(load_profile(DRAFTER_PROFILE), kinds)


def figures(profile: Profile, kind: str) -> tuple[float, float]:
    """(speedup, acceptance) of ``profile`` on ``kind`` traffic at one stream, 64 tokens out (the demo's workload)."""
    return rv.kind_figures(profile, load_profile(BASE_PROFILE), kind, concurrency=1, input_tokens=128, output_tokens=64)


def flag(command: list[str], name: str) -> str | None:
    """The value after ``name`` in a container's command (None when absent)."""
    return next((command[i + 1] for i, a in enumerate(command[:-1]) if a == name), None)


def captured_texts(directory: Path) -> list[str]:
    """The user messages of the capture claim's chat records (capture-*.jsonl, oldest file first, as the proxy names
    them), one text per conversation."""
    texts: list[str] = []
    for path in sorted(Path(directory).glob("capture-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            messages = record.get("messages") if isinstance(record, dict) else None
            if isinstance(messages, list):
                texts.append(" ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role") == "user"))
    return texts


def held_out(text: str) -> bool:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def offline_accept_length(profile: Profile, texts: list[str]) -> float | None:
    """The mean acceptance length of ``profile`` over ``texts`` by their kinds (None without a text)."""
    spec = profile.speculative
    if not texts or spec is None:
        return None
    return round(sum(spec.accept_length_for(classify(t)) for t in texts) / len(texts), 3)


class SimulatedExecute:
    """hack/job_runner.py's Execute for the demo: each stage of the training Job as the simulator's stand-in.

    gather: ``--max-samples`` captured conversations, ``--recent-share`` of them the newest (about a tenth of those held
    out) and the rest spread over the older ones, as the real stage takes them; train: the kinds learned
    from the rest (revisions.learned_kinds), warm-started from ``--init-from-drafter`` (a revision's own kinds when it
    is one, else ``serving_kinds``); publish: the revision directory and the contract's termination message. Every
    other stage succeeds at once. ``delay``: wall seconds each stage takes (the Job's progress shows in status)."""

    def __init__(self, serving_kinds: tuple[str, ...] = (TRAINED_ON,), delay: float = 0.5) -> None:
        self.serving_kinds = serving_kinds
        self.delay = delay
        self.jobs: dict[str, dict[str, Any]] = {}  # job -> what its stages found

    def __call__(self, run: ContainerRun) -> Ran:
        started = time.thread_time()
        time.sleep(self.delay)
        state = self.jobs.setdefault(run.job, {})
        stage = getattr(self, f"_{run.name}", None)
        code = stage(run, state) if stage is not None else 0
        run.log.write_text(f"simulated {run.name}: {shlex.join(run.command)[:300]} -> exit {code}\n")
        return Ran(code, time.thread_time() - started)

    def _gather(self, run: ContainerRun, state: dict[str, Any]) -> int:
        texts = captured_texts(Path(flag(run.command, "--capture") or "/nonexistent"))
        if not texts:
            run.termination_log.write_text("gather: no chat request in the capture; nothing to train on\n")
            return 2
        # The real stage's window (drafter_training/gather.py): the newest share held out from, older traffic trained on.
        share = float(flag(run.command, "--recent-share") or RECENT_SHARE)
        older, newest = sample_window(texts, int(flag(run.command, "--max-samples") or MAX_SAMPLES), share)
        state["heldout"] = [t for t in newest if held_out(t)]
        state["train"] = older + [t for t in newest if not held_out(t)]
        return 0

    def _train(self, run: ContainerRun, state: dict[str, Any]) -> int:
        start = Path(flag(run.command, "--init-from-drafter") or "")
        state["serving"] = rv.read_revision(start) if (start / rv.REVISION_FILE).is_file() else drafter(self.serving_kinds)
        state["kinds"] = rv.learned_kinds(state.get("train") or [])
        state["steps"] = int(flag(run.command, "--max-steps") or 0)
        return 0 if state["kinds"] else 2

    def _publish(self, run: ContainerRun, state: dict[str, Any]) -> int:
        out = Path(flag(run.command, "--out") or "")
        job = flag(run.command, "--job") or run.job
        if not out.name or not state.get("kinds"):
            return 2
        staging = out.with_name(f".{out.name}.partial")
        staging.mkdir(parents=True, exist_ok=True)
        rv.write_revision(staging, DRAFTER_PROFILE, state["kinds"])
        # The held-out slice beside the drafter, as drafter_training/publish.py keeps it: the operator races the revision on it.
        heldout = "".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in state.get("heldout") or [])
        if heldout:
            (staging / "heldout.jsonl").write_text(heldout)
        (staging / "COMPLETE").write_text(json.dumps({"job": job, "simulated": True}) + "\n")
        os.replace(staging, out)
        run.termination_log.write_text(publish_report(job, state, sum(f.stat().st_size for f in out.iterdir())) + "\n")
        return 0


def publish_report(job: str, state: dict[str, Any], size: int) -> str:
    """The publish container's termination message (schema 1 of the contract), one line; no text of the traffic."""
    heldout = state.get("heldout") or []
    revision = rv.trained_on(load_profile(DRAFTER_PROFILE), state["kinds"])
    doc: dict[str, Any] = {"schema": 1, "revision": job, "path": job, "heldout": len(heldout)}
    ours, theirs = offline_accept_length(revision, heldout), offline_accept_length(state["serving"], heldout)
    if ours is not None and theirs is not None:
        doc["offline"] = {"revision": {"acceptLength": ours}, "serving": {"acceptLength": theirs}}
    doc |= {"validation": {"passed": True, "codes": []}, "trainSamples": len(state.get("train") or []), "steps": state.get("steps", 0)}
    doc |= {"bytes": size, "pruned": []}
    return json.dumps(doc, separators=(",", ":"))[:4000]
