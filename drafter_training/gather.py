"""A retraining Job's first stage: the captured traffic as prompt conversations, with a held-out slice.

The capture (docs/capture.md) writes JSON lines `capture-<UTC start>-<pod>.jsonl` into its claim, one request a line.
`gather` reads them (the claim is mounted read-only), keeps the chat requests (`messages`; a completions `prompt` has
no chat turns to regenerate through the template, so it is counted and left out), drops repeats, and keeps at most
`max_samples`: where there are more, `recent_share` of them are the newest and the rest are spread evenly over the
older ones (:func:`sample_window`), so that a Job on a busy server, whose newest conversations may all come after a
traffic shift, still trains on the traffic before it (a drafter retrained on the shifted traffic alone forgets the
old: docs/retraining.md). The newest are split by a hash of each conversation: about `heldout_share` of them go to
`heldout.jsonl` (the slice of recent traffic a retrained drafter is evaluated and raced on, never trained on; the same
conversation always lands on the same side), the rest, with the older ones, to `prompts.jsonl` for
`specdec-train regenerate`. A line that is not a whole JSON record (a file being written) is skipped and counted. The
files are written whole (temporary file, then rename), with `gather.json`, the counts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from specdec_operator.errors import InputError

from .regenerate import normalize_conversation

CAPTURE_GLOB = "capture-*.jsonl"
PROMPTS = "prompts.jsonl"
HELDOUT = "heldout.jsonl"
STATS = "gather.json"
RECENT_SHARE = 0.5  # spec.retraining.training.budget.recentShare's default

T = TypeVar("T")


def _records(files: list[Path], counts: dict[str, int]) -> list[list[dict[str, str]]]:
    """The chat conversations of every file, oldest file first, repeats dropped."""
    seen: set[str] = set()
    conversations = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                counts["unreadable"] += 1
                continue
            if not isinstance(record, dict) or "messages" not in record:
                counts["not_chat"] += 1
                continue
            try:
                messages = normalize_conversation({"messages": record["messages"]}, f"{path}:{n}")
            except InputError:
                counts["not_chat"] += 1
                continue
            key = _key(messages)
            if key in seen:
                counts["repeated"] += 1
                continue
            seen.add(key)
            conversations.append(messages)
    return conversations


def _key(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _row(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"id": _key(messages)[:16], "messages": messages}


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)


def sample_window(items: Sequence[T], max_samples: int | None, recent_share: float = RECENT_SHARE) -> tuple[list[T], list[T]]:
    """(older, newest): at most ``max_samples`` of ``items`` (oldest first). All of them are the newest when they fit;
    else the newest ``recent_share`` of max_samples (at least one), and the rest spread evenly over the older items,
    oldest first (the same items for the same capture: no randomness)."""
    if max_samples is None or len(items) <= max_samples:
        return [], list(items)
    recent = max(1, min(max_samples, round(max_samples * recent_share)))
    older, newest = items[: len(items) - recent], items[len(items) - recent :]
    spread = max_samples - recent
    return [older[i * len(older) // spread] for i in range(spread)], list(newest)


def gather(
    capture_dir: str | Path,
    out_dir: str | Path,
    heldout_share: float = 0.1,
    max_samples: int | None = None,
    recent_share: float = RECENT_SHARE,
) -> dict[str, int]:
    """Write `prompts.jsonl`, `heldout.jsonl` and `gather.json` under out_dir from the capture's files."""
    if not 0 <= heldout_share < 1:
        raise InputError(f"--heldout-share {heldout_share}: must be at least 0 and below 1")
    if not 0 < recent_share <= 1:
        raise InputError(f"--recent-share {recent_share}: must be above 0 and at most 1 (1: the newest conversations only)")
    capture_dir, out_dir = Path(capture_dir), Path(out_dir)
    files = sorted(capture_dir.glob(CAPTURE_GLOB))
    if not files:
        raise InputError(f"{capture_dir}: no {CAPTURE_GLOB}; pass the captured traffic's directory (spec.retraining.capture)")
    counts = {"files": len(files), "unreadable": 0, "not_chat": 0, "repeated": 0}
    # Oldest first: file names start with their UTC start.
    older, newest = sample_window(_records(files, counts), max_samples, recent_share)
    train: list[dict[str, Any]] = [_row(messages) for messages in older]  # older traffic is trained on, never held out
    heldout: list[dict[str, Any]] = []
    for messages in newest:
        row = _row(messages)
        (heldout if int(row["id"][:8], 16) % 10_000 < heldout_share * 10_000 else train).append(row)
    if not train:
        raise InputError(f"{capture_dir}: no chat conversation to train on ({counts}); capture more traffic")
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / PROMPTS, train)
    _write(out_dir / HELDOUT, heldout)
    stats = {**counts, "conversations": len(older) + len(newest), "older": len(older), "train": len(train), "heldout": len(heldout)}
    (out_dir / STATS).write_text(json.dumps(stats, indent=1) + "\n")
    return stats
