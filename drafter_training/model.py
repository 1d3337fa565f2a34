"""The EAGLE-3 draft network, written to compute exactly what SGLang's `LlamaForCausalLMEagle3` computes.

SGLang 0.5.23 (srt/models/llama_eagle3.py) runs one decoder layer whose first step takes
`fc(concat(low, mid, high))` as its hidden state. The layer keeps that hidden state as the residual,
RMS-normalises it (`hidden_norm`), concatenates `input_layernorm(embedding)` IN FRONT of it
(`cat([embeds, hidden])`, so q/k/v see 2*hidden inputs), runs attention and adds the residual, then the
post-attention norm, the MLP and the residual again. `norm` of that sum feeds `lm_head` over the draft
vocabulary; the un-normed sum is what the next draft step receives as its hidden state (SGLang's default,
`norm_output` false). The parameter names below are the checkpoint names SGLang loads (`midlayer.*` is
renamed to `layers.0.*` by its loader), so `state_dict()` minus the embeddings IS the export.

Training-time test (TTT) and evaluation share one attention routine (`Eagle3Draft.step`): step 0 attends
causally over the prefix; step k >= 1 of the unrolled chain at position t attends to step-0 keys at
positions <= t plus the keys that steps 1..k produced at that same position t, at rotary position t + k.
That is the key set a chain draft at depth k sees in the server: the prefix KV from the draft-extend pass
over target hidden states plus its own earlier chain tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    """Shape of an EAGLE-3 draft; field names follow the Llama config keys SGLang reads."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary (embeddings are the target's)
    draft_vocab_size: int
    target_hidden_size: int
    # Capture layers in SGLang's config convention (eagle_aux_hidden_state_layer_ids: the OUTPUT of layer i).
    aux_layer_ids: list[int] = field(default_factory=list)
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftConfig:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


class RMSNorm(nn.Module):
    """Llama RMSNorm computed in float32, as SGLang's and Hugging Face's are."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    inv_freq: torch.Tensor  # a registered buffer
    """Default (unscaled) rotary embedding in the Llama/NeoX rotate-half layout SGLang's Llama uses."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x [B, heads, T, d], positions [B, T]
        freqs = positions.float()[..., None] * self.inv_freq  # [B, T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, d]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        d = cfg.resolved_head_dim
        self.num_heads, self.num_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        width_in = 2 * cfg.hidden_size  # [embeds, hidden]: SGLang's q/k/v input width
        self.q_proj = nn.Linear(width_in, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(width_in, self.num_kv * d, bias=False)
        self.v_proj = nn.Linear(width_in, self.num_kv * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, cfg.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: only silu is implemented")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class StepCache:
    """Keys/values of one unrolled chain: step 0 over every position, then one per later step."""

    def __init__(self) -> None:
        self.k0: torch.Tensor | None = None  # [B, kv, T, d]
        self.v0: torch.Tensor | None = None
        self.diag_k: list[torch.Tensor] = []  # each [B, kv, Tq, d], aligned with the step's query rows
        self.diag_v: list[torch.Tensor] = []


class Eagle3Draft(nn.Module):
    d2t: torch.Tensor  # registered buffers: the vocabulary mapping
    t2d: torch.Tensor
    """EAGLE-3 draft. Parameter names are SGLang's checkpoint names; `embed_tokens` is the target's (frozen)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        num_aux = len(cfg.aux_layer_ids) or 3  # SGLang: len(eagle_aux_hidden_state_layer_ids), else 3
        self.fc = nn.Linear(num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = Rotary(cfg.resolved_head_dim, cfg.rope_theta)
        # d2t[i] = target_id(i) - i (SGLang adds arange); t2d marks target ids in the draft vocabulary.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # ---- vocabulary mapping -------------------------------------------------------------------------
    def set_vocab_mapping(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t.to(torch.int64))
        self.t2d.copy_(t2d.to(torch.bool))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # ---- one step of the draft ----------------------------------------------------------------------
    def step(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: StepCache,
        query_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the draft layer once.

        hidden: [B, Tq, 3*target_hidden] at step 0 (goes through fc) or [B, Tq, hidden] (previous step's
        un-normed output). input_ids/positions: [B, Tq]. On step 0 the queries are every position and they
        attend causally to each other. On later steps `query_rows` [Tq] names the step-0 row of each query:
        it attends to step-0 keys at rows <= its row plus this chain's earlier diagonal keys and its own.
        Returns (logits over the draft vocabulary, un-normed hidden state for the next step).
        """
        layer = self.midlayer
        attn = layer.self_attn
        if cache.k0 is None:  # step 0: the captured target layers go through fc
            hidden = self.fc(hidden.to(self.fc.weight.dtype))
        residual = hidden
        x = torch.cat([layer.input_layernorm(self.embed_tokens(input_ids)), layer.hidden_norm(hidden)], dim=-1)
        bsz, tq, _ = x.shape
        d = attn.head_dim
        q = attn.q_proj(x).view(bsz, tq, attn.num_heads, d).transpose(1, 2)
        k = attn.k_proj(x).view(bsz, tq, attn.num_kv, d).transpose(1, 2)
        v = attn.v_proj(x).view(bsz, tq, attn.num_kv, d).transpose(1, 2)
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        rep = attn.num_heads // attn.num_kv
        scale = 1.0 / math.sqrt(d)
        if cache.k0 is None:
            cache.k0, cache.v0 = k, v
            out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True)
        else:
            cache.diag_k.append(k)
            cache.diag_v.append(v)
            assert cache.k0 is not None and cache.v0 is not None  # set by the first call
            k0 = cache.k0.repeat_interleave(rep, dim=1)
            v0 = cache.v0.repeat_interleave(rep, dim=1)
            total = k0.shape[2]
            rows = query_rows if query_rows is not None else torch.arange(tq, device=q.device)
            s0 = torch.matmul(q, k0.transpose(-1, -2)).float() * scale  # [B, h, Tq, T]
            causal = torch.arange(total, device=q.device)[None, :] > rows[:, None]
            s0 = s0.masked_fill(causal, float("-inf"))
            dk = torch.stack([t.repeat_interleave(rep, dim=1) for t in cache.diag_k], dim=-2)  # [B,h,Tq,k,d]
            dv = torch.stack([t.repeat_interleave(rep, dim=1) for t in cache.diag_v], dim=-2)
            sd = (q.unsqueeze(-2) * dk).sum(-1).float() * scale  # [B, h, Tq, k]
            probs = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1).to(q.dtype)
            out = torch.matmul(probs[..., :total], v0) + (probs[..., total:].unsqueeze(-1) * dv).sum(-2)
        out = out.transpose(1, 2).reshape(bsz, tq, attn.num_heads * d)
        hidden = attn.o_proj(out) + residual
        hidden = layer.mlp(layer.post_attention_layernorm(hidden)) + hidden
        logits = self.lm_head(self.norm(hidden))
        return logits, hidden

    # ---- training-time test -------------------------------------------------------------------------
    def unroll(self, aux: torch.Tensor, step_input_ids: list[torch.Tensor], positions: torch.Tensor) -> list[torch.Tensor]:
        """Training-time test: run len(step_input_ids) steps over every position; return logits per step.

        step_input_ids[k][b, t] is the token the draft embeds at step k for row t (the ground-truth token
        t+1+k); positions [B, T] are the step-0 rotary positions (step k uses positions + k).
        """
        cache = StepCache()
        hidden: torch.Tensor = aux
        outputs = []
        for k, ids in enumerate(step_input_ids):
            logits, hidden = self.step(hidden, ids, positions + k, cache)
            outputs.append(logits)
        return outputs


def trainable_state_dict(model: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The checkpoint SGLang loads: everything but the (target's) embeddings and the rotary table."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
