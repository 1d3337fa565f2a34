"""The real-engine tier's models: a tiny Llama target and EAGLE-3 drafters made by `specdec-train`, built once per
machine and cached outside the checkout (issue 26).

    ~/.cache/specdec-operator/real-engine/<key>/   key: a hash of the pipeline's source files and of BUILD below

The build (about a minute or two on an idle 2-core machine):
1. targets `a` and `b`: tests/support/tiny_models.make_model, llama, 4 layers, hidden 256 (4 heads of 64: vLLM's CPU
   attention takes head sizes 32, 64, 80 ... 512 only), seeds 0 and 1 (same tokenizer, same shapes), whose lm_head
   can only pick whole words, and whose attention output is scaled down (`shape_target`, below);
2. for each target, `specdec-train regenerate` through a real HTTP server of that target (tests/support/tiny_server.py,
   transformers' greedy generate: what vLLM serves greedily, in float32), `capture --capture-layers 0,1,2`,
   `vocab`, `train`, and `export --engine vllm` (drafter-<t>-vllm) and `--engine sglang` (drafter-<t>-sglang);
3. held-out prompts (same distribution, other seed) for the served acceptance and `specdec-train evaluate`.

Why the targets are shaped (`shape_target`):
- A random model emits byte tokens that decode to invalid UTF-8; regenerate's text (what an OpenAI API returns)
  re-tokenizes that as U+FFFD's three bytes, so the drafter would learn a stream the server never produces. The lm_head
  keeps only " word" tokens that re-encode to themselves (10 of the 320), so text and tokens round-trip.
- A random 4-layer model's greedy continuation is chaotic (a table of the previous token predicts the next one 22 % of
  the time, measured on 40 prompts): no drafter learns that in a couple of minutes, and on a CPU a speculative step of
  vLLM costs about 2-3 decode steps, so a drafter needs an acceptance length near 3 of 3+1 before speculation pays.
  With the attention output scaled by BUILD["attention_scale"] the next token is mostly a function of the current one
  (85 %), with a little context left, so the matched drafter accepts most tokens and the operator has a real speedup to
  find, while another target's drafter (another function) accepts almost none.
- A decode step of a real LLM is bound by reading its weights, so verifying 4 tokens costs about what decoding one
  does, and that is what speculation buys. With an MLP 2 x 256 wide, vLLM's CPU step is all overhead and a speculative
  step (verify + 3 draft passes) cost 2-3 plain ones: the matched drafter, accepting 3.16 of 4, measured 0.97-1.03x
  in the probe. The targets' MLPs are 8192 wide (100 MB of float32 weights read per step) and the drafter's 512.

The draft vocabulary is smaller than the target's (BUILD["draft_vocab_size"] < 320): with the full vocabulary the
export writes `d2t`, which vLLM 0.32's Eagle3LlamaForCausalLM refuses (docs/vllm-cpu.md). A changed source file or
parameter gives a new key, so a changed pipeline is rebuilt; old keys are left for `rm -rf` (each is about 240 MB, mostly the two targets).
The build happens in a temporary directory renamed into place, under a lock, so concurrent sessions build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECDEC_REAL_ENGINE_CACHE", Path.home() / ".cache" / "specdec-operator" / "real-engine"))
TRAIN = [sys.executable, "-m", "drafter_training.cli", "--quiet"]
TARGET_SEEDS = {"a": 0, "b": 1}
BUILD: dict[str, Any] = {
    "layers": 4,
    "attention_scale": 0.001,
    "intermediate": 8192,  # the target's MLP width; the drafter's is --intermediate-size below
    "hidden": 256,
    "capture_layers": "0,1,2",  # output indices: 4 layers refuse the default [1, N/2-1, N-4]
    "train_prompts": 64,
    "heldout_prompts": 8,
    "words_per_prompt": 6,
    "max_new_tokens": 48,
    "draft_vocab_size": 64,
    "train_args": ["--epochs", "40", "--lr", "3e-3", "--batch-size", "4", "--ttt-steps", "3", "--max-length", "128", "--intermediate-size", "512"],
    # Target b's drafter only has to be a real drafter of another target: fewer steps.
    "train_steps": {"a": 150, "b": 40},
}
WORDS = ["alpha", "beta", "gamma", "delta", "def", "class", "return", "print", "hello", "world", "list", "dict", "quick", "fox"]


@dataclass(frozen=True)
class RealEngineModels:
    root: Path

    def target(self, name: str = "a") -> Path:
        return self.root / f"target-{name}"

    def drafter(self, target: str = "a", engine: str = "vllm") -> Path:
        """The drafter trained for `target`, exported for `engine` (its aux layer ids in that engine's convention)."""
        return self.root / f"drafter-{target}-{engine}"

    def run(self, target: str = "a") -> Path:
        """The training run (its final/ is what `specdec-train evaluate` loads)."""
        return self.root / f"run-{target}"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout.jsonl"

    def heldout_prompt_ids(self) -> list[list[int]]:
        """The held-out prompts as the servers see them: the chat template applied, tokenized."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(self.target("a")))
        out = []
        for line in self.heldout.read_text().splitlines():
            messages = json.loads(line)["messages"]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            out.append(tok.encode(text, add_special_tokens=False))
        return out

    @property
    def build_report(self) -> dict[str, Any]:
        return json.loads((self.root / "build.json").read_text())


def pipeline_key() -> str:
    """A hash of everything that decides what the build makes: the pipeline's sources and BUILD."""
    h = hashlib.sha256(json.dumps(BUILD, sort_keys=True).encode())
    files = sorted((REPO / "drafter_training").rglob("*.py")) + [
        REPO / "tests" / "support" / name for name in ("tiny_models.py", "tiny_server.py", "real_engine.py")
    ]
    files += sorted((REPO / "operator" / "specdec_operator" / "validator").rglob("*.py"))  # export checks its output with it
    for path in files:
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def shape_target(target: Path) -> list[int]:
    """Zero the lm_head rows of every token but " word" tokens that re-encode to themselves (returns those ids), and
    scale every attention output projection by BUILD["attention_scale"].

    A zero row scores 0 while the kept rows score both signs, so greedy decoding picks only kept tokens, and a
    sequence of " word" tokens decodes to text that re-tokenizes to the same ids (each is its own pre-token)."""
    import re

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    words = [
        i for i in range(len(tok)) if re.fullmatch(r" [A-Za-z]+", tok.decode([i])) and tok.encode(tok.decode([i]), add_special_tokens=False) == [i]
    ]
    state = load_file(str(target / "model.safetensors"))
    keep = torch.zeros(state["lm_head.weight"].shape[0], dtype=torch.bool)
    keep[words] = True
    state["lm_head.weight"][~keep] = 0
    for name in state:
        if name.endswith("self_attn.o_proj.weight"):
            state[name] = state[name] * BUILD["attention_scale"]
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    return words


def write_prompts(path: Path, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            user = " ".join(rnd.choice(WORDS) for _ in range(BUILD["words_per_prompt"]))
            f.write(json.dumps({"messages": [{"role": "user", "content": user}]}) + "\n")


def _stage(cmd: list[str], log: Path, timings: dict[str, float], name: str) -> Any:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
    log.write_text(proc.stdout + proc.stderr)
    timings[name] = round(time.monotonic() - t0, 1)
    if proc.returncode != 0:
        raise RuntimeError(f"specdec-train {name} exited {proc.returncode} (log {log}): {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None


def _build_target(work: Path, name: str, timings: dict[str, float], report: dict[str, Any]) -> None:
    from tests.support.tiny_models import make_model
    from tests.support.tiny_server import TinyModelServer

    target = make_model(
        work / f"target-{name}", "llama", layers=BUILD["layers"], hidden=BUILD["hidden"], seed=TARGET_SEEDS[name], intermediate=BUILD["intermediate"]
    )
    report[f"target {name} output tokens"] = len(shape_target(target))
    samples, cap, run = work / f"samples-{name}.jsonl", work / f"cap-{name}", work / f"run-{name}"
    server = TinyModelServer(target)
    server.start()
    try:
        regen = ["regenerate", "--prompts", str(work / "train-prompts.jsonl"), "--out", str(samples), "--base-url", server.base_url]
        regen += ["--tokenizer", str(target), "--api", "chat", "--max-new-tokens", str(BUILD["max_new_tokens"]), "--concurrency", "1"]
        _stage(TRAIN + regen, work / f"regenerate-{name}.log", timings, f"regenerate {name}")
    finally:
        server.stop()
    capture = ["capture", "--samples", str(samples), "--target", str(target), "--out", str(cap), "--quantization", "none"]
    _stage(TRAIN + capture + ["--capture-layers", BUILD["capture_layers"]], work / f"capture-{name}.log", timings, f"capture {name}")
    _stage(
        TRAIN + ["vocab", "--capture", str(cap), "--draft-vocab-size", str(BUILD["draft_vocab_size"])],
        work / f"vocab-{name}.log",
        timings,
        f"vocab {name}",
    )
    train = ["train", "--capture", str(cap), "--target", str(target), "--out", str(run), "--device", "cpu", *BUILD["train_args"]]
    train += ["--max-steps", str(BUILD["train_steps"][name])]
    report[f"train {name}"] = _stage(TRAIN + train, work / f"train-{name}.log", timings, f"train {name}")
    for engine in ("vllm", "sglang"):
        export = ["export", "--run", str(run), "--target", str(target), "--out", str(work / f"drafter-{name}-{engine}"), "--engine", engine]
        _stage(TRAIN + export, work / f"export-{name}-{engine}.log", timings, f"export {name} {engine}")
    shutil.rmtree(cap)  # the captured hidden states are only the training's input


def build(dest: Path) -> None:
    """Build everything into `dest` (a fresh directory)."""
    import torch

    torch.set_num_threads(1)
    started = time.monotonic()
    dest.mkdir(parents=True)
    write_prompts(dest / "train-prompts.jsonl", BUILD["train_prompts"], seed=0)
    write_prompts(dest / "heldout.jsonl", BUILD["heldout_prompts"], seed=1)
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"build": BUILD, "timings_s": timings}
    for name in TARGET_SEEDS:
        _build_target(dest, name, timings, report)
    report["seconds"] = round(time.monotonic() - started, 1)
    (dest / "build.json").write_text(json.dumps(report, indent=1) + "\n")


def real_engine_models() -> RealEngineModels:
    """The cached build for the current pipeline, built first if missing (once, under a lock)."""
    root = CACHE / pipeline_key()
    if (root / "build.json").exists():
        return RealEngineModels(root)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "build.json").exists():
            tmp = CACHE / f".{root.name}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                build(tmp)
                tmp.rename(root)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return RealEngineModels(root)


if __name__ == "__main__":  # python -m tests.support.real_engine: build (or find) the cache, print where it is
    models = real_engine_models()
    print(models.root)
    print(json.dumps(models.build_report, indent=1))
