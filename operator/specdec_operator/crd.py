"""Generate the SpeculativeServer CustomResourceDefinition from the pydantic API models.

pydantic emits JSON Schema with $refs, anyOf-null for optionals and JSON-Schema-2020 exclusive bounds;
Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no $ref, no anyOf for nullability,
boolean exclusiveMinimum/Maximum. `structural_schema` converts one into the other; nothing in crds/ is
written by hand (`specdec crd > crds/specdec.io_speculativeservers.yaml`, cli/crd.py; checked by a drift test).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from . import API_GROUP, API_VERSION, KIND, PLURAL
from .api import NAME_RULES, SpeculativeServerSpec, SpeculativeServerStatus

SHORT_NAMES = ["specserver", "sps"]
CRD_NAME = f"{PLURAL}.{API_GROUP}"

PRINTER_COLUMNS = [
    {"name": "Active", "type": "string", "jsonPath": ".status.activeVariant", "description": "Server the stable Service selects."},
    {"name": "Speedup", "type": "number", "jsonPath": ".status.speedup", "description": "Measured speedup of the speculative server."},
    {"name": "Accept", "type": "number", "jsonPath": ".status.acceptLength", "description": "Acceptance length of the drafter."},
    {"name": "Fleet", "type": "string", "jsonPath": ".status.rolloutProgress", "description": "Speculative servers out of spec.replicas."},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready servers.", "priority": 1},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "description": "Why the phase is what it is.", "priority": 1},
    {
        "name": "Break-even",
        "type": "string",
        "jsonPath": ".status.probe.breakEven.summary",
        "description": "Concurrency where the measured speedup crosses 1.0, with its interval.",
        "priority": 1,
    },
    {
        "name": "Load-aware",
        "type": "string",
        "jsonPath": ".status.probe.loadAware.summary",
        "description": "Load-aware speculation: the batch sizes the speculative server drafts at, or why it does not run.",
    },
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "description": "What is happening now.", "priority": 1},
    {
        "name": "Address",
        "type": "string",
        "jsonPath": ".status.serviceAddress",
        "description": "The stable Service's in-cluster address (<name>.<namespace>.svc:<port>).",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# kubectl scale, HPA and KEDA act on spec.replicas; the operator writes status.replicas and status.selector.
SCALE_SUBRESOURCE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}

# Keys of JSON Schema that a structural OpenAPI v3 schema keeps as they are.
_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "format",
    "nullable",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string",
    "x-kubernetes-map-type",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = copy.deepcopy(defs[name])
        merged.update({k: v for k, v in node.items() if k != "$ref"})
        return _resolve(merged, defs)
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any], default_objects: bool) -> dict[str, Any]:
    node = _resolve(node, defs)
    # Optional[X] -> X: absence (not null) is how Kubernetes says "unset".
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node}")
        # The field's own keys (its description, json_schema_extra: e.g. the items of a list of free objects) win
        # over those of the type they annotate.
        inner = {k: v for k, v in node.items() if k != "anyOf"}
        for key, value in _resolve(options[0], defs).items():
            inner.setdefault(key, value)
        inner.pop("default", None) if node.get("default") is None else None
        return _convert(inner, defs, default_objects)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = {k: v for k, v in node.items() if k != "allOf"}
        inner.update(_resolve(node["allOf"][0], defs))
        return _convert(inner, defs, default_objects)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}

    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP}
    # JSON Schema 2020 numeric exclusive bounds -> OpenAPI v3.0 boolean form.
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if out.get("default", ...) is None:
        del out["default"]
    if "enum" in out and "type" not in out:
        sample = out["enum"][0]
        out["type"] = "integer" if isinstance(sample, int) else "number" if isinstance(sample, float) else "string"

    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {name: _convert(sub, defs, default_objects) for name, sub in node["properties"].items()}
        for name, sub in out["properties"].items():
            # An optional object whose fields all have defaults defaults to {} so the API server fills them in
            # (not one whose default is None: unset means "not given", e.g. podTemplate.metadata).
            if (
                default_objects
                and name not in node.get("required", [])
                and _resolve(node["properties"][name], defs).get("default", ...) is not None
                and sub.get("type") == "object"
                and "properties" in sub
                and not sub.get("required")
                and "default" not in sub
            ):
                sub["default"] = {}
        if not out.get("required"):
            out.pop("required", None)
    elif node.get("type") == "object" and not out.get("x-kubernetes-preserve-unknown-fields"):
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _convert(extra, defs, default_objects)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {n: _convert(s, defs, default_objects) for n, s in node["properties"].items()}
    if node.get("type") == "array" or "items" in node:
        out["type"] = "array"
        out["items"] = _convert(node.get("items", {}), defs, default_objects)
    if "type" not in out:
        raise ValueError(f"schema node without a type cannot be structural: {node}")
    return out


def structural_schema(model: type[BaseModel], *, default_objects: bool = True) -> dict[str, Any]:
    """OpenAPI v3 structural schema of a pydantic model, with descriptions, defaults, bounds and CEL rules.

    default_objects: give optional all-defaulted sub-objects `default: {}` so the API server fills in their
    fields when the user leaves them out (wanted in spec; not in status, which only the operator writes).
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, default_objects)


def custom_resource_definition() -> dict[str, Any]:
    """The full apiextensions.k8s.io/v1 CustomResourceDefinition object."""
    spec_schema = structural_schema(SpeculativeServerSpec)
    status_schema = structural_schema(SpeculativeServerStatus, default_objects=False)
    spec_schema["description"] = "Desired state: the target, the drafter, the servers and how to decide between them."
    status_schema["description"] = "Observed state, written by the operator."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {"specdec.io/generated-by": "specdec crd (from specdec_operator.api); do not edit"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": ["specdec"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "A SGLang deployment whose speculative-decoding variant is validated, measured against "
                                "the base server, promoted only when faster, and rolled back when it stops paying off."
                            ),
                            "required": ["spec"],
                            **NAME_RULES,
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version of this object."},
                                "kind": {"type": "string", "description": "Kind of this object."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_yaml() -> str:
    import yaml

    return yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=120)


def _reference_rows(node: dict[str, Any], path: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, sub in node.get("properties", {}).items():
        sub_path = f"{path}.{name}" if path else name
        kind = sub.get("type", "")
        if kind == "array":
            kind = f"[]{sub.get('items', {}).get('type', '')}"
        bounds = []
        if "enum" in sub:
            bounds.append(" \\| ".join(str(v) for v in sub["enum"]))
        if "minimum" in sub:
            bounds.append((">" if sub.get("exclusiveMinimum") else ">=") + f" {sub['minimum']}")
        if "maximum" in sub:
            bounds.append(("<" if sub.get("exclusiveMaximum") else "<=") + f" {sub['maximum']}")
        required = name in node.get("required", [])
        default = "required" if required else ("" if "default" not in sub or sub["default"] == {} else f"`{json_compact(sub['default'])}`")
        desc = sub.get("description", "").replace("|", "\\|").replace("\n", " ")
        if bounds:
            desc += f" ({'; '.join(bounds)})"
        rows.append((f"`{sub_path}`", kind, default, desc))
        target = sub.get("items", sub) if kind.startswith("[]") else sub
        if target.get("properties") and not target.get("x-kubernetes-preserve-unknown-fields"):
            rows += _reference_rows(target, sub_path + ("[]" if kind.startswith("[]") else ""))
    return rows


def json_compact(value: Any) -> str:
    import json

    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def render_reference() -> str:
    """Markdown reference of every spec and status field, generated like the CRD (docs/api.md)."""
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    out = [
        f"# {KIND} API reference ({API_GROUP}/{API_VERSION})",
        "",
        "Generated by `specdec crd --reference` from operator/specdec_operator/api.py; do not edit.",
        "Cross-field rules (CEL, enforced by the API server) are listed after the fields.",
        "",
    ]
    for part in ("spec", "status"):
        out += [f"## {part}", "", "| field | type | default | description |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _reference_rows(root[part], part)]
        out.append("")
    out += ["## Cross-field rules", ""]

    def rules(node: dict[str, Any], path: str) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            out.append(f"- `{path}`: {rule['message']}")
        for name, sub in node.get("properties", {}).items():
            rules(sub, f"{path}.{name}")
        if "items" in node:
            rules(node["items"], f"{path}[]")

    for rule in NAME_RULES["x-kubernetes-validations"]:
        out.append(f"- `metadata.name`: {rule['message']}")
    rules(root["spec"], "spec")
    out.append("")
    return "\n".join(out)
