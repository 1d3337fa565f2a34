"""Stage 3: the draft vocabulary (d2t / t2d) from loss-masked token frequencies.

The `draft_vocab_size` most frequent target ids among tokens the drafter must predict (loss_mask == 1)
are kept, sorted ascending by id. When fewer distinct tokens occur, the vocabulary is padded with the
lowest unused ids so the shapes stay what the config says (a public failure mode was a d2t shorter than
draft_vocab_size). SGLang maps back with target = draft + d2t[draft].
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec_operator.errors import InputError

from .capture import CaptureReader

VOCAB_FILE = "vocab_map.safetensors"


def token_counts(reader: CaptureReader, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(len(reader)):
        s = reader.get(i)
        ids = s["input_ids"][s["loss_mask"]]
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise InputError(f"sample {i}: token id {int(ids.max())} >= target vocab_size {vocab_size}")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def build_mapping(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(d2t int64 [draft], t2d bool [target], stats) from per-target-id counts."""
    vocab_size = counts.numel()
    if draft_vocab_size <= 0:
        raise InputError(f"draft_vocab_size {draft_vocab_size}: must be positive")
    draft_vocab_size = min(draft_vocab_size, vocab_size)
    seen = int((counts > 0).sum())
    # Stable ordering: most frequent first, ties by lower id; then unused ids fill the rest.
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    chosen = sorted(order[:draft_vocab_size])
    d2t = torch.tensor(chosen, dtype=torch.int64) - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.tensor(chosen)] = True
    total = int(counts.sum())
    covered = int(counts[t2d].sum())
    stats = {
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": vocab_size,
        "distinct_tokens_seen": seen,
        "padded_with_unused": max(0, draft_vocab_size - seen),
        "masked_tokens": total,
        "coverage": covered / total if total else 0.0,
    }
    return d2t, t2d, stats


def build_vocab(capture_dir: str | Path, out: str | Path, draft_vocab_size: int = 32000) -> dict:
    """Count, map and write `vocab_map.safetensors` (d2t, t2d) and `vocab_stats.json` next to it."""
    reader = CaptureReader(capture_dir)
    counts = token_counts(reader, reader.index.data["vocab_size"])
    d2t, t2d, stats = build_mapping(counts, draft_vocab_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"d2t": d2t, "t2d": t2d, "counts": counts}, str(out / VOCAB_FILE))
    (out / "vocab_stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def load_mapping(directory: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    path = Path(directory) / VOCAB_FILE
    if not path.is_file():
        raise InputError(f"{path}: not found; run `specdec-train vocab` first")
    data = load_file(str(path))
    return data["d2t"], data["t2d"]


def draft_ids_of_targets(d2t: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids of each draft id [draft], draft id of each target id or -1 [target])."""
    draft_to_target = d2t + torch.arange(d2t.numel())
    target_to_draft = torch.full((vocab_size,), -1, dtype=torch.int64)
    target_to_draft[draft_to_target] = torch.arange(d2t.numel())
    return draft_to_target, target_to_draft
