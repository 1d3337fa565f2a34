"""The training pipeline reads a target as the validator does: the same sizes, the same words for its quantization."""

from __future__ import annotations

from pathlib import Path

import pytest

from drafter_training.target import quantization_of, read_config
from specdec_operator.validator import normalize_quantization
from specdec_operator.validator.modelmeta import read_model_dir
from tests.support import model_dirs as md

COMPRESSED_TENSORS_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 32}}},
}


@pytest.mark.parametrize(
    "config,expected",
    [
        ({}, "bf16"),
        ({"quantization_config": COMPRESSED_TENSORS_INT4}, "int4"),
        ({"text_config": {"quantization_config": COMPRESSED_TENSORS_INT4}}, "int4"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}, "int4"),
        ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, "fp8"),
    ],
)
def test_recorded_quantization_is_what_the_validator_reads(config, expected):
    assert normalize_quantization(quantization_of(config)) == expected


@pytest.mark.parametrize("wrapper", ["text_config", "language_config", "llm_config"])
def test_training_reads_the_sizes_the_validator_reads(tmp_path: Path, wrapper: str) -> None:
    # A vision-language wrapper whose top level carries its vision tower's sizes, not the language model's.
    language = {"hidden_size": 4096, "vocab_size": 151936, "num_hidden_layers": 36, "num_attention_heads": 32}
    md.write_json(
        tmp_path / "config.json",
        {"architectures": ["Qwen3VLForConditionalGeneration"], "hidden_size": 1152, "vocab_size": 0, "num_hidden_layers": 27, wrapper: language},
    )
    trained = read_config(tmp_path)
    validated = read_model_dir(str(tmp_path), role="target", weights="none")
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        assert trained[key] == validated.text_int(key) == language[key], key
