"""Multi-node servers on the real control plane, with the real `specdec run` process.

1. Without the LeaderWorkerSet CRD a multi-node spec is refused (phase Failed, Ready False, reason
   LeaderWorkerSetMissing, a Warning Event saying what to install); nothing is created, and an existing fleet's
   children are left as they are.
2. With a CRD installed, the same resource goes on by itself (the operator asks API discovery again): it creates one
   LeaderWorkerSet per variant whose ranks SGLang's parser accepts, the probe decides, and a rollback scales the
   speculative LeaderWorkerSet to 0 groups: the speculative group goes as one.

The CRD here is a TEST STAND-IN (STANDIN_CRD below: the real group, kind and names, a schema that keeps any
field), not the upstream one: the LeaderWorkerSet source cannot be fetched here (the Go module proxy refuses
sigs.k8s.io/lws's zip, and the repository does not carry other projects' source), so neither its CRD nor its
controller runs. The test plays the controller's part that the operator depends on: it creates each group's
leader and worker pods from the LeaderWorkerSet's templates, with the controller's labels.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml
from kube import wait_until
from test_multinode import kubelet_expand
from test_operator_e2e import (  # noqa: F401  (operator and sims are fixtures)
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    events,
    example,
    get,
    operator,
    sims,
    status,
)

from specdec_operator import manifests as m
from specdec_operator import sglang as sglang_args
from specdec_operator.resource import parse_spec

pytestmark = pytest.mark.cluster

LWS_GROUP, LWS_VERSION = m.LWS_API_VERSION.split("/")

# A TEST STAND-IN for the LeaderWorkerSet CRD (sigs.k8s.io/lws): the served group/version/kind/plural the operator
# uses, with status and scale subresources like the real one, and no schema beyond "an object" (the real schema is
# checked by tests/test_multinode.py when the pinned CRD file is present).
STANDIN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": m.LWS_CRD_NAME, "labels": {"specdec.test/stand-in": "true"}},
    "spec": {
        "group": LWS_GROUP,
        "scope": "Namespaced",
        "names": {
            "kind": m.LWS_KIND,
            "listKind": "LeaderWorkerSetList",
            "plural": m.LWS_PLURAL,
            "singular": "leaderworkerset",
            "shortNames": ["lws"],
        },
        "versions": [
            {
                "name": LWS_VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.hpaPodSelector",
                    },
                },
            }
        ],
    },
}


def multi_node_example(name: str, namespace: str, **changes: Any) -> dict:
    cr = example(
        "llama31-8b-eagle3.yaml",
        name,
        namespace,
        annotations=compatible_annotations(),
        resources__nodes=2,
        resources__gpus=4,
        resources__gpuFamily="blackwell",
        rollout__keepBaseWarm=False,
        **changes,
    )
    return cr


def deployments_spec(apps_v1: Any, namespace: str) -> dict:
    return {
        d.metadata.name: (d.metadata.generation, d.spec.replicas, d.spec.template.metadata.annotations[m.ANNOTATION_TEMPLATE_HASH])
        for d in apps_v1.list_namespaced_deployment(namespace).items
    }


def warning_reasons(core_v1: Any, namespace: str, name: str) -> list[str]:
    return [e.reason for e in events(core_v1, namespace, name) if e.type == "Warning"]


@pytest.fixture
def no_lws_crd(kube_cluster: Any) -> None:
    if kube_cluster.kubectl("get", f"crd/{m.LWS_CRD_NAME}", check=False).returncode == 0:
        pytest.skip("this cluster has a LeaderWorkerSet CRD: the refusal cannot be seen here")


@pytest.fixture
def standin_crd(kube_cluster: Any) -> Any:
    """Installs the stand-in CRD when called; removes it at the end (only if it is the stand-in)."""
    installed = []

    def install() -> None:
        kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(STANDIN_CRD))
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{m.LWS_CRD_NAME}", "--timeout=30s")
        installed.append(True)

    yield install
    if installed:
        kube_cluster.kubectl("delete", f"crd/{m.LWS_CRD_NAME}", "--wait=false", check=False)
        wait_until(
            lambda: kube_cluster.kubectl("get", f"crd/{m.LWS_CRD_NAME}", check=False).returncode != 0, timeout=60, message="stand-in CRD removed"
        )


def play_the_lws_controller(core_v1: Any, custom_objects: Any, namespace: str, owner: dict, lws_name: str) -> list[str]:
    """What the LeaderWorkerSet controller would do for group 0: a leader and its workers from the templates, with
    the controller's labels (group index, worker index, group key) and the variables its webhook injects."""
    lws = custom_objects.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL, lws_name)
    lwt = lws["spec"]["leaderWorkerTemplate"]
    reference = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    names = []
    for rank in range(lwt["size"]):
        template = copy.deepcopy(lwt["leaderTemplate"] if rank == 0 else lwt["workerTemplate"])
        pod_name = f"{lws_name}-0" + (f"-{rank}" if rank else "")
        labels = {
            **template["metadata"]["labels"],
            m.LWS_LABEL_NAME: lws_name,
            m.LWS_LABEL_GROUP_INDEX: "0",
            m.LWS_LABEL_WORKER_INDEX: str(rank),
            m.LWS_LABEL_GROUP_KEY: f"{lws_name}-group-0",
        }
        env = [
            {"name": "LWS_LEADER_ADDRESS", "value": f"{lws_name}-0.{lws_name}.{namespace}"},
            {"name": "LWS_GROUP_SIZE", "value": str(lwt["size"])},
            {"name": "LWS_WORKER_INDEX", "value": str(rank)},
        ]
        for container in template["spec"]["containers"]:
            container["env"] = env + container.get("env", [])
        metadata = {**template["metadata"], "name": pod_name, "namespace": namespace, "labels": labels, "ownerReferences": [reference]}
        core_v1.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
        names.append(pod_name)
    return names


def test_without_the_crd_a_multi_node_spec_is_refused_and_with_it_leaderworkersets_are_made_and_rolled_back_as_groups(
    no_lws_crd: None,
    standin_crd: Any,
    operator: Operator,
    sims: Any,
    namespace: str,
    custom_objects: Any,
    core_v1: Any,
    apps_v1: Any,
    server_parser: Any,
) -> None:
    from sglang.srt.server_args import ServerArgs

    base = sims.start("llama31-8b-base", time_scale=10.0)
    spec_sim = sims.start("llama31-8b-eagle3", time_scale=10.0)
    spec_sim.sim.engine.set_accept_length_mean(1.0)  # the drafter accepts nothing: the probe rolls it back
    operator.map("kimi-base", base.url)
    operator.map("kimi-spec", spec_sim.url)
    operator.start()

    # An existing one-node resource, then its spec asks for two nodes: refused, its children left as they are.
    single = example("llama31-8b-eagle3.yaml", "single", namespace, annotations=compatible_annotations())
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, single)
    wait_until(lambda: len(apps_v1.list_namespaced_deployment(namespace).items) == 2, timeout=60, message="the one-node resource's Deployments")
    before = deployments_spec(apps_v1, namespace)
    custom_objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "single", {"spec": {"resources": {"nodes": 2, "gpuFamily": "blackwell"}}}
    )

    # A new multi-node resource: refused, nothing created.
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, multi_node_example("kimi", namespace))
    for name in ("kimi", "single"):
        st = wait_until(
            lambda name=name: (s := status(custom_objects, namespace, name)).get("reason") == "LeaderWorkerSetMissing" and s,
            timeout=60,
            message=f"{name}: LeaderWorkerSetMissing",
        )
        assert st["phase"] == "Failed" and "install the LeaderWorkerSet controller" in st["message"] and m.LWS_CRD_NAME in st["message"]
        (ready,) = [c for c in st["conditions"] if c["type"] == "Ready"]
        assert ready["status"] == "False" and ready["reason"] == "LeaderWorkerSetMissing"
        wait_until(
            lambda name=name: "LeaderWorkerSetMissing" in warning_reasons(core_v1, namespace, name), timeout=20, message=f"{name}: the Warning Event"
        )
    assert not [s.metadata.name for s in core_v1.list_namespaced_service(namespace).items if s.metadata.name.startswith("kimi")]
    after = deployments_spec(apps_v1, namespace)
    assert after == before  # no Deployment for kimi; single's untouched (its spec: status changes with its pods)
    custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "single")

    # The CRD arrives: within the discovery recheck (30 s) the operator makes one LeaderWorkerSet per variant.
    installed = time.monotonic()
    standin_crd()

    def both_sets() -> list | None:
        found = custom_objects.list_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL)["items"]
        return found if {o["metadata"]["name"] for o in found} == {"kimi-base", "kimi-spec"} else None

    sets = {o["metadata"]["name"]: o for o in wait_until(both_sets, timeout=90, message="LeaderWorkerSets kimi-base and kimi-spec")}
    print(f"\nCRD installed -> both LeaderWorkerSets: {time.monotonic() - installed:.1f} s")
    assert status(custom_objects, namespace, "kimi")["phase"] != "Failed"
    owner = get(custom_objects, namespace, "kimi")
    parsed_spec = parse_spec(owner["spec"])
    for lws_name, lws in sets.items():
        assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert lws["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        # The ranks the kubelet would run, with the variables the webhook injects: commands SGLang accepts.
        address = f"{lws_name}-0.{lws_name}.{namespace}"
        for rank, which in enumerate(("leaderTemplate", "workerTemplate")):
            command = lws["spec"]["leaderWorkerTemplate"][which]["spec"]["containers"][0]["command"]
            argv = kubelet_expand(command, {"LWS_LEADER_ADDRESS": address, "LWS_WORKER_INDEX": str(rank)})
            args = ServerArgs.from_cli_args(server_parser.parse_args(argv[len(sglang_args.RELEASES[parsed_spec.sglang_version].entrypoint) :]))
            assert (args.nnodes, args.node_rank, args.tp_size) == (2, rank, 8)
            assert args.dist_init_addr == f"{address}:{sglang_args.DIST_INIT_PORT}"
    for svc in ("kimi", "kimi-base", "kimi-spec"):
        selector = wait_until(lambda svc=svc: core_v1.read_namespaced_service(svc, namespace).spec.selector, timeout=30, message=f"Service {svc}")
        assert selector[m.LABEL_ROLE] == m.ROLE_LEADER

    # The groups' pods (the controller's part, played by the test); the probe measures the leaders, and the
    # drafter that accepts nothing is rolled back: the speculative LeaderWorkerSet goes to 0 groups at once.
    for lws_name in ("kimi-base", "kimi-spec"):
        play_the_lws_controller(core_v1, custom_objects, namespace, owner, lws_name)
    st = wait_until(
        lambda: (s := status(custom_objects, namespace, "kimi")).get("phase") in ("Promoted", "RolledBack", "Failed") and s,
        timeout=180,
        message="a decision",
    )
    assert st["phase"] == "RolledBack", json.dumps(st)[:800]
    wait_until(
        lambda: custom_objects.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL, "kimi-spec")["spec"]["replicas"] == 0,
        timeout=30,
        message="kimi-spec at 0 groups",
    )
    assert custom_objects.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL, "kimi-base")["spec"]["replicas"] == 1
    assert core_v1.read_namespaced_service("kimi", namespace).spec.selector == {**m.selector_labels("kimi", "base"), m.LABEL_ROLE: m.ROLE_LEADER}
    # The ranks of each group ran on distinct Blackwell nodes (the group's anti-affinity, gpuFamily's affinity).
    nodes = {p.metadata.name: p.spec.node_name for p in core_v1.list_namespaced_pod(namespace).items if p.metadata.name.startswith("kimi-")}
    for lws_name in ("kimi-base", "kimi-spec"):
        leader, worker = nodes[f"{lws_name}-0"], nodes[f"{lws_name}-0-1"]
        assert leader and worker and leader != worker
        for node in (leader, worker):
            assert core_v1.read_node(node).metadata.labels["nvidia.com/gpu.family"] == "blackwell"


def test_nodes_1_to_2_replaces_the_deployments_with_leaderworkersets_and_deletes_them_once_a_group_serves(
    standin_crd: Any, operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any
) -> None:
    standin_crd()
    base = sims.start("llama31-8b-base", time_scale=10.0)
    spec_sim = sims.start("llama31-8b-eagle3", time_scale=10.0)
    operator.map("grow-base", base.url)
    operator.map("grow-spec", spec_sim.url)
    operator.start()
    # maxSurge 1 >= replicas 1: room for the new kind beside the old (reconcile/retire.py).
    cr = example("llama31-8b-eagle3.yaml", "grow", namespace, annotations=compatible_annotations(), rollout__maxSurge=1)
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
    wait_until(lambda: status(custom_objects, namespace, "grow").get("phase") in ("Promoted", "RolledBack"), timeout=180, message="a decision")
    stable_before = core_v1.read_namespaced_service("grow", namespace).spec.selector
    assert m.LABEL_ROLE not in stable_before
    custom_objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "grow", {"spec": {"resources": {"nodes": 2, "gpus": 4, "gpuFamily": "blackwell"}}}
    )

    def both_sets() -> list | None:
        found = custom_objects.list_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL)["items"]
        return found if {o["metadata"]["name"] for o in found} == {"grow-base", "grow-spec"} else None

    wait_until(both_sets, timeout=60, message="LeaderWorkerSets grow-base and grow-spec")
    time.sleep(3)  # a few operator steps with no group pod yet
    assert {d.metadata.name for d in apps_v1.list_namespaced_deployment(namespace).items} == {"grow-base", "grow-spec"}
    assert core_v1.read_namespaced_service("grow", namespace).spec.selector == stable_before  # still the Deployments' pods
    st = status(custom_objects, namespace, "grow")
    assert "come up beside the Deployments" in st["message"], st["message"]

    owner = get(custom_objects, namespace, "grow")
    for lws_name in ("grow-base", "grow-spec"):
        play_the_lws_controller(core_v1, custom_objects, namespace, owner, lws_name)

    def leader_ready() -> bool:
        pod = core_v1.read_namespaced_pod("grow-base-0", namespace)
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

    # Poll until the Deployments are gone: they must still exist while no base group is Ready.
    deadline = time.monotonic() + 90
    while apps_v1.list_namespaced_deployment(namespace).items:
        assert time.monotonic() < deadline, "the Deployments were never deleted"
        ready_now = leader_ready()
        selector = core_v1.read_namespaced_service("grow", namespace).spec.selector
        if not ready_now:
            assert selector == stable_before, f"the stable Service left the Deployments' pods before a group was Ready: {selector}"
        time.sleep(0.2)
    assert leader_ready(), "the Deployments were deleted before the base group was Ready"
    selector = wait_until(
        lambda: (s := core_v1.read_namespaced_service("grow", namespace).spec.selector).get(m.LABEL_ROLE) and s, timeout=30, message="leaders"
    )
    assert selector[m.LABEL_ROLE] == m.ROLE_LEADER and selector[m.LABEL_INSTANCE] == "grow"
    # The garbage collector took the Deployments' pods; the groups' pods stay.
    wait_until(
        lambda: all(
            m.LABEL_ROLE in (p.metadata.labels or {}) for p in core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_INSTANCE}=grow").items
        ),
        timeout=60,
        message="the Deployments' pods gone",
    )
    wait_until(lambda: "resources.nodes changed" not in status(custom_objects, namespace, "grow").get("message", ""), timeout=30, message="status")
