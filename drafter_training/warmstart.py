"""Warm start from an exported drafter (`specdec-train train --init-from-drafter DIR`), keeping its vocabulary map.

The drafter flywheel retrains the drafter that serves, on the traffic it serves: the new drafter starts from the
serving one's weights and keeps its d2t/t2d map, so the draft vocabulary the engine maps back with does not move
under it. `TrainConfig.init_from` reads a training run's own `final/` (draft.safetensors in float32, the trained
layers as output indices); this reads what `specdec-train export` wrote for an engine instead:

* config.json, plain (architectures LlamaForCausalLMEagle3, both engines) or speculators (vLLM): the draft's
  shape, and eagle_aux_hidden_state_layer_ids in the serving engine's convention;
* model.safetensors: the weights in bf16 under SGLang's names, `d2t` (int64) and `t2d` (bool); a vLLM export
  whose draft vocabulary is the whole vocabulary carries no maps (export.full_vocab_without_maps), which is the
  identity map;
* training_provenance.json: the trained layers as output indices (capture_layer_ids), the engine the ids were
  written for, and the tokenizer's hash.

The trained layers come from the provenance when it names them; otherwise from config.json's ids read in the
engine's convention (the provenance's engine, a speculators config's vLLM, or `--init-from-engine`), through the
validator's per-class capture rule (validator/checks.captured_layers). The captured hidden states the new run trains
on must come from exactly those layers (fc's weights mean them), and the target must be the one the drafter was
exported for (vocabulary, width, tokenizer): anything else is refused in one line naming the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specdec_operator.choices import ENGINES
from specdec_operator.enginefacts import facts_for
from specdec_operator.errors import InputError
from specdec_operator.validator.checks import captured_layers
from specdec_operator.validator.provenance import FILENAME as PROVENANCE
from specdec_operator.validator.provenance import DrafterProvenance
from specdec_operator.validator.speculators import flatten, is_speculators

from .model import DraftConfig, Eagle3Draft
from .target import read_config, tokenizer_sha256

WEIGHTS = "model.safetensors"
MAPS = ("d2t", "t2d")


@dataclass(frozen=True)
class ExportedDrafter:
    """An exported drafter as training reads it: its shape (aux_layer_ids as output indices), its weights in float32
    (SGLang's names, the maps left out) and its vocabulary map."""

    config: DraftConfig
    weights: dict[str, torch.Tensor]
    d2t: torch.Tensor
    t2d: torch.Tensor
    engine: str | None  # the engine config.json's ids were written for, when known


def load_exported_drafter(drafter_dir: str | Path, target_dir: str | Path, engine: str | None = None) -> ExportedDrafter:
    """Read an export of `specdec-train export` (either engine, either format) for warm-starting against `target_dir`.
    engine: the convention of config.json's layer ids when neither the provenance nor the format says it."""
    drafter_dir = Path(drafter_dir)
    flat, speculators = _flat_config(drafter_dir)
    provenance = _provenance(drafter_dir)
    target_cfg = read_config(target_dir)
    engine = _engine(engine, provenance, speculators)
    layers = _trained_layers(drafter_dir, flat, provenance, engine, target_cfg)
    cfg = _draft_config(flat, layers)
    _check_target(drafter_dir, cfg, provenance, target_cfg, target_dir)
    weights, d2t, t2d = _weights(drafter_dir, cfg)
    return ExportedDrafter(config=cfg, weights=weights, d2t=d2t, t2d=t2d, engine=engine)


def trained_layers(drafter_dir: str | Path, target_dir: str | Path, engine: str | None = None) -> list[int]:
    """The target layers (output indices) an exported drafter was trained on: what a capture for its warm start must
    record (`specdec-train capture --capture-layers-of DIR`)."""
    drafter_dir = Path(drafter_dir)
    flat, speculators = _flat_config(drafter_dir)
    provenance = _provenance(drafter_dir)
    return _trained_layers(drafter_dir, flat, provenance, _engine(engine, provenance, speculators), read_config(target_dir))


def _engine(named: str | None, provenance: DrafterProvenance | None, speculators: bool) -> str | None:
    """The convention of config.json's layer ids: as named, as the provenance says, vLLM's for a speculators config."""
    engine = named or (provenance.exported_for() if provenance else None) or ("vllm" if speculators else None)
    if engine is not None and engine not in ENGINES:
        raise InputError(f"--init-from-engine {engine}: must be one of {', '.join(ENGINES)}")
    return engine


def check_capture_layers(drafter: ExportedDrafter, drafter_dir: str | Path, capture_dir: str | Path, captured: list[int]) -> None:
    """The new hidden states must be the layers the drafter's fc was trained on."""
    trained = list(drafter.config.aux_layer_ids)
    if list(captured) != trained:
        shown = ",".join(str(i) for i in trained)
        raise InputError(
            f"{capture_dir}: captured layers {list(captured)} (output indices), but the drafter in {drafter_dir} was trained on {trained}; "
            f"capture again with --capture-layers {shown}"
        )


def _flat_config(drafter_dir: Path) -> tuple[dict[str, Any], bool]:
    path = drafter_dir / "config.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: not found; pass --init-from-drafter an exported drafter (specdec-train export --out)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc}); export the drafter again") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: must be a JSON object; export the drafter again")
    if is_speculators(doc):
        flat, notes = flatten(doc)
        if flat is None:
            raise InputError(f"{path}: {notes[0][2]}")
        return flat, True
    if "eagle_config" not in doc or "draft_vocab_size" not in doc:
        raise InputError(f"{path}: not an EAGLE-3 drafter config (no eagle_config/draft_vocab_size); pass an export of specdec-train export")
    return doc, False


def _provenance(drafter_dir: Path) -> DrafterProvenance | None:
    path = drafter_dir / PROVENANCE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc}); export the drafter again") from None
    return DrafterProvenance.from_json(doc, str(path))


def _trained_layers(
    drafter_dir: Path, flat: dict[str, Any], provenance: DrafterProvenance | None, engine: str | None, target_cfg: dict[str, Any]
) -> list[int]:
    """The target layers (output indices) the drafter's fc was trained on."""
    if provenance is not None and provenance.capture_layer_ids is not None:
        return list(provenance.capture_layer_ids.output_index)
    ids = flat.get("eagle_aux_hidden_state_layer_ids") or (flat.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise InputError(f"{drafter_dir}/config.json: no eagle_aux_hidden_state_layer_ids; export the drafter again")
    if engine is None:
        raise InputError(
            f"{drafter_dir}: neither {PROVENANCE} nor the config format says which engine's layer-id convention config.json uses; "
            "pass --init-from-engine sglang or vllm"
        )
    arch = (target_cfg.get("architectures") or [""])[0]
    found = captured_layers(facts_for(engine), arch, list(ids), int(target_cfg["num_hidden_layers"]))
    if found is None:
        raise InputError(f"{drafter_dir}/config.json: which layers {arch} captures for ids {ids} is not known; add capture_layer_ids to {PROVENANCE}")
    return [i - 1 for i in found[0]]


def _draft_config(flat: dict[str, Any], layers: list[int]) -> DraftConfig:
    rope = flat.get("rope_parameters") or {}
    values = {
        "hidden_size": flat["hidden_size"],
        "intermediate_size": flat["intermediate_size"],
        "num_attention_heads": flat["num_attention_heads"],
        "num_key_value_heads": flat.get("num_key_value_heads") or flat["num_attention_heads"],
        "head_dim": flat.get("head_dim"),
        "vocab_size": flat["vocab_size"],
        "draft_vocab_size": flat["draft_vocab_size"],
        "target_hidden_size": flat.get("target_hidden_size") or flat["hidden_size"],
        "aux_layer_ids": layers,
        "rms_norm_eps": float(flat.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(flat.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "max_position_embeddings": int(flat.get("max_position_embeddings", 4096)),
        "hidden_act": flat.get("hidden_act", "silu"),
    }
    return DraftConfig(**values)


def _check_target(
    drafter_dir: Path, cfg: DraftConfig, provenance: DrafterProvenance | None, target_cfg: dict[str, Any], target_dir: str | Path
) -> None:
    if (cfg.vocab_size, cfg.target_hidden_size, cfg.hidden_size) != (target_cfg["vocab_size"], target_cfg["hidden_size"], target_cfg["hidden_size"]):
        raise InputError(
            f"{drafter_dir}: a drafter for vocab {cfg.vocab_size}/hidden {cfg.target_hidden_size}, but --target {target_dir} has "
            f"{target_cfg['vocab_size']}/{target_cfg['hidden_size']}; warm-start only from a drafter of this target"
        )
    if provenance is not None and provenance.tokenizer_sha256 and provenance.tokenizer_sha256 != tokenizer_sha256(target_dir):
        raise InputError(
            f"{drafter_dir}/{PROVENANCE}: tokenizer_sha256 differs from --target {target_dir}'s tokenizer; warm-start only from a drafter of this target"
        )


def _weights(drafter_dir: Path, cfg: DraftConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The weights in float32 (as training keeps them) and the vocabulary map, every name and shape checked."""
    from .export import expected_weight_shapes

    path = drafter_dir / WEIGHTS
    if not path.is_file():
        raise InputError(f"{path}: not found; pass --init-from-drafter an exported drafter (specdec-train export --out)")
    shapes = expected_weight_shapes(cfg)
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        tensors = {name: f.get_tensor(name) for name in shapes if name in names}
    missing = [n for n in shapes if n not in tensors and n not in MAPS]
    if missing:
        raise InputError(f"{path}: missing {missing[0]}; export the drafter again")
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise InputError(f"{path}: {name} has shape {tuple(t.shape)}, expected {shapes[name]} from config.json")
    if "d2t" in tensors and "t2d" in tensors:
        d2t, t2d = tensors["d2t"].to(torch.int64), tensors["t2d"].to(torch.bool)
    elif cfg.draft_vocab_size == cfg.vocab_size and not any(m in tensors for m in MAPS):
        # A full draft vocabulary exported without maps (vLLM): draft id i is target id i.
        d2t, t2d = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64), torch.ones(cfg.vocab_size, dtype=torch.bool)
    else:
        raise InputError(f"{path}: no d2t/t2d for a draft vocabulary of {cfg.draft_vocab_size} < {cfg.vocab_size}; export the drafter again")
    weights = {name: t.float() for name, t in tensors.items() if name not in MAPS}
    return weights, d2t, t2d


def exported_draft_model(drafter_dir: str | Path, target_dir: str | Path, engine: str | None = None) -> Eagle3Draft:
    """An exported drafter as a model to evaluate (`specdec-train evaluate --drafter EXPORT`): its weights as the
    engine reads them (bf16, here in float32), its vocabulary map, the target's embeddings."""
    from .train import target_embeddings_and_head

    exported = load_exported_drafter(drafter_dir, target_dir, engine)
    model = Eagle3Draft(exported.config)
    embed, _ = target_embeddings_and_head(target_dir)
    model.embed_tokens.weight.data.copy_(embed.float())
    model.load_state_dict(exported.weights, strict=False)
    model.set_vocab_mapping(exported.d2t, exported.t2d)
    return model.eval()
