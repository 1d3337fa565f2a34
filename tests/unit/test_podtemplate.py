"""spec.podTemplate: what a platform team sets on its pods, merged with what the operator owns (issue 25, item 5).

Unit tests of the rendering (every pod the operator creates for a server: both Deployments, a LeaderWorkerSet's
leader and worker templates, the validator init container), of the refusals (the CRD's CEL rules, evaluated by
cel-python as the CLI does; tests/cluster/test_admission_cluster.py has them refused by the real API server), of the
older top-level fields, and of status.serviceAddress.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from specdec_operator import api
from specdec_operator import manifests as m
from specdec_operator.errors import InputError
from specdec_operator.reconcile import Observed, reconcile
from specdec_operator.resource import parse_spec
from specdec_operator.sglang import render_argv
from tests.support.platform import PLATFORM

BASE_SPEC: dict[str, Any] = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "resources": {"gpus": 1, "gpuFamily": "hopper"},
}


def spec_with(template: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    if template is not None:
        spec["podTemplate"] = copy.deepcopy(template)
    spec.update(copy.deepcopy(top))
    return spec


def pod_of(spec_dict: dict[str, Any], variant: str) -> dict[str, Any]:
    spec = parse_spec(spec_dict, check_rules=True)
    return m.deployment("srv", "ns", spec, variant, command=render_argv(spec, variant), replicas=1, revision="r")["spec"]["template"]


def refusal(spec_dict: dict[str, Any]) -> str:
    with pytest.raises(InputError) as info:
        parse_spec(spec_dict, check_rules=True)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("variant", ["base", "speculative"])
def test_every_platform_field_reaches_the_pod_and_the_operator_keeps_what_it_owns(variant: str) -> None:
    plain = pod_of(spec_with(), variant)
    template = pod_of(spec_with(PLATFORM), variant)
    pod, server = template["spec"], template["spec"]["containers"][0]
    assert template["metadata"]["labels"]["team"] == "inference" and template["metadata"]["annotations"]["cost-center"] == "42"
    assert template["metadata"]["labels"][m.LABEL_VARIANT] == variant  # the operator's labels stay
    assert pod["serviceAccountName"] == "inference" and pod["automountServiceAccountToken"] is True
    assert pod["imagePullSecrets"] == [{"name": "mirror"}]
    assert pod["priorityClassName"] == "inference-high" and pod["runtimeClassName"] == "nvidia"
    assert pod["topologySpreadConstraints"] == PLATFORM["topologySpreadConstraints"]
    assert pod["nodeSelector"] == {"pool": "h200"}
    assert (
        PLATFORM["tolerations"][0] in pod["tolerations"]
        and {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    )
    # The GPU family's node affinity is still there, beside the user's pod anti-affinity.
    assert "podAntiAffinity" in pod["affinity"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": m.GPU_FAMILY_LABEL, "operator": "In", "values": ["hopper"]} in terms[0]["matchExpressions"]
    # Security contexts: the user's fields over the operator's, the operator's hardening where the user said nothing.
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 2000, "supplementalGroups": [3000]}
    assert server["securityContext"]["runAsUser"] == 1000 and server["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert server["securityContext"]["readOnlyRootFilesystem"] is True and server["securityContext"]["allowPrivilegeEscalation"] is False
    # Volumes and mounts are added after the operator's; the server container is otherwise unchanged.
    assert [v["name"] for v in pod["volumes"]] == [v["name"] for v in plain["spec"]["volumes"]] + ["ca", "compile-cache"]
    assert server["volumeMounts"] == plain["spec"]["containers"][0]["volumeMounts"] + PLATFORM["volumeMounts"]
    for owned in ("image", "command", "resources", "ports", "startupProbe", "readinessProbe", "livenessProbe", "env"):
        assert server[owned] == plain["spec"]["containers"][0][owned], owned
    assert server["resources"]["limits"][m.GPU_RESOURCE] == "1"
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod}, "1.36.0", strict=True)


def test_the_validator_init_container_takes_the_container_security_context_too() -> None:
    plain = pod_of(spec_with(), "speculative")["spec"]["initContainers"][0]["securityContext"]
    assert plain["runAsUser"] == 65532 and plain["runAsNonRoot"] is True  # the operator's own default
    # OpenShift-style: a UID from the namespace's range instead of 65532.
    template = {"containerSecurityContext": {"runAsUser": 1000650000, "runAsGroup": 1000650000}}
    validator = pod_of(spec_with(template), "speculative")["spec"]["initContainers"][0]
    assert validator["securityContext"]["runAsUser"] == 1000650000 and validator["securityContext"]["runAsNonRoot"] is True
    assert validator["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The user's extra mounts are the server's: the validator reads only the model volume.
    with_mounts = pod_of(spec_with(PLATFORM), "speculative")["spec"]["initContainers"][0]
    assert [v["name"] for v in with_mounts["volumeMounts"]] == [m.MODEL_VOLUME]


def test_multi_node_leader_and_worker_templates_take_the_platform_fields() -> None:
    spec = parse_spec(spec_with(PLATFORM, resources={"gpus": 8, "nodes": 2, "gpuFamily": "blackwell"}), check_rules=True)
    lws = m.leader_worker_set(
        "srv",
        "ns",
        spec,
        "speculative",
        leader_command=render_argv(spec, "speculative"),
        worker_command=render_argv(spec, "speculative", worker=True),
        replicas=1,
        revision="r",
    )
    templates = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = templates[role]["spec"]
        assert pod["serviceAccountName"] == "inference" and pod["priorityClassName"] == "inference-high", role
        assert pod["imagePullSecrets"] == [{"name": "mirror"}] and pod["runtimeClassName"] == "nvidia", role
        assert pod["containers"][0]["volumeMounts"][-2:] == PLATFORM["volumeMounts"], role
        # The group's own placement terms are added to the user's affinity, not instead of it.
        assert "podAntiAffinity" in pod["affinity"] and pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert templates["leaderTemplate"]["spec"]["initContainers"][0]["securityContext"]["runAsUser"] == 1000


def test_a_spec_without_a_pod_template_renders_only_the_operators_fields() -> None:
    pod = pod_of(spec_with(), "base")["spec"]
    for absent in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "runtimeClassName", "topologySpreadConstraints", "nodeSelector"):
        assert absent not in pod, absent
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def test_the_older_top_level_fields_render_the_same_pod_as_the_pod_template() -> None:
    """Existing resources keep working, and keep their template hash (no restart when the operator is upgraded)."""
    old = spec_with(
        None,
        nodeSelector={"pool": "h200"},
        tolerations=PLATFORM["tolerations"],
        affinity=PLATFORM["affinity"],
        podMetadata={"labels": {"team": "inference"}, "annotations": {"cost-center": "42"}},
    )
    new = spec_with({k: PLATFORM[k] for k in ("nodeSelector", "tolerations", "affinity", "metadata")})
    for variant in ("base", "speculative"):
        assert pod_of(old, variant) == pod_of(new, variant)
    # The API server defaults podMetadata to {}: that says nothing and is no conflict.
    assert parse_spec(spec_with({"metadata": {"labels": {"a": "b"}}}, podMetadata={}), check_rules=True).pod_template.metadata is not None


@pytest.mark.parametrize(
    "old, value, new",
    [
        ("nodeSelector", {"pool": "a"}, {"nodeSelector": {"pool": "b"}}),
        ("tolerations", [{"key": "k", "operator": "Exists"}], {"tolerations": []}),
        ("affinity", {}, {"affinity": {}}),
        ("podMetadata", {"labels": {"a": "b"}}, {"metadata": {}}),
    ],
)
def test_setting_an_older_field_and_its_pod_template_field_is_refused(old: str, value: Any, new: dict[str, Any]) -> None:
    spec = spec_with(new, **{old: value})
    message = refusal(spec)
    assert f"{old} and podTemplate." in message and "move it into podTemplate" in message
    # The CEL rule says the same to the API server (evaluated on the spec as stored, nothing moved yet).
    from specdec_operator.celrules import violations
    from specdec_operator.crd import structural_schema

    assert any(f"{old} and podTemplate." in text for _, text in violations(structural_schema(api.SpeculativeServerSpec), spec, "spec"))


@pytest.mark.parametrize(
    "template, needle",
    [
        ({"volumes": [{"name": "model", "emptyDir": {}}]}, "podTemplate.volumes[].name must not be model"),
        ({"volumes": [{"name": "cache", "emptyDir": {}}]}, "the operator's own volumes"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/models"}]}, "must not be model.mountPath"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/models/extra"}]}, "must not be model.mountPath"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/tmp"}]}, "must not be /dev/shm, /tmp"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/dev"}]}, "a directory above one of them"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/etc"}]}, "a directory above one of them"),
        ({"volumeMounts": [{"name": "x", "mountPath": "/data"}]}, "must name a volume of podTemplate.volumes"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/a/../models"}]}, "'..' segments"),
        ({"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "data"}]}, "volumeMounts"),
        ({"containerSecurityContext": {"runAsUser": 0}}, "runAsUser 0 also needs runAsNonRoot: false"),
        ({"imagePullSecrets": [{"name": "Not_A_Name"}]}, "podTemplate.imagePullSecrets"),
        ({"priorityClassName": "High Priority"}, "podTemplate.priorityClassName"),
    ],
)
def test_a_pod_template_that_conflicts_with_the_operator_is_refused_naming_the_field(template: dict[str, Any], needle: str) -> None:
    message = refusal(spec_with(template))
    assert needle in message
    assert "podTemplate" in message


def test_a_parent_of_a_custom_model_mount_path_is_refused_and_a_mount_below_cache_is_not() -> None:
    volumes = [{"name": "x", "emptyDir": {}}]
    custom = {"volume": {"persistentVolumeClaim": {"claimName": "w"}}, "mountPath": "/mnt/models"}
    assert "must not be model.mountPath" in refusal(
        spec_with({"volumes": volumes, "volumeMounts": [{"name": "x", "mountPath": "/mnt"}]}, model=custom)
    )
    fine = parse_spec(spec_with({"volumes": volumes, "volumeMounts": [{"name": "x", "mountPath": "/mnt/other"}]}, model=custom), check_rules=True)
    assert fine.pod_template.volume_mounts == [{"name": "x", "mountPath": "/mnt/other"}]
    parse_spec(spec_with({"volumes": volumes, "volumeMounts": [{"name": "x", "mountPath": "/cache/triton"}]}), check_rules=True)
    # runAsUser 0 is fine when the user also says runAsNonRoot: false.
    parse_spec(spec_with({"containerSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}}), check_rules=True)


def test_the_names_the_api_reserves_are_the_ones_the_operator_renders() -> None:
    spec = parse_spec(spec_with(), check_rules=True)
    template = m.pod_template("srv", spec, "speculative", render_argv(spec, "speculative"), "r", m.ManifestSettings(), adaptive_config_hash="h")
    assert {v["name"] for v in template["spec"]["volumes"]} == set(api.OPERATOR_VOLUME_NAMES)
    mounts = {v["mountPath"] for v in template["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == set(api.OPERATOR_MOUNT_PATHS) | {spec.model.mount_path}


def test_the_dataset_reader_pod_takes_the_pull_secrets_and_scheduling_fields() -> None:
    spec_dict = spec_with(PLATFORM)
    spec_dict["rollout"] = {
        "workloads": [{"name": "file", "concurrency": 1, "requests": 1, "prompts": {"source": "File", "file": {"path": "prompts.jsonl"}}}]
    }
    spec = parse_spec(spec_dict, check_rules=True)
    pod = m.reader_pod("srv", "ns", "uid", spec.rollout.workloads[0], spec, m.ManifestSettings())
    assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror"}]
    assert pod["spec"]["nodeSelector"] == {"pool": "h200"} and PLATFORM["tolerations"][0] in pod["spec"]["tolerations"]


def test_status_gives_the_stable_services_address_once_it_exists() -> None:
    spec = parse_spec(spec_with(), check_rules=True)
    now = datetime(2026, 12, 5, tzinfo=UTC)
    before = reconcile(spec, Observed("llama", "inference", "uid", 1), None, now)
    assert before.new_status.service_address is None
    observed = Observed("llama", "inference", "uid", 1, services={"llama": m.service("llama", "inference", None)})
    after = reconcile(spec, observed, before.new_status, now)
    assert after.new_status.service_address == "llama.inference.svc:30000"
    assert after.status["serviceAddress"] == "llama.inference.svc:30000"
