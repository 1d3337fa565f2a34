"""What a retraining Job's publish stage reports: the revision's figures, as one line of JSON for the operator.

`specdec-train publish ... --termination-log /dev/termination-log` (the Job's `publish` container) reads what the
earlier stages wrote under the staging directory before publishing it:

* `work/evaluation.json` (specdec-train evaluate --serving): the held-out prompts evaluated and each drafter's offline
  acceptance length (offline.accept_lengths);
* `work/validation.json` (specdec-train validate): the validator's verdict, passed and the error codes;
* `work/run/final/train_summary.json` (specdec-train train): the samples trained on and the steps;

publishes the revision with those figures in its COMPLETE marker (a rerun after the rename answers the same), prunes
the oldest revisions beyond `--keep` (revisions.prune_revisions, never a `--protect`ed one), and writes the message of
the contract between the Job and the operator (schema 1) to the termination log, which Kubernetes copies into the pod's
status.containerStatuses[publish].state.terminated.message:

    {"schema": 1, "revision": JOB, "path": JOB, "heldout": N, "offline": {"revision": {"acceptLength": X},
     "serving": {"acceptLength": Y}}, "validation": {"passed": B, "codes": [...]}, "trainSamples": N, "steps": N,
     "bytes": N, "pruned": [...]}

A key is missing when its stage wrote nothing (no held-out prompt: no "offline"); a file that is there but not what its
stage writes is unusable input (exit 2, one line naming it). Only counts, names, codes and figures: never a prompt or
any text of the traffic.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from specdec_operator.errors import InputError

from .offline import accept_lengths
from .publish import is_published, publish
from .revisions import prune_revisions, remove_stale_staging, size_on_disk

SCHEMA = 1
MESSAGE_LIMIT = 4000  # bytes: below Kubernetes' 4096 for one container's termination message
EVALUATION = "work/evaluation.json"
VALIDATION = "work/validation.json"
TRAIN_SUMMARY = "work/run/final/train_summary.json"
log = logging.getLogger(__name__)


def _read(staging: Path, relative: str) -> dict[str, Any] | None:
    path = staging / relative
    if not path.is_file():
        log.warning("%s: not there; its figures are left out of the report", path)
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not JSON ({type(exc).__name__}); run its stage again (a retried pod does)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: must be a JSON object; run its stage again (a retried pod does)")
    return doc


def _count(doc: dict[str, Any], key: str, path: Path) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{path}: {key} must be a count, not {type(value).__name__}; run its stage again")
    return value


def revision_figures(staging: str | Path) -> dict[str, Any]:
    """The figures of the export under `staging`, from what the earlier stages wrote there."""
    staging = Path(staging)
    figures: dict[str, Any] = {}
    evaluation = _read(staging, EVALUATION)
    if evaluation is not None:
        figures["heldout"] = _count(evaluation, "prompts", staging / EVALUATION)
        lengths = accept_lengths(evaluation)
        if lengths["revision"] is not None and lengths["serving"] is not None:
            figures["offline"] = {role: {"acceptLength": round(value, 4)} for role, value in lengths.items() if value is not None}
    validation = _read(staging, VALIDATION)
    if validation is not None:
        codes = validation.get("codes")
        if not isinstance(validation.get("passed"), bool) or not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise InputError(f"{staging / VALIDATION}: needs passed (true/false) and codes (a list of names); run specdec-train validate again")
        figures["validation"] = {"passed": validation["passed"], "codes": codes}
    summary = _read(staging, TRAIN_SUMMARY)
    if summary is not None:
        figures["trainSamples"] = _count(summary, "num_samples", staging / TRAIN_SUMMARY)
        figures["steps"] = _count(summary, "steps", staging / TRAIN_SUMMARY)
    return figures


def termination_message(doc: dict[str, Any], limit: int = MESSAGE_LIMIT) -> str:
    """One line of ASCII JSON within `limit` bytes: lists are cut from their end ("truncated": true) when it must."""
    doc = json.loads(json.dumps(doc))
    while True:
        text = json.dumps(doc, ensure_ascii=True, separators=(",", ":"))
        if len(text) <= limit:
            return text
        lists = [v for v in (doc.get("pruned"), (doc.get("validation") or {}).get("codes")) if v]
        if not lists:
            raise ValueError(f"the report is {len(text)} bytes without lists to cut, over {limit}")
        max(lists, key=len).pop()
        doc["truncated"] = True


def write_termination_log(path: str | Path, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="ascii")
    except OSError as exc:
        log.warning("cannot write the termination log %s: %s", path, exc.strerror or type(exc).__name__)


def publish_revision(
    staging: str | Path,
    out: str | Path,
    job: str | None,
    *,
    keep: int | None = None,
    protect: list[str] | tuple[str, ...] = (),
    termination_log: str | Path | None = None,
) -> dict[str, Any]:
    """Publish `<staging>/export` as `out` with its figures, prune beyond `keep`, report; returns the message's document."""
    if keep is not None and keep < 1:
        raise InputError(f"--keep {keep}: must be at least 1 (the revision just published is kept)")
    out = Path(out)
    # A rerun after the rename (the pod died before it exited) reads the figures back from the marker.
    marker = publish(staging, out, job, None if is_published(out) else revision_figures(staging))
    figures = marker.get("figures") or {}
    pruned = prune_revisions(out.parent, keep, protect, current=out.name) if keep is not None else []
    remove_stale_staging(out.parent, current=Path(staging).name)
    doc = {"schema": SCHEMA, "revision": out.name, "path": out.name, **figures, "bytes": size_on_disk(out), "pruned": pruned}
    text = termination_message(doc)
    if termination_log is not None:
        write_termination_log(termination_log, text)
    return json.loads(text)
