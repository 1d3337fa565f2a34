"""The base of the API sections that live beside api.py (api_retraining.py, api_retraining_job.py): api._SpecModel's
rules in a module of their own, so that those sections need not import api.py, which imports them; api._SpecModel
drops nulls with the same function."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """Strict types, unknown fields refused, null is unset (the API server drops null from typed fields before
    defaulting), camelCase aliases or the Python names."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        return unset_nulls(cls, data)


def unset_nulls(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the nulls of ``model``'s known fields: the API server drops null from typed fields before
    defaulting. An unknown field is left for strict validation to refuse, even when null."""
    if not isinstance(data, dict):
        return data
    known = {f.alias or n for n, f in model.model_fields.items()} | set(model.model_fields)
    return {k: v for k, v in data.items() if v is not None or k not in known}
