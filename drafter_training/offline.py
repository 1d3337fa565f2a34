"""Offline evaluation of a retrained drafter against the one that serves (issue 36, item 3).

`specdec-train evaluate --drafter NEW --serving OLD --prompts heldout.jsonl` runs both drafters the same way
(evaluate.evaluate_drafter: chain speculative decoding against the target, loaded as capture loads it, so with the
weights and quantization the training data's hidden states came from) over the same held-out prompts, the slice
`gather` kept out of training. The report carries each one's runs; `accept_lengths` reads the figure the retraining
Job's publish stage reports: the greedy run's acceptance length (tokens per verify, bonus included) of each.

A drafter is either a training run's `final/` (draft_config.json) or an export of `specdec-train export` (config.json,
either engine or format: what serves, bf16 weights and its vocabulary map). No held-out prompt (a small capture) is
not an error: the report says `prompts: 0` with no runs, and the figures are missing, which the operator reads as an
offline gate not passed. So is a drafter that cannot be loaded when two are compared (its `error`, one line, in the
report): the Job still publishes the validator's verdict on it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from specdec_operator.errors import InputError

from .evaluate import Eagle3Proposer, evaluate_drafter, load_prompts
from .model import Eagle3Draft


def load_drafter(path: str | Path, target_dir: str | Path, engine: str | None = None) -> Eagle3Draft:
    """A training run's final/ or an exported drafter, ready to propose against `target_dir`."""
    if (Path(path) / "draft_config.json").is_file():
        from .train import load_trained

        return load_trained(path, target_dir)
    from .warmstart import exported_draft_model

    return exported_draft_model(path, target_dir, engine)


def drafter_runs(
    target: Any, draft: Eagle3Draft, prompts: list[list[int]], temperatures: list[float], settings: dict[str, Any], progress: bool
) -> list[dict[str, Any]]:
    """evaluate_drafter once per temperature; none without prompts (its figures would be NaN)."""
    if not prompts:
        return []
    return [
        evaluate_drafter(
            target, Eagle3Proposer(draft), prompts, draft.cfg.aux_layer_ids, temperature=t, draft_for_simulation=draft, progress=progress, **settings
        )
        for t in temperatures
    ]


def evaluation_report(
    target_dir: str,
    drafters: dict[str, str],
    prompts_path: str,
    *,
    quantization: str = "checkpoint",
    engine: str | None = None,
    temperatures: list[float] | None = None,
    limit: int | None = 64,
    device: str | None = None,
    settings: dict[str, Any] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Each drafter of `drafters` ({"drafter": NEW, "serving": OLD}) evaluated on the same prompts against one target."""
    from transformers import AutoTokenizer

    from .target import load_target

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tgt = load_target(target_dir, quantization, device=device)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = load_prompts(prompts_path, tokenizer, limit)
    eos = tgt.config.get("eos_token_id")
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    run_settings = {"eos_ids": eos_ids, **(settings or {})}
    report: dict[str, Any] = {"target": target_dir, "target_quantization": tgt.quantization, "prompts": len(prompts)}
    for role, path in drafters.items():
        entry: dict[str, Any] = {"drafter": path, "runs": []}
        try:
            draft = load_drafter(path, target_dir, engine).to(device)
        except InputError as exc:
            if len(drafters) == 1:
                raise
            # Comparing two: the other's figure still counts, this one is missing (the operator reads that as an
            # offline gate not passed), and the Job goes on to publish the validator's verdict.
            entry["error"] = " ".join(str(exc).split())
        else:
            entry["runs"] = drafter_runs(tgt.model, draft, prompts, temperatures or [0.0, 0.7], run_settings, progress)
        if role == "drafter":
            report.update(entry)
        else:
            report[role] = entry
    return report


def accept_length(runs: list[dict[str, Any]]) -> float | None:
    """The greedy run's acceptance length (else the first run's); None without a finite one."""
    run = next((r for r in runs if r.get("temperature") == 0), runs[0] if runs else None)
    value = run.get("acceptance_length") if run else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def accept_lengths(report: dict[str, Any]) -> dict[str, float | None]:
    """{"revision": new drafter's, "serving": serving drafter's} from an evaluation report."""
    serving = report.get("serving") or {}
    return {"revision": accept_length(report.get("runs") or []), "serving": accept_length(serving.get("runs") or [])}
