"""Stage 6: real acceptance length of a drafter against its target, by chain speculative decoding.

This runs what SGLang runs with `--speculative-eagle-topk 1`: `num_steps` draft tokens proposed one after
another (topk 1), then ONE target forward over them (`num_draft_tokens` = num_steps + 1 positions: the
last committed token and the drafts) that accepts the longest agreeing prefix and adds the target's own
next token (the bonus). Acceptance length = tokens emitted per verify, bonus included (1.00 = nothing
accepted, num_draft_tokens = everything accepted), as in SGLang's `accept len` log field.

Greedy: a draft token is accepted while it equals the target's argmax. Sampled (temperature > 0): the
draft is deterministic (its top-1), so token d is accepted with probability p_target(d) and a rejection
resamples from p_target with d removed -- the standard rule that leaves the output distributed exactly
as the target's (and what SGLang's target-only verification does with its default thresholds).

The draft's prefix comes from the target's captured layers of all committed tokens (SGLang's draft-extend
pass); chain step k attends to that prefix plus its own earlier chain tokens (model.Eagle3Draft.step).
Every verify recomputes the target over the whole sequence: slower than a KV cache, impossible to get
wrong. The simulated acceptance length (TTT accuracies on the very sequences generated) is reported beside.
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from specdec_operator.errors import InputError

from .model import Eagle3Draft, StepCache
from .target import capture_forward
from .train import simulated_acceptance
from .vocab import draft_ids_of_targets

log = logging.getLogger(__name__)


class Proposer(Protocol):
    def propose(self, seq: torch.Tensor, aux: torch.Tensor, num_steps: int) -> list[int]:
        """Draft `num_steps` target-vocabulary ids after `seq` [L]; aux [L-1, 3H] covers positions 0..L-2."""


class Eagle3Proposer:
    """An EAGLE-3 draft proposing a topk-1 chain."""

    def __init__(self, draft: Eagle3Draft) -> None:
        self.draft = draft.eval()
        self.device = next(draft.parameters()).device

    @torch.no_grad()
    def propose(self, seq: torch.Tensor, aux: torch.Tensor, num_steps: int) -> list[int]:
        d = self.draft
        n = seq.numel() - 1  # draft rows: target position t paired with token t+1
        ids = seq[1:].to(self.device)[None]
        positions = torch.arange(n, device=self.device)[None]
        cache = StepCache()
        logits, hidden = d.step(aux[None].to(self.device, next(d.parameters()).dtype), ids, positions, cache)
        last = torch.tensor([n - 1], device=self.device)
        out: list[int] = []
        for k in range(num_steps):
            tok = int(d.draft_to_target(logits[0, -1].argmax()))
            out.append(tok)
            if k + 1 == num_steps:
                break
            logits, hidden = d.step(hidden[:, -1:], torch.tensor([[tok]], device=self.device), (last + k + 1)[None], cache, query_rows=last)
        return out


class TargetGreedyProposer:
    """The target's own next-token predictor as a drafter: the upper bound (acceptance = num_draft_tokens)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def propose(self, seq: torch.Tensor, aux: torch.Tensor, num_steps: int) -> list[int]:
        device = next(self.model.parameters()).device
        cur = seq.to(device)
        out: list[int] = []
        for _ in range(num_steps):
            tok = int(self.model(input_ids=cur[None], use_cache=False).logits[0, -1].argmax())
            out.append(tok)
            cur = torch.cat([cur, torch.tensor([tok], device=device)])
        return out


@dataclass
class PromptResult:
    prompt_tokens: int
    generated: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)  # per verify, bonus included, before truncation
    emitted: int = 0  # tokens kept (truncated at max_new_tokens / EOS)


@torch.no_grad()
def speculative_generate(
    target: torch.nn.Module,
    proposer: Proposer,
    prompt: list[int],
    layer_ids: list[int],
    *,
    num_steps: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_ids: set[int] | None = None,
    generator: torch.Generator | None = None,
) -> PromptResult:
    """Chain speculative decoding of one prompt; the output is the target's own (greedy or sampled)."""
    device = next(target.parameters()).device
    eos_ids = eos_ids or set()
    seq = torch.tensor(prompt, dtype=torch.long, device=device)
    res = PromptResult(prompt_tokens=len(prompt))
    aux, _, logits = capture_forward(target, seq[None], layer_ids)
    first = _pick(logits[0, -1], temperature, generator)
    seq = torch.cat([seq, torch.tensor([first], device=device)])
    res.generated.append(first)
    aux = aux[0]
    while len(res.generated) < max_new_tokens and first not in eos_ids:
        drafts = proposer.propose(seq, aux[: seq.numel() - 1], num_steps)
        cand = torch.cat([seq, torch.tensor(drafts, dtype=torch.long, device=device)])
        aux_all, _, logits = capture_forward(target, cand[None], layer_ids)
        ver = logits[0, seq.numel() - 1 :]  # distributions after the last committed token and each draft
        emitted = verify_chain(ver, drafts, temperature, generator)
        res.accept_lengths.append(len(emitted))
        keep = emitted[: max_new_tokens - len(res.generated)]
        for j, tok in enumerate(keep):
            if tok in eos_ids:
                keep = keep[: j + 1]
                break
        res.generated.extend(keep)
        seq = torch.cat([seq, torch.tensor(keep, dtype=torch.long, device=device)])
        aux = aux_all[0]
        if keep and keep[-1] in eos_ids:
            break
    res.emitted = len(res.generated)
    return res


def verify_chain(ver_logits: torch.Tensor, drafts: list[int], temperature: float, generator: torch.Generator | None = None) -> list[int]:
    """Tokens one verify emits: the accepted prefix of `drafts` plus one token from the target.

    ver_logits[i] is the target's next-token logits after the committed prefix and drafts[:i]
    (len(drafts) + 1 rows). Greedy: accept while the draft is the argmax, then emit the argmax. Sampled:
    the draft is deterministic, so accept d with probability p(d); on rejection sample from p without d
    (renormalised); after a fully accepted chain sample the bonus from the last row. Either way every
    emitted token is distributed as the target alone would have produced it.
    """
    emitted: list[int] = []
    for i, d in enumerate(drafts):
        if temperature <= 0:
            best = int(ver_logits[i].argmax())
            emitted.append(best)
            if best != d:
                return emitted
            continue
        probs = torch.softmax(ver_logits[i].float() / temperature, -1).cpu()
        if float(torch.rand((), generator=generator)) < float(probs[d]):
            emitted.append(d)
            continue
        residual = probs.clone()
        residual[d] = 0
        emitted.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return emitted
    emitted.append(_pick(ver_logits[len(drafts)], temperature, generator))
    return emitted


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, -1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def bootstrap_ci(
    numerators: list[float], denominators: list[float], resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap over prompts of sum(numerators) / sum(denominators)."""
    n = len(numerators)
    if n == 0:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        den = sum(denominators[i] for i in pick)
        stats.append(sum(numerators[i] for i in pick) / den if den else math.nan)
    stats.sort()
    lo = stats[int((1 - level) / 2 * resamples)]
    hi = stats[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


@torch.no_grad()
def simulated_on_sequence(
    target: torch.nn.Module, draft: Eagle3Draft, seq: list[int], prompt_len: int, layer_ids: list[int], steps: int
) -> list[tuple[int, int]]:
    """Per-step (correct, counted) of the TTT accuracy on one generated sequence (generated part masked in)."""
    from .train import target_distribution, ttt_loss

    device = next(draft.parameters()).device
    ids = torch.tensor(seq, dtype=torch.long, device=device)[None]
    aux, final, _ = capture_forward(target, ids.to(next(target.parameters()).device), layer_ids)
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[0, prompt_len:] = True
    batch = {"input_ids": ids, "loss_mask": loss_mask, "aux": aux.to(device, next(draft.parameters()).dtype), "final": final.to(device)}
    d2t_to_target, target_to_draft = draft_ids_of_targets(draft.d2t.cpu(), draft.cfg.vocab_size)
    head = cast(Any, target).get_output_embeddings().weight.to(device)  # a transformers model, typed as its nn.Module
    p, am, iv = target_distribution(batch, head[d2t_to_target.to(device)], head, draft.t2d, target_to_draft.to(device))
    _, _, counts = ttt_loss(draft, batch, p, am, iv, steps, 0.8)
    return counts


def evaluate_drafter(
    target: torch.nn.Module,
    proposer: Proposer,
    prompts: list[list[int]],
    layer_ids: list[int],
    *,
    num_steps: int = 3,
    num_draft_tokens: int | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    eos_ids: set[int] | None = None,
    seed: int = 0,
    draft_for_simulation: Eagle3Draft | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Acceptance statistics of `proposer` against `target` over `prompts` (token id lists)."""
    from tqdm import tqdm

    num_draft_tokens = num_draft_tokens or num_steps + 1
    if num_draft_tokens != num_steps + 1:
        # SGLang corrects topk-1 runs the same way (with a warning).
        log.warning("topk 1: num_draft_tokens %d corrected to num_steps + 1 = %d", num_draft_tokens, num_steps + 1)
        num_draft_tokens = num_steps + 1
    gen = torch.Generator().manual_seed(seed) if temperature > 0 else None  # CPU: reproducible anywhere
    results: list[PromptResult] = []
    sim_correct = [0] * num_steps
    sim_count = [0] * num_steps
    for prompt in tqdm(prompts, desc=f"evaluate T={temperature}", disable=not progress):
        if not prompt:
            raise InputError("an evaluation prompt is empty")
        r = speculative_generate(
            target,
            proposer,
            prompt,
            layer_ids,
            num_steps=num_steps,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            eos_ids=eos_ids,
            generator=gen,
        )
        results.append(r)
        if draft_for_simulation is not None and len(r.generated) > 2:
            counts = simulated_on_sequence(target, draft_for_simulation, prompt + r.generated, len(prompt), layer_ids, num_steps)
            for k, (c, n) in enumerate(counts):
                sim_correct[k] += c
                sim_count[k] += n
    verifies = sum(len(r.accept_lengths) for r in results)
    accepted = sum(sum(r.accept_lengths) for r in results)
    emitted_after_first = sum(r.emitted - 1 for r in results)  # the first token comes from prefill
    per_prompt_num = [float(sum(r.accept_lengths)) for r in results]
    per_prompt_den = [float(len(r.accept_lengths)) for r in results]
    lo, hi = bootstrap_ci(per_prompt_num, per_prompt_den, seed=seed)
    out: dict[str, Any] = {
        "prompts": len(results),
        "num_steps": num_steps,
        "topk": 1,
        "num_draft_tokens": num_draft_tokens,
        "temperature": temperature,
        "verifies": verifies,
        "acceptance_length": accepted / verifies if verifies else math.nan,
        "acceptance_length_ci95": [lo, hi],
        "tokens_per_verify": emitted_after_first / verifies if verifies else math.nan,
        "acceptance_rate": (accepted - verifies) / (verifies * num_steps) if verifies else math.nan,
        "generated_tokens": sum(r.emitted for r in results),
        "accept_length_histogram": {str(k): sum(r.accept_lengths.count(k) for r in results) for k in range(1, num_draft_tokens + 1)},
    }
    if draft_for_simulation is not None:
        acc = [c / n if n else 0.0 for c, n in zip(sim_correct, sim_count)]
        out["simulated_step_accuracy"] = acc
        out["simulated_acceptance_length"] = simulated_acceptance(acc)
    return out


def load_prompts(path: str | Path, tokenizer: Any, limit: int | None = None) -> list[list[int]]:
    """Held-out prompts: regenerated samples (prompt = tokens before the first loss-masked one) or
    conversations (the turns before the last assistant turn, rendered with the generation prompt)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: not found; pass a JSONL of samples or conversations")
    prompts: list[list[int]] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        if "input_ids" in rec and "loss_mask" in rec:
            mask = rec["loss_mask"]
            first = mask.index(1) if 1 in mask else len(mask)
            prompts.append(list(rec["input_ids"][:first]))
        else:
            from .regenerate import normalize_conversation

            msgs = normalize_conversation(rec, f"{path}:{n}")
            while msgs and msgs[-1]["role"] == "assistant":
                msgs.pop()
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            prompts.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        if limit and len(prompts) >= limit:
            break
    return [p for p in prompts if p]
