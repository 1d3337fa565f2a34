"""What SGLang supports, as tables the checks look up: which classes can be an EAGLE-3 target, which draft
classes exist and what weights they load, which targets have NextN/MTP drafts, and how context lengths
are derived.

Every table mirrors the source of the SGLang release SGLANG_VERSION names (see docs/validator.md), so
that the validator's init container needs no SGLang; tests/test_validate_sglang.py re-derives each table
from the installed wheel and fails when they disagree, e.g. after an SGLang upgrade.
"""

from __future__ import annotations

# Target classes whose implementation has set_eagle3_layers_to_capture (directly or
# inherited): EAGLE-3 cannot run on any other target, start-up raises ValueError. Derived from the
# package's source (tests/test_validate_sglang.py re-derives it from the installed wheel).
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
# Of those, the DeepSeek-V2 family (and Kimi-K2.5, whose language model is DeepseekV3ForCausalLM)
# add 1 to the configured layer ids only when the first id is 1; every other class always adds 1.
# SGLang captures the INPUT of layer (id [+1]); an index >= num_hidden_layers is never captured.
DEEPSEEK_CAPTURE_CONVENTION = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)
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
