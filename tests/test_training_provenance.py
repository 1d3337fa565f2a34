"""The training provenance speaks the validator's language about quantization."""

from __future__ import annotations

import pytest

from drafter_training.target import quantization_of
from specdec_operator.validator import normalize_quantization

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
