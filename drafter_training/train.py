"""Stage 4: train the EAGLE-3 draft with training-time test (TTT).

Alignment (as the server runs it): the draft row t sees the target's captured layers at token t and the
embedding of token t+1, and predicts token t+2. Unrolled step k (k = 0..ttt_steps-1) embeds the
ground-truth token t+1+k, takes the previous step's own hidden state, sits at rotary position t+k and is
scored against the target's next-token distribution at position t+1+k (which predicts token t+2+k).

Loss: forward KL(target || draft) over the draft vocabulary, averaged over the positions whose predicted
token is loss-masked (assistant-written) and whose target argmax is inside the draft vocabulary, weighted
0.8^k per step. AdamW, linear warm-up then cosine decay, gradient-norm clipping, bf16 autocast on GPU,
one GPU or `torchrun` DDP (WORLD_SIZE/RANK/LOCAL_RANK), checkpoints every N steps and per epoch, resume.
Evaluation each epoch on a held-out split: per-step accuracy and simulated acceptance length
1 + sum_k prod_{i<=k} acc_i.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec_operator.errors import InputError

from .capture import CaptureReader
from .model import DraftConfig, Eagle3Draft, trainable_state_dict
from .target import read_config
from .vocab import draft_ids_of_targets, load_mapping

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    capture_dir: str
    target_dir: str
    out_dir: str
    vocab_dir: str | None = None  # default: capture_dir
    ttt_steps: int = 7
    epochs: int = 10
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.015
    grad_clip: float = 0.5
    step_weight: float = 0.8
    batch_size: int = 1
    max_length: int = 2048
    eval_fraction: float = 0.05
    eval_max_samples: int = 256
    checkpoint_every: int = 0  # optimizer steps; 0 = per epoch only
    seed: int = 0
    device: str | None = None
    intermediate_size: int | None = None
    max_steps: int | None = None  # cap on total optimizer steps (the schedule is laid out over this many)
    stop_after: int | None = None  # leave this invocation after N steps (checkpointed; resume continues)
    progress: bool = True
    init_from: str | None = None  # a training run's final/ (draft.safetensors): its weights
    # An exported drafter (specdec-train export --out, either engine or format): its shape, weights and vocabulary map
    # (warmstart.py); init_from_engine: the convention of its config's layer ids when nothing in it says.
    init_from_drafter: str | None = None
    init_from_engine: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---- target tensors ---------------------------------------------------------------------------------


def load_target_tensors(target_dir: str | Path, suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Find tensors whose names end with the given suffixes in the target's safetensors (bounded reads)."""
    target_dir = Path(target_dir)
    files = sorted(target_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"{target_dir}: no *.safetensors; the trainer reads the target's embeddings from them")
    found: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118  (safe_open is not iterable)
                for suffix in suffixes:
                    if suffix not in found and (name == suffix or name.endswith("." + suffix)):
                        found[suffix] = handle.get_tensor(name)
    return found


def target_embeddings_and_head(target_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    found = load_target_tensors(target_dir, ("embed_tokens.weight", "lm_head.weight"))
    if "embed_tokens.weight" not in found:
        raise InputError(f"{target_dir}: no *embed_tokens.weight in its safetensors")
    embed = found["embed_tokens.weight"]
    head = found.get("lm_head.weight", embed)  # tied embeddings
    return embed, head


def draft_config_from_target(
    target_cfg: dict[str, Any], draft_vocab_size: int, aux_layer_ids: list[int], intermediate_size: int | None = None
) -> DraftConfig:
    """The draft mirrors the target's width, heads and rotary base (so it can share the target's embeddings)."""
    heads = target_cfg["num_attention_heads"]
    kv = target_cfg.get("num_key_value_heads") or heads
    rope = target_cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", target_cfg.get("rope_theta", 10000.0))
    return DraftConfig(
        hidden_size=target_cfg["hidden_size"],
        intermediate_size=intermediate_size or target_cfg.get("intermediate_size") or 4 * target_cfg["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=target_cfg["hidden_size"] // heads,
        vocab_size=target_cfg["vocab_size"],
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=target_cfg["hidden_size"],
        aux_layer_ids=list(aux_layer_ids),
        rms_norm_eps=float(target_cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position_embeddings=int(target_cfg.get("max_position_embeddings", 4096)),
    )


# ---- batches ------------------------------------------------------------------------------------------


def collate(samples: list[dict[str, torch.Tensor]], max_length: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of captured samples into one batch (padding is loss-masked)."""
    n = min(max(s["input_ids"].numel() for s in samples), max_length)
    b = len(samples)
    out: dict[str, torch.Tensor] = {
        "input_ids": torch.zeros(b, n, dtype=torch.long),
        "loss_mask": torch.zeros(b, n, dtype=torch.bool),
        "aux": torch.zeros(b, n, samples[0]["aux"].shape[-1], dtype=samples[0]["aux"].dtype),
    }
    if "final" in samples[0]:
        out["final"] = torch.zeros(b, n, samples[0]["final"].shape[-1], dtype=samples[0]["final"].dtype)
    else:
        k = samples[0]["topk_ids"].shape[-1]
        out["topk_ids"] = torch.zeros(b, n, k, dtype=torch.long)
        out["topk_logprobs"] = torch.full((b, n, k), float("-inf"))
    for r, s in enumerate(samples):
        m = min(s["input_ids"].numel(), n)
        for key in out:
            out[key][r, :m] = s[key][:m]
    return out


def target_distribution(
    batch: dict[str, torch.Tensor],
    head_draft: torch.Tensor,
    head_full: torch.Tensor,
    t2d: torch.Tensor,
    target_to_draft: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p over draft vocab [B,T,Dv] float32, target argmax as draft id [B,T], argmax-in-draft-vocab [B,T])."""
    if "final" in batch:
        final = batch["final"].to(head_full.dtype)
        argmax = (final @ head_full.T).argmax(-1)
        p = torch.softmax((final @ head_draft.T).float(), dim=-1)
    else:
        ids, lps = batch["topk_ids"], batch["topk_logprobs"]
        argmax = ids[..., 0]
        draft = target_to_draft[ids]
        prob = torch.where(draft >= 0, lps.exp(), torch.zeros_like(lps))
        p = torch.zeros(*ids.shape[:2], head_draft.shape[0], device=ids.device)
        p.scatter_add_(-1, draft.clamp(min=0), prob)
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
    in_vocab = t2d[argmax]
    return p, target_to_draft[argmax].clamp(min=0), in_vocab


def shifted(x: torch.Tensor, k: int, fill: float | int | bool = 0) -> torch.Tensor:
    """x[:, t + k] at row t, `fill` past the end."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def ttt_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    p: torch.Tensor,
    target_draft_argmax: torch.Tensor,
    in_vocab: torch.Tensor,
    ttt_steps: int,
    step_weight: float,
) -> tuple[torch.Tensor, list[float], list[tuple[int, int]]]:
    """Weighted KL over the unrolled steps; returns (loss, per-step KL, per-step (correct, counted))."""
    ids, loss_mask = batch["input_ids"], batch["loss_mask"]
    b, t = ids.shape
    positions = torch.arange(t, device=ids.device)[None].expand(b, t)
    step_inputs = [shifted(ids, 1 + k) for k in range(ttt_steps)]
    if isinstance(model, Eagle3Draft):
        logits_per_step = model.unroll(batch["aux"], step_inputs, positions)
    else:  # DistributedDataParallel around _Unroller: its forward is the unroll
        logits_per_step = model(batch["aux"], step_inputs, positions)
    total = torch.zeros((), device=ids.device)
    stats = []
    for k, logits in enumerate(logits_per_step):
        pk = shifted(p, 1 + k)
        valid = shifted(loss_mask, 2 + k, False) & shifted(in_vocab, 1 + k, False)
        n = valid.sum()
        logq = F.log_softmax(logits.float(), dim=-1)
        # KL(p || q) = sum p (log p - log q); xlogy keeps p = 0 terms at 0.
        kl_rows = (torch.special.xlogy(pk, pk) - pk * logq).sum(-1)
        kl = (kl_rows * valid).sum() / n.clamp(min=1)
        total = total + (step_weight**k) * kl
        correct = ((logits.argmax(-1) == shifted(target_draft_argmax, 1 + k)) & valid).sum()
        stats.append(torch.stack([kl.detach().float(), correct.float(), n.float()]))
    # One device-to-host copy per batch instead of three per unrolled step (each would stall the GPU).
    host = torch.stack(stats).cpu().tolist()
    kls = [row[0] for row in host]
    counts = [(int(row[1]), int(row[2])) for row in host]
    return total, kls, counts


class _Unroller(torch.nn.Module):
    """Gives DDP a forward() that is the unrolled draft (DDP hooks fire on forward)."""

    def __init__(self, draft: Eagle3Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, aux, step_inputs, positions):
        return self.draft.unroll(aux, step_inputs, positions)


def simulated_acceptance(accuracies: list[float], steps: int | None = None) -> float:
    """SpecForge's simulated acceptance length 1 + sum_k prod_{i<=k} acc_i (bonus token included)."""
    total, running = 1.0, 1.0
    for acc in accuracies[: steps or len(accuracies)]:
        running *= acc
        total += running
    return total


# ---- the loop -----------------------------------------------------------------------------------------


def _dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def split_indices(n: int, eval_fraction: float, eval_max: int, seed: int) -> tuple[list[int], list[int]]:
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    n_eval = min(eval_max, round(n * eval_fraction)) if n > 1 else 0
    if eval_fraction > 0 and n > 1:
        n_eval = max(1, n_eval)
    return sorted(idx[n_eval:]), sorted(idx[:n_eval])


def make_batches(indices: list[int], lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Length-bucketed batches in a seeded random order (padding waste stays small)."""
    order = sorted(indices, key=lambda i: lengths[i])
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


def cosine_lambda(total_steps: int, warmup_ratio: float):
    warm = max(1, int(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


@torch.no_grad()
def evaluate_split(
    model: Eagle3Draft,
    reader: CaptureReader,
    indices: list[int],
    cfg: TrainConfig,
    device: torch.device,
    heads: tuple[torch.Tensor, torch.Tensor],
    t2d: torch.Tensor,
    target_to_draft: torch.Tensor,
) -> dict[str, Any]:
    """Per-step accuracy and KL on held-out samples, and the simulated acceptance length."""
    model.eval()
    correct = [0] * cfg.ttt_steps
    counted = [0] * cfg.ttt_steps
    kl_sum = [0.0] * cfg.ttt_steps
    for i in indices:
        batch = {k: v.to(device) for k, v in collate([reader.get(i)], cfg.max_length).items()}
        with _autocast(device):
            p, am, iv = target_distribution(batch, heads[0], heads[1], t2d, target_to_draft)
            _, kls, counts = ttt_loss(model, batch, p, am, iv, cfg.ttt_steps, cfg.step_weight)
        for k, (c, n) in enumerate(counts):
            correct[k] += c
            counted[k] += n
            kl_sum[k] += kls[k] * n
    model.train()
    acc = [c / n if n else 0.0 for c, n in zip(correct, counted)]
    return {
        "step_accuracy": acc,
        "step_kl": [s / n if n else 0.0 for s, n in zip(kl_sum, counted)],
        "positions": counted[0],
        "simulated_acceptance_length": simulated_acceptance(acc),
        "simulated_acceptance_length_3_steps": simulated_acceptance(acc, 3),
    }


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def build_draft(
    cfg: TrainConfig, index: dict[str, Any], target_cfg: dict[str, Any], embed: torch.Tensor
) -> tuple[Eagle3Draft, DraftConfig, torch.Tensor, torch.Tensor]:
    """The draft a run starts from, with its vocabulary map: a new one shaped after the target with the capture's map
    (--vocab), or an exported drafter's shape, weights and map (--init-from-drafter; warmstart.py); then a training
    run's weights over it (--init-from)."""
    if cfg.init_from_drafter:
        from .warmstart import check_capture_layers, load_exported_drafter

        if cfg.vocab_dir:
            raise InputError("--vocab with --init-from-drafter: the drafter's own vocabulary map is kept; drop --vocab")
        if cfg.init_from:
            raise InputError("--init-from with --init-from-drafter: start from one of them")
        warm = load_exported_drafter(cfg.init_from_drafter, cfg.target_dir, cfg.init_from_engine)
        check_capture_layers(warm, cfg.init_from_drafter, cfg.capture_dir, index["aux_layer_ids"])
        if cfg.intermediate_size and cfg.intermediate_size != warm.config.intermediate_size:
            raise InputError(f"--intermediate-size {cfg.intermediate_size}: the drafter's {warm.config.intermediate_size} is kept; drop it")
        draft_cfg, d2t, t2d, weights = warm.config, warm.d2t, warm.t2d, warm.weights
    else:
        weights = {}
        d2t, t2d = load_mapping(cfg.vocab_dir or cfg.capture_dir)
        draft_cfg = draft_config_from_target(target_cfg, d2t.numel(), index["aux_layer_ids"], cfg.intermediate_size)
    model = Eagle3Draft(draft_cfg)
    model.embed_tokens.weight.data.copy_(embed.float())
    model.load_state_dict(weights, strict=False)  # the exported drafter's (none for a new draft)
    model.set_vocab_mapping(d2t, t2d)
    if cfg.init_from:
        model.load_state_dict(load_file(str(Path(cfg.init_from) / "draft.safetensors")), strict=False)
    return model, draft_cfg, d2t, t2d


def _save_checkpoint(path: Path, model: Eagle3Draft, opt, sched, state: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "checkpoint.pt.tmp"
    torch.save(
        {
            "model": trainable_state_dict(model),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "state": state,
            "rng": torch.get_rng_state(),
        },
        tmp,
    )
    os.replace(tmp, path / "checkpoint.pt")


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train a draft; writes `<out>/final/` (draft_config.json, draft.safetensors, train_summary.json)."""
    from tqdm import tqdm

    rank, world, local_rank = _dist_env()
    if world > 1:
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if cfg.device:
        device = torch.device(cfg.device)
    elif torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(cfg.seed)

    out = Path(cfg.out_dir)
    reader = CaptureReader(cfg.capture_dir)
    index = reader.index.data
    target_cfg = read_config(cfg.target_dir)
    if target_cfg["hidden_size"] != index["hidden_size"] or target_cfg["vocab_size"] != index["vocab_size"]:
        raise InputError(
            f"{cfg.capture_dir}: captured from a model with hidden {index['hidden_size']}/vocab {index['vocab_size']}, "
            f"but --target has {target_cfg['hidden_size']}/{target_cfg['vocab_size']}; pass the captured target"
        )
    embed, head = target_embeddings_and_head(cfg.target_dir)
    model, draft_cfg, d2t, t2d = build_draft(cfg, index, target_cfg, embed)
    model.to(device)
    draft_to_target, target_to_draft = draft_ids_of_targets(d2t, draft_cfg.vocab_size)
    head_full = head.to(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    head_draft = head_full[draft_to_target.to(device)]
    t2d_dev, t2d_map = t2d.to(device), target_to_draft.to(device)

    train_idx, eval_idx = split_indices(len(reader), cfg.eval_fraction, cfg.eval_max_samples, cfg.seed)
    if not train_idx:
        raise InputError(f"{cfg.capture_dir}: no training samples after holding out the evaluation split")
    lengths = reader.lengths()
    batches_per_epoch = math.ceil(len(train_idx) / cfg.batch_size)
    # Every rank runs the same number of steps (DDP all-reduces each one).
    steps_per_epoch = max(1, batches_per_epoch // world) if world > 1 else batches_per_epoch
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_lambda(total_steps, cfg.warmup_ratio))
    state: dict[str, Any] = {"epoch": 0, "batch_in_epoch": 0, "step": 0, "history": [], "evals": [], "tokens": 0}
    ckpt = out / "checkpoint"
    if (ckpt / "checkpoint.pt").is_file():
        saved = torch.load(ckpt / "checkpoint.pt", map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        state = saved["state"]
        torch.set_rng_state(saved["rng"])
        log.info("resumed at epoch %d batch %d (step %d)", state["epoch"], state["batch_in_epoch"], state["step"])

    runner: torch.nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        runner = DistributedDataParallel(_Unroller(model), device_ids=[local_rank] if device.type == "cuda" else None)
    model.train()
    heads = (head_draft, head_full)
    started = time.time()
    tokens_this_run = 0
    bar = tqdm(total=total_steps, initial=state["step"], desc="train", unit="step", disable=not cfg.progress or rank)
    done = state["step"] >= total_steps
    started_step, stopped = state["step"], False
    while not done and not stopped and state["epoch"] < cfg.epochs:
        batches = make_batches(train_idx, lengths, cfg.batch_size, cfg.seed + state["epoch"])
        mine = batches[rank::world][:steps_per_epoch]
        for bi in range(state["batch_in_epoch"], len(mine)):
            samples = [reader.get(i) for i in mine[bi]]
            batch = {k: v.to(device, non_blocking=True) for k, v in collate(samples, cfg.max_length).items()}
            with _autocast(device):
                with torch.no_grad():
                    p, am, iv = target_distribution(batch, head_draft, head_full, t2d_dev, t2d_map)
                loss, kls, counts = ttt_loss(runner, batch, p, am, iv, cfg.ttt_steps, cfg.step_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            ntok = int(batch["loss_mask"].sum())
            tokens_this_run += int(batch["input_ids"].numel())
            state["tokens"] += ntok
            state["step"] += 1
            state["batch_in_epoch"] = bi + 1
            if state["batch_in_epoch"] == len(mine):
                state["epoch"] += 1
                state["batch_in_epoch"] = 0
            state["history"].append(
                {
                    "step": state["step"],
                    "loss": float(loss.detach()),
                    "kl": kls,
                    "grad_norm": float(grad_norm),
                    "lr": sched.get_last_lr()[0],
                    "acc0": counts[0][0] / max(counts[0][1], 1),
                }
            )
            bar.update(1)
            bar.set_postfix(loss=f"{state['history'][-1]['loss']:.3f}", acc0=f"{state['history'][-1]['acc0']:.2f}")
            if rank == 0 and cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0:
                _save_checkpoint(ckpt, model, opt, sched, state)
            if state["step"] >= total_steps:
                done = True
                break
            if cfg.stop_after and state["step"] - started_step >= cfg.stop_after:
                stopped = True
                break
        if stopped:
            if rank == 0:
                _save_checkpoint(ckpt, model, opt, sched, state)
            break
        if rank == 0 and eval_idx:
            ev = evaluate_split(model, reader, eval_idx, cfg, device, heads, t2d_dev, t2d_map)
            ev["epoch"] = state["epoch"]
            ev["step"] = state["step"]
            state["evals"].append(ev)
            log.info(
                "epoch %d eval: acc %s simulated accept %.3f",
                state["epoch"],
                [round(a, 3) for a in ev["step_accuracy"]],
                ev["simulated_acceptance_length"],
            )
        if rank == 0:
            _save_checkpoint(ckpt, model, opt, sched, state)
    bar.close()
    elapsed = time.time() - started
    summary = {
        "config": asdict(cfg),
        "draft_config": draft_cfg.to_dict(),
        "num_samples": len(train_idx),
        "num_eval_samples": len(eval_idx),
        "epochs_completed": state["epoch"] + (state["batch_in_epoch"] / max(steps_per_epoch, 1)),
        "epochs": cfg.epochs,
        "steps": state["step"],
        "wall_seconds_this_run": elapsed,
        "tokens_per_second": tokens_this_run * world / elapsed if elapsed > 0 else 0.0,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "first_loss": state["history"][0]["loss"] if state["history"] else None,
        "last_loss": state["history"][-1]["loss"] if state["history"] else None,
        "history": state["history"],
        "evals": state["evals"],
        "capture": {
            k: index[k]
            for k in ("source", "target_model", "target_quantization", "aux_layer_ids", "aux_layer_ids_input_index", "storage", "tokenizer_sha256")
        },
    }
    if rank == 0:
        final = out / "final"
        final.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in trainable_state_dict(model).items()}, str(final / "draft.safetensors"))
        (final / "draft_config.json").write_text(json.dumps(draft_cfg.to_dict(), indent=1))
        (final / "train_summary.json").write_text(json.dumps(summary, indent=1))
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return summary


def load_trained(final_dir: str | Path, target_dir: str | Path | None = None) -> Eagle3Draft:
    """A trained draft from `<out>/final` (embeddings from the target checkpoint when given)."""
    final_dir = Path(final_dir)
    try:
        cfg = DraftConfig.from_dict(json.loads((final_dir / "draft_config.json").read_text()))
    except FileNotFoundError:
        raise InputError(f"{final_dir}/draft_config.json: not found; pass a training run's final/ directory") from None
    model = Eagle3Draft(cfg)
    model.load_state_dict(load_file(str(final_dir / "draft.safetensors")), strict=False)
    if target_dir is not None:
        embed, _ = target_embeddings_and_head(target_dir)
        model.embed_tokens.weight.data.copy_(embed.float())
    return model.eval()
