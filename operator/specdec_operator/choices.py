"""Choices of a SpeculativeServer spec that code without pydantic needs as well.

api.py types spec fields with these Literals; the validator (`specdec validate`, an init container that
must start without importing pydantic) accepts the same values as flags.
"""

from __future__ import annotations

from typing import Literal, get_args

Algorithm = Literal["EAGLE3", "EAGLE", "NEXTN"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)

Quantization = Literal["auto", "none", "bf16", "fp8", "int8", "int4", "fp4"]
QUANTIZATIONS: tuple[Quantization, ...] = get_args(Quantization)
