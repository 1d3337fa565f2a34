"""What the serving engines are, as data: one EngineFacts per engine (SGLANG, VLLM), and DEFAULT, the one place
that says which engine serves where none is named.

The names (spec.engine's SGLang / vLLM; the flags' sglang / vllm), the release each is read from, how each reads a
drafter's eagle_aux_hidden_state_layer_ids, which drafter formats and draft classes it loads, and its metric names.
Code outside engines/ and this module asks these facts (``facts_for(name).x``) instead of comparing an engine's name
(tests/unit/test_engine_seam.py keeps it so).

Standard library only: the API (api.py), the validator (an init container that must start in milliseconds, without
pydantic) and drafter_training all import it, and engines/ (the renderers, which import api.py) builds on it, so it
can import none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from . import SGLANG_VERSION

# spec.engine: how the API, status and messages name an engine.
EngineName = Literal["SGLang", "vLLM"]
# How the command lines (`specdec validate --engine`, `specdec-train export --engine`, `specdec probe --engine`) and
# training_provenance.json's `engine` name it.
EngineCliName = Literal["sglang", "vllm"]

# config.json formats of a drafter: plain (architectures LlamaForCausalLMEagle3 and the Llama fields) and speculators
# (vLLM's: transformer_layer_config beside the EAGLE-3 fields, validator/speculators.py).
PLAIN, SPECULATORS = "plain", "speculators"
DRAFTER_FORMATS = (PLAIN, SPECULATORS)

# SGLang's metric names (the sglang: gauges and counters of its /metrics).
SGLANG_ACCEPT_LENGTH_METRIC = "sglang:spec_accept_length"
SGLANG_THROUGHPUT_METRIC = "sglang:gen_throughput"
SGLANG_VERIFY_CALLS_METRIC = "sglang:spec_verify_calls_total"
SGLANG_GENERATED_TOKENS_METRIC = "sglang:generation_tokens_total"

# vLLM 0.32's metric names (vllm/v1/spec_decode/metrics.py: counters only).
VLLM_DRAFTS_METRIC = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS_METRIC = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED_TOKENS_METRIC = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POSITION_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_GENERATED_TOKENS_METRIC = "vllm:generation_tokens_total"
VLLM_POSITION_LABEL = "position"


@dataclass(frozen=True)
class EngineFacts:
    """One serving engine's facts, for code that renders nothing for it (engines/ holds what does)."""

    name: EngineName  # spec.engine
    cli_name: EngineCliName  # --engine, training_provenance.json's engine
    version: str  # the release the operator renders for and the validator's rules were read from
    # eagle_aux_hidden_state_layer_ids: id i makes the engine capture the input of target layer i + offset. SGLang's ids
    # are layer outputs (LlamaForCausalLM.set_eagle3_layers_to_capture adds one: it captures the input of layer id + 1),
    # vLLM's layer inputs (LlamaModel.forward adds the hidden state after `id` layers, the input of layer id).
    aux_layer_id_offset: int
    aux_layer_id_convention: str  # the offset in words, for messages
    # SGLang's target classes each implement set_eagle3_layers_to_capture, some with their own rule (validator/tables.py
    # EAGLE3_CAPTURE_RULE); vLLM applies the offset alone on every target.
    capture_rule_per_target_class: bool
    drafter_formats: tuple[str, ...]  # config.json formats the engine loads (PLAIN, SPECULATORS)
    # EAGLE-3 draft classes this engine's registry loads besides the names SGLang's tables list
    # (validator/tables.py EAGLE3_DRAFT_ARCHITECTURES), with the weight layout the validator checks them as (None:
    # not checked).
    own_eagle3_draft_classes: tuple[tuple[str, str | None], ...]
    # Whether it loads the token maps d2t/t2d when the draft vocabulary is the target's whole one (vLLM 0.32 builds
    # draft_id_to_target_id only for a smaller one and refuses d2t then).
    full_vocab_token_maps: bool
    # spec.sglangVersion picks the release whose command line is rendered (SGLang); vLLM is rendered for one release.
    release_per_spec: bool
    # The variable without which the engine refuses to start with a context longer than the target's (SGLang's
    # model_config.py; vLLM's config/model.py).
    longer_context_env: str
    # Whether it also refuses a context longer than the drafter's max_position_embeddings (SGLang, under the same
    # variable); vLLM 0.32 caps the draft's max_model_len instead (SpeculativeConfig._maybe_override_draft_max_model_len).
    refuses_shorter_draft_context: bool
    metric_prefix: str  # every sample name of the engine's own starts with it
    metric_names: frozenset[str]  # the /metrics sample names the operator reads

    def captured_inputs(self, ids: Sequence[int]) -> list[int]:
        """The target layers whose inputs the engine captures for these config ids (the offset alone; SGLang's
        per-class exceptions are validator/checks.eagle3_captured_layers)."""
        return [i + self.aux_layer_id_offset for i in ids]

    def ids_for_inputs(self, inputs: Sequence[int]) -> list[int]:
        """The config ids that make the engine capture the inputs of these target layers."""
        return [i - self.aux_layer_id_offset for i in inputs]

    def eagle3_draft_layout(self, architecture: str) -> tuple[bool, str | None]:
        """(whether this engine loads the draft class as its own, the weight layout checked for it)."""
        for name, layout in self.own_eagle3_draft_classes:
            if name == architecture:
                return True, layout
        return False, None


SGLANG = EngineFacts(
    name="SGLang",
    cli_name="sglang",
    version=SGLANG_VERSION,
    aux_layer_id_offset=1,
    aux_layer_id_convention="the output of layer id, the input of layer id + 1",
    capture_rule_per_target_class=True,
    drafter_formats=(PLAIN,),
    own_eagle3_draft_classes=(),
    full_vocab_token_maps=True,
    release_per_spec=True,
    longer_context_env="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
    refuses_shorter_draft_context=True,
    metric_prefix="sglang:",
    metric_names=frozenset({SGLANG_ACCEPT_LENGTH_METRIC, SGLANG_THROUGHPUT_METRIC, SGLANG_VERIFY_CALLS_METRIC, SGLANG_GENERATED_TOKENS_METRIC}),
)

VLLM = EngineFacts(
    name="vLLM",
    cli_name="vllm",
    version="0.32.0",
    aux_layer_id_offset=0,
    aux_layer_id_convention="the hidden state after `id` layers, the input of layer id",
    capture_rule_per_target_class=False,
    drafter_formats=(PLAIN, SPECULATORS),
    # Its own name for SGLang's LlamaForCausalLMEagle3 layout (its registry maps both), and its Qwen3 draft class.
    own_eagle3_draft_classes=(("Eagle3LlamaForCausalLM", "llama"), ("Eagle3Qwen3ForCausalLM", None)),
    full_vocab_token_maps=False,
    release_per_spec=False,
    longer_context_env="VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    refuses_shorter_draft_context=False,
    metric_prefix="vllm:",
    metric_names=frozenset(
        {VLLM_DRAFTS_METRIC, VLLM_DRAFT_TOKENS_METRIC, VLLM_ACCEPTED_TOKENS_METRIC, VLLM_ACCEPTED_PER_POSITION_METRIC, VLLM_GENERATED_TOKENS_METRIC}
    ),
)

ENGINES: tuple[EngineFacts, ...] = (SGLANG, VLLM)
ENGINE_NAMES: tuple[EngineName, ...] = get_args(EngineName)
CLI_NAMES: tuple[EngineCliName, ...] = get_args(EngineCliName)

# The engine wherever none is named: spec.engine's default, the --engine flags' default, the probe's and the
# monitor's without a spec. SGLang, the only engine before spec.engine existed. Exports that predate
# training_provenance.json's engine field were SGLang exports for the same reason (validator/provenance.py).
DEFAULT = SGLANG


def facts_for(name: str) -> EngineFacts:
    """The facts of the engine `name` names (spec.engine's SGLang / vLLM, or a flag's sglang / vllm, in any case);
    ValueError naming the choices otherwise (callers turn it into their one-line error)."""
    for facts in ENGINES:
        if name.lower() == facts.cli_name:
            return facts
    raise ValueError(f"{name!r} is not one of {', '.join(ENGINE_NAMES)}")
