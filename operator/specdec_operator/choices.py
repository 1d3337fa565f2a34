"""Choices of a SpeculativeServer spec that code without pydantic needs as well.

api.py types spec fields with these Literals; the validator (`specdec validate`, an init container that
must start without importing pydantic) accepts the same values as flags.
"""

from __future__ import annotations

from typing import Literal, get_args

from .enginefacts import CLI_NAMES, EngineCliName

# A speculative method (spec.drafter.algorithm, spec.candidates[].algorithm), in SGLang's names; engines/vllm.py maps
# each to vLLM's (STANDALONE is its draft_model, NEXTN its mtp). EAGLE3, EAGLE, STANDALONE and DFLASH load a separate
# draft model (drafter.path); NEXTN drafts with the target's own MTP layers; NGRAM and SUFFIX need no drafter at all
# (they draft from the prompt and the output so far).
Algorithm = Literal["EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "DFLASH", "NGRAM", "SUFFIX"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
# The methods whose drafter is a model directory of its own (drafter.path; the validator checks it against the target).
DRAFT_MODEL_ALGORITHMS: tuple[Algorithm, ...] = ("EAGLE3", "EAGLE", "STANDALONE", "DFLASH")
# The methods that need no trained drafter (no path, nothing for the validator to read).
DRAFTER_FREE_ALGORITHMS: tuple[Algorithm, ...] = ("NGRAM", "SUFFIX")
# The methods that draft a tree (drafter.eagleTopk above 1): SGLang's EAGLE worker, which STANDALONE runs on too.
TREE_ALGORITHMS: tuple[Algorithm, ...] = ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE")

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
