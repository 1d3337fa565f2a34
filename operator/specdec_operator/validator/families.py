"""The checks of the draft-model methods beyond the EAGLE family (checks.py): STANDALONE (vLLM's draft_model) and
DFLASH, from metadata alone. NGRAM and SUFFIX have no drafter to read: admission checks their parameters.

STANDALONE: a small model drafts tokens the target verifies, id for id, so it must share the target's vocabulary and
tokenizer. vLLM 0.32 refuses to start when the vocabulary sizes differ (SpeculativeConfig.
verify_equal_vocab_size_if_draft_model); SGLang would map the draft's ids onto the wrong target tokens and accept
nothing. The tokenizers are compared on tokenizer.json's vocabulary and added tokens (read under a cap).

DFLASH (block diffusion; SGLang 0.5.23 models/dflash.py, speculative/dflash_utils.py and
spec_aux_hidden_state.py; vLLM 0.32 models/qwen3_dflash.py): the draft class must be one the engine registers; the
draft's config must say num_hidden_layers; its projection takes the concatenated hidden states of the target layers
in target_layer_ids (dflash_config.target_layer_ids, else the top-level field), each of which must be a layer of the
target, and of the target's hidden size (SGLang sizes it from the draft's hidden_size, vLLM from target_hidden_size
when given); the mask token (dflash_config.mask_token_id) must be a target token id; layer_types, when given, needs
an entry per draft layer. A draft trained for a target of another depth (num_target_layers) is served with layers
chosen for the runtime target: a warning, as SGLang logs it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from .. import enginefacts
from .modelmeta import MetaReader, MiB, ModelMeta
from .report import ERROR, INFO, WARNING

if TYPE_CHECKING:
    from .checks import _Checks

TOKENIZER_JSON = "tokenizer.json"
MAX_TOKENIZER_JSON_BYTES = 48 * MiB  # Llama-3's is 9 MiB, Qwen3's 11 MiB

# The DFlash draft classes each engine registers: SGLang 0.5.23 models/dflash.py EntryClass; vLLM 0.32
# model_executor/models/registry.py (its speculative decoding models).
DFLASH_DRAFT_ARCHITECTURES: dict[enginefacts.EngineFacts, tuple[str, ...]] = {
    enginefacts.SGLANG: (
        "DFlashDraftModel",
        "DFlashLagunaForCausalLM",
        "MuseGlimmerAssistantModel",
        "DFlash2DraftModel",
        "DFlash2BeamDraftModel",
        "MiniMaxDFlash2DraftModel",
    ),
    enginefacts.VLLM: (
        "DFlashDraftModel",
        "DFlash2DraftModel",
        "MuseGlimmerAssistantModel",
        "DFlashMuseGlimmerAssistantModel",
        "DFlashLagunaForCausalLM",
    ),
}


def check_standalone(c: _Checks, t_vocab: int) -> None:
    """A draft model for STANDALONE / draft_model: the target's vocabulary and tokenizer, and weights to load."""
    d = c.d
    d_vocab = d.text_int("vocab_size", required=True, minimum=1)
    if d_vocab != t_vocab:
        c.add(
            ERROR,
            "VocabSizeMismatch",
            f"STANDALONE drafter vocab_size {d_vocab} != target vocab_size {t_vocab}: a draft model must share the target's "
            f"tokenizer and vocabulary ({c.facts.name} verifies its token ids as the target's); use a smaller model of the "
            "target's family",
            f"drafter.config.{d.field_path('vocab_size')}",
        )
    if d.weight_format == "none":
        c.add(ERROR, "MissingDrafterWeights", f"{d.path} has no weights (no *.safetensors, index or pytorch_model*.bin)", "drafter.weights")
    _compare_tokenizers(c)


def _tokenizer_vocab(meta: ModelMeta, reader: MetaReader) -> tuple[str, dict[str, Any], list[tuple[Any, Any]]] | None:
    """(digest of the file, model.vocab, added tokens as (id, content)) of a model directory's tokenizer.json, or None."""
    path = os.path.join(meta.fs_path, TOKENIZER_JSON)
    if not meta.fs_path or not os.path.isfile(path):
        return None
    raw = reader.read_bytes(path, MAX_TOKENIZER_JSON_BYTES, TOKENIZER_JSON)
    digest = hashlib.sha256(raw).hexdigest()
    try:
        doc = json.loads(raw)
    except ValueError:
        return digest, {}, []
    model = doc.get("model") if isinstance(doc, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    added = doc.get("added_tokens") if isinstance(doc, dict) else None
    pairs = sorted((a.get("id"), a.get("content")) for a in added or [] if isinstance(a, dict))
    return digest, vocab if isinstance(vocab, dict) else {}, pairs


def _compare_tokenizers(c: _Checks, reader: MetaReader | None = None) -> None:
    reader = reader or MetaReader()
    target, drafter = _tokenizer_vocab(c.t, reader), _tokenizer_vocab(c.d, reader)
    if target is None or drafter is None:
        missing = "target" if target is None else "drafter"
        c.add(
            INFO,
            "TokenizerNotCompared",
            f"the {missing} has no {TOKENIZER_JSON}: the tokenizers were compared on vocab_size and tokenizer_config.json only",
            f"{missing}.tokenizer",
        )
        return
    if target[0] == drafter[0]:
        return  # the same file
    t_vocab, d_vocab = target[1], drafter[1]
    differing = sorted(tok for tok in set(t_vocab) | set(d_vocab) if t_vocab.get(tok) != d_vocab.get(tok))
    if differing or target[2] != drafter[2]:
        first = (
            f"token {differing[0]!r} is id {d_vocab.get(differing[0])} in the drafter, {t_vocab.get(differing[0])} in the target"
            if differing
            else "their added tokens differ"
        )
        c.add(
            ERROR,
            "TokenizerMismatch",
            f"the drafter's {TOKENIZER_JSON} is not the target's ({len(differing)} tokens differ; {first}): a draft model must "
            "tokenize as the target does, or its drafts are other tokens",
            "drafter.tokenizer",
        )


def _dflash_value(cfg: dict[str, Any], key: str) -> Any:
    """A DFlash field as SGLang reads it: dflash_config first, then the top level (dflash_utils.parse_dflash_draft_config)."""
    nested = cfg.get("dflash_config")
    if isinstance(nested, dict) and nested.get(key) is not None:
        return nested[key]
    return cfg.get(key)


def check_dflash(c: _Checks, t_hidden: int, t_vocab: int, t_layers: int) -> None:
    """A DFlash drafter against its target (see the module's docstring for what each check mirrors)."""
    d = c.d
    arch = d.architecture
    known = DFLASH_DRAFT_ARCHITECTURES[c.facts]
    if arch not in known:
        c.add(
            ERROR,
            "DrafterArchitectureUnsupported",
            f"{c.facts.name} {c.facts.version} loads DFlash drafters of the classes {', '.join(known)}, not {arch or 'a config without architectures'}",
            "drafter.config.architectures",
        )
    d_layers = d.text_int("num_hidden_layers", minimum=1)
    if d_layers is None:
        c.add(
            ERROR,
            "DFlashConfigIncomplete",
            "the DFlash drafter's config has no num_hidden_layers; the engine refuses it",
            "drafter.config.num_hidden_layers",
        )
    _check_dflash_hidden(c, t_hidden)
    _check_dflash_layers(c, t_layers, d_layers)
    mask = _dflash_value(d.config, "mask_token_id")
    if isinstance(mask, int) and not isinstance(mask, bool) and not 0 <= mask < t_vocab:
        c.add(
            ERROR,
            "DFlashMaskTokenOutOfRange",
            f"dflash_config.mask_token_id {mask} is not a target token id (vocab_size {t_vocab}): the engine refuses to start",
            "drafter.config.dflash_config.mask_token_id",
        )
    block = _dflash_value(d.config, "block_size")
    if isinstance(block, int) and not isinstance(block, bool):
        c.add(
            INFO,
            "DFlashBlockSize",
            f"trained with block_size {block}: serve it with numSteps {block - 1} (a block of numSteps + 1)",
            "drafter.config.block_size",
        )
    if d.weight_format == "none":
        c.add(ERROR, "MissingDrafterWeights", f"{d.path} has no weights (no *.safetensors, index or pytorch_model*.bin)", "drafter.weights")


def _check_dflash_hidden(c: _Checks, t_hidden: int) -> None:
    d = c.d
    d_hidden = d.text_int("hidden_size", required=True, minimum=1)
    declared = d.text_int("target_hidden_size", minimum=1)
    if (declared or d_hidden) != t_hidden:
        c.add(
            ERROR,
            "HiddenSizeMismatch",
            f"DFlash drafter {'target_hidden_size' if declared else 'hidden_size'} {declared or d_hidden} != target hidden_size "
            f"{t_hidden}: its projection takes the target's hidden states",
            f"drafter.config.{'target_hidden_size' if declared else 'hidden_size'}",
        )
    elif declared is not None and declared != d_hidden:
        c.add(
            WARNING,
            "DFlashTargetHiddenSize",
            f"target_hidden_size {declared} differs from hidden_size {d_hidden}: vLLM sizes the projection from target_hidden_size, "
            "SGLang 0.5.23 from hidden_size (it would not load on SGLang)",
            "drafter.config.target_hidden_size",
        )


def _check_dflash_layers(c: _Checks, t_layers: int, d_layers: int | None) -> None:
    d = c.d
    ids = _dflash_value(d.config, "target_layer_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            c.add(
                ERROR,
                "DFlashConfigIncomplete",
                f"dflash_config.target_layer_ids must be a non-empty list of layer numbers, got {ids!r}"[:300],
                "drafter.config.dflash_config.target_layer_ids",
            )
        elif any(not 0 <= i < t_layers for i in ids):
            bad = next(i for i in ids if not 0 <= i < t_layers)
            c.add(
                ERROR,
                "DFlashLayerOutOfRange",
                f"dflash_config.target_layer_ids names layer {bad}, but the target has {t_layers} layers (0-{t_layers - 1}): "
                "a drafter trained for another target",
                "drafter.config.dflash_config.target_layer_ids",
            )
    trained = _dflash_value(d.config, "num_target_layers")
    if isinstance(trained, int) and not isinstance(trained, bool) and trained != t_layers:
        c.add(
            WARNING,
            "DFlashTargetDepthDiffers",
            f"the drafter was trained on a target of {trained} layers, this one has {t_layers}: the engine captures layers chosen "
            "for this target, not those it was trained on",
            "drafter.config.num_target_layers",
        )
    types = d.text.get("layer_types", d.config.get("layer_types"))
    if d_layers is not None and isinstance(types, list) and len(types) < d_layers:
        c.add(
            ERROR,
            "DFlashConfigIncomplete",
            f"layer_types has {len(types)} entries for {d_layers} draft layers: SGLang needs one per layer",
            "drafter.config.layer_types",
        )
