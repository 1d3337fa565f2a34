"""Multi-node servers (resources.nodes > 1): SGLang's flags per rank, checked with SGLang's own parser, and the
LeaderWorkerSet that runs each server as a group of pods on distinct nodes."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from hack import devcluster
from specdec_operator import manifests as m
from specdec_operator import sglang as sglang_args
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from tests.support.multinode import kubelet_expand, parsed, spec_with

# The pinned release's CRD, which `hack/tools.sh lws` copies from the sigs.k8s.io/lws module (`make test` builds it).
LWS_CRD = devcluster.lws_crd_file()


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 8), (3, 8), (4, 4), (2, 1)])
@pytest.mark.parametrize("variant", ["base", "speculative"])
def test_every_rank_renders_flags_that_sglang_accepts(server_parser, nodes: int, gpus: int, variant: str) -> None:
    spec = parse_spec(spec_with(nodes=nodes, gpus=gpus), check_rules=True)
    leader = sglang_args.render_argv(spec, variant)
    worker = sglang_args.render_argv(spec, variant, worker=True)
    leader_address = "kimi-base-0.kimi-base.ns"  # what the LeaderWorkerSet webhook puts in LWS_LEADER_ADDRESS
    for rank in range(nodes):
        env = {"LWS_LEADER_ADDRESS": leader_address, "LWS_WORKER_INDEX": str(rank), "LWS_GROUP_SIZE": str(nodes)}
        argv = kubelet_expand(leader if rank == 0 else worker, env)
        args = parsed(server_parser, spec, argv)
        assert args.nnodes == nodes and args.node_rank == rank
        assert args.dist_init_addr == f"{leader_address}:{sglang_args.DIST_INIT_PORT}"
        assert args.tp_size == nodes * gpus  # tensor parallelism spans every GPU of the group
        assert args.host == "0.0.0.0" and args.port == 30000
        assert (args.speculative_algorithm is not None) == (variant == "speculative")
    # Leader and worker commands differ in the rank alone.
    differing = [(a, b) for a, b in zip(leader, worker, strict=True) if a != b]
    assert differing == [("0", "$(LWS_WORKER_INDEX)")]


def test_one_node_servers_render_no_multi_node_flag(server_parser) -> None:
    spec = parse_spec(spec_with(nodes=1), check_rules=True)
    argv = sglang_args.render_argv(spec, "speculative")
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(argv)
    assert parsed(server_parser, spec, argv).tp_size == 8
    assert sglang_args.render_argv(spec, "speculative", worker=True) == argv


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--node-r", "--nno"])
def test_multi_node_flags_are_the_operators_not_extra_args(flag: str) -> None:
    spec = spec_with()
    spec["sglang"] = {"extraArgs": [flag, "1"]}
    with pytest.raises(InputError, match="sglang.extraArgs"):
        parse_spec(spec, check_rules=True)
    with pytest.raises(InputError, match=f"{re.escape(flag)} would set"):
        sglang_args.render_argv(parse_spec(spec), "base")


def lws(spec_dict: dict | None = None, variant: str = "speculative", replicas: int = 3) -> dict:
    spec = parse_spec(spec_dict or spec_with(), check_rules=True)
    return m.leader_worker_set(
        "kimi",
        "ns",
        spec,
        variant,
        leader_command=sglang_args.render_argv(spec, variant),
        worker_command=sglang_args.render_argv(spec, variant, worker=True),
        replicas=replicas,
        revision="rev1",
    )


def as_pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]}, "spec": template["spec"]}


def test_leader_worker_set_shape() -> None:
    obj = lws()
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "kimi-spec")
    spec = obj["spec"]
    assert spec["replicas"] == 3  # groups: one per server
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    assert leader["metadata"]["labels"][m.LABEL_ROLE] == "leader" and worker["metadata"]["labels"][m.LABEL_ROLE] == "worker"
    for t in (leader, worker):
        assert t["metadata"]["labels"][m.LABEL_VARIANT] == "speculative"
        pod = t["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"  # resources.gpus per node
        # Distinct nodes within a group (the LeaderWorkerSet webhook's group key, matched per pod) ...
        (anti,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti["topologyKey"] == "kubernetes.io/hostname" and anti["matchLabelKeys"] == [m.LWS_LABEL_GROUP_KEY]
        # ... of one GPU family: the node affinity of gpuFamily, and the group kept on one family's nodes.
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "nvidia.com/gpu.family", "operator": "In", "values": ["blackwell"]} in terms[0]["matchExpressions"]
        (same,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert same["topologyKey"] == "nvidia.com/gpu.family"
        # The startup probe gives the group the single-node allowance plus 10 minutes per extra node.
        startup = pod["containers"][0]["startupProbe"]
        assert startup["failureThreshold"] * startup["periodSeconds"] == m.STARTUP_ALLOWANCE_S + m.STARTUP_PER_EXTRA_NODE_S
        assert t["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == m.template_hash(t)
    assert "$(LWS_WORKER_INDEX)" in worker["spec"]["containers"][0]["command"]
    assert "$(LWS_WORKER_INDEX)" not in leader["spec"]["containers"][0]["command"]
    # The drafter is validated once per group, by the leader.
    assert [c["name"] for c in leader["spec"]["initContainers"]] == [m.VALIDATOR_CONTAINER]
    assert "initContainers" not in worker["spec"]
    # Both templates are valid pods for Kubernetes 1.36.
    for t in (leader, worker):
        kubernetes_validate.validate(as_pod(t), "1.36.0", strict=True)


@pytest.mark.lws  # reads the CRD that `hack/tools.sh lws` leaves (`make test` builds that group with the control plane)
def test_leader_worker_set_passes_the_leaderworkerset_crd_schema() -> None:
    """Against the openAPIV3Schema of the pinned LeaderWorkerSet CRD (sigs.k8s.io/lws, hack/tools.sh lws): every
    field we write exists and has the type the API server will check."""
    if not LWS_CRD.exists():  # `make test` builds group lws; a bare `pytest` may not have
        pytest.skip(f"{LWS_CRD} is not there: run `hack/tools.sh lws` (or `make tools LWS=1`)")
    crd = yaml.safe_load(LWS_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]

    def check(node: dict, value, path: str) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string"):
            return
        kind = node.get("type")
        if kind == "object":
            assert isinstance(value, dict), path
            props = node.get("properties")
            for key, sub in value.items():
                if props is not None:
                    assert key in props, f"{path}.{key} is not in the LeaderWorkerSet schema"
                    check(props[key], sub, f"{path}.{key}")
                elif "additionalProperties" in node:
                    check(node["additionalProperties"], sub, f"{path}.{key}")
            for key in node.get("required", []):
                assert key in value, f"{path}.{key} is required"
        elif kind == "array":
            assert isinstance(value, list), path
            for i, item in enumerate(value):
                check(node["items"], item, f"{path}[{i}]")
        elif kind == "string":
            assert isinstance(value, str), path
            if "enum" in node:
                assert value in node["enum"], f"{path}: {value!r} not in {node['enum']}"
        elif kind == "integer":
            assert isinstance(value, int), path
        elif kind == "boolean":
            assert isinstance(value, bool), path

    obj = lws()
    check(schema["properties"]["spec"], obj["spec"], "spec")


def test_stable_and_variant_services_select_leaders_only_for_groups() -> None:
    svc = m.service("kimi", "ns", None, active="speculative", leaders_only=True)
    assert svc["spec"]["selector"][m.LABEL_ROLE] == "leader"
    assert m.LABEL_ROLE not in m.service("kimi", "ns", None, active="speculative")["spec"]["selector"]


def test_without_the_leaderworkerset_crd_a_multi_node_spec_is_refused_with_what_to_install() -> None:
    multi = parse_spec(spec_with(nodes=2))
    single = parse_spec(spec_with(nodes=1))
    message = m.lws_missing_message(multi, set())
    assert message is not None
    assert "spec.resources.nodes is 2" in message and m.LWS_CRD_NAME in message and "install the LeaderWorkerSet controller" in message
    assert "\n" not in message
    assert m.lws_missing_message(multi, {m.LWS_CRD_NAME}) is None
    assert m.lws_missing_message(single, set()) is None
    assert m.multi_node(multi) and not m.multi_node(single)
