"""Stage 5: export a trained draft in the EAGLE-3 format of the engine that will serve it, with its provenance.

config.json: `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields, `num_hidden_layers: 1`,
`vocab_size` (the target's), `draft_vocab_size`, `target_hidden_size`, `tie_word_embeddings: false` (so
the engine loads our `lm_head.weight` over the draft vocabulary), and `eagle_config` with
`eagle_aux_hidden_state_layer_ids` in the serving engine's convention. The two engines read those ids one
layer apart: SGLang captures the input of target layer id + 1 (LlamaForCausalLM.set_eagle3_layers_to_capture
adds one), vLLM the hidden state after `id` layers, i.e. the input of layer id (vLLM 0.32's LlamaModel.forward
calls _maybe_add_hidden_state with start_layer before its loop and with idx + 1 after layer idx). Training records the
layer outputs (SGLang's numbers on most targets), so `--engine vllm` writes each id plus one. SGLang's DeepSeek family
adds one only when the first id is 1 (deepseek_v2.py), so the ids are those that make the serving engine capture the
trained layers on the target's class (validator/checks.ids_capturing, the rule the validator checks), and an export
no ids can serve is refused. Both engines load the same architecture name and the same tensors.
model.safetensors: `midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight` (bf16), `d2t` (int64),
`t2d` (bool). The engines skip unknown names silently, so `check_export` verifies every expected name.
training_provenance.json (validator/provenance.py's DrafterProvenance): what the validator compares against
the serving target and engine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec_operator.choices import ENGINES
from specdec_operator.enginefacts import DRAFTER_FORMATS, PLAIN, SPECULATORS, EngineFacts, facts_for
from specdec_operator.enginefacts import ENGINES as ALL_ENGINES
from specdec_operator.errors import InputError
from specdec_operator.validator.checks import ids_capturing
from specdec_operator.validator.provenance import FILENAME as PROVENANCE
from specdec_operator.validator.provenance import TRAINER, CaptureLayerIds, DrafterProvenance
from specdec_operator.validator.speculators import SPECULATOR_ARCHITECTURE, flatten, is_speculators

from .model import DraftConfig
from .target import read_config, tokenizer_sha256

ARCHITECTURE = "LlamaForCausalLMEagle3"
# config.json formats: plain (architectures LlamaForCausalLMEagle3, both engines) and speculators (vLLM only): which
# engine reads which is enginefacts.EngineFacts.drafter_formats.
FORMATS = DRAFTER_FORMATS
SPECULATORS_VERSION = "0.3.0"


def expected_weight_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor SGLang's LlamaForCausalLMEagle3 loader maps, with its shape."""
    h, d = cfg.hidden_size, cfg.resolved_head_dim
    q, kv, i = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    num_aux = len(cfg.aux_layer_ids) or 3
    return {
        "fc.weight": (h, num_aux * cfg.target_hidden_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,),
        "t2d": (cfg.vocab_size,),
    }


def aux_layer_ids_for(cfg: DraftConfig, target_cfg: dict[str, Any], engine: str, target_architecture: str | None = None) -> list[int]:
    """The eagle_aux_hidden_state_layer_ids that make `engine` capture the layers the draft was trained on
    (cfg.aux_layer_ids, output indices) on this target: the engine's convention (enginefacts), with SGLang's per-class
    rules (validator/checks.ids_capturing: its DeepSeek family adds one only when the first id is 1). InputError when
    no ids do (SGLang's DeepSeek family cannot capture the input of layer 1 first)."""
    facts = facts_for(engine)
    inputs = CaptureLayerIds.from_output_index(list(cfg.aux_layer_ids)).input_index
    arch = target_architecture or (target_cfg.get("architectures") or [""])[0]
    ids = ids_capturing(facts, arch, inputs, int(target_cfg["num_hidden_layers"]))
    if ids is None:
        raise InputError(
            f"--engine {facts.cli_name}: no eagle_aux_hidden_state_layer_ids make {facts.name} {facts.version}'s {arch or 'target class'} "
            f"capture the inputs of target layers {inputs} (the outputs of layers {list(cfg.aux_layer_ids)}, which the draft was trained "
            "on); capture other layers (specdec-train capture --capture-layers) and train again"
        )
    return ids


def draft_config_json(cfg: DraftConfig, target_cfg: dict[str, Any], engine: str, target_architecture: str | None = None) -> dict[str, Any]:
    """config.json for `engine` (sglang | vllm); cfg.aux_layer_ids are the trained layers as output indices, written as
    the ids that make `engine` capture them on this target (aux_layer_ids_for)."""
    aux_layer_ids = aux_layer_ids_for(cfg, target_cfg, engine, target_architecture)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.resolved_head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": target_cfg.get("bos_token_id"),
        "eos_token_id": target_cfg.get("eos_token_id"),
        "pad_token_id": target_cfg.get("pad_token_id"),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": aux_layer_ids,
            "use_aux_hidden_state": True,
        },
    }


def speculators_config_json(plain: dict[str, Any], target_cfg: dict[str, Any], verifier: str, speculative_tokens: int) -> dict[str, Any]:
    """The speculators format of a plain vLLM config (`draft_config_json(..., engine="vllm")`), as vLLM 0.32 reads it
    (validator/speculators.py): the layer's config under transformer_layer_config, the EAGLE-3 fields beside it."""
    eagle_fields = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config")
    return {
        "architectures": [SPECULATOR_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {k: v for k, v in plain.items() if k not in eagle_fields},
        "draft_vocab_size": plain["draft_vocab_size"],
        "target_hidden_size": plain["target_hidden_size"],
        # The trained layer normalises the hidden state after taking the residual (drafter_training/model.py), as a
        # plain config's default says; the speculators format defaults to true, so it is written out.
        "norm_before_residual": False,
        "norm_before_fc": False,
        "eagle_aux_hidden_state_layer_ids": plain["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(target_cfg.get("architectures") or [])},
        },
    }


def export_drafter(
    final_dir: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    *,
    engine: str,
    target_model: str | None = None,
    fmt: str = PLAIN,
    speculative_tokens: int = 3,
) -> DrafterProvenance:
    """Write config.json (for `engine`, in format `fmt`), model.safetensors and training_provenance.json; returns the
    provenance. engine: sglang | vllm, no default (the ids in config.json are one layer apart). fmt speculators: the
    speculators format (vLLM only), with speculative_tokens as its proposal method's."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: must be one of {', '.join(ENGINES)}")
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: must be one of {', '.join(FORMATS)}")
    facts = facts_for(engine)
    if fmt not in facts.drafter_formats:
        readers = _readers(fmt)
        raise InputError(
            f"--format {fmt} with --engine {engine}: only {' and '.join(f.name for f in readers)} reads the {fmt} format; pass "
            f"{' or '.join(f'--engine {f.cli_name}' for f in readers)} or --format {PLAIN}"
        )
    if speculative_tokens < 1:
        raise InputError(f"--speculative-tokens {speculative_tokens}: must be at least 1")
    final_dir, out_dir = Path(final_dir), Path(out_dir)
    try:
        cfg = DraftConfig.from_dict(json.loads((final_dir / "draft_config.json").read_text()))
        summary = json.loads((final_dir / "train_summary.json").read_text())
    except FileNotFoundError as exc:
        raise InputError(f"{exc.filename}: not found; pass a training run's final/ directory") from None
    target_cfg = read_config(target_dir)
    if target_cfg["vocab_size"] != cfg.vocab_size or target_cfg["hidden_size"] != cfg.target_hidden_size:
        raise InputError(
            f"{target_dir}: vocab {target_cfg['vocab_size']}/hidden {target_cfg['hidden_size']} differ from the "
            f"draft's {cfg.vocab_size}/{cfg.target_hidden_size}; pass the target it was trained on"
        )
    state = load_file(str(final_dir / "draft.safetensors"))
    shapes = expected_weight_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name not in state:
            raise InputError(f"{final_dir}/draft.safetensors: missing {name}; the training run is incomplete")
        t = state[name]
        if tuple(t.shape) != shape:
            raise InputError(f"{final_dir}/draft.safetensors: {name} has shape {tuple(t.shape)}, expected {shape}")
        if name == "d2t":
            t = t.to(torch.int64)
        elif name == "t2d":
            t = t.to(torch.bool)
        else:
            t = t.to(torch.bfloat16)
        tensors[name] = t.contiguous()
    _drop_full_vocab_maps(tensors, cfg, facts, final_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    capture = summary.get("capture", {})
    config = draft_config_json(cfg, target_cfg, engine, _architecture(target_dir))
    if fmt == SPECULATORS:
        config = speculators_config_json(config, target_cfg, target_model or capture.get("target_model") or str(target_dir), speculative_tokens)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    final_eval = (summary.get("evals") or [{}])[-1]
    provenance = DrafterProvenance(
        target_model=target_model or capture.get("target_model") or str(target_dir),
        target_quantization=capture.get("target_quantization", "unknown"),
        hidden_state_source={"hf": "transformers"}.get(capture.get("source"), capture.get("source", "unknown")),
        num_samples=summary.get("num_samples"),
        epochs=summary.get("epochs_completed"),
        tokenizer_sha256=tokenizer_sha256(target_dir),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        engine=engine,
        capture_layer_ids=CaptureLayerIds.from_output_index(list(cfg.aux_layer_ids)),
        hidden_state_storage=capture.get("storage"),
        ttt_steps=summary.get("config", {}).get("ttt_steps"),
        draft_vocab_size=cfg.draft_vocab_size,
        simulated_acceptance_length=final_eval.get("simulated_acceptance_length"),
        trainer=TRAINER,
        # A warm start (train --init-from-drafter) says which drafter it continued, keeping that drafter's vocabulary map.
        extra={"warm_started_from": warm} if (warm := summary.get("config", {}).get("init_from_drafter")) else {},
    )
    if capture.get("tokenizer_sha256") and capture["tokenizer_sha256"] != provenance.tokenizer_sha256:
        raise InputError(f"{target_dir}: tokenizer differs from the one the hidden states were captured with; export against the captured target")
    (out_dir / PROVENANCE).write_text(provenance.dumps())
    check_export(out_dir, engine=engine)
    return provenance


def _architecture(target_dir: str | Path) -> str | None:
    """The target's class as the serving engine and the validator read it: the top-level config's architectures (a
    vision-language wrapper's, not its language model's)."""
    archs = json.loads((Path(target_dir) / "config.json").read_text()).get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def _readers(fmt: str) -> list[EngineFacts]:
    """The engines that read config.json format `fmt`."""
    return [f for f in ALL_ENGINES if fmt in f.drafter_formats]


def full_vocab_without_maps(cfg: DraftConfig, facts: EngineFacts) -> bool:
    """vLLM 0.32 refuses d2t when the draft vocabulary is the target's whole one (its Eagle3LlamaForCausalLM builds
    draft_id_to_target_id only for a smaller one; t2d it skips always): such an export carries neither map."""
    return not facts.full_vocab_token_maps and cfg.draft_vocab_size == cfg.vocab_size


def _drop_full_vocab_maps(tensors: dict[str, torch.Tensor], cfg: DraftConfig, facts: EngineFacts, final_dir: Path) -> None:
    if not full_vocab_without_maps(cfg, facts):
        return
    if bool(tensors["d2t"].any()):
        raise InputError(
            f"{final_dir}/draft.safetensors: the draft vocabulary is the whole vocabulary but d2t reorders it; vLLM reads the draft's "
            "tokens as the target's own then (it takes no map for a full vocabulary): rebuild the vocabulary in target order, or "
            "export --engine sglang"
        )
    del tensors["d2t"], tensors["t2d"]


def _exported_engine(out_dir: Path) -> str:
    """The engine an export was written for, as its provenance says (exports from before the field: SGLang's)."""
    shown = f"{out_dir}/{PROVENANCE}"
    try:
        doc = json.loads((out_dir / PROVENANCE).read_text())
    except FileNotFoundError:
        raise InputError(f"{shown}: not found; pass check_export the engine, or export the drafter again") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{shown}: unreadable ({exc}); export the drafter again") from None
    engine = DrafterProvenance.from_json(doc, shown).exported_for()
    if engine is None:
        raise InputError(f"{shown}: names no engine and no trainer this project knows; pass check_export the engine")
    return engine


def check_export(out_dir: str | Path, *, engine: str | None = None) -> None:
    """Reopen an export and check every name, shape and dtype the engines need (they would skip them silently).
    engine: the engine it was written for (None: its training_provenance.json says)."""
    out_dir = Path(out_dir)
    facts = facts_for(engine if engine is not None else _exported_engine(out_dir))
    cfg_json = json.loads((out_dir / "config.json").read_text())
    if is_speculators(cfg_json):
        flat, notes = flatten(cfg_json)  # what vLLM builds its draft class from
        if flat is None:
            raise InputError(f"{out_dir}/config.json: {notes[0][2]}")
        aux_ids = flat.get("eagle_aux_hidden_state_layer_ids")
        if not aux_ids:
            raise InputError(f"{out_dir}/config.json: no eagle_aux_hidden_state_layer_ids; export it again")
        cfg_json = flat
    elif cfg_json.get("architectures") != [ARCHITECTURE]:
        raise InputError(f"{out_dir}/config.json: architectures must be [{ARCHITECTURE!r}]")
    else:
        aux_ids = cfg_json["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg = DraftConfig(
        hidden_size=cfg_json["hidden_size"],
        intermediate_size=cfg_json["intermediate_size"],
        num_attention_heads=cfg_json["num_attention_heads"],
        num_key_value_heads=cfg_json["num_key_value_heads"],
        head_dim=cfg_json.get("head_dim"),
        vocab_size=cfg_json["vocab_size"],
        draft_vocab_size=cfg_json["draft_vocab_size"],
        target_hidden_size=cfg_json["target_hidden_size"],
        aux_layer_ids=aux_ids,
    )
    expected = expected_weight_shapes(cfg)
    if full_vocab_without_maps(cfg, facts):
        expected = {k: v for k, v in expected.items() if k not in ("d2t", "t2d")}
    with safe_open(str(out_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name, shape in expected.items():
            if name not in names:
                raise InputError(f"{out_dir}/model.safetensors: {name} missing (the engine would skip it silently)")
            t = f.get_slice(name)
            if tuple(t.get_shape()) != shape:
                raise InputError(f"{out_dir}/model.safetensors: {name} shape {tuple(t.get_shape())} != {shape}")
        extra = names - set(expected)
        if extra:
            raise InputError(f"{out_dir}/model.safetensors: unexpected tensors {sorted(extra)[:5]}")
        if "d2t" not in expected:
            return
        d2t = f.get_tensor("d2t")
        if d2t.dtype != torch.int64:
            raise InputError(f"{out_dir}/model.safetensors: d2t must be int64, is {d2t.dtype}")
        target_ids = d2t + torch.arange(d2t.numel())
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= cfg.vocab_size or target_ids.unique().numel() != d2t.numel():
            raise InputError(f"{out_dir}/model.safetensors: d2t maps to invalid or repeated target ids")
