"""The copy target's EAGLE-3 drafter (tests/support/copy_models.py), made by the training pipeline as the tier's
drafters are (tests/support/real_engine.py): `specdec-train regenerate` through the stand-in HTTP server of the target
(transformers' greedy generate), `capture`, `vocab`, `train` and `export --engine vllm`.

It has a key of its own (EAGLE_BUILD and the pipeline's sources), so changing how the drafter is trained rebuilds
minutes of it, not the target's twenty. The draft vocabulary must hold every word the target answers with (256
passage words and 64 of the answer cycle): the first build's 128 could not, and its acceptance on the copy workload
was 1.26 tokens per verify (docs/benchmarks/vllm-race.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

from tests.support.copy_workloads import training_examples
from tests.support.real_engine import TRAIN, _stage

REPO = Path(__file__).resolve().parents[2]
EAGLE_BUILD: dict[str, Any] = {
    "prompts": 64,
    "max_new_tokens": 48,
    "capture_layers": "0,1,2",  # output indices: 4 layers refuse the default [1, N/2-1, N-4]
    "draft_vocab_size": 384,  # below the target's 1213 (vLLM 0.32 refuses a full-vocabulary d2t: docs/vllm-cpu.md)
    "train_args": ["--epochs", "40", "--lr", "3e-3", "--batch-size", "4", "--ttt-steps", "3", "--max-length", "192", "--intermediate-size", "512"],
    "steps": 150,
}


def eagle_key() -> str:
    h = hashlib.sha256(json.dumps(EAGLE_BUILD, sort_keys=True).encode())
    files = sorted((REPO / "drafter_training").rglob("*.py")) + sorted((REPO / "operator" / "specdec_operator" / "validator").rglob("*.py"))
    files += [REPO / "tests" / "support" / "tiny_server.py"]
    for path in files:
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_eagle3(target: Path, dest: Path) -> None:
    """The drafter of `target` into `dest` (a fresh directory): drafter-copy-vllm/, the logs and build.json."""
    from tests.support.tiny_server import TinyModelServer

    started = time.monotonic()
    dest.mkdir(parents=True)
    report: dict[str, Any] = {"build": EAGLE_BUILD, "target": str(target)}
    timings = report.setdefault("timings_s", {})
    prompts = [m for m, _ in training_examples(EAGLE_BUILD["prompts"], seed=random.Random(7).randrange(1 << 30))]
    (dest / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in prompts))
    samples, cap, run = dest / "samples.jsonl", dest / "cap", dest / "run-copy"
    server = TinyModelServer(target)
    server.start()
    try:
        regen = ["regenerate", "--prompts", str(dest / "prompts.jsonl"), "--out", str(samples), "--base-url", server.base_url]
        regen += ["--tokenizer", str(target), "--api", "chat", "--max-new-tokens", str(EAGLE_BUILD["max_new_tokens"]), "--concurrency", "1"]
        _stage(TRAIN + regen, dest / "regenerate.log", timings, "regenerate")
    finally:
        server.stop()
    capture = ["capture", "--samples", str(samples), "--target", str(target), "--out", str(cap), "--quantization", "none"]
    _stage(TRAIN + capture + ["--capture-layers", EAGLE_BUILD["capture_layers"]], dest / "capture.log", timings, "capture")
    vocab = ["vocab", "--capture", str(cap), "--draft-vocab-size", str(EAGLE_BUILD["draft_vocab_size"])]
    _stage(TRAIN + vocab, dest / "vocab.log", timings, "vocab")
    args = ["train", "--capture", str(cap), "--target", str(target), "--out", str(run), "--device", "cpu", *EAGLE_BUILD["train_args"]]
    report["train"] = _stage(TRAIN + args + ["--max-steps", str(EAGLE_BUILD["steps"])], dest / "train.log", timings, "train")
    export = ["export", "--run", str(run), "--target", str(target), "--out", str(dest / "drafter-copy-vllm"), "--engine", "vllm"]
    _stage(TRAIN + export, dest / "export.log", timings, "export")
    shutil.rmtree(cap)
    report["seconds"] = round(time.monotonic() - started, 1)
    (dest / "build.json").write_text(json.dumps(report, indent=1) + "\n")
