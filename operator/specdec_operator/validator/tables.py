"""What SGLang supports, as tables the checks look up: which classes can be an EAGLE-3 target, which draft
classes exist and what weights they load, which targets have NextN/MTP drafts, and how context lengths
are derived.

Every table mirrors the source of the SGLang release SGLANG_VERSION names (see docs/validator.md), so
that the validator's init container needs no SGLang; tests/unit/test_validate_sglang.py re-derives each table
from the installed wheel and fails when they disagree, e.g. after an SGLang upgrade.
"""

from __future__ import annotations

# Target classes whose implementation has set_eagle3_layers_to_capture (directly or
# inherited): EAGLE-3 cannot run on any other target, start-up raises ValueError. Derived from the
# package's source (tests/unit/test_validate_sglang.py re-derives it from the installed wheel).
EAGLE3_TARGET_ARCHITECTURES = frozenset(
    {
        "ApertusForCausalLM",
        "BailingMoEForCausalLM",
        "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM",
        "Cosmos3ForConditionalGeneration",
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma4AssistantForCausalLM",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedAssistantForCausalLM",
        "Gemma4UnifiedForConditionalGeneration",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm5NextForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GptOssForCausalLM",
        "IQuestCoderForCausalLM",
        "InternLM3ForCausalLM",
        "InternS1ProForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "Llama4ForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlamaForCausalLM",
        "LongcatFlashForCausalLM",
        "MellumForCausalLM",
        "MindSporeForCausalLM",
        "MiniMaxM2ForCausalLM",
        "MiniMaxM3SparseForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration",
        "Ministral3ForCausalLM",
        "MistralForCausalLM",
        "MistralLarge3ForCausalLM",
        "Phi3ForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "SarvamMoEForCausalLM",
        "TeleFLMForCausalLM",
    }
)
# How each EAGLE-3 target class turns the drafter's eagle_aux_hidden_state_layer_ids into the layer indices
# it captures (its set_eagle3_layers_to_capture, resolved through inheritance and delegation to a language
# model). SGLang captures the INPUT of layer i (the output of layer i - 1), hence the +1 most classes add.
#   plus_one         [i + 1 for i in ids]                      (llama.py LlamaForCausalLM, qwen3.py, ...)
#   first_id_one     +1 only when ids[0] == 1, else as given   (deepseek_v2.py DeepseekV2ForCausalLM,
#                                                               glm4_moe_lite.py Glm4MoeLiteForCausalLM)
#   max_is_boundary  as given when max(ids) == num_layers, else +1  (gpt_oss.py GptOssForCausalLM)
#   delegated        handed to a model outside SGLang's source (mindspore.py): not checkable here
CAPTURE_PLUS_ONE = "plus_one"
CAPTURE_FIRST_ID_ONE = "first_id_one"
CAPTURE_MAX_IS_BOUNDARY = "max_is_boundary"
CAPTURE_DELEGATED = "delegated"
_FIRST_ID_ONE = {
    # deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture and its subclasses
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "MistralLarge3ForCausalLM",
    # kimi_k25.py KimiK25ForConditionalGeneration delegates to its language_model, a DeepseekV3ForCausalLM
    "KimiK25ForConditionalGeneration",
    # glm4_moe_lite.py Glm4MoeLiteForCausalLM.set_eagle3_layers_to_capture (a copy of DeepSeek's rule)
    "Glm4MoeLiteForCausalLM",
}
EAGLE3_CAPTURE_RULE: dict[str, str] = {
    arch: (
        CAPTURE_FIRST_ID_ONE
        if arch in _FIRST_ID_ONE
        else CAPTURE_MAX_IS_BOUNDARY
        if arch == "GptOssForCausalLM"
        else CAPTURE_DELEGATED
        if arch == "MindSporeForCausalLM"
        else CAPTURE_PLUS_ONE
    )
    for arch in EAGLE3_TARGET_ARCHITECTURES
}
# Kept for the classes that add 1 only when the first id is 1 (the DeepSeek-V2 family and Kimi-K2.5).
DEEPSEEK_CAPTURE_CONVENTION = frozenset(a for a, rule in EAGLE3_CAPTURE_RULE.items() if rule == CAPTURE_FIRST_ID_ONE)
# Target classes whose model forward also captures index num_layers, the last layer's output (after the
# decoder loop): gpt_oss.py GptOssModel.forward (`self.end_layer in self.layers_to_capture`, through the final
# norm), gemma3_causal.py Gemma3TextModel.forward and gemma4_causal.py Gemma4TextModel.forward (`num_layers in
# self.layers_to_capture`), minimax_m3.py MiniMaxM3Model.forward (`self.end_layer in self.layers_to_capture`).
# Every other class only captures inputs of layers 0..num_layers-1: a larger index is never produced (the
# list-style forwards leave fc short of an input; the qwen2_moe/qwen3_moe/qwen3_next/qwen3_5 models index
# self.layers[i] and fail at start-up).
EAGLE3_CAPTURES_LAST_LAYER_OUTPUT = frozenset(
    {
        "GptOssForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4AssistantForCausalLM",
        "Gemma4UnifiedAssistantForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "MiniMaxM3SparseForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration",
    }
)
# Without layer ids every class captures [2, L // 2, L - 3] as given, except minimax_m3_vl.py
# MiniMaxM3SparseForConditionalGeneration.set_eagle3_layers_to_capture, which adds 1 to its defaults too.
EAGLE3_DEFAULT_IDS_PLUS_ONE = frozenset({"MiniMaxM3SparseForConditionalGeneration"})

# EAGLE-3 draft classes SGLang registers, and the weight layout each loads.
EAGLE3_DRAFT_ARCHITECTURES = {"LlamaForCausalLMEagle3": "llama", "Eagle3DeepseekV2ForCausalLM": "mla"}
# EAGLE (v1/v2) draft classes: fc = Linear(2 x hidden, hidden) over [embedding, last hidden state].
EAGLE_DRAFT_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLMEagle",
        "MistralForCausalLMEagle",
        "Qwen2ForCausalLMEagle",
        "MistralLarge3ForCausalLMEagle",
    }
)
# Targets whose checkpoint SGLang rewrites into a NextN/MTP draft (model_config._config_draft_model).
NEXTN_TARGET_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV4ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm5NextForConditionalGeneration",
        "GlmOcrForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "MiMoForCausalLM",
        "Step3p5ForCausalLM",
        "InklingForConditionalGeneration",
        "GigaChat35ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "BailingMoeV2ForCausalLM",
        "BailingMoeForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM",
        "Ernie4_5_MoeForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen4ExpForConditionalGeneration",
        "Qwen3MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "HYV3ForCausalLM",
        "HYV4ForCausalLM",
    }
)

# The config fields utils.get_context_length reads, in its order (the first present wins).
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")

# Defaults of the transformers config class AutoConfig builds for a draft's model_type, for the fields the
# draft classes read when config.json leaves them out (read from transformers 5.25.0; SGLang 0.5.23 pins
# 5.19.0). SGLang's own aliases count: utils/hf_transformers/common.py registers kimi_k2 as a DeepseekV3Config.
# tests/unit/test_validate_published.py re-reads every value from the installed transformers.
#   max_position_embeddings: utils/hf_transformers/common.py get_context_length reads the config attribute;
#     a draft shorter than the target's context makes model_config.py _derive_context_length refuse to start.
#   intermediate_size / intermediate_size_mlp: llama_eagle3.py LlamaDecoderLayer builds LlamaMLP with
#     intermediate_size_mlp when model_type is llama4_text, else intermediate_size.
#   head_dim: llama.py LlamaAttention uses getattr(config, "head_dim", hidden_size // num_attention_heads);
#     None: the class computes that quotient itself or has no head_dim attribute.
DRAFT_CONFIG_DEFAULTS: dict[str, dict[str, int | None]] = {
    "llama": {"max_position_embeddings": 2048, "intermediate_size": 11008, "head_dim": None},
    "mistral": {"max_position_embeddings": 131072, "intermediate_size": 14336, "head_dim": None},
    "qwen2": {"max_position_embeddings": 32768, "intermediate_size": 22016, "head_dim": None},
    "qwen3": {"max_position_embeddings": 32768, "intermediate_size": 22016, "head_dim": 128},
    "qwen3_moe": {"max_position_embeddings": 32768, "intermediate_size": 6144, "head_dim": None},
    "phi3": {"max_position_embeddings": 4096, "intermediate_size": 8192, "head_dim": None},
    "deepseek_v2": {"max_position_embeddings": 2048, "intermediate_size": 11008, "head_dim": 64},
    "deepseek_v3": {"max_position_embeddings": 4096, "intermediate_size": 18432, "head_dim": 64},
    "kimi_k2": {"max_position_embeddings": 4096, "intermediate_size": 18432, "head_dim": 64},
    "gpt_oss": {"max_position_embeddings": 131072, "intermediate_size": 2880, "head_dim": 64},
    "llama4_text": {"max_position_embeddings": 131072, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "head_dim": 128},
}
# The transformers config class behind each model_type above (kimi_k2: SGLang's alias of DeepseekV3Config).
DRAFT_CONFIG_CLASS_MODEL_TYPE = {"kimi_k2": "deepseek_v3"}
