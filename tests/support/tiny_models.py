"""Tiny random-initialised Hugging Face models (Llama, Qwen3, DeepSeek-V3-like) and a real tokenizer, saved
to disk inside the tests: the drafter pipeline runs on them end to end without network or model hub."""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i * i)\n",
    "Speculative decoding drafts tokens and the target verifies them.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "user assistant system hello world how are you today",
] * 4


def make_tokenizer(directory: Path, vocab_size: int = 320):
    """A byte-level BPE tokenizer trained here, with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return fast


def make_model(directory: Path, family: str = "llama", layers: int = 4, hidden: int = 64, seed: int = 0, intermediate: int | None = None) -> Path:
    """Save a tiny random model of `family` (llama | qwen3 | deepseek_v3) with the tiny tokenizer; `intermediate`: the
    MLP width of llama and qwen3 (default 2 * hidden)."""
    from transformers import AutoModelForCausalLM

    tokenizer = make_tokenizer(directory)
    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    if family == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(intermediate_size=intermediate or 2 * hidden, **common)
    elif family == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(intermediate_size=intermediate or 2 * hidden, head_dim=hidden // 4, **common)
    elif family == "deepseek_v3":
        from transformers import DeepseekV3Config

        common["num_key_value_heads"] = 4
        cfg = DeepseekV3Config(
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden // 2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            **common,
        )
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Sharper than the default init (std 0.02) so greedy continuations are not all one token.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(str(directory))
    return directory
