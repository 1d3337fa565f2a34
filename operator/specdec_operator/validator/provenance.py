"""training_provenance.json: what a drafter says about how it was trained and for which engine it was exported.

One model for both sides of the contract: drafter_training's export builds a DrafterProvenance and writes
`to_json()`; the validator reads the file with `DrafterProvenance.from_json()` and checks it against the
serving target. Every field is optional, so provenance written by hand or by other trainers (SpecForge)
reads too; keys this model does not know are kept in `extra` and written back unchanged.

`engine` says which engine's layer-id convention config.json was exported in. Files exported before the
field existed were all exported for SGLang (the only engine `specdec-train export` wrote then): for those
`exported_for()` answers "sglang" (EXPORTED_BEFORE_ENGINE_FIELD) when `trainer` names this project's pipeline, and
None (unknown) otherwise. A user may have corrected config.json for another engine since, so the validator compares
the ids in config.json with `capture_layer_ids` (the trained layers) rather than trusting `engine`.

Standard library only: the validator runs as an init container and must start in milliseconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..choices import ENGINES
from ..enginefacts import SGLANG, facts_for
from ..errors import InputError

FILENAME = "training_provenance.json"
TRAINER = "specdec-operator drafter_training"
# What `specdec-train export` wrote before the engine field: SGLang's convention (its only engine then).
EXPORTED_BEFORE_ENGINE_FIELD = SGLANG.cli_name


@dataclass(frozen=True)
class CaptureLayerIds:
    """The target layers whose hidden states the drafter was trained on, in both conventions.

    output_index: layer outputs, as SGLang's config reads them (SGLang captures the input of layer id + 1).
    input_index: layer inputs, as vLLM's config reads them (vLLM captures the input of layer id).
    Each engine's convention is its enginefacts.EngineFacts.aux_layer_id_offset.
    """

    output_index: list[int]
    input_index: list[int]

    def for_engine(self, engine: str) -> list[int]:
        """eagle_aux_hidden_state_layer_ids as `engine` (sglang | vllm) reads them, on a target whose class captures
        by the engine's plain rule (validator/checks.py applies SGLang's per-class exceptions)."""
        return facts_for(engine).ids_for_inputs(self.input_index)

    def to_json(self) -> dict[str, list[int]]:
        # The key names predate this class; exported drafters carry them.
        return {"sglang_config_output_index": list(self.output_index), "input_index": list(self.input_index)}

    @classmethod
    def from_output_index(cls, output_index: list[int]) -> CaptureLayerIds:
        return cls(output_index=list(output_index), input_index=[i + 1 for i in output_index])


@dataclass(frozen=True)
class DrafterProvenance:
    target_model: str | None = None
    target_quantization: str | None = None
    hidden_state_source: str | None = None
    num_samples: int | None = None
    epochs: int | float | None = None
    tokenizer_sha256: str | None = None
    created: str | None = None
    engine: str | None = None  # "sglang" | "vllm": whose eagle_aux_hidden_state_layer_ids convention config.json uses
    capture_layer_ids: CaptureLayerIds | None = None
    hidden_state_storage: str | None = None
    ttt_steps: int | None = None
    draft_vocab_size: int | None = None
    simulated_acceptance_length: float | None = None
    trainer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this model does not know, kept as written

    def exported_for(self) -> str | None:
        """The engine config.json was exported for; None when nothing says so."""
        if self.engine is not None:
            return self.engine
        return EXPORTED_BEFORE_ENGINE_FIELD if self.trainer == TRAINER else None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object, in the order fields are declared (None fields written as null, as before)."""
        doc: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name == "engine" and value is None:
                continue
            doc[f.name] = value.to_json() if isinstance(value, CaptureLayerIds) else value
        doc.update(self.extra)
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, doc: Any, shown: str) -> DrafterProvenance:
        """Validate a parsed training_provenance.json; `shown` names the file in the one-line InputError."""
        if not isinstance(doc, dict):
            raise InputError(f"{shown}: must be a JSON object, got {_kind(doc)}")
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {"extra": {k: v for k, v in doc.items() if k not in known}}
        for key in known:
            value = doc.get(key)
            if value is None:
                continue
            check = _CHECKS[key]
            values[key] = check(value, f"{shown}: {key}")
        return cls(**values)


def _kind(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where} must be a string, got {_kind(value)}")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where} must be an integer, got {_kind(value)}")
    if value < 0:
        raise InputError(f"{where} must be >= 0, got {value}")
    return value


def _number(value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where} must be an integer or a number, got {_kind(value)}")
    return value


def _engine(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.lower() not in ENGINES:
        raise InputError(f"{where} must be one of {', '.join(ENGINES)}, got {_kind(value)}")
    return value.lower()


def _layer_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise InputError(f"{where} must be a list of layer numbers, got {_kind(value)}")
    return value


def _capture_layer_ids(value: Any, where: str) -> CaptureLayerIds:
    if not isinstance(value, dict):
        raise InputError(f"{where} must be an object with sglang_config_output_index and input_index, got {_kind(value)}")
    output = value.get("sglang_config_output_index")
    inputs = value.get("input_index")
    if output is None and inputs is None:
        raise InputError(f"{where} must name sglang_config_output_index or input_index")
    out_ids = _layer_list(output, f"{where}.sglang_config_output_index") if output is not None else None
    in_ids = _layer_list(inputs, f"{where}.input_index") if inputs is not None else None
    if out_ids is None:
        assert in_ids is not None
        out_ids = [i - 1 for i in in_ids]
    if in_ids is None:
        in_ids = [i + 1 for i in out_ids]
    if in_ids != [i + 1 for i in out_ids]:
        raise InputError(f"{where}: input_index {in_ids} must be sglang_config_output_index {out_ids} plus one")
    return CaptureLayerIds(output_index=out_ids, input_index=in_ids)


_CHECKS = {
    "target_model": _string,
    "target_quantization": _string,
    "hidden_state_source": _string,
    "num_samples": _count,
    "epochs": _number,
    "tokenizer_sha256": _string,
    "created": _string,
    "engine": _engine,
    "capture_layer_ids": _capture_layer_ids,
    "hidden_state_storage": _string,
    "ttt_steps": _count,
    "draft_vocab_size": _count,
    "simulated_acceptance_length": _number,
    "trainer": _string,
}
