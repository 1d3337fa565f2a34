"""The last stage of a retraining Job: publish the export as a new revision, all at once or not at all.

Every earlier stage of the Job writes under its staging directory (`<revisions>/.staging/<job>/`: `work/` for the
samples, hidden states and training run, `export/` for `specdec-train export`), where a retried pod resumes them.
Nothing there is ever served. `publish` checks the export (export.check_export: every name, shape and dtype the engine
needs), makes its files readable by every user (the server runs as its image's user), writes the marker file COMPLETE into it (the Job, the time, each file's sha256), renames it to the revision
directory in one rename(2) on the same volume, and removes the staging directory. A revision directory without
COMPLETE is not a revision (is_published): a Job that failed, was killed or ran out of time leaves at most a staging
directory, which the next Job of another name never reads.

Run again after a successful rename (a pod that died before it could exit), it finds the revision complete and
answers with its marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from specdec_operator.errors import InputError

from .export import check_export

MARKER = "COMPLETE"
EXPORT_DIR = "export"
# The held-out slice gather wrote (prompts only, never trained on): published beside the drafter so that the operator's
# race of this revision measures it on recent traffic (a File workload on the revisions claim; docs/retraining.md).
HELDOUT_STAGED = "work/prompts/heldout.jsonl"
HELDOUT = "heldout.jsonl"


def is_published(revision_dir: str | Path) -> bool:
    """Whether a revision directory is a whole published export (its marker is there)."""
    return (Path(revision_dir) / MARKER).is_file()


def read_marker(revision_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(revision_dir) / MARKER).read_text())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def publish(staging: str | Path, out: str | Path, job: str | None = None, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check `<staging>/export`, mark it COMPLETE, rename it to `out` and remove `staging`; returns the marker.
    figures: the revision's report (report.revision_figures), kept in the marker so that a rerun answers the same."""
    staging, out = Path(staging), Path(out)
    if is_published(out):
        shutil.rmtree(staging, ignore_errors=True)
        return read_marker(out)
    if out.exists():
        raise InputError(f"{out}: exists without {MARKER}: not a revision this Job published; pass a new revision directory")
    export = staging / EXPORT_DIR
    if not (export / "config.json").is_file():
        raise InputError(f"{export}: no export; run specdec-train export --out {export} first")
    check_export(export)
    _include_heldout(staging, export)
    files = {p.name: _sha256(p) for p in sorted(export.iterdir()) if p.is_file() and p.name != MARKER}
    _readable(export, files)
    marker: dict[str, Any] = {"job": job, "published": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}
    if figures is not None:
        marker["figures"] = figures
    tmp = export / f".{MARKER}.tmp"
    with tmp.open("w") as f:
        f.write(json.dumps(marker, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, export / MARKER)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.rename(export, out)  # one step on one volume: the revision appears whole
    _fsync_dir(out.parent)
    shutil.rmtree(staging, ignore_errors=True)
    return marker


def _include_heldout(staging: Path, export: Path) -> None:
    """Copy the held-out slice into the export (hashed in the marker like its other files); nothing when gather held
    none out. The engines read only the drafter's own files from the directory."""
    source = staging / HELDOUT_STAGED
    if source.is_file() and source.stat().st_size > 0:
        shutil.copyfile(source, export / HELDOUT)


def _readable(export: Path, files: dict[str, str]) -> None:
    """Files readable by every user (safetensors writes its files 0600): the speculative server that mounts the
    revision runs as the engine image's user, not as the Job's UID."""
    export.chmod(0o755)
    for name in files:
        (export / name).chmod(0o644)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
