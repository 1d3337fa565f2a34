"""The revisions of one SpeculativeServer on its claim, and their storage cap (issue 36, item 3).

The claim `<name>-revisions` holds one directory per published revision, `<job>` (complete only with its COMPLETE
marker, publish.is_published), and `.staging/<job>/` for the Job at work. After publishing, the Job's publish stage
keeps at most `keep` complete revisions (spec.retraining.training.maxRevisions): the oldest go first, never a
protected one (the revision serving and the one spec.retraining.revision pins, which the operator names when it
renders the Job) nor the one just published. A protected revision still counts, so the claim may hold more than
`keep` while the protected ones are old. A pruned revision is renamed into `.staging/` first (it stops being a
revision in one step, so a reader never sees it half removed) and then deleted.

Staging directories of other Jobs are what a failed, killed or timed-out Job left (a resource runs one Job at a
time: reconcile/retrain waits TrainingRunning); nothing reads them, so they are removed with the pruning.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from specdec_operator.errors import InputError

from .publish import MARKER, is_published

STAGING = ".staging"
log = logging.getLogger(__name__)


def _age_key(revision: Path) -> tuple[str, int, str]:
    """Oldest first: the marker's publication time, then the Job's number (-train-<n>), then the name."""
    try:
        published = str(json.loads((revision / MARKER).read_text()).get("published") or "")
    except (OSError, ValueError, AttributeError):
        published = ""  # an unreadable marker sorts as the oldest
    number = re.search(r"-train-(\d+)$", revision.name)
    return published, int(number.group(1)) if number else 0, revision.name


def complete_revisions(root: str | Path) -> list[str]:
    """The published revisions under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_published(p)]
    return [p.name for p in sorted(found, key=_age_key)]


def _remove(root: Path, name: str) -> None:
    parked = root / STAGING / f".pruned-{name}"
    parked.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(parked, ignore_errors=True)
    (root / name).rename(parked)  # no longer a revision, in one step
    shutil.rmtree(parked, ignore_errors=True)


def prune_revisions(root: str | Path, keep: int, protect: list[str] | tuple[str, ...] = (), current: str | None = None) -> list[str]:
    """Remove the oldest complete revisions beyond `keep`, never a protected one nor `current`; returns their names."""
    if keep < 1:
        raise InputError(f"--keep {keep}: must be at least 1 (the revision just published is kept)")
    root = Path(root)
    revisions = complete_revisions(root)
    excess = len(revisions) - keep
    pruned: list[str] = []
    for name in revisions:
        if excess <= 0:
            break
        if name in protect or name == current:
            continue
        _remove(root, name)
        pruned.append(name)
        excess -= 1
    return pruned


def remove_stale_staging(root: str | Path, current: str | None) -> list[str]:
    """Staging directories of other Jobs (left by a failed one), and parked revisions a killed pod left."""
    staging = Path(root) / STAGING
    if not staging.is_dir():
        return []
    stale = [p for p in staging.iterdir() if p.name != current]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        log.info("removed %d staging directories of earlier Jobs", len(stale))
    return [p.name for p in stale]


def size_on_disk(path: str | Path) -> int:
    """Bytes of the files under `path` (their sizes; the revision's share of the claim)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
