"""validate(target, drafter, ...): can SGLang serve this drafter with this target, and will it accept anything?

A pure function of what modelmeta read from the two directories. Every rule mirrors what SGLang does when
it loads the pair (tables.py, read from the release's source): which target classes implement
`set_eagle3_layers_to_capture`, how llama_eagle3.py / kimi_k25_eagle3.py name and size the draft's weights,
how model_config.py reads quantization_config and derives context lengths. SGLang skips unknown weight names
silently, so a broken drafter loads and then accepts nothing; catching that here costs milliseconds instead
of a GPU node for ten minutes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from .. import SGLANG_VERSION
from ..choices import ALGORITHMS, DRAFTER_FREE_ALGORITHMS, ENGINES, QUANTIZATIONS
from ..enginefacts import DEFAULT, SPECULATORS, EngineFacts, facts_for
from ..errors import InputError
from . import families, speculators
from .modelmeta import ModelMeta, TensorInfo
from .provenance import FILENAME as PROVENANCE_FILENAME
from .quantization import checkpoint_quantization, normalize_quantization
from .report import ERROR, INFO, SEVERITY_ORDER, WARNING, Finding, ValidationReport
from .tables import (
    CAPTURE_DELEGATED,
    CAPTURE_FIRST_ID_ONE,
    CAPTURE_MAX_IS_BOUNDARY,
    CAPTURE_PLUS_ONE,
    CONTEXT_LENGTH_KEYS,
    DRAFT_CONFIG_DEFAULTS,
    EAGLE3_CAPTURE_RULE,
    EAGLE3_CAPTURES_LAST_LAYER_OUTPUT,
    EAGLE3_DEFAULT_IDS_PLUS_ONE,
    EAGLE3_DRAFT_ARCHITECTURES,
    EAGLE3_TARGET_ARCHITECTURES,
    EAGLE_DRAFT_ARCHITECTURES,
    NEXTN_TARGET_ARCHITECTURES,
)

MIN_TRAINING_SAMPLES = 100_000
# The methods with a drafter directory to check (NGRAM and SUFFIX have none).
VALIDATED_ALGORITHMS = tuple(a for a in ALGORITHMS if a not in DRAFTER_FREE_ALGORITHMS)

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


def derived_context_length(cfg: dict[str, Any], default_max_position: int | None = None) -> int | None:
    """The context length SGLang derives from a (text) config, as utils.get_context_length does.

    default_max_position: what the config object says for max_position_embeddings when config.json leaves it
    out (its transformers class default); get_context_length reads the attribute, not the file.
    """
    factor: float = 1
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict) and rope:
        f = rope.get("factor", 1)
        factor = f if isinstance(f, (int, float)) and not isinstance(f, bool) else 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = cfg.get(key)
        if value is None and key == "max_position_embeddings":
            value = default_max_position
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            length = factor * value
            return int(length) if math.isfinite(length) else None
    return None


def draft_config_default(cfg: dict[str, Any], key: str) -> int | None:
    """The transformers default of `key` for this draft config's model_type (tables.DRAFT_CONFIG_DEFAULTS),
    None when the model_type is not one the table knows or the class has no default."""
    model_type = cfg.get("model_type")
    defaults = DRAFT_CONFIG_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    return defaults.get(key) if defaults else None


class _Checks:
    def __init__(self, target: ModelMeta, drafter: ModelMeta, engine: str) -> None:
        self.t, self.d = target, drafter
        self.engine = engine
        self.facts: EngineFacts = facts_for(engine)
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
    engine: str = DEFAULT.cli_name,
) -> ValidationReport:
    """Check a drafter against its target from metadata alone.

    quantization: the serving precision (bf16|fp8|int8|int4|fp4, "none" = bf16); None or "auto"
    derives it from the target's quantization_config. context_length: what the server will be
    started with (None: the target's own). algorithm: EAGLE3 | EAGLE | NEXTN (MTP) | STANDALONE | DFLASH. engine: the engine that
    will serve the pair (sglang | vllm); the two read eagle_aux_hidden_state_layer_ids one layer apart.
    Raises InputError when a field the checks need is missing or malformed.
    """
    algorithm = algorithm.upper()
    if algorithm == "MTP":
        algorithm = "NEXTN"
    if algorithm not in VALIDATED_ALGORITHMS:
        # NGRAM and SUFFIX have no drafter directory: admission checks their parameters, nothing here reads them.
        raise InputError(f"--algorithm {algorithm}: must be one of {', '.join(VALIDATED_ALGORITHMS)} (the methods with a drafter to check)")
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: must be one of {', '.join(ENGINES)}")
    c = _Checks(target, drafter, engine)
    drafter_readable = True
    if SPECULATORS in c.facts.drafter_formats and speculators.is_speculators(drafter.config):
        # vLLM reads the speculators format by flattening it (validator/speculators.py); the checks below read the
        # flattened config, as vLLM's draft class is built from it. SGLang refuses the format (_draft_layout).
        flat, notes = speculators.flatten(drafter.config)
        for note in notes:
            c.add(*note)
        if flat is None:
            drafter_readable = False
        else:
            c.add(
                INFO,
                "SpeculatorsFormat",
                "speculators-format drafter: checked as vLLM flattens it (transformer_layer_config and the EAGLE-3 fields)",
                "drafter.config",
            )
            drafter = dataclasses.replace(drafter, config=flat, text=flat, text_config_key=None)
            c.d = drafter

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

    _check_target_weights(c)
    if not drafter_readable:
        pass
    elif algorithm == "EAGLE3":
        _check_eagle3(c, t_hidden, t_vocab, t_layers)
    elif algorithm == "EAGLE":
        _check_eagle(c, t_hidden, t_vocab)
    elif algorithm == "STANDALONE":
        families.check_standalone(c, t_vocab)
    elif algorithm == "DFLASH":
        families.check_dflash(c, t_hidden, t_vocab, t_layers)
    else:
        _check_nextn(c, t_hidden, t_vocab, t_layers)

    if algorithm != "NEXTN" or not _same_dir(target, drafter):
        if algorithm != "STANDALONE":  # a standalone draft model reads none of the target's hidden states
            _check_provenance(c, serving_q)
        _check_tokenizers(c)
    _check_context(c, context_length)

    findings = sorted(c.findings, key=lambda f: SEVERITY_ORDER[f.severity])
    return ValidationReport(
        algorithm=algorithm,
        engine=engine,
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
        own, layout = c.facts.eagle3_draft_layout(arch)
        if own and layout is None:
            c.add(
                WARNING,
                "DrafterWeightsUnchecked",
                f"drafter is {c.facts.name}'s {arch}: its tensor names and shapes are not checked here",
                where,
            )
            return None
        if own:
            return layout
        if arch == "Eagle3LlamaForCausalLM":
            # vLLM's own class name for this layout (its registry maps LlamaForCausalLMEagle3 to it too); an engine
            # that does not know it refuses it, and the rest of the draft is checked as the layout it is.
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
    moe = _moe_fields(d.config)
    hint = (
        f"; its decoder layer is a mixture of experts ({', '.join(moe)}), which neither SGLang draft class builds "
        "(renaming architectures would serve an uninitialised dense MLP)"
        if moe and expected == "EAGLE3"
        else ""
    )
    c.add(ERROR, "DrafterArchitectureUnsupported", f"SGLang {SGLANG_VERSION} has no {expected} draft class {arch}; it loads {names}{hint}", where)
    return None


def _check_eagle3_target(c: _Checks) -> None:
    """The target can capture the auxiliary hidden states EAGLE-3 drafts from."""
    t = c.t
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


def _check_mla_layout(c: _Checks) -> None:
    """kimi_k25_eagle3: one MLA decoder layer, and q_lora_rank is required (ValueError otherwise)."""
    d = c.d
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


def _check_eagle3(c: _Checks, t_hidden: int, t_vocab: int, t_layers: int) -> None:
    d = c.d
    _check_eagle3_target(c)

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
        _check_mla_layout(c)
    if draft_vocab is not None and draft_vocab > min(d_vocab, t_vocab):
        c.add(
            ERROR,
            "DraftVocabTooLarge",
            f"draft_vocab_size {draft_vocab} exceeds the vocabulary ({min(d_vocab, t_vocab)}); the d2t map would point past the target's tokens",
            "drafter.config.draft_vocab_size",
        )

    _check_draft_config_fields(c, layout)
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
    _check_trained_layers(c, ids, t_layers)

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


def eagle3_captured_layers(t_arch: str, ids: list[int] | None, t_layers: int) -> tuple[list[int], str]:
    """The layer indices SGLang captures for a drafter's aux layer ids on this target class, and the rule.

    Mirrors each class's set_eagle3_layers_to_capture (tables.EAGLE3_CAPTURE_RULE names the file): index i
    is the input of layer i, index num_layers the last layer's output where the class captures it.
    """
    rule = EAGLE3_CAPTURE_RULE.get(t_arch, CAPTURE_PLUS_ONE)
    if ids is None:
        # Every set_eagle3_layers_to_capture: layers_to_capture = [2, num_layers // 2, num_layers - 3].
        defaults = [2, t_layers // 2, t_layers - 3]
        if t_arch in EAGLE3_DEFAULT_IDS_PLUS_ONE:  # minimax_m3_vl.py adds 1 to its defaults as well
            return [i + 1 for i in defaults], "defaults [2, L//2, L-3] + 1"
        return defaults, "defaults [2, L//2, L-3]"
    if rule == CAPTURE_FIRST_ID_ONE:
        # deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture
        if ids and ids[0] == 1:
            return [i + 1 for i in ids], "id + 1 (the first id is 1)"
        return list(ids), "id as given (the first id is not 1)"
    if rule == CAPTURE_MAX_IS_BOUNDARY:
        # gpt_oss.py GptOssForCausalLM.set_eagle3_layers_to_capture
        if ids and max(ids) == t_layers:
            return list(ids), f"id as given (the largest id is num_hidden_layers {t_layers})"
        return [i + 1 for i in ids], "id + 1"
    return [i + 1 for i in ids], "id + 1"


def captured_layers(facts: EngineFacts, t_arch: str, ids: list[int] | None, t_layers: int) -> tuple[list[int], str, int] | None:
    """The target layers whose inputs the engine captures for config ids `ids` (None: its defaults) on a target of class
    `t_arch` with `t_layers` layers, the rule in words, and the largest index the target produces (t_layers: the last
    layer's output, where it is captured). None where SGLang hands the ids to a model outside its source (not
    checkable)."""
    if not facts.capture_rule_per_target_class:
        # vLLM captures the hidden state after `id` layers (LlamaModel.forward's _maybe_add_hidden_state before the
        # loop and after each layer): 0..N, N being the last layer's output; its default ids are (2, N // 2, N - 3).
        captured = facts.captured_inputs(ids if ids is not None else [2, t_layers // 2, t_layers - 3])
        return captured, f"{facts.aux_layer_id_convention} ({facts.name})", t_layers
    if EAGLE3_CAPTURE_RULE.get(t_arch) == CAPTURE_DELEGATED:
        return None
    captured, rule = eagle3_captured_layers(t_arch, ids, t_layers)
    # Index num_layers (the last layer's output) exists only where the model's forward captures it.
    return captured, rule, t_layers if t_arch in EAGLE3_CAPTURES_LAST_LAYER_OUTPUT else t_layers - 1


def ids_capturing(facts: EngineFacts, t_arch: str, inputs: list[int], t_layers: int) -> list[int] | None:
    """The config ids that make the engine capture the inputs of exactly these target layers on a target of class
    `t_arch`, or None when no ids do (or the class hands them outside SGLang's source). The engine's plain convention
    first; SGLang's per-class rules (the DeepSeek family's "+1 only when the first id is 1", GPT-OSS's boundary) may
    instead take the layers as given or one less. `specdec-train export` writes these; the validator names them."""
    for ids in (facts.ids_for_inputs(inputs), list(inputs), [i - 1 for i in inputs]):
        found = captured_layers(facts, t_arch, ids, t_layers)
        if found is not None and min(ids, default=0) >= 0 and found[0] == list(inputs) and max(found[0], default=0) <= found[2]:
            return ids
    return None


def _captured_layers(c: _Checks, ids: list[int] | None, t_layers: int) -> tuple[list[int], str, int] | None:
    return captured_layers(c.facts, c.t.architecture or "", ids, t_layers)


def _ids_capturing(c: _Checks, inputs: list[int], t_layers: int) -> list[int] | None:
    return ids_capturing(c.facts, c.t.architecture or "", inputs, t_layers)


def _check_aux_layers(c: _Checks, ids: list[int] | None, num_aux_cfg: int | None, t_layers: int) -> None:
    t_arch = c.t.architecture or ""
    where = "drafter.config.eagle_config.eagle_aux_hidden_state_layer_ids"
    if ids is not None and not ids:
        c.add(ERROR, "AuxLayerOutOfRange", "eagle_aux_hidden_state_layer_ids is empty", where)
        return
    if ids is not None and num_aux_cfg is not None and num_aux_cfg != len(ids):
        c.add(ERROR, "AuxLayerOutOfRange", f"num_aux_hidden_states {num_aux_cfg} != {len(ids)} layer ids: fc's input width cannot match", where)
    engine = c.facts.name
    if ids is None and num_aux_cfg is not None and num_aux_cfg != 3:
        c.add(
            ERROR, "AuxLayerOutOfRange", f"num_aux_hidden_states is {num_aux_cfg} but {engine} captures 3 layers when no layer ids are given", where
        )
    found = _captured_layers(c, ids, t_layers)
    if found is None:
        c.add(INFO, "AuxLayers", f"{t_arch} hands the layer ids to a model outside SGLang's source; which layers it captures is not checked", where)
        return
    captured, rule, last = found
    shown_ids = ids if ids is not None else captured
    bad = [i for i, cap in zip(shown_ids, captured) if i < 0 or cap < 0 or cap > last]
    if bad:
        reach = f"layer inputs 0..{t_layers - 1}" + (f" and the last layer's output ({t_layers})" if last == t_layers else "")
        c.add(
            ERROR,
            "AuxLayerOutOfRange",
            f"layer ids {bad} are out of range: {t_arch or 'the target'} captures index {rule} and produces only "
            f"{reach} ({t_layers} layers); that hidden state is never produced",
            where,
        )
        return
    if len(set(captured)) != len(captured):
        # Each forward appends once per captured layer: fc then gets fewer inputs than it was built for (the
        # DeepSeek family's preallocated AuxHiddenStatePacker leaves a slot uninitialised).
        c.add(
            ERROR,
            "AuxLayersDuplicated",
            f"layer ids {shown_ids} capture the same layer twice ({captured}): fc gets fewer inputs than it expects",
            where,
        )
        return
    if ids is None:
        c.add(
            INFO,
            "AuxLayersDefaulted",
            f"drafter config names no eagle_aux_hidden_state_layer_ids; {engine} captures the inputs of target "
            f"layers {captured}, which must be the layers it was trained on",
            where,
        )
        return
    described = [f"{cap} (last layer's output)" if cap == t_layers else str(cap) for cap in captured]
    c.add(INFO, "AuxLayers", f"{engine} captures the inputs of target layers [{', '.join(described)}] ({rule})", where)


def _check_trained_layers(c: _Checks, ids: list[int] | None, t_layers: int) -> None:
    """The serving engine must capture, for config.json's aux layer ids, the layers the drafter was trained on
    (training_provenance.json's capture_layer_ids); served from layers one off, acceptance drops (docs/vllm-cpu.md).

    The engine a drafter was exported for only explains a mismatch: a drafter exported for SGLang whose config a user
    then corrected for vLLM serves well under vLLM, and one whose ids are still SGLang's does not."""
    prov = c.d.provenance
    if prov is None:
        return
    shown = f"{c.d.path}/{PROVENANCE_FILENAME}"
    name, flag = c.facts.name, c.facts.cli_name
    exported_for = prov.exported_for()
    other = facts_for(exported_for) if exported_for is not None and exported_for != flag else None
    if prov.capture_layer_ids is None:
        if other is not None:
            # Without the trained layers there is nothing to compare: whether the ids were converted is not known.
            c.add(
                WARNING,
                "DrafterExportedForOtherEngine",
                f"{shown}: the drafter was exported for {other.name} and records no capture_layer_ids, so whether config.json's "
                f"eagle_aux_hidden_state_layer_ids {ids} were converted for {name} ({c.facts.aux_layer_id_convention}) is not "
                f"checked; unless they were, re-export it with `specdec-train export --engine {flag}`",
                "drafter.provenance.engine",
            )
        return
    found = _captured_layers(c, ids, t_layers)
    if found is None:
        return
    captured = found[0]
    trained = list(prov.capture_layer_ids.input_index)
    write = _ids_capturing(c, trained, t_layers)
    if captured == trained:
        if other is not None:
            c.add(
                INFO,
                "DrafterConvertedForEngine",
                f"{shown} says the drafter was exported for {other.name}; config.json's eagle_aux_hidden_state_layer_ids {ids} "
                f"are its trained layers in {name}'s numbering (the inputs of target layers {trained}), as {name} needs",
                "drafter.config.eagle_config.eagle_aux_hidden_state_layer_ids",
            )
        return
    fix = (
        f"write eagle_aux_hidden_state_layer_ids {write} in config.json"
        if write is not None
        else f"no ids make {name} capture exactly those layers of {c.t.architecture or 'this target'}; retrain on layers it can capture"
    )
    if other is not None and ids is not None and ids == prov.capture_layer_ids.for_engine(other.cli_name):
        c.add(
            ERROR,
            "DrafterExportedForOtherEngine",
            f"{shown}: the drafter was exported for {other.name}, and config.json's eagle_aux_hidden_state_layer_ids {ids} are "
            f"still {other.name}'s numbers for the layers it was trained on (the inputs of target layers {trained}); this server "
            f"runs {name}, which reads them as {c.facts.aux_layer_id_convention}, so every aux hidden state would come from "
            f"the wrong layer: {fix}, or re-export it with `specdec-train export --engine {flag}`",
            "drafter.config.eagle_config.eagle_aux_hidden_state_layer_ids",
        )
        return
    config_says = (
        f"config.json's eagle_aux_hidden_state_layer_ids {ids} make {name} capture the inputs of target layers {captured}"
        if ids is not None
        else f"config.json names no eagle_aux_hidden_state_layer_ids, so {name} captures its defaults, the inputs of target layers {captured}"
    )
    records = f"records {write} for {name}" if write is not None else "records other layers"
    c.add(
        ERROR,
        "AuxLayersNotTrained",
        f"{config_says}, not the layers the drafter was trained on: {shown} {records} (the inputs of target layers "
        f"{trained}); {fix}, or re-export it with `specdec-train export --engine {flag}`",
        "drafter.config.eagle_config.eagle_aux_hidden_state_layer_ids",
    )


def _draft_weight_name(name: str) -> str:
    """A draft checkpoint's tensor name in one spelling, without "model." and with layers.0 for midlayer:
    llama_eagle3.load_weights maps midlayer -> layers.0 and adds a missing "model." prefix; kimi_k25_eagle3
    maps layers.0 -> midlayer and keeps lm_head at the top level, so both accept either spelling."""
    if name.startswith("model."):
        name = name[len("model.") :]
    return name.replace("midlayer.", "layers.0.")


# Legacy checkpoint names llama_eagle3.py LlamaForCausalLMEagle3.load_weights rewrites (legacy_name_map).
_LLAMA_LEGACY_NAMES = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2"))


def _eagle3_weight_name(name: str, layout: str) -> str | None:
    """A draft checkpoint's tensor name as the draft class's load_weights resolves it, spelt without the
    "model." prefix (layers.0 for the decoder layer); None when load_weights skips it.

    llama: llama_eagle3.py LlamaForCausalLMEagle3.load_weights applies legacy_name_map anywhere in the name,
    takes d2t/t2d by substring, then tries `name` and `model.{name}` against its parameters (lm_head.weight is
    top-level, so model.lm_head.weight finds nothing).
    mla: kimi_k25_eagle3.py Eagle3DeepseekV2ForCausalLM.load_weights takes d2t/t2d by suffix, maps ^layers.0.
    to midlayer. and prefixes model. (lm_head. stays top-level): a name that already has model. is skipped.
    """
    if layout == "llama":
        for legacy, current in _LLAMA_LEGACY_NAMES:
            name = name.replace(legacy, current)
        if "d2t" in name:
            return "d2t"
        if "t2d" in name:
            return "t2d"
        if name.startswith("model.lm_head."):
            return None
        return name[len("model.") :] if name.startswith("model.") else name
    if name == "d2t" or name.endswith(".d2t"):
        return "d2t"
    if name == "t2d" or name.endswith(".t2d"):
        return "t2d"
    if name.startswith("model."):
        return None
    return "layers.0." + name[len("midlayer.") :] if name.startswith("midlayer.") else name


class _DraftWeights:
    """A draft checkpoint's tensors, named as _eagle3_weight_name resolves them, those the draft class skips,
    and what the checks found missing or misshapen (in the order they looked)."""

    def __init__(self, tensors: dict[str, TensorInfo], layout: str) -> None:
        self.tensors: dict[str, TensorInfo] = {}
        self.skipped: list[str] = []
        for raw, info in tensors.items():
            name = _eagle3_weight_name(raw, layout)
            if name is None:
                self.skipped.append(raw)
            else:
                self.tensors[name] = info
        self.missing: list[str] = []
        self.bad_shapes: list[str] = []
        self.missing_norms: list[str] = []

    def expect(self, name: str, shape: tuple[int, ...] | None, why: str = "") -> None:
        info = self.tensors.get(name)
        if info is None:
            self.missing.append(name + (f" ({why})" if why else ""))
        elif shape is not None and info.shape != shape:
            self.bad_shapes.append(f"{name} is {list(info.shape)}, expected {list(shape)}{f' ({why})' if why else ''}")

    def expect_norm(self, name: str, shape: tuple[int, ...], why: str) -> None:
        """An optional norm the config switches on: RMSNorm starts as ones, so a missing weight loads silently."""
        info = self.tensors.get(name)
        if info is None:
            self.missing_norms.append(f"{name} ({why})")
        elif info.shape != shape:
            self.bad_shapes.append(f"{name} is {list(info.shape)}, expected {list(shape)} ({why})")


def _truthy(value: Any) -> bool:
    """How Python reads a config flag (getattr(config, name, False) in an if)."""
    return bool(value)


def draft_build_flags(cfg: dict[str, Any], layout: str) -> dict[str, bool]:
    """Which optional modules the SGLang draft class builds for this config.json, read where SGLang reads them.

    llama_eagle3.py LlamaModel.__init__: fc bias = getattr(config, "bias"); input_norm when
      eagle_config.norm_before_fc, else config.norm_before_fc; fc_norm when config.fc_norm or config.use_aux_norm;
      norm_output = config.norm_output (no tensor: which hidden state feeds the next draft step).
    llama.py LlamaDecoderLayer.__init__: o_proj bias = config.attention_bias or config.bias (llama_eagle3
      replaces qkv_proj with bias=False; LlamaMLP has no bias).
    kimi_k25_eagle3.py Eagle3MLAModel.__init__: fc bias, fc_norm and norm_output as above; no input_norm.
    """
    raw = cfg.get("eagle_config")
    eagle: dict[str, Any] = raw if isinstance(raw, dict) else {}
    norm_before_fc = _truthy(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False)))
    return {
        "fc_bias": _truthy(cfg.get("bias")),
        "o_proj_bias": layout == "llama" and (_truthy(cfg.get("attention_bias")) or _truthy(cfg.get("bias"))),
        "input_norm": layout == "llama" and norm_before_fc,
        "fc_norm": _truthy(cfg.get("fc_norm")) or _truthy(cfg.get("use_aux_norm")),
        "norm_before_fc_ignored": layout == "mla" and norm_before_fc,
    }


# Fields SGLang reads only at the top level of config.json (getattr(config, ...)); nested in eagle_config they
# are ignored. norm_before_fc is the one it also reads from eagle_config (llama_eagle3.py LlamaModel.__init__).
_TOP_LEVEL_ONLY_FIELDS = ("fc_norm", "use_aux_norm", "norm_output", "bias")


def _check_draft_config_fields(c: _Checks, layout: str) -> None:
    """Config fields that change what the SGLang draft class builds or computes, checked from config.json alone."""
    d = c.d
    cls = "LlamaForCausalLMEagle3" if layout == "llama" else "Eagle3DeepseekV2ForCausalLM"
    eagle = d.eagle_config
    ignored = [k for k in _TOP_LEVEL_ONLY_FIELDS if _truthy(eagle.get(k)) and not _truthy(d.config.get(k))]
    if draft_build_flags(d.config, layout)["norm_before_fc_ignored"]:
        # kimi_k25_eagle3.py Eagle3MLAModel has no input_norm: the trained norm over fc's input is dropped.
        ignored.append("norm_before_fc (Eagle3DeepseekV2ForCausalLM has no norm before fc)")
    if ignored:
        c.add(
            ERROR,
            "DrafterConfigIgnored",
            f"SGLang {SGLANG_VERSION}'s {cls} ignores {', '.join(ignored)} in eagle_config (it reads these at the top "
            "level of config.json): the draft would run without the behaviour it was trained with; move them to the top level",
            "drafter.config.eagle_config",
        )
    moe = _moe_fields(d.config)
    if "use_moe" in moe:
        # llama_eagle3.py LlamaDecoderLayer / kimi_k25_eagle3.py Eagle3MLADecoderLayer build a dense MLP.
        c.add(
            ERROR,
            "DrafterMoEUnsupported",
            f"config.json says use_moe: the drafter's decoder layer is a mixture of experts, but SGLang {SGLANG_VERSION}'s "
            f"{cls} always builds a dense MLP: the experts are skipped and the dense MLP is served uninitialised",
            "drafter.config.use_moe",
        )
    elif moe and d.tensors is None:
        c.add(
            WARNING,
            "DrafterMoEUnsupported",
            f"config.json has mixture-of-experts fields ({', '.join(moe)}) and the weights were not inspected: SGLang's "
            f"{cls} builds a dense MLP, so an MoE checkpoint would serve uninitialised MLP weights",
            f"drafter.config.{moe[0]}",
        )


# Tensors of a mixture-of-experts MLP (Qwen3-MoE, gpt-oss, Mixtral, DeepSeek spellings). Both SGLang draft
# classes build a dense MLP (llama_eagle3.py LlamaDecoderLayer: LlamaMLP; kimi_k25_eagle3.py
# Eagle3MLADecoderLayer: DeepseekV2MLP), so these are skipped and the dense MLP stays uninitialised.
_MOE_TENSOR = re.compile(r"^layers\.\d+\.(mlp\.(experts|gate|router|shared_experts?)\b|block_sparse_moe\.|feed_forward\.experts)")
# Config fields that describe an MoE layer (Qwen3-MoE: num_experts; gpt-oss/Mixtral: num_local_experts;
# DeepSeek: n_routed_experts), and the explicit switch some trainers write.
_MOE_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def _moe_fields(cfg: dict[str, Any]) -> list[str]:
    found = [k for k in _MOE_COUNT_FIELDS if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) and cfg[k] > 0]
    return (["use_moe"] if _truthy(cfg.get("use_moe")) else []) + found


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
    w = _DraftWeights(d.tensors, layout)
    flags = draft_build_flags(d.config, layout)
    tie = bool(d.config.get("tie_word_embeddings", False))
    lm_head_from_target = not tie and draft_vocab is None
    head_rows = draft_vocab if draft_vocab is not None else d_vocab

    if use_aux:
        w.expect("fc.weight", (d_hidden, fed_width * num_aux), f"hidden x {num_aux} x target hidden")
        if flags["fc_bias"]:
            w.expect("fc.bias", (d_hidden,), "config bias: true builds fc with a bias")
        if flags["input_norm"]:
            w.expect_norm("input_norm.weight", (fed_width * num_aux,), "norm_before_fc")
        if flags["fc_norm"]:
            for i in range(num_aux):
                w.expect_norm(f"fc_norm.{i}.weight", (fed_width,), "fc_norm")
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
        _expect_llama_layer(w, d, d_hidden, flags)
    else:
        _expect_mla_layer(w, d, d_hidden)

    moe_tensors = sorted(n for n in w.tensors if _MOE_TENSOR.match(n))
    if moe_tensors:
        c.add(
            ERROR,
            "DrafterMoEUnsupported",
            f"the drafter's decoder layer is a mixture of experts ({', '.join(moe_tensors[:3])}{' ...' if len(moe_tensors) > 3 else ''}) "
            f"but SGLang {SGLANG_VERSION}'s {d.architecture} always builds a dense MLP: the expert tensors are skipped "
            "and the dense MLP it serves is never loaded (uninitialised weights)",
            "drafter.weights",
        )
        # The dense MLP tensors are missing because the layer is MoE: one finding says so.
        w.missing = [m for m in w.missing if ".mlp." not in m]
    if w.missing:
        c.add(
            ERROR,
            "MissingDrafterWeights",
            f"drafter checkpoint lacks {', '.join(w.missing[:6])}{' ...' if len(w.missing) > 6 else ''}; SGLang skips "
            "missing names silently, so it would load and then accept nothing",
            "drafter.weights",
        )
    if w.missing_norms:
        c.add(
            WARNING,
            "DrafterNormMissing",
            f"config.json switches on {', '.join(w.missing_norms[:4])} but the checkpoint has no weight for it: SGLang's "
            "RMSNorm then keeps its initial ones instead of the trained scale, which quietly costs acceptance",
            "drafter.weights",
        )
    _check_token_maps(w, draft_vocab, t_vocab)
    _check_vllm_token_map(c, w, draft_vocab, t_vocab)
    if w.bad_shapes:
        c.add(ERROR, "DrafterWeightShapeMismatch", "; ".join(w.bad_shapes[:4]) + (" ..." if len(w.bad_shapes) > 4 else ""), "drafter.weights")
    _check_unbuilt_weights(c, w, layout, flags, moe_tensors)


def _expect_llama_layer(w: _DraftWeights, d: ModelMeta, d_hidden: int, flags: dict[str, bool]) -> None:
    """llama_eagle3's decoder layer: attention over [embedding, fc output] (2 x hidden wide), then the MLP."""
    heads = d.top_int("num_attention_heads", minimum=1)
    kv_heads = d.top_int("num_key_value_heads", minimum=1) or heads
    # llama.py LlamaAttention: getattr(config, "head_dim", hidden_size // num_attention_heads); the config
    # class may set head_dim itself (Qwen3Config: 128).
    head_dim = d.top_int("head_dim", minimum=1) or draft_config_default(d.config, "head_dim") or (d_hidden // heads if heads else None)
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
    w.expect("layers.0.self_attn.o_proj.weight", (d_hidden, q_rows) if q_rows else None)
    if flags["o_proj_bias"]:
        w.expect("layers.0.self_attn.o_proj.bias", (d_hidden,), "attention_bias/bias: true builds o_proj with a bias")
    inter, field_name = _draft_mlp_width(d)
    w.expect("layers.0.mlp.gate_proj.weight", (inter, d_hidden), f"{field_name} x hidden")
    w.expect("layers.0.mlp.up_proj.weight", (inter, d_hidden), f"{field_name} x hidden")
    w.expect("layers.0.mlp.down_proj.weight", (d_hidden, inter), f"hidden x {field_name}")


def _draft_mlp_width(d: ModelMeta) -> tuple[int, str]:
    """The MLP width llama_eagle3.py LlamaDecoderLayer builds: config.intermediate_size_mlp for model_type
    llama4_text, else config.intermediate_size; a field absent from config.json takes its transformers class
    default (LlamaConfig: 11008, Llama4TextConfig: 16384 for intermediate_size_mlp)."""
    key = "intermediate_size_mlp" if d.config.get("model_type") == "llama4_text" else "intermediate_size"
    value = d.top_int(key, minimum=1)
    if value is not None:
        return value, key
    default = draft_config_default(d.config, key)
    return (default if default is not None else 11008), f"{key} (default)"


def _expect_mla_layer(w: _DraftWeights, d: ModelMeta, d_hidden: int) -> None:
    """kimi_k25_eagle3's MLA decoder layer: its input projections read [embedding, fc output], 2 x hidden,
    then DeepseekV2MLP(intermediate_size)."""
    for proj in ("q_a_proj", "kv_a_proj_with_mqa"):
        name = f"layers.0.self_attn.{proj}.weight"
        info = w.tensors.get(name)
        if info is None:
            w.missing.append(name)
        elif len(info.shape) != 2 or info.shape[1] != 2 * d_hidden:
            w.bad_shapes.append(f"{name} is {list(info.shape)}, expected input width {2 * d_hidden} (2 x hidden)")
    for name in ("layers.0.self_attn.kv_b_proj.weight", "layers.0.self_attn.o_proj.weight"):
        w.expect(name, None)
    inter = d.top_int("intermediate_size", minimum=1) or draft_config_default(d.config, "intermediate_size")
    w.expect("layers.0.mlp.gate_proj.weight", (inter, d_hidden) if inter else None, "intermediate_size x hidden")
    w.expect("layers.0.mlp.up_proj.weight", (inter, d_hidden) if inter else None, "intermediate_size x hidden")
    w.expect("layers.0.mlp.down_proj.weight", (d_hidden, inter) if inter else None, "hidden x intermediate_size")


def _check_vllm_token_map(c: _Checks, w: _DraftWeights, draft_vocab: int | None, t_vocab: int) -> None:
    """vLLM 0.32's Eagle3LlamaForCausalLM builds draft_id_to_target_id only when draft_vocab_size differs from the
    target's vocabulary, and its loader renames d2t to it: with the full vocabulary the server dies at weight loading
    ("There is no module or parameter named 'draft_id_to_target_id'", docs/vllm-cpu.md). SGLang loads it."""
    if c.facts.full_vocab_token_maps or "d2t" not in w.tensors or (draft_vocab if draft_vocab is not None else t_vocab) != t_vocab:
        return
    c.add(
        ERROR,
        "TokenMapWithFullVocabulary",
        f"model.safetensors has d2t but draft_vocab_size is the target's whole vocabulary ({t_vocab}): vLLM then has no "
        "draft_id_to_target_id parameter and refuses the tensor at weight loading; re-export with `specdec-train export "
        "--engine vllm` (which drops d2t and t2d then), or drop d2t from the checkpoint",
        "drafter.weights.d2t",
    )


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


# Parameter names each draft class builds regardless of config (beyond the optional ones draft_build_flags
# switches): llama_eagle3.py LlamaModel / LlamaDecoderLayer (any number of layers), kimi_k25_eagle3.py
# Eagle3MLAModel (one midlayer with DeepseekV2AttentionMLA's projections and norms).
_BUILT_LLAMA = re.compile(
    r"^(fc\.weight|lm_head\.weight|embed_tokens\.weight|norm\.weight|d2t|t2d|"
    r"layers\.\d+\.(input_layernorm|hidden_norm|post_attention_layernorm)\.weight|"
    r"layers\.\d+\.self_attn\.[qkvo]_proj\.weight|layers\.\d+\.mlp\.(gate|up|down)_proj\.weight|"
    r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq)$"
)
_BUILT_MLA = re.compile(
    r"^(fc\.weight|lm_head\.weight|embed_tokens\.weight|norm\.weight|d2t|t2d|"
    r"layers\.0\.(input_layernorm|hidden_norm|post_attention_layernorm)\.weight|"
    r"layers\.0\.self_attn\.(q_a_proj|q_a_layernorm|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_a_layernorm|kv_b_proj|o_proj)\.weight|"
    r"layers\.0\.mlp\.(gate|up|down)_proj\.weight)$"
)
# Trained tensors whose module exists only when a config field asks for it, and that field.
_OPTIONAL_TENSORS = (
    (re.compile(r"^fc\.bias$"), "fc_bias", "bias: true"),
    (re.compile(r"^input_norm\.weight$"), "input_norm", "norm_before_fc: true (in eagle_config or at the top level)"),
    (re.compile(r"^fc_norm\.\d+\.weight$"), "fc_norm", "fc_norm: true (top level)"),
    (re.compile(r"^layers\.\d+\.self_attn\.o_proj\.bias$"), "o_proj_bias", "attention_bias: true"),
)


def _check_unbuilt_weights(c: _Checks, w: _DraftWeights, layout: str, flags: dict[str, bool], moe_tensors: list[str]) -> None:
    """Tensors the draft class has no parameter for: SGLang skips them (llama_eagle3 silently, kimi_k25_eagle3
    with a log line). A trained module the config does not switch on is dropped at serving time."""
    built = _BUILT_LLAMA if layout == "llama" else _BUILT_MLA
    cls = "LlamaForCausalLMEagle3" if layout == "llama" else "Eagle3DeepseekV2ForCausalLM"
    dropped: list[str] = []
    unused: list[str] = list(w.skipped)
    for name in sorted(w.tensors):
        if built.match(name) or name in moe_tensors:
            continue
        for pattern, flag, switch in _OPTIONAL_TENSORS:
            if pattern.match(name):
                if flags.get(flag, False):
                    pass  # built: loaded
                elif layout == "mla" and flag in ("input_norm", "o_proj_bias"):
                    dropped.append(f"{name} ({cls} has no such parameter)")
                else:
                    dropped.append(f"{name} (needs {switch})")
                break
        else:
            if re.match(r"^layers\.\d+\.(self_attn\.[qkv]_proj|mlp\.(gate|up|down)_proj)\.bias$", name):
                dropped.append(f"{name} ({cls} builds this projection without a bias)")
            else:
                unused.append(name)
    if dropped:
        c.add(
            ERROR,
            "DrafterConfigTensorMismatch",
            f"trained modules SGLang {SGLANG_VERSION} would not build: {', '.join(dropped[:4])}{' ...' if len(dropped) > 4 else ''}; "
            "their weights are skipped and the draft serves a different function than it was trained as (set the "
            "config field, or re-export the checkpoint)",
            "drafter.config",
        )
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
    source = normalize_quantization(prov.target_quantization) or normalize_quantization(prov.hidden_state_source)
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
            f"({prov.hidden_state_source or prov.target_quantization}) but this server runs {serving_q}: "
            f"acceptance can collapse; retrain on hidden states captured from the {serving_q} server",
            "drafter.provenance.target_quantization",
        )
    samples = prov.num_samples
    if samples is not None and samples < MIN_TRAINING_SAMPLES:
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
            f"--context-length {context_length} exceeds the target's {t_ctx}; {c.facts.name} {c.facts.version} refuses to "
            f"start unless {c.facts.longer_context_env}=1",
            "target.contextLength",
        )
    if _same_dir(c.t, c.d):
        return
    d_ctx = derived_context_length(c.d.text, draft_config_default(c.d.text, "max_position_embeddings"))
    if served is not None and d_ctx is not None and served > d_ctx:
        if not any(k in c.d.text for k in CONTEXT_LENGTH_KEYS):
            # model_config.py _derive_context_length gives the draft the target's length and compares it with
            # get_context_length(draft config), which reads the config class default when the file has none.
            source = f"no max_position_embeddings in config.json: transformers' {c.d.text.get('model_type')} default"
        else:
            source = "max_position_embeddings"
        engine = f"{c.facts.name} {c.facts.version}"
        starts = (
            f"{engine} refuses to start unless {c.facts.longer_context_env}=1"
            if c.facts.refuses_shorter_draft_context
            else f"{engine} caps the draft's max_model_len at {d_ctx}"
        )
        c.add(
            WARNING,
            "ContextLengthExceedsDrafter",
            f"the server runs with context {served} but the drafter was built for {d_ctx} ({source}): {starts}, and "
            "acceptance degrades on long prompts",
            "drafter.config.max_position_embeddings",
        )


def _check_target_weights(c: _Checks) -> None:
    """A target directory without weights (a config-only download, the wrong directory) cannot serve: SGLang would
    fail only after the pod has scheduled, pulled its image and taken its GPUs."""
    if c.t.weight_format != "none":
        return
    c.add(
        ERROR,
        "TargetWeightsMissing",
        f"target {c.t.path} has a config.json but no weights (no *.safetensors, model.safetensors.index.json or "
        "pytorch_model*.bin): finish the download, or point target.path at the directory that holds them",
        "target.path",
    )
