"""validate(target, drafter, ...): can SGLang serve this drafter with this target, and will it accept anything?

A pure function of what modelmeta read from the two directories. Every rule mirrors what SGLang does when
it loads the pair (tables.py, read from the release's source): which target classes implement
`set_eagle3_layers_to_capture`, how llama_eagle3.py / kimi_k25_eagle3.py name and size the draft's weights,
how model_config.py reads quantization_config and derives context lengths. SGLang skips unknown weight names
silently, so a broken drafter loads and then accepts nothing; catching that here costs milliseconds instead
of a GPU node for ten minutes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .. import SGLANG_VERSION
from ..choices import ALGORITHMS, QUANTIZATIONS
from ..errors import InputError
from .modelmeta import ModelMeta, TensorInfo
from .quantization import checkpoint_quantization, normalize_quantization
from .report import ERROR, INFO, SEVERITY_ORDER, WARNING, Finding, ValidationReport
from .tables import (
    CONTEXT_LENGTH_KEYS,
    DEEPSEEK_CAPTURE_CONVENTION,
    EAGLE3_DRAFT_ARCHITECTURES,
    EAGLE3_TARGET_ARCHITECTURES,
    EAGLE_DRAFT_ARCHITECTURES,
    NEXTN_TARGET_ARCHITECTURES,
)

MIN_TRAINING_SAMPLES = 100_000

CONVERT_EAGLE3_LLAMA = (
    'vLLM\'s name for the same layout: set architectures to ["LlamaForCausalLMEagle3"] in config.json '
    "(the weights midlayer.*, fc, lm_head, d2t, t2d load unchanged)"
)
CONVERT_SPECULATORS = (
    "the speculators format, which SGLang cannot load: export it in SGLang format (config.json with "
    'architectures ["LlamaForCausalLMEagle3"], the fields of transformer_layer_config, draft_vocab_size, '
    "target_hidden_size and eagle_config.eagle_aux_hidden_state_layer_ids); only valid when "
    "norm_before_residual is false, else retrain in SGLang format (SpecForge or specdec-train)"
)


def derived_context_length(cfg: dict[str, Any]) -> int | None:
    """The context length SGLang derives from a (text) config, as utils.get_context_length does."""
    factor: float = 1
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict) and rope:
        f = rope.get("factor", 1)
        factor = f if isinstance(f, (int, float)) and not isinstance(f, bool) else 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            length = factor * value
            return int(length) if math.isfinite(length) else None
    return None


class _Checks:
    def __init__(self, target: ModelMeta, drafter: ModelMeta) -> None:
        self.t, self.d = target, drafter
        self.findings: list[Finding] = []

    def add(self, severity: str, code: str, message: str, field_: str | None = None) -> None:
        self.findings.append(Finding(severity, code, message, field_))


def validate(
    target: ModelMeta,
    drafter: ModelMeta,
    *,
    quantization: str | None = None,
    context_length: int | None = None,
    algorithm: str = "EAGLE3",
) -> ValidationReport:
    """Check a drafter against its target from metadata alone.

    quantization: the serving precision (bf16|fp8|int8|int4|fp4, "none" = bf16); None or "auto"
    derives it from the target's quantization_config. context_length: what the server will be
    started with (None: the target's own). algorithm: EAGLE3 | EAGLE | NEXTN (MTP).
    Raises InputError when a field the checks need is missing or malformed.
    """
    algorithm = algorithm.upper()
    if algorithm == "MTP":
        algorithm = "NEXTN"
    if algorithm not in ALGORITHMS:
        raise InputError(f"--algorithm {algorithm}: must be one of {', '.join(ALGORITHMS)}")
    c = _Checks(target, drafter)

    ckpt_q, ckpt_how = checkpoint_quantization(target)
    if quantization in (None, "auto"):
        serving_q = ckpt_q
        if ckpt_q is None:
            c.add(
                WARNING,
                "QuantizationUnrecognized",
                f"target quantization_config is not one this validator knows ({ckpt_how}); pass "
                "--quantization to say what the server runs, so the hidden-state source can be checked",
                "target.config.quantization_config",
            )
    else:
        if quantization not in QUANTIZATIONS:
            raise InputError(f"--quantization {quantization}: must be one of {', '.join(QUANTIZATIONS)}")
        serving_q = "bf16" if quantization == "none" else quantization
        if ckpt_q is not None and serving_q != ckpt_q:
            c.add(INFO, "QuantizationOverridden", f"serving as {serving_q} while the checkpoint is {ckpt_q} ({ckpt_how})", "target.quantization")

    t_hidden = target.text_int("hidden_size", required=True, minimum=1)
    t_vocab = target.text_int("vocab_size", required=True, minimum=1)
    t_layers = target.text_int("num_hidden_layers", required=True, minimum=1)
    assert t_hidden is not None and t_vocab is not None and t_layers is not None

    if algorithm == "EAGLE3":
        _check_eagle3(c, t_hidden, t_vocab, t_layers)
    elif algorithm == "EAGLE":
        _check_eagle(c, t_hidden, t_vocab)
    else:
        _check_nextn(c, t_hidden, t_vocab, t_layers)

    if algorithm != "NEXTN" or not _same_dir(target, drafter):
        _check_provenance(c, serving_q)
        _check_tokenizers(c)
    _check_context(c, context_length)

    findings = sorted(c.findings, key=lambda f: SEVERITY_ORDER[f.severity])
    return ValidationReport(
        algorithm=algorithm,
        serving_quantization=serving_q,
        checkpoint_quantization=ckpt_q,
        findings=findings,
        target=dict(target.facts(), quantization=ckpt_q, quantization_source=ckpt_how),
        drafter=drafter.facts(),
    )


def _same_dir(a: ModelMeta, b: ModelMeta) -> bool:
    return a.path == b.path or a is b


def _draft_layout(c: _Checks, *, expected: str) -> str | None:
    """Check the drafter's architectures; return its weight layout or None when nothing else is checkable."""
    d = c.d
    arch = d.architecture
    where = "drafter.config.architectures"
    if arch is None:
        c.add(
            ERROR,
            "DrafterArchitectureUnsupported",
            f'{d.config_file} has no architectures; an EAGLE-3 draft for SGLang declares ["LlamaForCausalLMEagle3"]',
            where,
        )
        return None
    if arch == "Eagle3Speculator" or "speculators_model_type" in d.config:
        c.add(ERROR, "DrafterArchitectureUnsupported", f"drafter is {arch}: {CONVERT_SPECULATORS}", where)
        return None
    if expected == "EAGLE3":
        if arch in EAGLE3_DRAFT_ARCHITECTURES:
            return EAGLE3_DRAFT_ARCHITECTURES[arch]
        if arch == "Eagle3LlamaForCausalLM":
            c.add(ERROR, "DrafterArchitectureUnsupported", f"drafter is Eagle3LlamaForCausalLM, {CONVERT_EAGLE3_LLAMA}", where)
            return "llama"
        if arch in EAGLE_DRAFT_ARCHITECTURES:
            c.add(ERROR, "AlgorithmMismatch", f"drafter is an EAGLE (v1/v2) draft ({arch}); serve it with --algorithm EAGLE, not EAGLE3", where)
            return None
    else:  # EAGLE
        if arch in EAGLE_DRAFT_ARCHITECTURES:
            return "eagle"
        if arch in EAGLE3_DRAFT_ARCHITECTURES or arch == "Eagle3LlamaForCausalLM":
            c.add(
                ERROR,
                "AlgorithmMismatch",
                f"drafter is an EAGLE-3 draft ({arch}); launched as EAGLE its fc layer is skipped and it accepts nothing: use --algorithm EAGLE3",
                where,
            )
            return None
    if arch in EAGLE3_TARGET_ARCHITECTURES or arch in NEXTN_TARGET_ARCHITECTURES:
        hint = "; for a model's own MTP layers use --algorithm NEXTN" if d.text.get("num_nextn_predict_layers") else ""
        c.add(ERROR, "DrafterArchitectureUnsupported", f"drafter is a full model ({arch}), not a draft{hint}", where)
        return None
    names = " or ".join(EAGLE3_DRAFT_ARCHITECTURES) if expected == "EAGLE3" else ", ".join(sorted(EAGLE_DRAFT_ARCHITECTURES))
    c.add(ERROR, "DrafterArchitectureUnsupported", f"SGLang {SGLANG_VERSION} has no {expected} draft class {arch}; it loads {names}", where)
    return None


def _check_eagle3(c: _Checks, t_hidden: int, t_vocab: int, t_layers: int) -> None:
    t, d = c.t, c.d
    t_arch = t.architecture
    if t_arch is None:
        c.add(ERROR, "TargetArchitectureUnsupported", f"{t.config_file} has no architectures", "target.config.architectures")
    elif t_arch not in EAGLE3_TARGET_ARCHITECTURES:
        c.add(
            ERROR,
            "TargetArchitectureUnsupported",
            f"SGLang {SGLANG_VERSION}'s {t_arch} cannot capture auxiliary hidden states "
            "(no set_eagle3_layers_to_capture), so EAGLE-3 fails at start-up; use a supported target "
            "or --algorithm NEXTN/EAGLE",
            "target.config.architectures",
        )

    layout = _draft_layout(c, expected="EAGLE3")
    if layout is None:
        return
    d_hidden = d.top_int("hidden_size", required=True, minimum=1)
    d_vocab = d.top_int("vocab_size", required=True, minimum=1)
    d_target_hidden = d.top_int("target_hidden_size", minimum=1)
    draft_vocab = d.top_int("draft_vocab_size", minimum=1)
    assert d_hidden is not None and d_vocab is not None
    fed_width = d_target_hidden or d_hidden

    if fed_width != t_hidden:
        source = "target_hidden_size" if d_target_hidden else "hidden_size (no target_hidden_size)"
        c.add(
            ERROR,
            "HiddenSizeMismatch",
            f"drafter expects target hidden states of width {fed_width} ({source}) but the target's "
            f"hidden_size is {t_hidden}: it was trained for another model",
            f"drafter.config.{'target_hidden_size' if d_target_hidden else 'hidden_size'}",
        )
    if d_vocab != t_vocab:
        c.add(
            ERROR,
            "VocabSizeMismatch",
            f"drafter vocab_size {d_vocab} != target vocab_size {t_vocab}: different tokenizer; its token ids would map to the wrong target tokens",
            "drafter.config.vocab_size",
        )
    if layout == "llama" and "draft_vocab_size" not in d.config and not d.config.get("tie_word_embeddings", False):
        # llama_eagle3 reads config.draft_vocab_size directly; transformers' LlamaConfig has no default.
        c.add(
            ERROR,
            "DrafterConfigIncomplete",
            "config.json has no draft_vocab_size and untied embeddings: SGLang's LlamaForCausalLMEagle3 then "
            "fails at start-up (AttributeError); set draft_vocab_size (null = full vocabulary, lm_head from the target)",
            "drafter.config.draft_vocab_size",
        )
    if "model_type" not in d.config:
        c.add(
            ERROR,
            "DrafterConfigIncomplete",
            'config.json has no model_type: transformers\' AutoConfig cannot load it (an SGLang-format EAGLE-3 draft says "llama")',
            "drafter.config.model_type",
        )
    if layout == "mla":
        # kimi_k25_eagle3: one MLA decoder layer, and q_lora_rank is required (ValueError otherwise).
        if d.top_int("num_hidden_layers", minimum=0) not in (None, 1):
            c.add(
                ERROR,
                "DrafterConfigIncomplete",
                f"Eagle3DeepseekV2ForCausalLM supports exactly 1 layer; num_hidden_layers is {d.config.get('num_hidden_layers')}",
                "drafter.config.num_hidden_layers",
            )
        missing_mla = [
            k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if d.top_int(k, minimum=1) is None
        ]
        if missing_mla:
            c.add(
                ERROR,
                "DrafterConfigIncomplete",
                f"Eagle3DeepseekV2ForCausalLM needs the MLA fields {', '.join(missing_mla)} in config.json",
                f"drafter.config.{missing_mla[0]}",
            )
    if draft_vocab is not None and draft_vocab > min(d_vocab, t_vocab):
        c.add(
            ERROR,
            "DraftVocabTooLarge",
            f"draft_vocab_size {draft_vocab} exceeds the vocabulary ({min(d_vocab, t_vocab)}); the d2t map would point past the target's tokens",
            "drafter.config.draft_vocab_size",
        )

    eagle_cfg = d.eagle_config
    use_aux = eagle_cfg.get("use_aux_hidden_state", True)
    if use_aux is False:
        c.add(
            ERROR,
            "AuxHiddenStatesDisabled",
            "eagle_config.use_aux_hidden_state is false: SGLang then feeds only the last hidden state, the fc "
            "layer is skipped and an EAGLE-3 draft accepts nothing",
            "drafter.config.eagle_config.use_aux_hidden_state",
        )
    ids = d.aux_layer_ids()
    num_aux_cfg = d.top_int("num_aux_hidden_states", minimum=1)
    num_aux = num_aux_cfg or (len(ids) if ids else 3)
    _check_aux_layers(c, ids, num_aux_cfg, t_layers)

    if d.weight_format == "bin":
        c.add(
            WARNING,
            "WeightsNotInspected",
            f"drafter weights are pickled ({', '.join(d.weight_files[:2])}); convert them to safetensors so "
            "their names and shapes can be checked without loading",
            "drafter.weights",
        )
        return
    if d.weight_format == "none" or d.tensors is None:
        c.add(ERROR, "MissingDrafterWeights", f"{d.path} has no model.safetensors, index, or pytorch_model.bin", "drafter.weights")
        return
    _check_draft_weights(
        c,
        layout,
        d_hidden=d_hidden,
        fed_width=fed_width,
        num_aux=num_aux,
        d_vocab=d_vocab,
        t_vocab=t_vocab,
        draft_vocab=draft_vocab,
        use_aux=use_aux is not False,
    )


def _check_aux_layers(c: _Checks, ids: list[int] | None, num_aux_cfg: int | None, t_layers: int) -> None:
    t_arch = c.t.architecture or ""
    where = "drafter.config.eagle_config.eagle_aux_hidden_state_layer_ids"
    if ids is None:
        captured = [2, t_layers // 2, t_layers - 3]
        c.add(
            INFO,
            "AuxLayersDefaulted",
            f"drafter config names no eagle_aux_hidden_state_layer_ids; SGLang captures the inputs of target "
            f"layers {captured}, which must be the layers it was trained on",
            where,
        )
        if num_aux_cfg is not None and num_aux_cfg != 3:
            c.add(
                ERROR, "AuxLayerOutOfRange", f"num_aux_hidden_states is {num_aux_cfg} but SGLang captures 3 layers when no layer ids are given", where
            )
        return
    if not ids:
        c.add(ERROR, "AuxLayerOutOfRange", "eagle_aux_hidden_state_layer_ids is empty", where)
        return
    if num_aux_cfg is not None and num_aux_cfg != len(ids):
        c.add(ERROR, "AuxLayerOutOfRange", f"num_aux_hidden_states {num_aux_cfg} != {len(ids)} layer ids: fc's input width cannot match", where)
    plus_one = not (t_arch in DEEPSEEK_CAPTURE_CONVENTION and ids[0] != 1)
    captured = [i + 1 if plus_one else i for i in ids]
    bad = [i for i, cap in zip(ids, captured) if i < 0 or cap >= t_layers]
    if bad:
        rule = "id + 1" if plus_one else "id"
        c.add(
            ERROR,
            "AuxLayerOutOfRange",
            f"layer ids {bad} are out of range: {t_arch or 'the target'} captures the input of layer {rule}, "
            f"and the target has {t_layers} layers (0..{t_layers - 1}); that hidden state is never produced",
            where,
        )
    elif len(set(captured)) != len(captured):
        c.add(WARNING, "AuxLayersDuplicated", f"layer ids {ids} capture the same layer twice", where)
    else:
        c.add(INFO, "AuxLayers", f"SGLang captures the inputs of target layers {captured}", where)


def _draft_weight_name(name: str) -> str:
    """A draft checkpoint's tensor name in one spelling, without "model." and with layers.0 for midlayer:
    llama_eagle3.load_weights maps midlayer -> layers.0 and adds a missing "model." prefix; kimi_k25_eagle3
    maps layers.0 -> midlayer and keeps lm_head at the top level, so both accept either spelling."""
    if name.startswith("model."):
        name = name[len("model.") :]
    return name.replace("midlayer.", "layers.0.")


class _DraftWeights:
    """A draft checkpoint's tensors, named as _draft_weight_name spells them, and what the checks found
    missing or misshapen (in the order they looked)."""

    def __init__(self, tensors: dict[str, TensorInfo]) -> None:
        self.tensors = {_draft_weight_name(n): info for n, info in tensors.items()}
        self.missing: list[str] = []
        self.bad_shapes: list[str] = []

    def expect(self, name: str, shape: tuple[int, ...] | None, why: str = "") -> None:
        info = self.tensors.get(name)
        if info is None:
            self.missing.append(name + (f" ({why})" if why else ""))
        elif shape is not None and info.shape != shape:
            self.bad_shapes.append(f"{name} is {list(info.shape)}, expected {list(shape)}{f' ({why})' if why else ''}")


def _check_draft_weights(
    c: _Checks,
    layout: str,
    *,
    d_hidden: int,
    fed_width: int,
    num_aux: int,
    d_vocab: int,
    t_vocab: int,
    draft_vocab: int | None,
    use_aux: bool,
) -> None:
    d = c.d
    assert d.tensors is not None
    w = _DraftWeights(d.tensors)
    tie = bool(d.config.get("tie_word_embeddings", False))
    lm_head_from_target = not tie and draft_vocab is None
    head_rows = draft_vocab if draft_vocab is not None else d_vocab

    if use_aux:
        w.expect("fc.weight", (d_hidden, fed_width * num_aux), f"hidden x {num_aux} x target hidden")
    if not tie and not lm_head_from_target:
        w.expect("lm_head.weight", (head_rows, d_hidden), "draft_vocab x hidden")
    if d.top_int("target_hidden_size") not in (None, d_hidden):
        # set_embed skips sharing when target_hidden_size != hidden_size: the draft needs its own.
        w.expect("embed_tokens.weight", (d_vocab, d_hidden), "not shared with the target when target_hidden_size != hidden_size")
    if draft_vocab is not None and draft_vocab != d_vocab and not lm_head_from_target:
        w.expect("d2t", (draft_vocab,), "draft -> target token map")
    w.expect("norm.weight", (d_hidden,))
    w.expect("layers.0.hidden_norm.weight", (d_hidden,))
    w.expect("layers.0.input_layernorm.weight", (d_hidden,))
    if layout == "llama":
        _expect_llama_layer(w, d, d_hidden)
    else:
        _expect_mla_layer(w, d_hidden)

    if w.missing:
        c.add(
            ERROR,
            "MissingDrafterWeights",
            f"drafter checkpoint lacks {', '.join(w.missing[:6])}{' ...' if len(w.missing) > 6 else ''}; SGLang skips "
            "missing names silently, so it would load and then accept nothing",
            "drafter.weights",
        )
    _check_token_maps(w, draft_vocab, t_vocab)
    if w.bad_shapes:
        c.add(ERROR, "DrafterWeightShapeMismatch", "; ".join(w.bad_shapes[:4]) + (" ..." if len(w.bad_shapes) > 4 else ""), "drafter.weights")
    _check_unused_weights(c, w.tensors)


def _expect_llama_layer(w: _DraftWeights, d: ModelMeta, d_hidden: int) -> None:
    """llama_eagle3's decoder layer: attention over [embedding, fc output] (2 x hidden wide), then the MLP."""
    heads = d.top_int("num_attention_heads", minimum=1)
    kv_heads = d.top_int("num_key_value_heads", minimum=1) or heads
    head_dim = d.top_int("head_dim", minimum=1) or (d_hidden // heads if heads else None)
    q_rows = heads * head_dim if heads and head_dim else None
    kv_rows = kv_heads * head_dim if kv_heads and head_dim else None
    for proj, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
        name = f"layers.0.self_attn.{proj}.weight"
        info = w.tensors.get(name)
        if info is None:
            w.missing.append(name)
        elif len(info.shape) != 2 or info.shape[1] != 2 * d_hidden or (rows is not None and info.shape[0] != rows):
            w.bad_shapes.append(
                f"{name} is {list(info.shape)}, expected [{rows if rows else '*'}, {2 * d_hidden}] (input is 2 x hidden: embedding and fc output)"
            )
    # transformers' LlamaConfig defaults intermediate_size to 11008 when absent; SGLang's weight
    # loader then asserts on the first MLP tensor, after the target has loaded.
    inter = d.top_int("intermediate_size", minimum=1) or 11008
    w.expect("layers.0.self_attn.o_proj.weight", (d_hidden, q_rows) if q_rows else None)
    w.expect("layers.0.mlp.gate_proj.weight", (inter, d_hidden), "intermediate_size x hidden")
    w.expect("layers.0.mlp.up_proj.weight", (inter, d_hidden), "intermediate_size x hidden")
    w.expect("layers.0.mlp.down_proj.weight", (d_hidden, inter), "hidden x intermediate_size")


def _expect_mla_layer(w: _DraftWeights, d_hidden: int) -> None:
    """kimi_k25_eagle3's MLA decoder layer: its input projections read [embedding, fc output], 2 x hidden."""
    for proj in ("q_a_proj", "kv_a_proj_with_mqa"):
        name = f"layers.0.self_attn.{proj}.weight"
        info = w.tensors.get(name)
        if info is None:
            w.missing.append(name)
        elif len(info.shape) != 2 or info.shape[1] != 2 * d_hidden:
            w.bad_shapes.append(f"{name} is {list(info.shape)}, expected input width {2 * d_hidden} (2 x hidden)")
    for name in ("layers.0.self_attn.kv_b_proj.weight", "layers.0.self_attn.o_proj.weight"):
        w.expect(name, None)


def _check_token_maps(w: _DraftWeights, draft_vocab: int | None, t_vocab: int) -> None:
    """d2t (draft token -> offset to the target token) and t2d (target token -> in the draft vocabulary)."""
    d2t = w.tensors.get("d2t")
    t2d = w.tensors.get("t2d")
    if d2t is not None:
        if draft_vocab is not None and d2t.shape != (draft_vocab,):
            w.bad_shapes.append(f"d2t is {list(d2t.shape)}, expected [{draft_vocab}] (one offset per draft token)")
        if d2t.dtype not in ("I64", "I32"):
            w.bad_shapes.append(f"d2t has dtype {d2t.dtype}; it holds token-id offsets and must be an integer type (I64)")
    if t2d is not None and t2d.shape != (t_vocab,):
        w.bad_shapes.append(f"t2d is {list(t2d.shape)}, expected [{t_vocab}] (one flag per target token)")


# The names a draft class has parameters for; SGLang skips any other tensor without a word.
_KNOWN_DRAFT_WEIGHT = re.compile(
    r"^(fc\.(weight|bias)|lm_head\.weight|embed_tokens\.weight|norm\.weight|d2t|t2d|input_norm\.weight|"
    r"fc_norm\.\d+\.weight|aux_norm_(low|mid|high)\.weight|layers\.\d+\..+)$"
)


def _check_unused_weights(c: _Checks, tensors: dict[str, TensorInfo]) -> None:
    unused = sorted(n for n in tensors if not _KNOWN_DRAFT_WEIGHT.match(n))
    if unused:
        c.add(
            WARNING,
            "UnusedDrafterWeights",
            f"SGLang ignores {len(unused)} tensor(s) it has no parameter for: {', '.join(unused[:4])}"
            f"{' ...' if len(unused) > 4 else ''} (a format mix-up?)",
            "drafter.weights",
        )


def _check_eagle(c: _Checks, t_hidden: int, t_vocab: int) -> None:
    d = c.d
    if _draft_layout(c, expected="EAGLE") is None:
        return
    d_hidden = d.top_int("hidden_size", required=True, minimum=1)
    d_vocab = d.top_int("vocab_size", required=True, minimum=1)
    if d_hidden != t_hidden:
        c.add(ERROR, "HiddenSizeMismatch", f"EAGLE drafter hidden_size {d_hidden} != target hidden_size {t_hidden}", "drafter.config.hidden_size")
    if d_vocab != t_vocab:
        c.add(ERROR, "VocabSizeMismatch", f"drafter vocab_size {d_vocab} != target vocab_size {t_vocab}", "drafter.config.vocab_size")
    if d.tensors is None:
        if d.weight_format != "bin":
            c.add(ERROR, "MissingDrafterWeights", f"{d.path} has no model.safetensors or index", "drafter.weights")
        return
    names = {_draft_weight_name(n): info for n, info in d.tensors.items()}
    fc = names.get("fc.weight")
    if fc is None:
        c.add(ERROR, "MissingDrafterWeights", "drafter checkpoint lacks fc.weight; SGLang would load it and accept nothing", "drafter.weights")
    elif d_hidden is not None and fc.shape != (d_hidden, 2 * d_hidden):
        c.add(ERROR, "DrafterWeightShapeMismatch", f"fc.weight is {list(fc.shape)}, expected [{d_hidden}, {2 * d_hidden}]", "drafter.weights")


def _check_nextn(c: _Checks, t_hidden: int, t_vocab: int, t_layers: int) -> None:
    t, d = c.t, c.d
    t_arch = t.architecture
    nextn = t.text_int("num_nextn_predict_layers")
    if t_arch not in NEXTN_TARGET_ARCHITECTURES:
        c.add(
            ERROR,
            "TargetArchitectureUnsupported",
            f"SGLang {SGLANG_VERSION} has no NextN/MTP draft for {t_arch or 'a config without architectures'}",
            "target.config.architectures",
        )
    if not nextn:
        c.add(
            ERROR,
            "NextNLayersMissing",
            f"target {t.field_path('num_nextn_predict_layers')} is {nextn or 0}: the checkpoint has no MTP layers "
            "to draft with; use an EAGLE-3 drafter",
            f"target.config.{t.field_path('num_nextn_predict_layers')}",
        )
    if not _same_dir(t, d):
        d_hidden = d.text_int("hidden_size", required=True, minimum=1)
        d_vocab = d.text_int("vocab_size", required=True, minimum=1)
        if d_hidden != t_hidden:
            c.add(ERROR, "HiddenSizeMismatch", f"MTP drafter hidden_size {d_hidden} != target {t_hidden}", "drafter.config.hidden_size")
        if d_vocab != t_vocab:
            c.add(ERROR, "VocabSizeMismatch", f"MTP drafter vocab_size {d_vocab} != target {t_vocab}", "drafter.config.vocab_size")
        return
    if nextn:
        # The MTP layers follow the last decoder layer: model.layers.{L}.* for L = num_hidden_layers.
        prefix = f"model.layers.{t_layers}."
        if t.has_tensor_prefix(prefix) is False:
            c.add(
                ERROR,
                "MissingDrafterWeights",
                f"the checkpoint has no {prefix}* tensors although num_nextn_predict_layers is {nextn}: the MTP "
                "layers were dropped (common in quantized re-exports)",
                "target.weights",
            )


def _check_provenance(c: _Checks, serving_q: str | None) -> None:
    prov = c.d.provenance
    quantized = serving_q not in ("bf16", None)
    if prov is None:
        if quantized:
            c.add(
                WARNING,
                "ProvenanceMissing",
                f"the target serves {serving_q} and the drafter has no training_provenance.json: nothing says its "
                "hidden states came from the same quantization (bf16-trained drafters on INT4 targets accept ~nothing)",
                "drafter.provenance",
            )
        return
    source = normalize_quantization(prov.get("target_quantization")) or normalize_quantization(prov.get("hidden_state_source"))
    if source is None:
        if quantized:
            c.add(
                WARNING,
                "ProvenanceMissing",
                "training_provenance.json does not say which quantization the hidden states came from (target_quantization)",
                "drafter.provenance.target_quantization",
            )
    elif serving_q is not None and source != serving_q:
        c.add(
            WARNING,
            "HiddenStateSourceMismatch",
            f"the drafter was trained on hidden states of the target served as {source} "
            f"({prov.get('hidden_state_source') or prov.get('target_quantization')}) but this server runs {serving_q}: "
            f"acceptance can collapse; retrain on hidden states captured from the {serving_q} server",
            "drafter.provenance.target_quantization",
        )
    samples = prov.get("num_samples")
    if isinstance(samples, int) and samples < MIN_TRAINING_SAMPLES:
        c.add(
            WARNING,
            "SmallTrainingSet",
            f"trained on {samples:,} samples; good public drafters use 500k-2M (below {MIN_TRAINING_SAMPLES:,} acceptance is usually poor)",
            "drafter.provenance.num_samples",
        )


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(tc: dict[str, Any]) -> tuple[dict[str, str | None], set[str]]:
    named = {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    added: set[str] = set()
    decoder = tc.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for entry in decoder.values():
            if isinstance(entry, dict) and entry.get("special") and isinstance(entry.get("content"), str):
                added.add(entry["content"])
    return named, added


def _chat_template(meta: ModelMeta) -> str | None:
    if meta.chat_template is not None:
        return meta.chat_template
    tc = meta.tokenizer_config or {}
    tpl = tc.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        for item in tpl:
            if isinstance(item, dict) and item.get("name") == "default":
                return str(item.get("template"))
        return json.dumps(tpl, sort_keys=True)
    return tpl if isinstance(tpl, str) else None


def _check_tokenizers(c: _Checks) -> None:
    t_tc, d_tc = c.t.tokenizer_config, c.d.tokenizer_config
    if t_tc is None or d_tc is None:
        return  # SGLang serves with the target's tokenizer; a drafter without one has nothing to compare
    t_named, t_added = _special_tokens(t_tc)
    d_named, d_added = _special_tokens(d_tc)
    diffs = [
        f"{k} {d_named[k]!r} vs target {t_named[k]!r}"
        for k in t_named
        if t_named[k] is not None and d_named[k] is not None and t_named[k] != d_named[k]
    ]
    if t_added and d_added and t_added != d_added:
        only_d, only_t = sorted(d_added - t_added), sorted(t_added - d_added)
        diffs.append(f"added special tokens differ (drafter only: {only_d[:3]}, target only: {only_t[:3]})")
    if diffs:
        c.add(
            WARNING,
            "SpecialTokensDiffer",
            "drafter tokenizer_config.json differs from the target's: " + "; ".join(diffs[:3]) + " (trained with another tokenizer or template)",
            "drafter.tokenizer_config",
        )
    t_tpl, d_tpl = _chat_template(c.t), _chat_template(c.d)
    if t_tpl is not None and d_tpl is not None and t_tpl.strip() != d_tpl.strip():
        c.add(
            WARNING,
            "ChatTemplateDiffers",
            "the drafter's chat template differs from the target's: it was trained on differently formatted "
            "prompts (thinking vs non-thinking templates cut acceptance)",
            "drafter.tokenizer_config.chat_template",
        )


def _check_context(c: _Checks, context_length: int | None) -> None:
    t_ctx = derived_context_length(c.t.text)
    served = context_length or t_ctx
    if context_length is not None and t_ctx is not None and context_length > t_ctx:
        c.add(
            WARNING,
            "ContextLengthExceedsTarget",
            f"--context-length {context_length} exceeds the target's {t_ctx}; SGLang {SGLANG_VERSION} refuses to "
            "start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
            "target.contextLength",
        )
    if _same_dir(c.t, c.d):
        return
    d_ctx = derived_context_length(c.d.text)
    if served is not None and d_ctx is not None and served > d_ctx:
        c.add(
            WARNING,
            "ContextLengthExceedsDrafter",
            f"the server runs with context {served} but the drafter was built for {d_ctx} "
            f"(max_position_embeddings): SGLang {SGLANG_VERSION} refuses to start unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, and acceptance degrades on long prompts",
            "drafter.config.max_position_embeddings",
        )
