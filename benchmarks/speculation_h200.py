"""Speculative decoding on one GPU with the project's own target and EAGLE-3 drafter: acceptance on random
token ids vs held-out natural text, and real batched draft/verify throughput against target-only decoding.

The target and drafter are built as benchmarks/drafter_h200.py builds them (a ~100M Llama trained on the
machine's Python source, byte-level BPE; regenerate / capture / vocab / train through drafter_training),
then a KV-cached decoder measures:

  (a) acceptance length, greedy, chain drafting (topk 1, num_draft_tokens = steps + 1, as SGLang's EAGLE
      with topk 1), 3 and 7 draft steps, the same drafter, on prompts cut from held-out Python files and on
      prompts of uniformly random token ids (the output is the target's own greedy continuation either way,
      as in SGLang's bench_serving with the random dataset); bootstrap 95% intervals over sequences. The
      library's reference loop (drafter_training.evaluate, full recompute per verify) is run on the first
      prompts as a cross-check of the cached decoder.
  (b) decode throughput at several batch sizes: target-only (one token per sequence per forward) against
      speculative decoding (draft phase: one draft-extend pass over the rows the last verify accepted plus
      steps-1 chain steps; verify phase: ONE target forward over steps+1 tokens per sequence with a KV cache,
      greedy acceptance on the device). Each phase is one CUDA graph (torch.cuda.CUDAGraph) replayed; times
      are CUDA events around the replays after warm-up; eager timings are taken once per configuration too.
      Prefill is not timed (decode only).

    PYTHONPATH=.:operator python3 benchmarks/speculation_h200.py --out DIR          # the H200 run
    PYTHONPATH=.:operator python3 benchmarks/speculation_h200.py --out DIR --smoke  # minutes on a CPU
    python3 benchmarks/speculation_h200.py --analyze DIR/speculation-h200.json       # tables + simulator check

Attention runs over the whole preallocated cache with a mask (static shapes for the graphs), so a step's
attention cost does not grow with the context here; at these lengths (<= 400) attention is a small part.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from benchmarks.drafter_h200 import (
    build_target,
    corpus_and_tokenizer,
    heldout_quality,
    regenerate_local,
    train_target,
)
from drafter_training.capture import capture_hf
from drafter_training.evaluate import Eagle3Proposer, bootstrap_ci, evaluate_drafter
from drafter_training.model import Eagle3Draft, Rotary, rotate_half
from drafter_training.target import LoadedTarget, read_config
from drafter_training.train import TrainConfig, load_trained, train
from drafter_training.vocab import build_vocab

RESULTS: dict[str, Any] = {}
T0 = time.time()
OUT_NAME = "speculation-h200.json"


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def save(out: Path) -> None:
    RESULTS["elapsed_seconds"] = time.time() - T0
    (out / OUT_NAME).write_text(json.dumps(RESULTS, indent=1, default=float))


# ---- the KV-cached decoder ----------------------------------------------------------------------------


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Decoder:
    """Static-shape batched decoding of one target (+ optional EAGLE-3 draft) with KV caches.

    All state lives in preallocated device tensors that the phases update in place, so each phase can be
    captured once as a CUDA graph and replayed. Target cache slot == position. Draft row t pairs the
    target's captured layers at position t with token t+1 (SGLang's draft-extend), slot == rotary position.
    """

    def __init__(
        self, target: torch.nn.Module, draft: Eagle3Draft | None, batch: int, steps: int, max_len: int, aux_ids: list[int], iters: int
    ) -> None:
        p = next(target.parameters())
        self.dev, self.dtype = p.device, p.dtype
        self.t, self.d = target, draft
        self.B, self.S, self.L, self.iters = batch, steps, max_len, iters
        cfg = target.config
        self.layers = target.model.layers
        self.kvh = cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.aux_ids = set(aux_ids) if draft is not None else set()
        self.aux_order = list(aux_ids)
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=self.dev)  # noqa: E731
        self.tk = [z(batch, self.kvh, max_len, self.hd, dt=self.dtype) for _ in self.layers]
        self.tv = [z(batch, self.kvh, max_len, self.hd, dt=self.dtype) for _ in self.layers]
        self.slots = torch.arange(max_len, device=self.dev)
        self.arT = torch.arange(steps + 1, device=self.dev)
        self.tgt_len, self.last_tok, self.seq = z(batch), z(batch), z(batch, max_len)
        self.drafts = z(batch, steps)
        self.it, self.elog = z(1), z(iters + 4, batch)
        if draft is not None:
            dc = draft.cfg
            self.dkvh, self.dhd = dc.num_key_value_heads, dc.resolved_head_dim
            ddt = next(draft.parameters()).dtype  # the draft may run in another precision than the target
            self.dk = z(batch, self.dkvh, max_len, self.dhd, dt=ddt)
            self.dv = z(batch, self.dkvh, max_len, self.dhd, dt=ddt)
            self.drot = Rotary(self.dhd, dc.rope_theta).to(self.dev)  # float32 frequencies
            self.draft_len, self.pend_v = z(batch), z(batch)
            self.pend_ids = z(batch, steps + 1)
            self.pend_aux = z(batch, steps + 1, len(aux_ids) * cfg.hidden_size, dt=self.dtype)
        self._state_names = [
            n for n in ("tgt_len", "last_tok", "seq", "drafts", "it", "elog", "draft_len", "pend_v", "pend_ids", "pend_aux") if hasattr(self, n)
        ]
        self._snap: dict[str, torch.Tensor] = {}

    # -- model pieces
    def _mask(self, pos: torch.Tensor) -> torch.Tensor:
        return self.slots[None, None, None, :] <= pos[:, None, :, None]  # [B, 1, T, L]

    def target_forward(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        m = self.t.model
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, pos)
        cos, sin = cos[:, None], sin[:, None]
        mask = self._mask(pos)
        B, T = ids.shape
        slot = pos[:, None, :, None].expand(B, self.kvh, T, self.hd)
        aux = {}
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(B, T, -1, self.hd).transpose(1, 2)
            k = a.k_proj(x).view(B, T, -1, self.hd).transpose(1, 2)
            v = a.v_proj(x).view(B, T, -1, self.hd).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.tk[i].scatter_(2, slot, k)
            self.tv[i].scatter_(2, slot, v)
            o = F.scaled_dot_product_attention(q, self.tk[i], self.tv[i], attn_mask=mask, enable_gqa=self.kvh != q.shape[1])
            h = h + a.o_proj(o.transpose(1, 2).reshape(B, T, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i in self.aux_ids:
                aux[i] = h
        logits = self.t.lm_head(m.norm(h))
        return logits, (torch.cat([aux[i] for i in self.aux_order], -1) if aux else None)

    def draft_forward(self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, first: bool):
        d = self.d
        layer, attn = d.midlayer, d.midlayer.self_attn
        if first:
            hidden = d.fc(hidden.to(d.fc.weight.dtype))
        residual = hidden
        x = torch.cat([layer.input_layernorm(d.embed_tokens(ids)), layer.hidden_norm(hidden)], dim=-1)
        B, T, _ = x.shape
        q = attn.q_proj(x).view(B, T, -1, self.dhd).transpose(1, 2)
        k = attn.k_proj(x).view(B, T, -1, self.dhd).transpose(1, 2)
        v = attn.v_proj(x).view(B, T, -1, self.dhd).transpose(1, 2)
        q, k = self.drot(q, pos), self.drot(k, pos)
        slot = pos[:, None, :, None].expand(B, self.dkvh, T, self.dhd)
        self.dk.scatter_(2, slot, k)
        self.dv.scatter_(2, slot, v)
        o = F.scaled_dot_product_attention(q, self.dk, self.dv, attn_mask=self._mask(pos), enable_gqa=self.dkvh != q.shape[1])
        hidden = attn.o_proj(o.transpose(1, 2).reshape(B, T, -1)) + residual
        hidden = layer.mlp(layer.post_attention_layernorm(hidden)) + hidden
        return d.lm_head(d.norm(hidden)), hidden

    # -- phases
    @torch.no_grad()
    def prefill(self, prompts: torch.Tensor) -> torch.Tensor:
        """Eager, untimed: target over the prompts, then the draft over prompt rows 0..P-2; row P-1 pending."""
        B, P = prompts.shape
        pos = torch.arange(P, device=self.dev)[None].expand(B, P)
        logits, aux = self.target_forward(prompts, pos)
        first = logits[:, -1].argmax(-1)
        self.seq.zero_()
        self.seq[:, :P] = prompts
        self.seq[:, P] = first
        self.tgt_len.fill_(P)
        self.last_tok.copy_(first)
        self.it.zero_()
        self.elog.zero_()
        if self.d is not None:
            self.draft_forward(aux[:, : P - 1], prompts[:, 1:], pos[:, : P - 1], first=True)
            self.draft_len.fill_(P - 1)
            self.pend_aux.zero_()
            self.pend_aux[:, 0] = aux[:, P - 1]
            self.pend_ids.zero_()
            self.pend_ids[:, 0] = first
            self.pend_v.fill_(1)
        self._snap = {n: getattr(self, n).clone() for n in self._state_names}
        return logits

    def restore(self) -> None:
        for n, v in self._snap.items():
            getattr(self, n).copy_(v)

    @torch.no_grad()
    def draft_phase(self) -> None:
        d, B, S = self.d, self.B, self.S
        pos = self.draft_len[:, None] + self.arT  # extend rows: last verify's accepted rows (+ masked junk)
        logits, hidden = self.draft_forward(self.pend_aux, self.pend_ids, pos, first=True)
        row = (self.pend_v - 1)[:, None, None]
        lg = logits.gather(1, row.expand(B, 1, logits.shape[-1]))[:, 0]
        h = hidden.gather(1, row.expand(B, 1, hidden.shape[-1]))
        new_len = self.draft_len + self.pend_v
        self.draft_len.copy_(new_len)
        tok = d.draft_to_target(lg.argmax(-1))
        self.drafts[:, 0] = tok
        for k in range(1, S):
            p = (new_len - 1 + k)[:, None]
            lg, h = self.draft_forward(h, tok[:, None], p, first=False)
            tok = d.draft_to_target(lg[:, 0].argmax(-1))
            self.drafts[:, k] = tok

    @torch.no_grad()
    def verify_phase(self) -> None:
        S = self.S
        ids = torch.cat([self.last_tok[:, None], self.drafts], 1)  # [B, S+1]
        pos = self.tgt_len[:, None] + self.arT
        logits, aux = self.target_forward(ids, pos)
        g = logits.argmax(-1)
        if S:
            n = (self.drafts == g[:, :S]).long().cumprod(1).sum(1)
        else:
            n = torch.zeros_like(self.tgt_len)
        e = n + 1
        self.seq.scatter_(1, self.tgt_len[:, None] + 1 + self.arT, g)
        self.last_tok.copy_(g.gather(1, n[:, None])[:, 0])
        self.tgt_len.add_(e)
        if self.d is not None:
            self.pend_aux.copy_(aux)
            self.pend_ids.copy_(g)
            self.pend_v.copy_(e)
        self.elog.index_copy_(0, self.it, e[None])
        self.it.add_(1)

    def phases(self):
        return ([self.draft_phase] if self.d is not None else []) + [self.verify_phase]


def capture(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def timed_loop(dec: Decoder, calls: list, iters: int) -> dict[str, float]:
    """Run `iters` iterations of the phase callables; per-phase and total milliseconds."""
    n = len(calls)
    if dec.dev.type == "cuda":
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters * n + 1)]
        ev[0].record()
        for i in range(iters):
            for j, c in enumerate(calls):
                c()
                ev[i * n + j + 1].record()
        torch.cuda.synchronize()
        per = [[ev[i * n + j].elapsed_time(ev[i * n + j + 1]) for i in range(iters)] for j in range(n)]
        total = ev[0].elapsed_time(ev[-1])
    else:
        per = [[0.0] * iters for _ in range(n)]
        start = time.perf_counter()
        for i in range(iters):
            for j, c in enumerate(calls):
                t = time.perf_counter()
                c()
                per[j][i] = (time.perf_counter() - t) * 1e3
        total = (time.perf_counter() - start) * 1e3
    out = {"total_ms": total}
    names = ["draft_ms", "verify_ms"] if n == 2 else ["verify_ms"]
    for name, xs in zip(names, per, strict=True):
        out[name] = sum(xs)
    return out


def run_config(
    target,
    draft,
    prompts: torch.Tensor,
    batch: int,
    steps: int,
    iters: int,
    groups: int,
    reps: int,
    max_len: int,
    aux_ids: list[int],
    use_graphs: bool,
    eager: bool,
) -> dict[str, Any]:
    dec = Decoder(target, draft if steps else None, batch, steps, max_len, aux_ids, iters)
    res: dict[str, Any] = {"batch": batch, "steps": steps, "iters": iters, "groups": groups, "reps": reps, "sequences": batch * groups}
    dec.prefill(prompts[:batch])
    calls = dec.phases()
    graphs_ok = False
    if use_graphs:
        try:
            gs = [capture(c) for c in calls]
            calls_g = [g.replay for g in gs]
            graphs_ok = True
        except Exception as exc:  # recorded, then eager
            res["graph_error"] = f"{type(exc).__name__}: {exc}"[:500]
            torch.cuda.synchronize()
    res["cuda_graphs"] = graphs_ok
    run_calls = calls_g if graphs_ok else calls
    totals, drafts_ms, verifies_ms, tokens = [], [], [], 0
    elogs, seqs = [], []
    for g in range(groups):
        dec.prefill(prompts[g * batch : (g + 1) * batch])
        reps_t = []
        for r in range(reps):
            dec.restore()
            reps_t.append(timed_loop(dec, run_calls, iters))
            if r == 0:
                el = dec.elog[:iters].clone()
            elif not torch.equal(el, dec.elog[:iters]):
                res["nondeterministic_reps"] = True
        med = sorted(reps_t, key=lambda x: x["total_ms"])[len(reps_t) // 2]
        totals.append(med["total_ms"])
        drafts_ms.append(med.get("draft_ms", 0.0))
        verifies_ms.append(med["verify_ms"])
        elogs.append(el.cpu())
        seqs.append(dec.seq.cpu().clone())
        tokens += int(el.sum())
    total_ms = sum(totals)
    res.update(
        {
            "tokens": tokens,
            "total_ms": total_ms,
            "draft_ms": sum(drafts_ms),
            "verify_ms": sum(verifies_ms),
            "tokens_per_second": tokens / (total_ms / 1e3),
            "iteration_ms": total_ms / (groups * iters),
            "draft_ms_per_iteration": sum(drafts_ms) / (groups * iters),
            "verify_ms_per_iteration": sum(verifies_ms) / (groups * iters),
            "accept_length": tokens / (batch * groups * iters),
            "group_total_ms": totals,
        }
    )
    elog = torch.cat(elogs, 1)  # [iters, sequences]
    per_seq = elog.sum(0).double() / iters
    res["accept_length_per_sequence"] = per_seq.tolist()
    res["accept_length_ci95"] = list(bootstrap_ci(elog.sum(0).double().tolist(), [float(iters)] * elog.shape[1]))
    res["accept_length_by_iteration"] = elog.double().mean(1).tolist()
    res["accept_length_histogram"] = {str(k): int((elog == k).sum()) for k in range(1, steps + 2)}
    res["_seqs"] = torch.cat(seqs, 0)  # dropped before saving
    res["_elog"] = elog
    if eager and graphs_ok:
        # The same first group, eager: its time, and a check that the graphs produced the same tokens.
        dec.prefill(prompts[:batch])
        dec.restore()
        te = timed_loop(dec, calls, iters)
        res["eager"] = {
            "total_ms": te["total_ms"],
            "tokens_per_second": int(dec.elog[:iters].sum()) / (te["total_ms"] / 1e3),
            "draft_ms": te.get("draft_ms", 0.0),
            "verify_ms": te["verify_ms"],
            "same_tokens_as_graphs": bool(torch.equal(dec.elog[:iters].cpu(), elogs[0]) and torch.equal(dec.seq.cpu(), seqs[0])),
        }
    del dec
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return res


def first_divergence(a: torch.Tensor, b: torch.Tensor, start: int, lengths: list[int]) -> list[int]:
    """Per row: index (from start) of the first differing token within that row's length, else the length."""
    out = []
    for i, n in enumerate(lengths):
        nz = (a[i, start : start + n] != b[i, start : start + n]).nonzero()
        out.append(int(nz[0]) if nz.numel() else n)
    return out


# ---- analysis (no GPU): tables and the simulator check --------------------------------------------------


def analyze(path: Path) -> str:
    from specdec_operator.simulator.model import profile_from_dict

    data = json.loads(path.read_text())
    rows = data["throughput"]
    lines = []
    by = {(r["data"], r["batch"], r["steps"]): r for r in rows}
    batches = sorted({r["batch"] for r in rows})
    steps_list = sorted({r["steps"] for r in rows if r["steps"]})
    for kind in ("natural", "random"):
        for s in steps_list:
            graphs = all(r["cuda_graphs"] for r in rows if r["data"] == kind and r["steps"] in (0, s))
            lines.append(f"\n{kind}, {s} steps ({'CUDA graphs' if graphs else 'eager, at least in part'})")
            lines.append(
                "| batch | target-only tok/s | speculative tok/s | speedup | accept len | base step ms | "
                "spec iteration ms (draft + verify) | eager: target-only, speculative tok/s, speedup |"
            )
            lines.append("|---|---|---|---|---|---|---|---|")
            for b in batches:
                base, spec = by.get((kind, b, 0)), by.get((kind, b, s))
                if not base or not spec:
                    continue
                lines.append(
                    f"| {b} | {base['tokens_per_second']:,.0f} | {spec['tokens_per_second']:,.0f} | "
                    f"{spec['tokens_per_second'] / base['tokens_per_second']:.2f} | {spec['accept_length']:.2f} | "
                    f"{base['iteration_ms']:.3f} | {spec['iteration_ms']:.3f} "
                    f"({spec['draft_ms_per_iteration']:.3f} + {spec['verify_ms_per_iteration']:.3f}) | "
                    + (
                        f"{base['eager']['tokens_per_second']:,.0f}, {spec['eager']['tokens_per_second']:,.0f}, "
                        f"{spec['eager']['tokens_per_second'] / base['eager']['tokens_per_second']:.2f} |"
                        if "eager" in base and "eager" in spec
                        else "– |"
                    )
                )
    # The simulator: step_ms(batch) interpolated linearly, accept_length_mean independent of batch.
    # A profile of two measured points (batch 1 and batch 128, as the shipped Kimi profiles are built from two
    # points) and one accept length (batch 1's), against what was measured between and beyond those points.
    lo = batches[0]
    hi = 128 if 128 in batches else batches[-1]
    lines.append(
        f"\nsimulator check: Profile.step_seconds from two measured points (batch {lo} and {hi}), "
        f"accept_length_mean from batch {lo}; beyond {hi} the simulator extrapolates linearly"
    )
    lines.append(
        "| data | steps | batch | measured speedup | simulator speedup | base step: simulator / measured | spec step: simulator / measured |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for kind in ("natural", "random"):
        for s in steps_list:

            def prof(mode, pts, kind=kind, s=s):
                return profile_from_dict(
                    {
                        "name": f"{kind}-{mode}",
                        "load_seconds": 0,
                        "max_running_requests": 4096,
                        "prefill_tokens_per_s": 1e9,
                        "jitter": 0.0,
                        "step_ms": [[b, by[(kind, b, mode)]["iteration_ms"]] for b in pts],
                        "speculative": None
                        if mode == 0
                        else {
                            "algorithm": "EAGLE3",
                            "num_steps": s,
                            "eagle_topk": 1,
                            "num_draft_tokens": s + 1,
                            "accept_length_mean": by[(kind, lo, s)]["accept_length"],
                        },
                    }
                )

            b2, s2 = prof(0, [lo, hi]), prof(s, [lo, hi])

            def sim(b, b2=b2, s2=s2):
                return s2.mean_tokens_per_step * b2.step_seconds(b) / s2.step_seconds(b)

            for b in batches:
                base, spec = by[(kind, b, 0)], by[(kind, b, s)]
                meas = spec["tokens_per_second"] / base["tokens_per_second"]
                lines.append(
                    f"| {kind} | {s} | {b} | {meas:.2f} | {sim(b):.2f} | "
                    f"{b2.step_seconds(b) * 1e3 / base['iteration_ms']:.2f} | "
                    f"{s2.step_seconds(b) * 1e3 / spec['iteration_ms']:.2f} |"
                )
            # crossover: where the measured speedup crosses 1, linear in batch between measured points
            sp = [(b, by[(kind, b, s)]["tokens_per_second"] / by[(kind, b, 0)]["tokens_per_second"]) for b in batches]
            cross = "none in the measured range"
            for (x0, y0), (x1, y1) in itertools.pairwise(sp):
                if (y0 - 1) * (y1 - 1) <= 0 and y0 != y1:
                    cross = f"{x0 + (1 - y0) * (x1 - x0) / (y1 - y0):.0f}"
                    break
            sim_cross = next((str(b) for b in range(1, 4097) if sim(b) < 1), "none up to 4096")
            lines.append(f"| {kind} | {s} | crossover (speedup = 1) | {cross} | {sim_cross} | | |")
    # The simulator's per-verify token count: a chain in which each draft is accepted with one probability p
    # (SpeculativeConfig.chain_accept_probability), against the measured histogram at the largest batch.
    from specdec_operator.simulator.model import SpeculativeConfig

    big = batches[-1]
    lines.append(
        f"\nsimulator check: tokens per verify, measured histogram (batch {big}) against the simulator's "
        "chain of equal per-draft acceptance with the same mean"
    )
    lines.append("| data | steps | accept len | k = 1, 2, ... measured | simulator |")
    lines.append("|---|---|---|---|---|")
    for kind in ("natural", "random"):
        for s in steps_list:
            r = by[(kind, big, s)]
            hist = [r["accept_length_histogram"][str(k)] for k in range(1, s + 2)]
            tot = sum(hist)
            cfg = SpeculativeConfig("EAGLE3", s, 1, s + 1, r["accept_length"])
            p = cfg.chain_accept_probability
            sim = [p ** (k - 1) * (1 - p) for k in range(1, s + 1)] + [p**s]
            lines.append(
                f"| {kind} | {s} | {r['accept_length']:.2f} | {' '.join(f'{h / tot:.3f}' for h in hist)} | "
                f"{' '.join(f'{x:.3f}' for x in sim)} (p = {p:.3f}) |"
            )
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--analyze", help="print the tables and the simulator check of a results JSON, then exit")
    ap.add_argument("--work", default="/tmp/speculation-bench")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: runs on a CPU in a few minutes")
    ap.add_argument("--corpus-bytes", type=int, default=100_000_000)
    ap.add_argument("--tokenizer-bytes", type=int, default=20_000_000)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--target-seconds", type=float, default=120)
    ap.add_argument("--target-lr", type=float, default=1.5e-3)
    ap.add_argument("--target-batch", type=int, default=64)
    ap.add_argument("--target-seq", type=int, default=512)
    ap.add_argument("--samples", type=int, default=3072)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--regen-batch", type=int, default=512)
    ap.add_argument("--regen-temperature", type=float, default=0.7)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--draft-epochs", type=int, default=5)
    ap.add_argument("--draft-lr", type=float, default=6e-4)
    ap.add_argument("--draft-batch", type=int, default=16)
    ap.add_argument("--capture-layers", default=None)
    ap.add_argument("--batches", default="1,4,16,64,128,256,512")
    ap.add_argument("--steps", default="3,7")
    ap.add_argument("--base-iters", type=int, default=64)
    ap.add_argument("--spec-tokens", type=int, default=192, help="iterations per run = this / (steps + 1)")
    ap.add_argument("--min-sequences", type=int, default=16, help="small batches run several groups of prompts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--library-prompts", type=int, default=16)
    ap.add_argument("--library-tokens", type=int, default=64)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--deadline-seconds", type=float, default=560, help="skip eager timings past this")
    args = ap.parse_args()
    if args.analyze:
        print(analyze(Path(args.analyze)))
        return 0
    if not args.out:
        ap.error("--out is required")
    if args.smoke:
        args.corpus_bytes, args.tokenizer_bytes, args.vocab = 1_500_000, 600_000, 512
        args.layers, args.hidden, args.heads = 4, 64, 4
        args.target_seconds, args.target_batch, args.target_seq = 20, 16, 128
        args.samples, args.prompt_len, args.gen_len, args.regen_batch = 96, 32, 24, 48
        args.draft_vocab, args.draft_epochs, args.draft_batch, args.draft_lr = 256, 2, 8, 2e-3
        args.capture_layers = args.capture_layers or "0,1,2"
        args.batches, args.base_iters, args.spec_tokens, args.min_sequences, args.reps = "1,4", 8, 24, 4, 2
        args.library_prompts, args.library_tokens = 4, 16
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import tokenizers
    import transformers

    smi = ""
    if device.type == "cuda":
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,power.limit", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
        except Exception as exc:
            smi = repr(exc)
    RESULTS.update(
        {
            "command": " ".join(["python3", "benchmarks/speculation_h200.py", *sys.argv[1:]]),
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "nvidia_smi": smi,
            "versions": {
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0],
            },
            "args": vars(args),
            "stages": {},
        }
    )
    stages = RESULTS["stages"]

    # -- corpus + tokenizer
    t = time.time()
    tdir = work / "target"
    tokenizer, train_tokens, held_tokens, RESULTS["corpus"] = corpus_and_tokenizer(args, tdir)
    stages["corpus_and_tokenizer_seconds"] = time.time() - t
    log(f"corpus {RESULTS['corpus']}")
    save(out)

    # -- target
    t = time.time()
    model = build_target(args, len(tokenizer), tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    tr = train_target(model, train_tokens, args, device)
    q = heldout_quality(model, held_tokens, device)
    model.to(torch.bfloat16).save_pretrained(str(tdir))
    del model
    RESULTS["target"] = {"params": n_params, "layers": args.layers, "hidden": args.hidden, **tr, "heldout_loss": q["loss"], "heldout_top1": q["top1"]}
    stages["target_train_seconds"] = time.time() - t
    log(f"target: {n_params / 1e6:.1f}M params, held-out loss {q['loss']:.3f} top1 {q['top1']:.3f}")
    save(out)

    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=dtype).to(device).eval()
    loaded = LoadedTarget(target, read_config(tdir), "none", str(tdir))
    layers = [int(x) for x in args.capture_layers.split(",")] if args.capture_layers else None

    rng = np.random.default_rng(2)

    def windows(tokens: np.ndarray, n: int) -> list[list[int]]:
        starts = rng.integers(0, len(tokens) - args.prompt_len - 1, n)
        return [tokens[s : s + args.prompt_len].astype(np.int64).tolist() for s in starts]

    # -- drafter data: regenerate (T=0.7) + capture + vocab, then one TTT-7 drafter
    t = time.time()
    samples = work / "samples.jsonl"
    rg = regenerate_local(
        target, windows(train_tokens, args.samples), args.gen_len, args.regen_temperature, tokenizer.eos_token_id, args.regen_batch, samples, seed=3
    )
    t_regen = time.time() - t
    t = time.time()
    cap = work / "capture"
    capture_hf(samples, tdir, cap, capture_layers=layers, loaded=loaded, shard_samples=1024, max_batch_tokens=65536, progress=False)
    t_cap = time.time() - t
    vstats = build_vocab(cap, cap, args.draft_vocab)
    RESULTS["data"] = {**rg, "regenerate_seconds": t_regen, "capture_seconds": t_cap, "vocab": vstats}
    log(f"data: {RESULTS['data']}")
    t = time.time()
    s = train(
        TrainConfig(
            capture_dir=str(cap),
            target_dir=str(tdir),
            out_dir=str(work / "run-ttt7"),
            ttt_steps=7,
            epochs=args.draft_epochs,
            lr=args.draft_lr,
            batch_size=args.draft_batch,
            warmup_ratio=0.03,
            max_length=args.prompt_len + args.gen_len,
            eval_fraction=0.03,
            eval_max_samples=128,
            progress=False,
        )
    )
    RESULTS["drafter"] = {
        "ttt_steps": 7,
        "samples": s["num_samples"],
        "steps": s["steps"],
        "seconds": s["wall_seconds_this_run"],
        "tokens_per_second": s["tokens_per_second"],
        "first_loss": s["first_loss"],
        "last_loss": s["last_loss"],
        "evals": s["evals"],
        "stage_seconds": time.time() - t,
    }
    log(f"drafter: eval {s['evals'][-1] if s['evals'] else None}")
    save(out)
    draft32 = load_trained(work / "run-ttt7" / "final", tdir).to(device)
    aux_ids = list(draft32.cfg.aux_layer_ids)
    draft = load_trained(work / "run-ttt7" / "final", tdir).to(device=device, dtype=dtype).eval()

    # -- prompts: held-out windows (natural) and uniformly random ids (not the EOS id)
    batches = [int(x) for x in args.batches.split(",")]
    steps_list = [int(x) for x in args.steps.split(",")]
    n_prompts = max(max(batches), args.min_sequences, args.library_prompts)
    gen = torch.Generator().manual_seed(7)
    vocab = len(tokenizer)
    rand = torch.randint(0, vocab - 1, (n_prompts, args.prompt_len), generator=gen)
    rand = rand + (rand >= tokenizer.eos_token_id).long()
    prompts = {"natural": torch.tensor(windows(held_tokens, n_prompts)), "random": rand}
    max_gen = max(args.base_iters, max((args.spec_tokens // (s + 1)) * (s + 1) for s in steps_list))
    max_len = int(math.ceil((args.prompt_len + max_gen + max(steps_list) + 2) / 16) * 16)
    RESULTS["decoder"] = {
        "max_len": max_len,
        "aux_layer_ids": aux_ids,
        "draft_dtype": str(dtype),
        "target_dtype": str(dtype),
        "prompt_len": args.prompt_len,
    }

    # -- check: the cached target forward against transformers' own forward
    with torch.no_grad():
        p8 = prompts["natural"][:4].to(device)
        ref = target(input_ids=p8, use_cache=False).logits.float()
        dec = Decoder(target, draft, 4, 1, max_len, aux_ids, 4)
        mine = dec.prefill(p8).float()
        RESULTS["checks"] = {
            "prefill_logits_rel_err_vs_transformers": float((mine - ref).norm() / ref.norm()),
            "prefill_argmax_agreement": float((mine.argmax(-1) == ref.argmax(-1)).float().mean()),
        }
        del dec
    log(f"checks: {RESULTS['checks']}")

    # -- (b) throughput, and (a) acceptance from the same runs
    use_graphs = device.type == "cuda" and not args.no_graphs
    RESULTS["throughput"] = []
    seqs: dict[tuple, torch.Tensor] = {}
    elogs: dict[tuple, torch.Tensor] = {}
    for kind in ("natural", "random"):
        pk = prompts[kind].to(device)
        for b in batches:
            groups = max(1, args.min_sequences // b)
            for s in [0, *steps_list]:
                iters = args.base_iters if s == 0 else args.spec_tokens // (s + 1)
                t = time.time()
                r = run_config(
                    target, draft, pk, b, s, iters, groups, args.reps, max_len, aux_ids, use_graphs, eager=time.time() - T0 < args.deadline_seconds
                )
                seqs[(kind, b, s)] = r.pop("_seqs")
                elogs[(kind, b, s)] = r.pop("_elog")
                r["data"] = kind
                r["wall_seconds"] = time.time() - t
                if s:
                    # greedy speculative output must be the target's own greedy output: compare each sequence
                    # with the target-only run over the tokens both committed
                    n_cmp = [min(args.base_iters, int(x)) for x in elogs[(kind, b, s)].sum(0).tolist()]
                    div = first_divergence(seqs[(kind, b, 0)], seqs[(kind, b, s)], args.prompt_len + 1, n_cmp)
                    r["lossless_check"] = {
                        "compared_tokens": n_cmp,
                        "sequences_identical": sum(d == n for d, n in zip(div, n_cmp, strict=True)),
                        "sequences": len(div),
                        "first_divergence": div,
                    }
                RESULTS["throughput"].append(r)
                log(
                    f"{kind} B={b} steps={s}: {r['tokens_per_second']:,.0f} tok/s accept {r['accept_length']:.3f} "
                    f"iter {r['iteration_ms']:.3f} ms (draft {r['draft_ms_per_iteration']:.3f}, "
                    f"verify {r['verify_ms_per_iteration']:.3f}) graphs={r['cuda_graphs']} "
                    f"{'eager {:.0f} tok/s'.format(r['eager']['tokens_per_second']) if 'eager' in r else ''}"
                )
                save(out)

    # -- (a) acceptance: natural vs random, from the largest batch's runs (its sequences), plus the library loop
    big = max(batches)
    RESULTS["acceptance"] = {}
    for kind in ("natural", "random"):
        for s in steps_list:
            r = next(x for x in RESULTS["throughput"] if x["data"] == kind and x["batch"] == big and x["steps"] == s)
            RESULTS["acceptance"][f"{kind}_steps{s}"] = {
                "sequences": r["sequences"],
                "verifies_per_sequence": r["iters"],
                "accept_length": r["accept_length"],
                "ci95": r["accept_length_ci95"],
                "histogram": r["accept_length_histogram"],
                "accept_rate": (r["accept_length"] - 1) / s,
                "first_quarter": float(np.mean(r["accept_length_by_iteration"][: max(1, r["iters"] // 4)])),
                "last_quarter": float(np.mean(r["accept_length_by_iteration"][-max(1, r["iters"] // 4) :])),
            }
    RESULTS["library_acceptance"] = {}
    for kind in ("natural", "random"):
        for s in steps_list:
            t = time.time()
            pl = prompts[kind][: args.library_prompts].tolist()
            lib = evaluate_drafter(
                target, Eagle3Proposer(draft32), pl, aux_ids, num_steps=s, max_new_tokens=args.library_tokens, eos_ids=set(), seed=5
            )
            # the cached decoder at batch 1 ran these prompts first (groups of one): compare verify by verify
            el = elogs.get((kind, 1, s))
            lib["seconds"] = time.time() - t
            if el is not None:
                ours = el[:, : args.library_prompts].double()
                lib["cached_decoder_batch1_accept_length_same_prompts"] = float(ours.mean())
            RESULTS["library_acceptance"][f"{kind}_steps{s}"] = lib
            log(
                f"library {kind} steps={s}: accept {lib['acceptance_length']:.3f} {lib['acceptance_length_ci95']}"
                f" (cached decoder, same prompts: {lib.get('cached_decoder_batch1_accept_length_same_prompts')})"
            )
            save(out)
    # Verify by verify: the library's loop (drafter_training.evaluate.speculative_generate, float32 draft, the
    # target recomputed over the whole sequence each verify) against the cached decoder with the bf16 draft and
    # with the float32 draft, on the library's prompts, over exactly the verifies the library made per prompt.
    from drafter_training.evaluate import speculative_generate

    RESULTS["verify_by_verify_check"] = {}
    for kind in ("natural", "random"):
        for s in steps_list:
            pl = prompts[kind][: args.library_prompts]
            lib = [
                speculative_generate(target, Eagle3Proposer(draft32), pr, aux_ids, num_steps=s, max_new_tokens=args.library_tokens).accept_lengths
                for pr in pl.tolist()
            ]
            span = max(len(x) for x in lib)
            row: dict[str, Any] = {
                "prompts": len(lib),
                "verifies": sum(len(x) for x in lib),
                "library_fp32_draft": sum(map(sum, lib)) / sum(len(x) for x in lib),
            }
            for name, dr in (("cached_bf16_draft", draft), ("cached_fp32_draft", draft32)):
                ml = int(math.ceil((args.prompt_len + (span + 1) * (s + 1) + s + 2) / 16) * 16)
                dec = Decoder(target, dr, len(lib), s, ml, aux_ids, span + 1)
                dec.prefill(pl.to(device))
                for _ in range(span):
                    dec.draft_phase()
                    dec.verify_phase()
                el = dec.elog[:span].cpu()
                ours = [el[: len(x), i].tolist() for i, x in enumerate(lib)]
                row[name] = sum(map(sum, ours)) / row["verifies"]
                row[f"{name}_prompts_identical"] = sum(a == b for a, b in zip(ours, lib, strict=True))
                row[f"{name}_verifies_equal"] = sum(int(u == v) for a, b in zip(ours, lib, strict=True) for u, v in zip(a, b, strict=True))
                del dec
            RESULTS["verify_by_verify_check"][f"{kind}_steps{s}"] = row
            log(f"verify by verify {kind} steps={s}: {row}")
            save(out)
    if args.smoke:
        # fp32 on the CPU: the library loop and the cached decoder must agree verify by verify
        agree = []
        for kind in ("natural", "random"):
            for s in steps_list:
                pl = prompts[kind][: args.library_prompts].tolist()
                el = elogs[(kind, 1, s)]
                for i, pr in enumerate(pl):
                    from drafter_training.evaluate import speculative_generate

                    res = speculative_generate(target, Eagle3Proposer(draft32), pr, aux_ids, num_steps=s, max_new_tokens=args.library_tokens)
                    n = min(len(res.accept_lengths) - 1, el.shape[0])  # the last verify may be truncated
                    agree.append(res.accept_lengths[:n] == el[:n, i].tolist())
        RESULTS["checks"]["smoke_library_vs_cached_verify_by_verify"] = f"{sum(agree)}/{len(agree)}"
        log(f"smoke check library vs cached decoder: {sum(agree)}/{len(agree)} prompts agree verify by verify")
    stages["total_seconds"] = time.time() - T0
    if device.type == "cuda":
        RESULTS["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
    save(out)
    log("done")
    print(analyze(out / OUT_NAME))
    return 0


if __name__ == "__main__":
    sys.exit(main())
