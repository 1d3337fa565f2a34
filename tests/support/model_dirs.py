"""Realistic small model directories for validator tests and the benchmark.

Configs carry the fields of the public checkpoints (Llama-3.1-8B-Instruct, Qwen3-8B, DeepSeek-V3,
Kimi-K2-Instruct, the Kimi-K2.5 vision-language wrapper with its INT4 compressed-tensors
quantization_config) and of public EAGLE-3 drafters in SGLang format. Safetensors files get real
headers declaring the real shapes; their data area is a sparse hole (os.truncate), so a "2 GB"
drafter costs a few KiB of disk and nothing is ever read past the header.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

DTYPE_BITS = {"BF16": 16, "F16": 16, "F32": 32, "I64": 64, "I32": 32, "BOOL": 8, "U8": 8, "F8_E4M3": 8}

# -- targets ---------------------------------------------------------------------------------------

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

LLAMA_31_TOKENIZER: dict[str, Any] = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
    "clean_up_tokenization_spaces": True,
    "model_max_length": 131072,
    "tokenizer_class": "PreTrainedTokenizerFast",
    "added_tokens_decoder": {
        "128000": {"content": "<|begin_of_text|>", "special": True},
        "128001": {"content": "<|end_of_text|>", "special": True},
        "128006": {"content": "<|start_header_id|>", "special": True},
        "128007": {"content": "<|end_header_id|>", "special": True},
        "128009": {"content": "<|eot_id|>", "special": True},
    },
    "chat_template": "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
}

QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}

QWEN3_TOKENIZER: dict[str, Any] = {
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "model_max_length": 131072,
    "tokenizer_class": "Qwen2Tokenizer",
    "added_tokens_decoder": {
        "151643": {"content": "<|endoftext|>", "special": True},
        "151644": {"content": "<|im_start|>", "special": True},
        "151645": {"content": "<|im_end|>", "special": True},
    },
    "chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}",
}

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config", "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}

KIMI_K2 = dict(
    copy.deepcopy(DEEPSEEK_V3),
    model_type="kimi_k2",
    auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config", "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    bos_token_id=163584,
    eos_token_id=163585,
    first_k_dense_replace=1,
    max_position_embeddings=131072,
    n_group=1,
    n_routed_experts=384,
    num_attention_heads=64,
    num_key_value_heads=64,
    num_nextn_predict_layers=0,
    rope_scaling={
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    rope_theta=50000.0,
    routed_scaling_factor=2.827,
    topk_group=1,
    vocab_size=163840,
)

KIMI_TOKENIZER: dict[str, Any] = {
    "bos_token": "[BOS]",
    "eos_token": "[EOS]",
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "model_max_length": 1000000000000000019884624838656,
    "tokenizer_class": "TikTokenTokenizer",
    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    "added_tokens_decoder": {
        "163584": {"content": "[BOS]", "special": True},
        "163585": {"content": "[EOS]", "special": True},
        "163586": {"content": "<|im_end|>", "special": True},
        "163601": {"content": "<|im_middle|>", "special": True},
        "163838": {"content": "[PAD]", "special": True},
    },
    "chat_template": "{%- for message in messages -%}{%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{%- else -%}"
    "<|im_system|>system<|im_middle|>{%- endif -%}{{ message['content'] }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
}

# compressed-tensors INT4 weight-only (W4A16, group 32), as in the Kimi-K2-Thinking / K2.5 INT4 releases.
COMPRESSED_TENSORS_INT4: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "group_size": 32,
                "strategy": "group",
                "dynamic": False,
                "actorder": None,
                "observer": "minmax",
            },
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
}


def kimi_k25(*, quantization_in_text_config: bool = False) -> dict[str, Any]:
    """The Kimi-K2.5 wrapper: a vision tower plus a Kimi-K2 language model under text_config, INT4."""
    text = dict(copy.deepcopy(KIMI_K2), max_position_embeddings=262144)
    text.pop("quantization_config")
    text.pop("auto_map")
    cfg: dict[str, Any] = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config", "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "model_type": "kimi_k25",
        "media_placeholder_token_id": 163605,
        "pad_token_id": 163839,
        "text_config": text,
        "vision_config": {
            "model_type": "moonvit",
            "hidden_size": 1152,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "patch_size": 14,
            "merge_kernel_size": [2, 2],
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if quantization_in_text_config:
        text["quantization_config"] = copy.deepcopy(COMPRESSED_TENSORS_INT4)
    else:
        cfg["quantization_config"] = copy.deepcopy(COMPRESSED_TENSORS_INT4)
    return cfg


def with_quantization(config: dict[str, Any], quantization_config: dict[str, Any] | None) -> dict[str, Any]:
    cfg = copy.deepcopy(config)
    cfg.pop("quantization_config", None)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return cfg


# -- drafters (SGLang format) ------------------------------------------------------------------------


def eagle3_config(
    *,
    hidden: int,
    vocab: int,
    draft_vocab: int | None = 32000,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int | None = None,
    intermediate: int = 14336,
    max_position: int = 131072,
    aux_layer_ids: list[int] | None = None,
    target_hidden: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An EAGLE-3 draft config.json in SGLang format (LlamaForCausalLMEagle3)."""
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_position,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if target_hidden is not None:
        cfg["target_hidden_size"] = target_hidden
    if aux_layer_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layer_ids, "use_aux_hidden_state": True}
    cfg.update(extra)
    return cfg


def eagle3_tensors(
    cfg: dict[str, Any], *, target_hidden: int | None = None, num_aux: int = 3, prefix: str = "midlayer"
) -> dict[str, tuple[str, list[int]]]:
    """The tensors of an SGLang-format EAGLE-3 checkpoint with the shapes its config implies."""
    h = cfg["hidden_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    th = target_hidden or cfg.get("target_hidden_size") or h
    dv = cfg.get("draft_vocab_size") or cfg["vocab_size"]
    t: dict[str, tuple[str, list[int]]] = {
        "fc.weight": ("BF16", [h, num_aux * th]),
        f"{prefix}.hidden_norm.weight": ("BF16", [h]),
        f"{prefix}.input_layernorm.weight": ("BF16", [h]),
        f"{prefix}.post_attention_layernorm.weight": ("BF16", [h]),
        f"{prefix}.self_attn.q_proj.weight": ("BF16", [heads * hd, 2 * h]),
        f"{prefix}.self_attn.k_proj.weight": ("BF16", [kv * hd, 2 * h]),
        f"{prefix}.self_attn.v_proj.weight": ("BF16", [kv * hd, 2 * h]),
        f"{prefix}.self_attn.o_proj.weight": ("BF16", [h, heads * hd]),
        f"{prefix}.mlp.gate_proj.weight": ("BF16", [inter, h]),
        f"{prefix}.mlp.up_proj.weight": ("BF16", [inter, h]),
        f"{prefix}.mlp.down_proj.weight": ("BF16", [h, inter]),
        "norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [dv, h]),
    }
    if dv != cfg["vocab_size"]:
        t["d2t"] = ("I64", [dv])
        t["t2d"] = ("BOOL", [cfg["vocab_size"]])
    return t


def llama31_8b_drafter_config(**overrides: Any) -> dict[str, Any]:
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: note its 2048-token max_position_embeddings."""
    kw: dict[str, Any] = dict(hidden=4096, vocab=128256, max_position=2048)
    kw.update(overrides)
    return eagle3_config(**kw)


def qwen3_8b_drafter_config(**overrides: Any) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        hidden=4096, vocab=151936, head_dim=128, intermediate=12288, max_position=40960, aux_layer_ids=[1, 17, 32], rope_theta=1000000
    )
    kw.update(overrides)
    return eagle3_config(**kw)


def kimi_drafter_config(**overrides: Any) -> dict[str, Any]:
    """A Kimi-K2/K2.5 EAGLE-3 drafter (AQ-MedAI style): hidden 7168, 32k draft vocabulary, layers [2, 30, 58]."""
    kw: dict[str, Any] = dict(
        hidden=7168,
        vocab=163840,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=18432,
        max_position=262144,
        aux_layer_ids=[2, 30, 58],
        rope_theta=50000.0,
    )
    kw.update(overrides)
    return eagle3_config(**kw)


# -- writers -------------------------------------------------------------------------------------------


def write_json(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int]]], *, metadata: dict[str, str] | None = None, truncate_data_to: int | None = None
) -> int:
    """Write a safetensors file whose header declares `tensors`; the data area is a sparse hole.

    Returns the declared data size. truncate_data_to cuts the data area (a broken download).
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
    data = offset if truncate_data_to is None else truncate_data_to
    os.truncate(path, 8 + len(raw) + data)
    return offset


def make_drafter(
    directory: Path,
    config: dict[str, Any],
    *,
    tensors: dict[str, tuple[str, list[int]]] | None = None,
    drop: tuple[str, ...] = (),
    reshape: dict[str, list[int]] | None = None,
    provenance: dict[str, Any] | None = None,
    tokenizer_config: dict[str, Any] | None = None,
    shards: int = 1,
    target_hidden: int | None = None,
) -> Path:
    """Write an SGLang-format EAGLE-3 drafter directory (config, sparse safetensors, optional extras)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config)
    if tensors is None:
        n_aux = len(config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
        tensors = eagle3_tensors(config, target_hidden=target_hidden, num_aux=n_aux)
    tensors = {n: (dt, list((reshape or {}).get(n, shape))) for n, (dt, shape) in tensors.items() if n not in drop}
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors, metadata={"format": "pt"})
    else:
        names = list(tensors)
        weight_map: dict[str, str] = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::shards]}
            write_safetensors(directory / shard, part, metadata={"format": "pt"})
            weight_map.update({n: shard for n in part})
        write_json(directory / "model.safetensors.index.json", {"metadata": {"total_size": 0}, "weight_map": weight_map})
    if provenance is not None:
        write_json(directory / "training_provenance.json", provenance)
    if tokenizer_config is not None:
        write_json(directory / "tokenizer_config.json", tokenizer_config)
    return directory


def target_weight_names(config: dict[str, Any], *, experts: int | None = None, mtp: bool = True) -> list[str]:
    """Tensor names of a target checkpoint (DeepSeek/Kimi MoE layout when it has routed experts)."""
    text = config.get("text_config", config)
    layers = text["num_hidden_layers"]
    n_exp = text.get("n_routed_experts", 0) if experts is None else experts
    prefix = "language_model.model" if "text_config" in config else "model"
    names = [f"{prefix}.embed_tokens.weight", f"{prefix}.norm.weight", ("language_model." if "text_config" in config else "") + "lm_head.weight"]
    total = layers + ((text.get("num_nextn_predict_layers") or 0) if mtp else 0)
    quant = "weight_packed" if "quantization_config" in config or "quantization_config" in text else "weight"
    for i in range(total):
        base = f"{prefix}.layers.{i}"
        names += [f"{base}.input_layernorm.weight", f"{base}.post_attention_layernorm.weight", f"{base}.self_attn.o_proj.weight"]
        for e in range(n_exp):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names += [f"{base}.mlp.experts.{e}.{proj}.{quant}", f"{base}.mlp.experts.{e}.{proj}.weight_scale"]
    return names


def make_target(
    directory: Path,
    config: dict[str, Any],
    *,
    tokenizer_config: dict[str, Any] | None = None,
    shards: int = 4,
    experts: int | None = 0,
    mtp: bool = True,
) -> Path:
    """Write a target directory: config, tokenizer config, an index over `shards` small shard files."""
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config)
    if tokenizer_config is not None:
        write_json(directory / "tokenizer_config.json", tokenizer_config)
    names = target_weight_names(config, experts=experts, mtp=mtp)
    weight_map = {n: f"model-{(i % shards) + 1:05d}-of-{shards:05d}.safetensors" for i, n in enumerate(names)}
    write_json(directory / "model.safetensors.index.json", {"metadata": {"total_size": 0}, "weight_map": weight_map})
    for i in range(shards):
        write_safetensors(directory / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", {"placeholder": ("BF16", [1])})
    return directory


def provenance(
    *,
    target_model: str = "moonshotai/Kimi-K2.5",
    target_quantization: str = "int4",
    hidden_state_source: str = "sglang-0.5.23 int4 server",
    num_samples: int = 1_400_000,
    epochs: int = 10,
) -> dict[str, Any]:
    return {
        "target_model": target_model,
        "target_quantization": target_quantization,
        "hidden_state_source": hidden_state_source,
        "num_samples": num_samples,
        "epochs": epochs,
        "tokenizer_sha256": "0" * 64,
        "created": "2026-11-30T12:00:00Z",
    }
