"""Issue 35 (1): each candidate method's drafter validated for its family from metadata, as `specdec validate` (the
speculative pod's init container) runs it: STANDALONE needs the target's vocabulary and tokenizer, DFLASH its config
against the target (draft class, hidden size, target layers, mask token, layer types), NGRAM and SUFFIX have nothing to
read (no validator container is rendered for them)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import manifests as m
from specdec_operator import validator
from specdec_operator.api import spec_for_candidate
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from specdec_operator.validator import ValidationReport
from specdec_operator.validator.modelmeta import read_model_dir
from tests.support import model_dirs as md

# A tokenizer.json as Hugging Face writes it: what the validator compares (model.vocab and added_tokens).
VOCAB = {f"tok{i}": i for i in range(64)}
ADDED = [{"id": 128000, "content": "<|begin_of_text|>", "special": True}, {"id": 128009, "content": "<|eot_id|>", "special": True}]


def tokenizer_json(vocab: dict[str, int] = VOCAB, added: list[dict[str, Any]] = ADDED) -> dict[str, Any]:
    return {"version": "1.0", "added_tokens": added, "model": {"type": "BPE", "vocab": vocab, "merges": []}}


def small_llama(**overrides: Any) -> dict[str, Any]:
    """A Llama-3.2-1B-like config: the target's family and vocabulary, 16 layers of 2048."""
    config = copy.deepcopy(md.LLAMA_31_8B)
    config.update(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, tie_word_embeddings=True)
    config.update(overrides)
    return config


def dflash_config(**dflash: Any) -> dict[str, Any]:
    """A DFlash drafter for Llama-3.1-8B (32 layers of 4096) as SGLang's dflash_utils reads it."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 5,
        "num_attention_heads": 32,
        "vocab_size": 128256,
        "block_size": 16,
        "dflash_config": {"target_layer_ids": [1, 8, 15, 22, 29], "mask_token_id": 128002},
    }
    config["dflash_config"].update(dflash)
    return config


def model_dir(path: Path, config: dict[str, Any], tokenizer: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    md.write_json(path / "config.json", config)
    md.write_safetensors(path / "model.safetensors", {"lm_head.weight": ("BF16", [8, 8])})
    if tokenizer is not None:
        md.write_json(path / "tokenizer.json", tokenizer)
    return path


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = md.make_target(tmp_path_factory.mktemp("t") / "Llama-3.1-8B-Instruct", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    md.write_json(root / "tokenizer.json", tokenizer_json())
    return root


def check(target: Path, drafter: Path, algorithm: str, engine: str = "sglang") -> ValidationReport:
    argv = ["--target", str(target), "--drafter", str(drafter), "--algorithm", algorithm, "--engine", engine]
    report, _ = validator.run(validator.build_parser().parse_args(argv))
    return report


def codes(report: ValidationReport, severity: str = "error") -> list[str]:
    return [f.code for f in report.findings if f.severity == severity]


def test_a_standalone_draft_model_of_the_targets_family_and_tokenizer_is_compatible(target: Path, tmp_path: Path) -> None:
    drafter = model_dir(tmp_path / "Llama-3.2-1B", small_llama(), tokenizer_json())
    report = check(target, drafter, "STANDALONE")
    assert report.compatible, report.findings
    # A standalone draft model reads no hidden states: no provenance finding, however the target is served.
    assert not [f for f in report.findings if f.code.startswith("Provenance") or f.code == "HiddenStateSourceMismatch"]
    assert check(target, drafter, "STANDALONE", "vllm").compatible


def test_a_standalone_draft_model_of_another_vocabulary_is_refused(target: Path, tmp_path: Path) -> None:
    drafter = model_dir(tmp_path / "qwen-0.5b", small_llama(vocab_size=151936), tokenizer_json())
    report = check(target, drafter, "STANDALONE", "vllm")
    assert not report.compatible and "VocabSizeMismatch" in codes(report)
    message = next(f.message for f in report.findings if f.code == "VocabSizeMismatch")
    assert "151936" in message and "128256" in message and "vLLM" in message


def test_a_standalone_draft_model_that_tokenizes_otherwise_is_refused_naming_a_token(target: Path, tmp_path: Path) -> None:
    other = dict(VOCAB, tok5=6, tok6=5)  # same size, two ids swapped
    drafter = model_dir(tmp_path / "retrained", small_llama(), tokenizer_json(other))
    report = check(target, drafter, "STANDALONE")
    assert codes(report) == ["TokenizerMismatch"]
    assert "2 tokens differ" in report.findings[0].message and "'tok5' is id 6 in the drafter, 5 in the target" in report.findings[0].message
    # Added tokens count too.
    drafter = model_dir(tmp_path / "more-specials", small_llama(), tokenizer_json(added=[*ADDED, {"id": 128010, "content": "<x>"}]))
    assert codes(check(target, drafter, "STANDALONE")) == ["TokenizerMismatch"]


def test_without_tokenizer_json_the_tokenizers_are_compared_on_what_there_is(target: Path, tmp_path: Path) -> None:
    drafter = model_dir(tmp_path / "no-tokenizer", small_llama())
    report = check(target, drafter, "STANDALONE")
    assert report.compatible and "TokenizerNotCompared" in codes(report, "info")


def test_a_dflash_drafter_for_the_target_is_compatible_and_its_block_is_reported(target: Path, tmp_path: Path) -> None:
    drafter = model_dir(tmp_path / "dflash", dflash_config())
    report = check(target, drafter, "DFLASH")
    assert report.compatible, report.findings
    block = next(f for f in report.findings if f.code == "DFlashBlockSize")
    assert "numSteps 15" in block.message
    assert check(target, drafter, "DFLASH", "vllm").compatible


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"dflash_config": {"target_layer_ids": [1, 8, 15, 22, 40], "mask_token_id": 128002}}, "DFlashLayerOutOfRange", "layer 40"),
        ({"hidden_size": 2048}, "HiddenSizeMismatch", "hidden_size 2048 != target hidden_size 4096"),
        ({"dflash_config": {"target_layer_ids": [1, 29], "mask_token_id": 200000}}, "DFlashMaskTokenOutOfRange", "200000"),
        ({"architectures": ["LlamaForCausalLM"]}, "DrafterArchitectureUnsupported", "LlamaForCausalLM"),
        ({"num_hidden_layers": None}, "DFlashConfigIncomplete", "num_hidden_layers"),
        ({"layer_types": ["full_attention"] * 3}, "DFlashConfigIncomplete", "3 entries for 5 draft layers"),
    ],
)
def test_a_dflash_drafter_that_does_not_fit_the_target_is_refused(target: Path, tmp_path: Path, change: dict, code: str, words: str) -> None:
    config = {k: v for k, v in {**dflash_config(), **change}.items() if v is not None}
    report = check(target, model_dir(tmp_path / "dflash", config), "DFLASH")
    assert not report.compatible and code in codes(report)
    assert words in next(f.message for f in report.findings if f.code == code)


def test_dflash_draft_classes_and_target_hidden_size_follow_the_engine(target: Path, tmp_path: Path) -> None:
    beam = model_dir(tmp_path / "beam", {**dflash_config(), "architectures": ["DFlash2BeamDraftModel"]})
    assert check(target, beam, "DFLASH").compatible  # SGLang registers it
    assert "DrafterArchitectureUnsupported" in codes(check(target, beam, "DFLASH", "vllm"))  # vLLM 0.32 does not
    wide = model_dir(tmp_path / "wide", {**dflash_config(), "hidden_size": 2048, "target_hidden_size": 4096})
    report = check(target, wide, "DFLASH", "vllm")
    assert report.compatible and "DFlashTargetHiddenSize" in codes(report, "warning")
    trained = model_dir(tmp_path / "trained-on-other", {**dflash_config(), "num_target_layers": 36})
    assert "DFlashTargetDepthDiffers" in codes(check(target, trained, "DFLASH"), "warning")


def test_methods_without_a_drafter_have_nothing_to_validate(target: Path) -> None:
    with pytest.raises(InputError, match="--algorithm: invalid choice: 'NGRAM' .choose from 'EAGLE3', 'EAGLE', 'NEXTN', 'STANDALONE', 'DFLASH'"):
        validator.build_parser().parse_args(["--target", str(target), "--drafter", str(target), "--algorithm", "NGRAM"])
    with pytest.raises(InputError, match="the methods with a drafter to check"):
        validator.validate(read_model_dir(str(target), role="target"), read_model_dir(str(target), role="drafter"), algorithm="SUFFIX")


SPEC = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "candidates": [
        {"name": "small", "algorithm": "STANDALONE", "path": "llama-1b"},
        {"name": "dflash", "algorithm": "DFLASH", "path": "dflash", "numSteps": 15},
        {"name": "ngram", "algorithm": "NGRAM"},
    ],
}


def test_each_candidate_gets_the_validator_of_its_family_and_drafter_free_ones_none() -> None:
    spec = parse_spec(SPEC, check_rules=True)
    settings = m.ManifestSettings()
    for name, algorithm, path in (("small", "STANDALONE", "/models/llama-1b"), ("dflash", "DFLASH", "/models/dflash")):
        command = m.validator_container(spec_for_candidate(spec, name), settings)["command"]
        assert command[command.index("--algorithm") + 1] == algorithm and command[command.index("--drafter") + 1] == path
        # The container's own parser takes what the operator renders.
        args = validator.build_parser().parse_args(command[2 : command.index("--json")])
        assert args.algorithm == algorithm
    assert m.validator_container(spec_for_candidate(spec, "ngram"), settings) is None
