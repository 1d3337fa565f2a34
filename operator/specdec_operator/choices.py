"""Choices of a SpeculativeServer spec that code without pydantic needs as well.

api.py types spec fields with these Literals; the validator (`specdec validate`, an init container that
must start without importing pydantic) accepts the same values as flags.
"""

from __future__ import annotations

from typing import Literal, get_args

from .enginefacts import CLI_NAMES, EngineCliName

Algorithm = Literal["EAGLE3", "EAGLE", "NEXTN"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)

Quantization = Literal["auto", "none", "bf16", "fp8", "int8", "int4", "fp4"]
QUANTIZATIONS: tuple[Quantization, ...] = get_args(Quantization)

# The SGLang releases whose command line the operator can render (sglang.RELEASES holds what each accepts; a test
# keeps the two equal). spec.sglangVersion is one of these, and so must be the release an image tag names.
SGLangVersion = Literal["0.5.9", "0.5.22", "0.5.23"]
SGLANG_VERSIONS: tuple[SGLangVersion, ...] = get_args(SGLangVersion)

# The engine that serves a drafter, as the command lines name it (enginefacts.py holds each engine's facts). SGLang and
# vLLM read a drafter's eagle_aux_hidden_state_layer_ids one layer apart, so `specdec-train export --engine` and
# `specdec validate --engine` take the same values.
Engine = EngineCliName
ENGINES: tuple[Engine, ...] = CLI_NAMES
