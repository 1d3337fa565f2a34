"""The models of the real-engine retraining loop (issue 36, item 5): the copy target and an EAGLE-3 drafter of it that
was trained on one kind of traffic only, so that a shift to the other kind makes its acceptance fall.

    ~/.cache/specdec-operator/real-engine-retrain/<key>/models/    the /models volume of the loop's resource:
        target-copy        -> the copy target (tests/support/copy_models.py, cached there; ~20 minutes the first time)
        drafter-free-vllm     EAGLE-3 (export --engine vllm), trained on FREE traffic only

Why these: the copy target answers a free prompt with a fixed cycle of 64 coined words and a copy prompt ("Repeat this
text: ...") with its passage, the beginning of one of four fixed sequences of 256 other coined words
(tests/support/copy_workloads.py). A drafter trained on free traffic predicts the cycle and accepts almost nothing of
a passage; a drafter retrained on captured copy traffic learns the four sequences in a few hundred steps.

The drafter's vocabulary covers every word the target answers with (the 64 of the cycle and the 256 of the passages;
the map is the tokenizer's, as a drafter's map built from a broad corpus would be): the Job warm-starts from the
serving drafter and keeps its map, so a map of the free answers alone (64 words, the rest padding) could never draft a
passage word, whatever the retraining. The map is written where `specdec-train vocab` writes it, from the capture's
own counts plus one count for each answer word; the other stages are the pipeline's (regenerate through the stand-in
HTTP server of the target, capture, train, export), as the tier's drafters are made.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tests.support.copy_models import CACHE as COPY_CACHE
from tests.support.copy_models import CopyModels, build, cached, copy_key
from tests.support.copy_workloads import ANSWER_CYCLE, PASSAGE_WORDS, training_examples
from tests.support.real_engine import TRAIN, _stage

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECDEC_RETRAIN_ENGINE_CACHE", Path.home() / ".cache" / "specdec-operator" / "real-engine-retrain"))
FREE_BUILD: dict[str, Any] = {
    "prompts": 48,
    "max_new_tokens": 48,
    "capture_layers": "0,1,2",
    "draft_vocab_size": 384,  # every answer word (320) and the most frequent others
    "train_args": ["--epochs", "40", "--lr", "3e-3", "--batch-size", "4", "--ttt-steps", "3", "--max-length", "192", "--intermediate-size", "512"],
    "steps": 120,
    "seed": 21,
    "recipe": 1,  # bump when build_free_drafter changes what it makes
}
TARGET, DRAFTER = "target-copy", "drafter-free-vllm"


def retrain_key() -> str:
    """FREE_BUILD and the target's key (not the pipeline's sources, as copy_models: bump FREE_BUILD["recipe"] when the
    drafter should be rebuilt; the loop retrains it with the pipeline of the day anyway)."""
    h = hashlib.sha256(json.dumps(FREE_BUILD, sort_keys=True).encode())
    h.update(copy_key().encode())
    return h.hexdigest()[:16]


def write_answer_vocab(capture: Path, target: Path, draft_vocab_size: int) -> dict[str, Any]:
    """vocab_map.safetensors in `capture`: the capture's counts plus one for each answer word's token."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from drafter_training.capture import CaptureReader
    from drafter_training.vocab import VOCAB_FILE, build_mapping, token_counts

    reader = CaptureReader(capture)
    counts = token_counts(reader, reader.index.data["vocab_size"])
    tok = AutoTokenizer.from_pretrained(str(target))
    for word in PASSAGE_WORDS + ANSWER_CYCLE:
        (tid,) = tok.encode(" " + word, add_special_tokens=False)  # every coined word is one token (copy_models checks)
        counts[tid] += 1
    d2t, t2d, stats = build_mapping(counts, draft_vocab_size)
    save_file({"d2t": d2t, "t2d": t2d, "counts": counts}, str(capture / VOCAB_FILE))
    (capture / "vocab_stats.json").write_text(json.dumps(stats, indent=1))
    assert int(t2d.sum()) == draft_vocab_size and torch.all(t2d[[tok.encode(" " + w, add_special_tokens=False)[0] for w in PASSAGE_WORDS]])
    return stats


def build_free_drafter(target: Path, dest: Path) -> None:
    """`dest`/models/{target-copy -> target, drafter-free-vllm}, the logs and build.json."""
    from tests.support.tiny_server import TinyModelServer

    started = time.monotonic()
    dest.mkdir(parents=True)
    (dest / "models").mkdir()
    os.symlink(target, dest / "models" / TARGET)
    report: dict[str, Any] = {"build": FREE_BUILD, "target": str(target)}
    timings = report.setdefault("timings_s", {})
    examples = training_examples(FREE_BUILD["prompts"], seed=FREE_BUILD["seed"], copy_fraction=0.0)
    (dest / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m, _ in examples))
    samples, cap, run = dest / "samples.jsonl", dest / "cap", dest / "run-free"
    server = TinyModelServer(target)
    server.start()
    try:
        regen = ["regenerate", "--prompts", str(dest / "prompts.jsonl"), "--out", str(samples), "--base-url", server.base_url]
        regen += ["--tokenizer", str(target), "--api", "chat", "--max-new-tokens", str(FREE_BUILD["max_new_tokens"]), "--concurrency", "1"]
        _stage(TRAIN + regen, dest / "regenerate.log", timings, "regenerate")
    finally:
        server.stop()
    capture = ["capture", "--samples", str(samples), "--target", str(target), "--out", str(cap), "--quantization", "none"]
    _stage(TRAIN + capture + ["--capture-layers", FREE_BUILD["capture_layers"]], dest / "capture.log", timings, "capture")
    report["vocab"] = write_answer_vocab(cap, target, FREE_BUILD["draft_vocab_size"])
    args = ["train", "--capture", str(cap), "--target", str(target), "--out", str(run), "--device", "cpu", *FREE_BUILD["train_args"]]
    report["train"] = _stage(TRAIN + args + ["--max-steps", str(FREE_BUILD["steps"])], dest / "train.log", timings, "train")
    export = ["export", "--run", str(run), "--target", str(target), "--out", str(dest / "models" / DRAFTER), "--engine", "vllm"]
    _stage(TRAIN + export, dest / "export.log", timings, "export")
    shutil.rmtree(cap)
    report["seconds"] = round(time.monotonic() - started, 1)
    (dest / "build.json").write_text(json.dumps(report, indent=1) + "\n")


def retrain_models() -> Path:
    """The loop's /models directory (built first if missing, under the cache's lock); `target-copy` and `drafter-free-vllm` in it."""
    copy = CopyModels(cached(COPY_CACHE / copy_key(), build))
    CACHE.mkdir(parents=True, exist_ok=True)
    root = CACHE / retrain_key()
    if not (root / "build.json").exists():
        import fcntl

        with open(CACHE / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (root / "build.json").exists():
                tmp = CACHE / f".{root.name}.{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    build_free_drafter(copy.target, tmp)
                    # the symlink's target stays absolute; the directory is renamed into place
                    tmp.rename(root)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    return root / "models"


def free_prompts(n: int, seed: int) -> list[dict[str, Any]]:
    """Free chat prompts of the kind the drafter was trained on (other seeds than its training's)."""
    return [{"messages": m} for m, _ in training_examples(n, seed=seed, copy_fraction=0.0)]


if __name__ == "__main__":  # python -m tests.support.retrain_models: build (or find) the cache, print where it is
    print(retrain_models())
