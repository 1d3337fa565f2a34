"""Evaluate the CRD's `x-kubernetes-validations` CEL rules outside the API server.

The rules are written once, in api.py, and enforced by the API server. The CLI (`specdec sglang-args -f`)
and the tests evaluate the very same strings with cel-python, so a spec that a file-based tool accepts is one
the API server accepts too.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import celpy


@lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _typed(schema: dict[str, Any], value: Any) -> Any:
    """Kubernetes types CEL values by the schema: a `number` field is a double even when written as 2."""
    kind = schema.get("type")
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: _typed(props.get(k) or extra or {}, v) for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [_typed(schema.get("items", {}), v) for v in value]
    return value


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str:
    """The rule's messageExpression evaluated, as the API server does, else its static message."""
    if "messageExpression" in rule:
        try:
            return str(_program(rule["messageExpression"]).evaluate(activation))
        except celpy.CELEvalError:  # the API server, too, falls back to the static message
            pass
    return str(rule.get("message", rule["rule"]))


def violations(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Yield (field path, message) for every CEL rule of `schema` that `value` breaks, depth first."""
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            activation = {"self": celpy.json_to_cel(_typed(schema, value))}
        except ValueError:  # celpy refuses integers outside int64 (CEL's int); the API server cannot hold them either
            yield path + rule.get("fieldPath", ""), f"{rule.get('message', rule['rule'])} (a number is outside the 64-bit integer range)"
            continue
        try:
            ok = bool(_program(rule["rule"]).evaluate(activation))
        except celpy.CELEvalError as exc:  # a rule that cannot evaluate is a failed rule, as in the API server
            ok, rule = False, {**rule, "message": f"{rule.get('message', rule['rule'])} ({exc.args[0] if exc.args else exc})"}
        if not ok:
            yield path + rule.get("fieldPath", ""), _message(rule, activation)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            sub_schema = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub_schema:
                yield from violations(sub_schema, sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, sub in enumerate(value):
            yield from violations(schema["items"], sub, f"{path}[{i}]")
