"""SpeculativeServer resources as the CLI and the operator read them.

``parse_spec`` defaults and types a spec with the API models (one line naming the field when it is wrong) and,
when asked, also evaluates the CRD's CEL rules, which is what the API server does on admission: the CLI checks a
file exactly as ``kubectl apply`` would be checked. ``speculative_revision`` fingerprints what defines the
speculative server; ``dump`` is the camelCase JSON form the API server stores.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from . import API_GROUP, API_VERSION, KIND
from .api import SpeculativeServerSpec
from .enginefacts import DEFAULT, SGLANG
from .errors import InputError


def dump(model: BaseModel) -> dict[str, Any]:
    """camelCase JSON-ready dict without unset optionals: what goes into the API."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_spec(spec: dict[str, Any], *, source: str = "spec", check_rules: bool = False) -> SpeculativeServerSpec:
    """Parse and default a spec, turning pydantic's errors into one line naming the field.

    check_rules also evaluates the CRD's CEL rules (what the API server does on admission); the operator
    skips it for objects the API server already admitted.
    """
    try:
        parsed = SpeculativeServerSpec.model_validate(spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{source}: {'spec.' + loc if loc else 'spec'}: {err['msg']}{_yaml_boolean_hint(err)}{more}") from None
    if check_rules:
        # Checked on the spec as written: parsing fills sglangVersion in, which the CEL rule would then always see.
        from .api import unnamed_release

        unnamed = unnamed_release(spec)
        if unnamed is not None:
            raise InputError(f"{source}: spec.image: {unnamed}")
        from .celrules import violations
        from .crd import structural_schema

        broken = list(violations(structural_schema(SpeculativeServerSpec), dump(parsed), "spec"))
        if broken:
            where, message = broken[0]
            more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
            raise InputError(f"{source}: {where}: {message}{more}")
    return parsed


def _yaml_boolean_hint(err: Any) -> str:
    """Why a string field got a boolean: YAML 1.1 (PyYAML, kubectl) reads an unquoted y/n/yes/no/on/off/true/false as one,
    so a candidate named `no` arrives as false."""
    if err["type"] == "string_type" and isinstance(err.get("input"), bool):
        return f" (got {str(err['input']).lower()}: YAML reads an unquoted y, n, yes, no, on, off, true or false as a boolean; quote the value)"
    return ""


def load_custom_resource(path: str) -> tuple[dict[str, Any], SpeculativeServerSpec]:
    """Read a SpeculativeServer YAML file (the first document of that kind) and parse its spec."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d]
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            if doc.get("apiVersion") != f"{API_GROUP}/{API_VERSION}":
                raise InputError(f"{path}: apiVersion must be {API_GROUP}/{API_VERSION}, got {doc.get('apiVersion')!r}")
            if not isinstance(doc.get("spec"), dict):
                raise InputError(f"{path}: a {KIND} needs a spec mapping")
            return doc, parse_spec(doc["spec"], source=path, check_rules=True)
    raise InputError(f"{path}: no {KIND} document found (kind: {KIND}, apiVersion: {API_GROUP}/{API_VERSION})")


# The spec fields whose change means a different speculative server: a new revision is validated and probed
# again; edits elsewhere (labels, monitor settings, rollout thresholds of an already decided revision) are not.
_REVISION_FIELDS = ("image", "sglangVersion", "model", "target", "drafter", "resources", "sglang")


def speculative_revision(spec: SpeculativeServerSpec) -> str:
    """Short stable hash of what defines the speculative server (and its base for comparison)."""
    data = dump(spec)
    relevant = {k: data.get(k) for k in _REVISION_FIELDS}
    # resources.nodes came later: at its default a spec keeps the revision it had before (no new probe on upgrade).
    resources: dict[str, Any] = data.get("resources") or {}
    if resources.get("nodes") == 1:
        relevant["resources"] = {k: v for k, v in resources.items() if k != "nodes"}
    # spec.engine came later too: specs of the engine every spec had before it (SGLang) keep their revision; a vLLM
    # server is a different server.
    if data.get("engine", DEFAULT.name) != SGLANG.name:
        relevant["engine"] = data["engine"]
        relevant["vllm"] = data.get("vllm")
    blob = json.dumps(relevant, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
