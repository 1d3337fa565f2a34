"""The SpeculativeServer API: generated CRD, its structural schema, defaults, and the CEL rules."""

from __future__ import annotations

import copy
import hashlib
import json
import pathlib

import pytest
import yaml

from specdec_operator import api, crd, resource
from specdec_operator.celrules import violations
from specdec_operator.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "specdec.io_speculativeservers.yaml"

MINIMAL = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
}


def spec_schema() -> dict:
    return crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def rule_errors(spec: dict) -> list[tuple[str, str]]:
    """Default the spec as the API server would, then evaluate every CEL rule of the generated schema."""
    return list(violations(spec_schema(), resource.dump(api.SpeculativeServerSpec.model_validate(spec)), "spec"))


def with_(path: str, value, base: dict = MINIMAL) -> dict:
    spec = copy.deepcopy(base)
    node = spec
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return spec


def test_committed_crd_matches_the_models():
    assert CRD_FILE.read_text() == crd.render_yaml(), "crds/ drifted from the API models: run `make crd`"


def test_committed_api_reference_matches_the_models():
    assert (ROOT / "docs" / "api.md").read_text() == crd.render_reference(), "docs/api.md drifted: run `make crd`"


def test_chart_copy_of_crd_is_identical():
    chart_copy = ROOT / "charts" / "specdec-operator" / "crds" / CRD_FILE.name
    assert chart_copy.is_file(), f"{chart_copy} is missing: run `make crd`"
    assert chart_copy.read_text() == CRD_FILE.read_text(), "the chart's CRD differs: run `make crd`"


def _walk(node: dict, path: str = "spec"):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("part", ["spec", "status"])
def test_schema_is_structural_and_documented(part):
    root = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][part]
    text = yaml.safe_dump(root)
    assert "$ref" not in text and "anyOf" not in text and "allOf" not in text and "title" not in root
    for path, node in _walk(root):
        assert "type" in node, f"{path} has no type"
        if path.count(".") >= 1 and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description"


def columns_of(version):
    return {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}


def test_crd_names_columns_and_subresource():
    obj = crd.custom_resource_definition()
    assert obj["spec"]["names"]["shortNames"] == ["specserver", "sps"]
    version = obj["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"},
    }
    assert columns_of(version)["Fleet"] == ".status.rolloutProgress"
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Active"] == ".status.activeVariant"
    assert columns["Phase"] == ".status.phase"
    assert {"Speedup", "Accept", "Age"} <= set(columns)
    # Every printer column points at a field that exists in the status schema.
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for path in columns.values():
        if path.startswith(".status."):
            assert path.split(".")[2] in status


def test_defaults_of_a_minimal_spec():
    spec = api.SpeculativeServerSpec.model_validate(MINIMAL)
    assert spec.sglang_version == "0.5.23"
    assert spec.sglang.max_running_requests == 128
    assert spec.resources.gpus == 8 and spec.resources.gpu_family == "blackwell" and spec.resources.shm_size == "32Gi"
    assert spec.drafter.algorithm == "EAGLE3" and spec.drafter.draft_tokens == spec.drafter.num_steps + 1
    assert spec.model.mount_path == "/models"
    assert [w.concurrency for w in spec.rollout.workloads] == [1, 64]
    assert spec.rollout.min_speedup == 1.0 and spec.rollout.accept_length_floor == 1.1 and spec.rollout.keep_base_warm
    assert rule_errors(MINIMAL) == []


def test_schema_defaults_equal_pydantic_defaults():
    """The API server fills in defaults from the schema; the CLI from pydantic: they must agree."""
    schema = spec_schema()["properties"]
    assert schema["sglang"]["properties"]["maxRunningRequests"]["default"] == 128
    assert (
        schema["rollout"]["properties"]["workloads"]["default"]
        == resource.dump(api.SpeculativeServerSpec.model_validate(MINIMAL).rollout)["workloads"]
    )
    for section in ("resources", "sglang", "rollout", "monitor", "podMetadata"):
        assert schema[section]["default"] == {}, f"{section} must default to {{}} so its fields get defaults"
    # drafter is required: {} would be an invalid drafter (EAGLE3 needs a path) and the API server refuses a
    # CRD whose object default breaks the object's own CEL rules.
    assert "default" not in schema["drafter"] and "drafter" in spec_schema()["required"]


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example):
    doc, _spec = resource.load_custom_resource(str(example))
    assert doc["metadata"]["name"]
    assert rule_errors(doc["spec"]) == []


BAD_RULES = [
    (
        "topk 1 needs draft = steps + 1",
        with_("drafter", {"path": "d", "numSteps": 3, "eagleTopk": 1, "numDraftTokens": 6}),
        "spec.drafter.numDraftTokens",
        "numSteps + 1",
    ),
    (
        "tree needs explicit draft tokens",
        with_("drafter", {"path": "d", "numSteps": 3, "eagleTopk": 4}),
        "spec.drafter.numDraftTokens",
        "required when drafter.eagleTopk",
    ),
    ("tree too large", with_("drafter", {"path": "d", "numSteps": 2, "eagleTopk": 2, "numDraftTokens": 9}), "spec.drafter.numDraftTokens", "at most"),
    ("eagle needs a path", with_("drafter", {"algorithm": "EAGLE3"}), "spec.drafter.path", "required"),
    ("dotdot target", with_("target.path", "../etc"), "spec.target.path", "'..'"),
    ("absolute outside mount", with_("target.path", "/etc/llama"), "spec.target.path", "mountPath"),
    ("managed flag in extraArgs", with_("sglang", {"extraArgs": ["--max-running-requests=48"]}), "spec.sglang.extraArgs", "manages"),
    ("abbreviated managed flag in extraArgs", with_("sglang", {"extraArgs": ["--max-running", "48"]}), "spec.sglang.extraArgs", "manages"),
    ("speculative flag in extraArgs", with_("sglang", {"extraArgs": ["--speculative-num-steps", "5"]}), "spec.sglang.extraArgs", "manages"),
    (
        "requests below concurrency",
        with_("rollout", {"workloads": [{"name": "w", "concurrency": 64, "requests": 8}]}),
        "spec.rollout.workloads[0].requests",
        "concurrency",
    ),
    ("context too short", with_("target", {"path": "llama", "contextLength": 1000}), "spec.rollout.workloads", "contextLength"),
    ("floor above draft", with_("rollout", {"acceptLengthFloor": 4}), "spec.rollout.acceptLengthFloor", "draft tokens"),
    ("monitor floor above draft", with_("monitor", {"acceptLengthFloor": 5.5}), "spec.monitor.acceptLengthFloor", "draft tokens"),
]


@pytest.mark.parametrize("name,spec,field,text", BAD_RULES, ids=[b[0] for b in BAD_RULES])
def test_cel_rules_refuse_bad_specs_naming_the_field(name, spec, field, text):
    errors = rule_errors(spec)
    assert errors, f"{name}: accepted"
    assert errors[0][0] == field
    assert text in errors[0][1]


@pytest.mark.parametrize(
    "spec",
    [
        with_("drafter", {"path": "d", "numSteps": 5, "eagleTopk": 4, "numDraftTokens": 8}),
        with_("drafter", {"algorithm": "NEXTN", "numSteps": 1}),
        with_("sglang", {"extraArgs": ["--attention-backend", "flashinfer", "--model-loader-extra-config={}"]}),
        with_("sglang", {"extraArgs": ["--served-model-name", "kimi", "--skip-server-warmup", "--tool-call-parser", "kimi_k2"]}),
        with_("target.path", "/models/llama"),
        with_("rollout", {"acceptLengthFloor": 3.9}),
    ],
)
def test_cel_rules_accept_good_specs(spec):
    assert rule_errors(spec) == []


@pytest.mark.parametrize(
    "spec,where",
    [
        (with_("resources", {"gpus": 3}), "spec.resources.gpus"),
        (with_("rollout", {"minSpeedup": 0}), "spec.rollout.minSpeedup"),
        (with_("rollout", {"workloads": []}), "spec.rollout.workloads"),
        (with_("drafter", {"path": "d", "numStep": 3}), "spec.drafter.numStep"),
        (with_("target.quantization", "int3"), "spec.target.quantization"),
        (with_("image", ""), "spec.image"),
    ],
)
def test_parse_spec_errors_are_one_line_naming_the_field(spec, where):
    with pytest.raises(InputError) as err:
        resource.parse_spec(spec, source="cr.yaml", check_rules=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cr.yaml: {where}")


def test_a_name_yaml_read_as_a_boolean_is_refused_with_the_fix(tmp_path):
    cr = tmp_path / "cr.yaml"
    cr.write_text(
        yaml.safe_dump({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeServer", "metadata": {"name": "a"}, "spec": MINIMAL})
        + "  candidates:\n  - name: no\n    drafter: {algorithm: NGRAM}\n"
    )
    with pytest.raises(InputError) as err:
        resource.load_custom_resource(str(cr))
    message = str(err.value)
    assert "\n" not in message and "spec.candidates.0.name" in message and "got false" in message and "quote the value" in message


def test_duplicate_workload_names_are_a_schema_property():
    workloads = spec_schema()["properties"]["rollout"]["properties"]["workloads"]
    assert workloads["x-kubernetes-list-type"] == "map" and workloads["x-kubernetes-list-map-keys"] == ["name"]
    assert workloads["minItems"] == 1


def test_load_custom_resource_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: SpeculativeServer\napiVersion: specdec.io/v1\nspec: {}\n")
    with pytest.raises(InputError, match="apiVersion must be specdec.io/v1alpha1"):
        resource.load_custom_resource(str(bad))
    bad.write_text("a: [")
    with pytest.raises(InputError, match="not valid YAML"):
        resource.load_custom_resource(str(bad))
    with pytest.raises(InputError, match="cannot read"):
        resource.load_custom_resource(str(tmp_path / "missing.yaml"))


def test_revision_ignores_unrelated_edits():
    base = api.SpeculativeServerSpec.model_validate(MINIMAL)
    relabelled = api.SpeculativeServerSpec.model_validate(with_("podMetadata", {"labels": {"team": "a"}}))
    monitored = api.SpeculativeServerSpec.model_validate(with_("monitor", {"window": 9}))
    new_drafter = api.SpeculativeServerSpec.model_validate(with_("drafter", {"path": "eagle3/other"}))
    steps = api.SpeculativeServerSpec.model_validate(with_("drafter", {"path": "eagle3/llama", "numSteps": 5}))
    rev = resource.speculative_revision
    assert rev(base) == rev(relabelled) == rev(monitored)
    assert len({rev(base), rev(new_drafter), rev(steps)}) == 3


def test_fleet_fields_default_and_validate():
    spec = resource.parse_spec(copy.deepcopy(MINIMAL), check_rules=True)
    assert (spec.replicas, spec.rollout.max_surge, spec.rollout.max_unavailable, spec.resources.nodes) == (1, 0, 1, 1)
    with pytest.raises(InputError, match=r"spec\.rollout\.maxUnavailable: rollout\.maxSurge and rollout\.maxUnavailable must not both be 0"):
        resource.parse_spec(with_("rollout", {"maxSurge": 0, "maxUnavailable": 0}), check_rules=True)
    resource.parse_spec(with_("rollout", {"maxSurge": 1, "maxUnavailable": 0}), check_rules=True)
    with pytest.raises(InputError, match=r"spec\.resources\.gpus: resources\.gpus is per node"):
        resource.parse_spec(with_("resources", {"nodes": 2, "gpus": 16}), check_rules=True)
    with pytest.raises(InputError, match=r"spec\.replicas"):
        resource.parse_spec({**MINIMAL, "replicas": -1})
    two = resource.parse_spec(with_("resources", {"nodes": 2}), check_rules=True)
    assert two.resources.nodes == 2


def test_revision_is_unchanged_by_the_new_fields_at_their_defaults():
    # A spec written before resources.nodes existed keeps its revision (an operator upgrade probes nothing again);
    # a multi-node server is a different server; replicas and the walk's limits are not part of the revision.
    rev = resource.speculative_revision
    base = api.SpeculativeServerSpec.model_validate(MINIMAL)
    scaled = api.SpeculativeServerSpec.model_validate({**MINIMAL, "replicas": 8, "rollout": {"maxSurge": 2}})
    two_nodes = api.SpeculativeServerSpec.model_validate(with_("resources", {"nodes": 2}))
    assert rev(base) == rev(scaled) != rev(two_nodes)
    data = resource.dump(base)
    relevant = {k: data.get(k) for k in ("image", "sglangVersion", "model", "target", "drafter", "resources", "sglang")}
    relevant["resources"].pop("nodes")
    assert rev(base) == hashlib.sha256(json.dumps(relevant, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
