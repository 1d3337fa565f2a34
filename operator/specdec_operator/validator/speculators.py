"""The speculators format: an EAGLE-3 drafter's config.json as vLLM reads it and SGLang does not.

A speculators config keeps the draft layer's own Llama (or Qwen3) config under `transformer_layer_config` and the
EAGLE-3 fields beside it; vLLM turns it into the config its draft class is built from. What this module does
mirrors vLLM 0.32's `transformers_utils/configs/speculators/`:

* `base.py` SpeculatorsConfig.validate_speculators_config: `speculators_config.proposal_methods[0]
  .speculative_tokens`, `speculators_config.verifier.name_or_path` and `speculators_model_type` must be present,
  `transformer_layer_config` must be an object (else vLLM refuses the drafter at start);
* `algos.py` update_eagle3: the flattened config is `transformer_layer_config` plus draft_vocab_size,
  target_hidden_size, norm_before_residual (default **true**), norm_before_fc, fc_norm, norm_output (default
  false), eagle_aux_hidden_state_layer_ids, and architectures from the layer's model_type (llama ->
  Eagle3LlamaForCausalLM, qwen3 -> Eagle3Qwen3ForCausalLM; any other model_type is refused).

The default of norm_before_residual is where the two formats part: vLLM's draft layer (models/llama_eagle3.py)
reads `getattr(config, "norm_before_residual", False)`, so a plain config that leaves it out normalises after the
residual, and a speculators config that leaves it out normalises before. A drafter trained one way and served the
other loads without a word and accepts less.
"""

from __future__ import annotations

from typing import Any

from .report import ERROR, WARNING

SPECULATOR_ARCHITECTURE = "Eagle3Speculator"
# update_eagle3's eagle3_arch_map: the draft class vLLM builds for the layer's model_type.
EAGLE3_ARCH_BY_MODEL_TYPE = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
# update_eagle3's defaults for the fields it copies from the top level.
FLAG_DEFAULTS = {"norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False}

Note = tuple[str, str, str, str]  # severity, code, message, field


def is_speculators(config: dict[str, Any]) -> bool:
    """A speculators-format config (vLLM's test: a `speculators_config` object; the other two mark it too)."""
    return "speculators_config" in config or "speculators_model_type" in config or config.get("architectures") == [SPECULATOR_ARCHITECTURE]


def _required(config: dict[str, Any]) -> str | None:
    """The first field validate_speculators_config needs and does not find (None: all there)."""
    spec = config.get("speculators_config")
    if not isinstance(spec, dict):
        return "speculators_config"
    methods = spec.get("proposal_methods")
    if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
        return "speculators_config.proposal_methods"
    if "speculative_tokens" not in methods[0]:
        return "speculators_config.proposal_methods[0].speculative_tokens"
    verifier = spec.get("verifier")
    if not isinstance(verifier, dict) or "name_or_path" not in verifier:
        return "speculators_config.verifier.name_or_path"
    if "speculators_model_type" not in config:
        return "speculators_model_type"
    if not isinstance(config.get("transformer_layer_config"), dict):
        return "transformer_layer_config"
    return None


def flatten(config: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Note]]:
    """The config vLLM builds its draft class from, and what to say about it; None where vLLM refuses the drafter."""
    missing = _required(config)
    if missing is not None:
        return None, [
            (
                ERROR,
                "DrafterConfigIncomplete",
                f"speculators config without {missing}: vLLM refuses it at start (SpeculatorsConfig.validate_speculators_config); "
                "export it again (specdec-train export --engine vllm --format speculators)",
                f"drafter.config.{missing}",
            )
        ]
    kind = config["speculators_model_type"]
    if kind != "eagle3":
        return None, [
            (
                ERROR,
                "DrafterArchitectureUnsupported",
                f"speculators_model_type {kind!r}: this validator checks EAGLE-3 drafters (speculators_model_type eagle3)",
                "drafter.config.speculators_model_type",
            )
        ]
    layer = dict(config["transformer_layer_config"])
    model_type = layer.get("model_type", "llama")
    if model_type not in EAGLE3_ARCH_BY_MODEL_TYPE:
        return None, [
            (
                ERROR,
                "DrafterArchitectureUnsupported",
                f"transformer_layer_config.model_type {model_type!r}: vLLM builds EAGLE-3 speculators for "
                f"{' and '.join(EAGLE3_ARCH_BY_MODEL_TYPE)} layers only (update_eagle3)",
                "drafter.config.transformer_layer_config.model_type",
            )
        ]
    notes: list[Note] = []
    layer["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        layer["target_hidden_size"] = config["target_hidden_size"]
    for flag, default in FLAG_DEFAULTS.items():
        layer[flag] = config.get(flag, default)
    if "norm_before_residual" not in config:
        notes.append(
            (
                WARNING,
                "NormBeforeResidualDefault",
                "speculators config without norm_before_residual: vLLM takes true for this format (the hidden state is "
                "normalised before the residual), where a plain EAGLE-3 config defaults to false; a drafter trained the "
                "other way loads and accepts less. Write the value it was trained with",
                "drafter.config.norm_before_residual",
            )
        )
    layer["architectures"] = [EAGLE3_ARCH_BY_MODEL_TYPE[model_type]]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        layer["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return layer, notes
