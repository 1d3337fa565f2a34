"""The target model as the pipeline sees it: loading (with the serving quantization), capture layers, hashes.

Capture-layer conventions (see docs/training.md): SGLang's draft config field
`eagle_config.eagle_aux_hidden_state_layer_ids` names layer OUTPUTS (0-based layer i's output; SpecForge's
"output index", default [1, N//2-1, N-4]); SGLang adds one internally and captures the INPUT of layer i+1
("input index", default [2, N//2, N-3]). In Hugging Face `output_hidden_states` terms, output index i is
`hidden_states[i + 1]`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec_operator.errors import InputError
from specdec_operator.validator import checkpoint_quantization
from specdec_operator.validator.modelmeta import ModelMeta, language_model_config

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a model directory, with a vision-language wrapper's language-model fields lifted to the
    top level (from the sub-config `specdec validate` reads them from)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: not found; pass a Hugging Face model directory") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); fix the file") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: must be a JSON object, found {type(cfg).__name__}")
    text, key = language_model_config(cfg, str(path))
    return cfg if key is None else {**cfg, **text}


def tokenizer_sha256(model_dir: str | Path) -> str:
    """sha256 of tokenizer.json when present (what defines the token ids); else of the tokenizer files."""
    model_dir = Path(model_dir)
    main = model_dir / "tokenizer.json"
    if main.is_file():
        return hashlib.sha256(main.read_bytes()).hexdigest()
    digest = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        p = model_dir / name
        if p.is_file():
            found = True
            digest.update(name.encode() + b"\0" + p.read_bytes())
    if not found:
        raise InputError(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}); save the tokenizer there")
    return digest.hexdigest()


def default_capture_layers(num_layers: int) -> list[int]:
    """SGLang/SpecForge default capture layers in the config (output-index) convention."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def check_capture_layers(layer_ids: list[int], num_layers: int) -> list[int]:
    """Validate output-index capture ids: distinct, ascending, and inside the layers SGLang can capture.

    SGLang captures the input of layer i+1, so the last layer's output (i = N-1) is never captured.
    """
    ids = [int(i) for i in layer_ids]
    if len(ids) != 3 or len(set(ids)) != 3 or ids != sorted(ids) or ids[0] < 0 or ids[-1] > num_layers - 2:
        raise InputError(
            f"capture layers {ids}: need three distinct ascending layer ids in 0..{num_layers - 2} "
            f"(output-index convention) for a {num_layers}-layer target; pass --capture-layers low,mid,high"
        )
    return ids


def resolve_capture_layers(layer_ids: list[int] | None, num_layers: int) -> list[int]:
    ids = layer_ids if layer_ids else default_capture_layers(num_layers)
    return check_capture_layers(ids, num_layers)


def quantization_of(config: dict[str, Any]) -> str:
    """A short name for the quantization a checkpoint carries: 'none', or the validator's label with its detail.

    The provenance must use the words `specdec validate` derives for the serving target from the very same
    config (compressed-tensors keeps its bit width in config_groups, not in a top-level `bits`), or a drafter
    trained on the right hidden states would be flagged HiddenStateSourceMismatch/ProvenanceMissing.
    """
    text, _ = language_model_config(config, "config.json")
    q = config.get("quantization_config") or text.get("quantization_config")
    if not q:
        return "none"
    label, detail = checkpoint_quantization(ModelMeta(path="config.json", config=config, text=text))
    if label:
        return f"{label} ({detail})"
    name = str(q.get("quant_method", "unknown"))
    bits = q.get("bits") or q.get("w_bit")
    group = q.get("group_size") or q.get("q_group_size")
    if bits:
        name += f"-int{bits}"
    if group:
        name += f"-g{group}"
    return name


# ---- group-wise round-to-nearest INT4 (the seed's serving format, simulated in-place) ---------------


def rtn_quantize_(weight: torch.Tensor, bits: int = 4, group_size: int = 128) -> torch.Tensor:
    """Replace a [out, in] weight by its asymmetric group-wise RTN quantise/dequantise; returns max error."""
    out_f, in_f = weight.shape
    group = group_size if in_f % group_size == 0 else in_f
    w = weight.detach().float().reshape(out_f, in_f // group, group)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    qmax = 2**bits - 1
    scale = ((hi - lo) / qmax).clamp(min=1e-8)
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(w / scale) + zero, 0, qmax)
    deq = ((q - zero) * scale).reshape(out_f, in_f)
    err = (deq - weight.float()).abs().max()
    weight.data.copy_(deq.to(weight.dtype))
    return err


def apply_rtn_int4_(model: nn.Module, group_size: int = 128, bits: int = 4) -> int:
    """Quantise every Linear inside the decoder layers (lm_head and embeddings stay, as INT4 servers do)."""
    layers = decoder_layers(model)
    count = 0
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                rtn_quantize_(module.weight, bits, group_size)
                count += 1
    return count


# ---- loading and capture ------------------------------------------------------------------------------


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise InputError(f"{type(model).__name__}: no model.layers; only decoder-only causal LMs are supported")
    return layers


def final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None:
        raise InputError(f"{type(model).__name__}: no model.norm; only decoder-only causal LMs are supported")
    return norm


_RTN = re.compile(r"int([2-8])-rtn(?:-g(\d+))?")


def parse_quantization(spec: str | None) -> tuple[str, int]:
    """'none' | 'checkpoint' (whatever the checkpoint carries) | 'int<bits>-rtn-g<group>' (applied here).

    Returns (kind, group) with kind 'none', 'checkpoint' or 'int<bits>-rtn'.
    """
    spec = (spec or "checkpoint").lower()
    if spec in ("none", "checkpoint"):
        return spec, 0
    m = _RTN.fullmatch(spec)
    if m:
        return f"int{m.group(1)}-rtn", int(m.group(2) or 128)
    raise InputError(f"--quantization {spec}: one of checkpoint, none, int<bits>-rtn-g<group> (e.g. int4-rtn-g128)")


@dataclass
class LoadedTarget:
    model: nn.Module
    config: dict[str, Any]
    quantization: str  # recorded in provenance
    path: str


def load_target(path: str | Path, quantization: str | None = None, dtype: torch.dtype | None = None, device: str = "cpu") -> LoadedTarget:
    """Load the target with the quantization that will serve it.

    'checkpoint' loads what the checkpoint declares (AWQ/GPTQ/FP8 via transformers' own quantizers);
    'int4-rtn-g128' applies group-wise round-to-nearest INT4 to a full-precision checkpoint, the
    format the seed's server ran.
    """
    from transformers import AutoModelForCausalLM

    cfg = read_config(path)
    kind, group = parse_quantization(quantization)
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: transformers cannot load it ({str(exc).splitlines()[0]})") from None
    model.to(device).eval()  # type: ignore[arg-type]  # transformers types .to() through a decorator mypy misreads
    if kind.endswith("-rtn"):
        bits = int(kind[3])
        apply_rtn_int4_(model, group, bits=bits)
        recorded = f"{kind}-g{group}"
    elif kind == "none":
        recorded = "none"
    else:
        recorded = quantization_of(cfg)
    return LoadedTarget(model=model, config=cfg, quantization=recorded, path=str(path))


@torch.no_grad()
def capture_forward(
    model: nn.Module, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One target forward pass: (aux [B,T,3H] = outputs of layer_ids, final normed hidden [B,T,H], logits)."""
    captured: dict[str, torch.Tensor] = {}
    handle = final_norm(model).register_forward_hook(lambda _m, _i, out: captured.__setitem__("final", out))
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    aux = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return aux, captured["final"], out.logits
