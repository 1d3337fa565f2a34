"""A tiny target that copies its prompt, a smaller draft model of its tokenizer, and its EAGLE-3 drafter: the
real-engine race's models (issue 35, item 5), built once per machine and cached beside the tier's own.

    ~/.cache/specdec-operator/real-engine-copy/<key>/   key: copy_key(), a hash of COPY_BUILD and the examples
    ~/.cache/specdec-operator/real-engine-copy/<key>/eagle3-<eagle key>/   the EAGLE-3 drafter (copy_eagle.py)

The tier's targets a and b (tests/support/real_engine.py) are random models shaped so that the next token is mostly a
function of the current one: their greedy answers never quote the prompt, so n-gram speculation finds only the
answer's own loops. This target is trained instead (minutes on two cores), on tests/support/copy_workloads.py's
examples: a copy prompt's answer is its passage, any other prompt's answer walks a fixed cycle of 64 coined words
(no word of the prompt, no word twice within 48 tokens). So on the copy workload the answer repeats long spans of the
prompt and on the free one it does not, and the candidates have something different to win on each.

How it copies: every passage is the beginning (8-64 words) of one of four fixed sequences of 64 coined words, so the
target learns to find which sequence the prompt quotes and to continue it from its first word, which quotes the
passage. Copying an arbitrary passage needs an induction circuit (find the current word in the prompt, emit the one
after it); a 2-layer model trained on random passages stayed at the uniform loss (ln 96) for 125 steps, more than two
shared cores could give here, and one trained on stretches of a 120-word cycle from any word learnt the cycle but
not where in it the prompt starts (it began every answer at the same word). The lm_head row of <|im_end|> is zeroed
after training (target and draft alike), as the tier's targets keep only word rows: the answer never ends, which the
probe's requests (ignore_eos) assume anyway, and the first answer token, uncertain in training, cannot be the end.
Consequence for the race: on the copy workload the draft model and EAGLE-3 can predict the quoted words from the
sequences they learnt, as n-gram lookup finds them in the prompt; what separates the candidates there is mostly what
a draft costs, not whether it is accepted.

- ``target-copy``: llama, 4 layers, hidden 128 (4 heads of 32, a head size vLLM's CPU attention takes), trained with
  an MLP 512 wide, then widened to COPY_BUILD["serve_intermediate"] with zero columns in down_proj (the same function:
  the extra rows add exactly 0) so that a decode step reads ~50 MB of weights, as the tier's targets do, and
  verifying 4 tokens costs about what decoding one does.
- ``draft-copy``: llama, 2 layers, hidden 128, MLP 512, the same tokenizer files and vocabulary, initialised from the
  target's embeddings, first two layers and head, then trained on the same examples: vLLM's ``draft_model``
  (STANDALONE in the spec).
- ``eagle3-<key>/drafter-copy-vllm``: EAGLE-3, through `specdec-train regenerate/capture/vocab/train/export` as the
  tier's drafters (tests/support/copy_eagle.py; its own key, so a changed drafter recipe keeps the target).
- ``tokenizer``: byte-level BPE with every coined word one token (checked), ChatML template (tiny_models.CHAT_TEMPLATE).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.copy_eagle import build_eagle3, eagle_key
from tests.support.copy_workloads import ANSWER_CYCLE, ENGLISH, PASSAGE_WORDS, training_examples
from tests.support.tiny_models import CHAT_TEMPLATE, CORPUS, SPECIALS

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECDEC_COPY_ENGINE_CACHE", Path.home() / ".cache" / "specdec-operator" / "real-engine-copy"))
COPY_BUILD: dict[str, Any] = {
    "recipe": 2,  # bump when train() or widen_mlp() change what they make
    "vocab_size": 1536,
    "hidden": 128,
    "train_intermediate": 512,
    "serve_intermediate": 8192,
    "target_layers": 4,
    "draft_layers": 2,
    "examples": 4000,
    "steps": 250,
    "draft_steps": 150,
    "batch": 16,
    "lr": 2e-3,
    "seed": 0,
}


@dataclass(frozen=True)
class CopyModels:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target-copy"

    @property
    def draft(self) -> Path:
        """The draft model (vLLM draft_model, spec STANDALONE): smaller, the target's tokenizer and vocabulary."""
        return self.root / "draft-copy"

    @property
    def eagle3(self) -> Path:
        """The EAGLE-3 drafter, in a directory of its own build's key (copy_eagle.eagle_key)."""
        return self.root / f"eagle3-{eagle_key()}" / "drafter-copy-vllm"

    @property
    def build_report(self) -> dict[str, Any]:
        return json.loads((self.root / "build.json").read_text())


def copy_key() -> str:
    """A hash of what decides the target and the draft model: COPY_BUILD, the training examples and the words (not this
    module's text: bump COPY_BUILD["recipe"] when changing how it trains, so that a reformatted module keeps its cache)."""
    h = hashlib.sha256(json.dumps(COPY_BUILD, sort_keys=True).encode())
    h.update(json.dumps([training_examples(COPY_BUILD["examples"], COPY_BUILD["seed"]), PASSAGE_WORDS, ANSWER_CYCLE, ENGLISH, CORPUS]).encode())
    return h.hexdigest()[:16]


def make_copy_tokenizer(directory: Path) -> Any:
    """Byte-level BPE trained on the coined words, the English prompt words and the tier's corpus; every coined word
    with its leading space must be one token (the answers round-trip through text as the same tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = PASSAGE_WORDS + ANSWER_CYCLE
    corpus = ["".join(" " + w for w in words)] * 40 + ["".join(" " + w for w in ENGLISH)] * 10 + CORPUS
    trainer = trainers.BpeTrainer(
        vocab_size=COPY_BUILD["vocab_size"], special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    split = [w for w in words if len(fast.encode(" " + w, add_special_tokens=False)) != 1]
    if split:
        raise RuntimeError(f"copy tokenizer: {len(split)} coined words are not one token (e.g. {split[:3]}); raise COPY_BUILD['vocab_size']")
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return fast


def encode(tok: Any, messages: list[dict[str, str]], answer: str) -> tuple[list[int], list[int]]:
    """The served token ids of a chat (template, generation prompt, answer, <|im_end|>) and the labels: -100 on the prompt."""
    prompt = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    reply = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
    return prompt + reply, [-100] * len(prompt) + reply


def new_model(tok: Any, layers: int, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=COPY_BUILD["hidden"],
        intermediate_size=COPY_BUILD["train_intermediate"],
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def train(model: Any, batches: list[tuple[list[int], list[int]]], steps: int, seed: int) -> dict[str, Any]:
    """AdamW with a short warm-up and a cosine decay over `steps` batches drawn from `batches`; the loss on answers only."""
    import math

    import torch

    rnd = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=COPY_BUILD["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    losses = []
    for _ in range(steps):
        pick = [batches[rnd.randrange(len(batches))] for _ in range(COPY_BUILD["batch"])]
        width = max(len(ids) for ids, _ in pick)
        pad = model.config.pad_token_id
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in pick])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in pick])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in pick])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if len(losses) % 50 == 0:
            print(f"step {len(losses)} loss {sum(losses[-50:]) / 50:.4f}", flush=True)
    model.eval()
    return {"steps": steps, "first_loss": round(losses[0], 3), "final_loss": round(sum(losses[-20:]) / 20, 4)}


def widen_mlp(model: Any, width: int) -> Any:
    """The same function with every MLP `width` wide: new gate/up rows (random) whose down_proj columns are zero."""
    import torch
    from transformers import LlamaForCausalLM

    cfg = model.config.__class__.from_dict({**model.config.to_dict(), "intermediate_size": width})
    wide = LlamaForCausalLM(cfg)
    state = model.state_dict()
    extra = width - model.config.intermediate_size
    gen = torch.Generator().manual_seed(0)
    for name in list(state):
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            state[name] = torch.cat([state[name], torch.randn(extra, state[name].shape[1], generator=gen) * 0.02])
        elif name.endswith("down_proj.weight"):
            state[name] = torch.cat([state[name], torch.zeros(state[name].shape[0], extra)], dim=1)
    wide.load_state_dict(state)
    return wide.eval()


def greedy_copy_check(model: Any, tok: Any, n: int = 6) -> dict[str, float]:
    """Greedy answers (48 tokens) of held-out copy and free examples: their copy_share on tokens."""
    import torch

    from tests.support.copy_workloads import copy_share, copy_workload, free_workload

    out = {}
    for kind, prompts in (("copy", copy_workload(n, seed=99)), ("free", free_workload()[:n])):
        shares = []
        for p in prompts:
            ids = tok.encode(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False), add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, pad_token_id=tok.pad_token_id)
            shares.append(copy_share(ids, gen[0, len(ids) :].tolist()))
        out[kind] = round(sum(shares) / len(shares), 3)
    return out


def train_models(dest: Path, report: dict[str, Any]) -> None:
    """Tokenizer, target (widened after training) and draft model into `dest`; their losses and copy checks into report."""
    import torch

    tok = make_copy_tokenizer(dest / "tokenizer")
    batches = [encode(tok, m, a) for m, a in training_examples(COPY_BUILD["examples"], COPY_BUILD["seed"])]
    trained = None
    for name, layers in (("target-copy", COPY_BUILD["target_layers"]), ("draft-copy", COPY_BUILD["draft_layers"])):
        t0 = time.monotonic()
        model = new_model(tok, layers, COPY_BUILD["seed"] + layers)
        if trained is not None:  # the draft starts from the target's first layers, embeddings and head
            model.load_state_dict(trained, strict=False)
        stats = train(model, batches, COPY_BUILD["steps" if trained is None else "draft_steps"], COPY_BUILD["seed"] + layers)
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] = 0  # never ends (the module's docstring says why)
        stats["greedy_copy_share"] = greedy_copy_check(model, tok)
        if name == "target-copy":
            trained = {
                k: v for k, v in model.state_dict().items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < COPY_BUILD["draft_layers"]
            }
            model = widen_mlp(model, COPY_BUILD["serve_intermediate"])
            stats["widened_greedy_copy_share"] = greedy_copy_check(model, tok, n=2)
        model.save_pretrained(str(dest / name))
        tok.save_pretrained(str(dest / name))
        stats["seconds"] = round(time.monotonic() - t0, 1)
        report[name] = stats
        print(json.dumps({name: stats}), flush=True)


def build(dest: Path) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("SPECDEC_COPY_TRAIN_THREADS", "2")))
    started = time.monotonic()
    dest.mkdir(parents=True)
    report: dict[str, Any] = {"build": COPY_BUILD}
    train_models(dest, report)
    report["seconds"] = round(time.monotonic() - started, 1)
    (dest / "build.json").write_text(json.dumps(report, indent=1) + "\n")


def cached(root: Path, make: Callable[[Path], None]) -> Path:
    """`root`, made by make(tmp) in a temporary directory renamed into place (once, under the cache's lock) if it has
    no build.json yet."""
    if not (root / "build.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (root / "build.json").exists():
                tmp = root.parent / f".{root.name}.{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    make(tmp)
                    tmp.rename(root)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    return root


def copy_models() -> CopyModels:
    """The cached build for the current recipe, built first if missing (~20 minutes on two shared cores), and its
    EAGLE-3 drafter (~5 minutes more)."""
    models = CopyModels(cached(CACHE / copy_key(), build))
    cached(models.eagle3.parent, lambda dest: build_eagle3(models.target, dest))
    return models


if __name__ == "__main__":  # python -m tests.support.copy_models: build (or find) the cache, print where it is
    models = copy_models()
    print(models.root)
    print(json.dumps({"models": models.build_report, "eagle3": json.loads((models.eagle3.parent / "build.json").read_text())}, indent=1))
