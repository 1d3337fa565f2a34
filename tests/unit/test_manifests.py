"""The children of a SpeculativeServer: names, labels, scheduling, security, the validator init container."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from specdec_operator import manifests as m
from specdec_operator.resource import parse_spec
from specdec_operator.sglang import render_argv

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def build(spec_dict: dict, variant: str, *, name: str = "srv", replicas: int = 1, settings=m.ManifestSettings()) -> dict:
    spec = parse_spec(spec_dict)
    return m.deployment(name, "ns", spec, variant, command=render_argv(spec, variant), replicas=replicas, revision="rev1", settings=settings)


def pod_spec(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
@pytest.mark.parametrize("variant", ["base", "speculative"])
def test_every_child_of_every_example_passes_the_kubernetes_schema(path: str, variant: str) -> None:
    cr = example(path)
    spec = parse_spec(cr["spec"])
    name = cr["metadata"]["name"]
    objects = [
        m.deployment(name, "ns", spec, variant, command=render_argv(spec, variant), replicas=1, revision="r"),
        m.service(name, "ns", variant),
        m.service(name, "ns", None, active=variant),
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def test_names_labels_and_selectors_follow_the_design() -> None:
    cr = example("llama31-8b-eagle3.yaml")
    base, spec = build(cr["spec"], "base", name="llama"), build(cr["spec"], "speculative", name="llama")
    assert base["metadata"]["name"] == "llama-base" and spec["metadata"]["name"] == "llama-spec"
    labels = spec["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "sglang"
    assert labels["app.kubernetes.io/instance"] == "llama"
    assert labels["app.kubernetes.io/managed-by"] == "specdec-operator"
    assert labels["specdec.io/variant"] == "speculative"
    assert spec["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "sglang",
        "app.kubernetes.io/instance": "llama",
        "specdec.io/variant": "speculative",
    }
    stable = m.service("llama", "ns", None, active="speculative")
    assert stable["metadata"]["name"] == "llama"
    assert stable["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert m.service_variant(stable) == "speculative"
    assert m.service("llama", "ns", "base")["metadata"]["name"] == "llama-base"
    assert m.service("llama", "ns", "speculative")["spec"]["selector"]["specdec.io/variant"] == "speculative"


def test_gpus_affinity_toleration_shm_and_read_only_model() -> None:
    cr = example("kimi-k25-int4-eagle3.yaml")
    ps = pod_spec(build(cr["spec"], "speculative"))
    server = ps["containers"][0]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert server["resources"]["requests"]["nvidia.com/gpu"] == "8"
    terms = ps["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.family", "operator": "In", "values": ["blackwell"]}]}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in ps["tolerations"]
    volumes = {v["name"]: v for v in ps["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "model-weights"
    mounts = {v["name"]: v for v in server["volumeMounts"]}
    assert mounts["model"]["readOnly"] is True and mounts["model"]["mountPath"] == "/models"
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    # The command line is SGLang's, with the speculative flags only on the speculative server.
    assert server["command"] == render_argv(parse_spec(cr["spec"]), "speculative")
    assert "--speculative-algorithm" not in pod_spec(build(cr["spec"], "base"))["containers"][0]["command"]


def test_user_affinity_is_anded_with_the_gpu_family_and_any_adds_none() -> None:
    cr = example("llama31-8b-eagle3.yaml")
    spec = copy.deepcopy(cr["spec"])
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    terms = pod_spec(build(spec, "base"))["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert {"key": "nvidia.com/gpu.family", "operator": "In", "values": ["hopper"]} in term["matchExpressions"]
    spec.pop("affinity")
    spec["resources"]["gpuFamily"] = "any"
    assert "affinity" not in pod_spec(build(spec, "base"))


def test_probes_allow_a_30_minute_load_and_readiness_generates() -> None:
    server = pod_spec(build(example("llama31-8b-eagle3.yaml")["spec"], "base"))["containers"][0]
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    assert server["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert server["readinessProbe"]["timeoutSeconds"] > 20  # /health_generate may take 20 s on a busy server
    longer = m.ManifestSettings(startup_allowance_s=3600)
    startup = pod_spec(build(example("llama31-8b-eagle3.yaml")["spec"], "base", settings=longer))["containers"][0]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600


def test_security_context_no_escalation_read_only_root_no_host_network() -> None:
    ps = pod_spec(build(example("llama31-8b-eagle3.yaml")["spec"], "speculative"))
    assert ps["hostNetwork"] is False and ps["hostIPC"] is False and ps["hostPID"] is False
    assert ps["automountServiceAccountToken"] is False
    for container in ps["containers"] + ps["initContainers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
    # SGLang still needs writable /tmp and caches: emptyDirs, not the image's filesystem.
    mounts = {v["mountPath"] for v in ps["containers"][0]["volumeMounts"]}
    assert {"/tmp", "/cache", "/dev/shm"} <= mounts
    env = {e["name"]: e.get("value") for e in ps["containers"][0]["env"]}
    assert env["HOME"] == "/cache"
    assert ps["initContainers"][0]["securityContext"]["runAsNonRoot"] is True


def test_validator_init_container_only_on_the_speculative_pod() -> None:
    spec = example("kimi-k25-int4-eagle3.yaml")["spec"]
    settings = m.ManifestSettings(validator_image="registry.example/specdec:1.2.3")
    ps = pod_spec(build(spec, "speculative", settings=settings))
    (init,) = ps["initContainers"]
    assert init["name"] == m.VALIDATOR_CONTAINER
    assert init["image"] == "registry.example/specdec:1.2.3"
    cmd = init["command"]
    assert cmd[:2] == ["specdec", "validate"]
    assert cmd[cmd.index("--target") + 1] == "/models/kimi-k2.5-int4"
    assert cmd[cmd.index("--drafter") + 1] == "/models/eagle3/kimi-k2.5-custom-10k"
    assert cmd[cmd.index("--quantization") + 1] == "auto"
    assert "--json" in cmd and cmd[cmd.index("--termination-log") + 1] == "/dev/termination-log"
    assert init["terminationMessagePath"] == "/dev/termination-log"
    assert init["volumeMounts"] == [{"name": "model", "mountPath": "/models", "readOnly": True}]
    assert "initContainers" not in pod_spec(build(spec, "base", settings=settings))
    nextn = copy.deepcopy(spec)
    nextn["drafter"] = {"algorithm": "NEXTN", "numSteps": 3, "eagleTopk": 1}
    assert "initContainers" not in pod_spec(build(nextn, "speculative"))


def test_pod_metadata_passes_through_but_operator_labels_win() -> None:
    spec = example("llama31-8b-eagle3.yaml")["spec"]
    spec["podMetadata"] = {
        "labels": {"team": "infer", "specdec.io/variant": "base", "app.kubernetes.io/instance": "other"},
        "annotations": {"prometheus.io/scrape": "true"},
    }
    meta = build(spec, "speculative")["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "infer"
    assert meta["labels"]["specdec.io/variant"] == "speculative"
    assert meta["labels"]["app.kubernetes.io/instance"] == "srv"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert meta["annotations"][m.ANNOTATION_REVISION] == "rev1"
    assert m.ANNOTATION_REVISION not in build(spec, "base")["spec"]["template"]["metadata"]["annotations"]


def test_a_drafter_change_leaves_the_base_template_alone() -> None:
    spec = example("llama31-8b-eagle3.yaml")["spec"]
    other = copy.deepcopy(spec)
    other["drafter"]["path"] = "eagle3/another"
    parsed, parsed_other = parse_spec(spec), parse_spec(other)
    from specdec_operator.resource import speculative_revision

    base = m.deployment("srv", "ns", parsed, "base", command=render_argv(parsed, "base"), replicas=1, revision=speculative_revision(parsed))
    base2 = m.deployment(
        "srv", "ns", parsed_other, "base", command=render_argv(parsed_other, "base"), replicas=1, revision=speculative_revision(parsed_other)
    )
    assert speculative_revision(parsed) != speculative_revision(parsed_other)
    assert base["spec"]["template"] == base2["spec"]["template"]


def test_template_hash_tracks_the_template_only() -> None:
    spec = example("llama31-8b-eagle3.yaml")["spec"]
    first = build(spec, "speculative")["spec"]["template"]
    again = build(copy.deepcopy(spec), "speculative")["spec"]["template"]
    h = m.ANNOTATION_TEMPLATE_HASH
    assert first["metadata"]["annotations"][h] == again["metadata"]["annotations"][h] == m.template_hash(first)
    changed = copy.deepcopy(spec)
    changed["drafter"]["numSteps"] = 4
    assert build(changed, "speculative")["spec"]["template"]["metadata"]["annotations"][h] != first["metadata"]["annotations"][h]
    monitor_only = copy.deepcopy(spec)
    monitor_only["monitor"]["window"] = 9
    assert build(monitor_only, "speculative")["spec"]["template"]["metadata"]["annotations"][h] == first["metadata"]["annotations"][h]


def test_replicas_and_recreate_strategy() -> None:
    dep = build(example("llama31-8b-eagle3.yaml")["spec"], "speculative", replicas=0)
    assert dep["spec"]["replicas"] == 0
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["progressDeadlineSeconds"] > 30 * 60


def test_base_template_changes_roll_within_the_walk_limits() -> None:
    """A new base image never replaces every base server at once (issue: a 40-server fleet served nothing)."""
    spec = example("llama31-8b-eagle3.yaml")["spec"]
    one = build(spec, "base")
    # One server: the new pod loads beside the old one, which serves until the new one is Ready.
    assert one["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    fleet = copy.deepcopy(spec)
    fleet["replicas"] = 6
    fleet.setdefault("rollout", {}).update({"maxSurge": 0, "maxUnavailable": 1})
    assert build(fleet, "base")["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    fleet["rollout"].update({"maxSurge": 2, "maxUnavailable": 0})
    assert build(fleet, "base")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 2, "maxUnavailable": 0}
    assert build(fleet, "speculative")["spec"]["strategy"] == {"type": "Recreate"}


def test_speculative_server_may_run_a_drafter_with_a_shorter_context() -> None:
    """SGLang refuses to start a drafter whose max_position_embeddings is below the target's context unless told."""
    spec = example("llama31-8b-eagle3.yaml")["spec"]

    def env(variant: str, spec_dict: dict) -> dict:
        (container,) = pod_spec(build(spec_dict, variant))["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert env("speculative", spec)[m.ALLOW_LONGER_DRAFT_CONTEXT_ENV] == "1"
    assert m.ALLOW_LONGER_DRAFT_CONTEXT_ENV not in env("base", spec)
    user = copy.deepcopy(spec)
    user["sglang"] = {**user.get("sglang", {}), "env": [{"name": m.ALLOW_LONGER_DRAFT_CONTEXT_ENV, "value": "0"}]}
    assert env("speculative", user)[m.ALLOW_LONGER_DRAFT_CONTEXT_ENV] == "0"
