"""Multi-node servers on the real control plane, with the real `specdec run` process.

1. Without the LeaderWorkerSet CRD a multi-node spec is refused (phase Failed, Ready False, reason
   LeaderWorkerSetMissing, a Warning Event saying what to install); nothing is created, and an existing fleet's
   children are left as they are.
2. With a CRD installed, the same resource goes on by itself (the operator asks API discovery again): it creates one
   LeaderWorkerSet per variant whose ranks SGLang's parser accepts, the probe decides, and a rollback scales the
   speculative LeaderWorkerSet to 0 groups: the speculative group goes as one.

The LeaderWorkerSet CRD and controller are the real ones (sigs.k8s.io/lws at hack/versions.env's LWS_VERSION, built
by `hack/tools.sh lws`, run by devcluster.start_lws): the test stops them to see the refusal, starts them to see the
resource go on, and the controller makes each group's leader and worker pods (kwok runs them), with the ranks and
the leader's address its webhook injects.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from hack import devcluster
from specdec_operator import manifests as m
from specdec_operator import sglang as sglang_args
from specdec_operator.resource import parse_spec
from tests.support.kube import wait_until
from tests.support.multinode import kubelet_expand
from tests.support.operator_process import GROUP, LLAMA_EAGLE3_SCRIPT, PLURAL, VERSION, Operator, compatible_annotations, events, example, get, status

pytestmark = pytest.mark.cluster

LWS_GROUP, LWS_VERSION = m.LWS_API_VERSION.split("/")


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
def lws(kube_cluster: Any) -> Any:
    """The real LeaderWorkerSet controller and CRD: stopped and removed at the start (a session may have started them),
    started again by calling the fixture's value."""
    if kube_cluster.name == "external":
        pytest.skip("a SPECDEC_KUBECONFIG cluster: its LeaderWorkerSet controller cannot be stopped and started here")
    if devcluster.lws_tool_missing(kube_cluster.tools):  # `make test` builds it: a missing one is a setup error
        pytest.fail(
            f"the LeaderWorkerSet controller is not built in {kube_cluster.tools}: run `hack/tools.sh lws` (or `make tools LWS=1`)", pytrace=False
        )
    devcluster.stop_lws(kube_cluster)

    def start() -> None:
        devcluster.start_lws(kube_cluster, tie_to_parent=True)

    return start


def group_pods(core_v1: Any, namespace: str, lws_name: str) -> dict[str, Any]:
    """The pods the controller made for a LeaderWorkerSet's groups, by name."""
    return {p.metadata.name: p for p in core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LWS_LABEL_NAME}={lws_name}").items}


def server_env(pod: Any) -> dict[str, str]:
    (container,) = [c for c in pod.spec.containers if c.name == m.SERVER_CONTAINER]
    return {e.name: e.value for e in container.env or [] if e.value is not None}


def test_without_the_crd_a_multi_node_spec_is_refused_and_with_it_leaderworkersets_are_made_and_rolled_back_as_groups(
    lws: Any,
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
    # The probe decides on scripted evidence of that drafter (acceptance 1.0: DrafterNotAccepting): the test is about
    # the LeaderWorkerSets a decision makes and removes, not about measuring.
    operator.script("kimi", speedup=1.0, acceptLength=1.0)
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

    # The controller and its CRD arrive: within the discovery recheck (30 s) the operator makes one LeaderWorkerSet
    # per variant.
    installed = time.monotonic()
    lws()

    def both_sets() -> list | None:
        found = custom_objects.list_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL)["items"]
        return found if {o["metadata"]["name"] for o in found} == {"kimi-base", "kimi-spec"} else None

    sets = {o["metadata"]["name"]: o for o in wait_until(both_sets, timeout=90, message="LeaderWorkerSets kimi-base and kimi-spec")}
    print(f"\nCRD installed -> both LeaderWorkerSets: {time.monotonic() - installed:.1f} s")
    assert status(custom_objects, namespace, "kimi")["phase"] != "Failed"
    owner = get(custom_objects, namespace, "kimi")
    parsed_spec = parse_spec(owner["spec"])
    for lws_object in sets.values():
        assert lws_object["spec"]["replicas"] == 1 and lws_object["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert lws_object["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    for svc in ("kimi", "kimi-base", "kimi-spec"):
        selector = wait_until(lambda svc=svc: core_v1.read_namespaced_service(svc, namespace).spec.selector, timeout=30, message=f"Service {svc}")
        assert selector[m.LABEL_ROLE] == m.ROLE_LEADER

    # The controller makes each group's leader and worker; its webhook gives each its rank and the leader's address,
    # and the kubelet's expansion of our command with them is one SGLang's parser accepts.
    nodes: dict[str, str] = {}
    for lws_name in ("kimi-base", "kimi-spec"):
        pods = wait_until(
            lambda lws_name=lws_name: (
                (p := group_pods(core_v1, namespace, lws_name)).keys() == {f"{lws_name}-0", f"{lws_name}-0-1"}
                and all(pod.spec.node_name for pod in p.values())
                and p
            ),
            timeout=60,
            message=f"{lws_name}: a leader and a worker, scheduled",
        )
        nodes.update({name: pod.spec.node_name for name, pod in pods.items()})
        address = f"{lws_name}-0.{lws_name}-0.{namespace}"
        for rank, pod_name in enumerate((f"{lws_name}-0", f"{lws_name}-0-1")):
            pod = pods[pod_name]
            env = server_env(pod)
            assert env["LWS_LEADER_ADDRESS"] == address and env["LWS_WORKER_INDEX"] == str(rank), env
            argv = kubelet_expand(pod.spec.containers[0].command, env)
            args = ServerArgs.from_cli_args(server_parser.parse_args(argv[len(sglang_args.RELEASES[parsed_spec.sglang_version].entrypoint) :]))
            assert (args.nnodes, args.node_rank, args.tp_size) == (2, rank, 8)
            assert args.dist_init_addr == f"{address}:{sglang_args.DIST_INIT_PORT}"
        # The leader's address resolves before it is Ready: the group's own headless Service publishes it.
        headless = core_v1.read_namespaced_service(f"{lws_name}-0", namespace)
        assert headless.spec.cluster_ip == "None" and headless.spec.publish_not_ready_addresses

    # The probe (scripted) rolls back the drafter that accepts nothing: the speculative
    # LeaderWorkerSet goes to 0 groups at once, and the controller deletes the group, leader and worker together.
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
    wait_until(lambda: not group_pods(core_v1, namespace, "kimi-spec"), timeout=60, message="the speculative group's leader and worker deleted")
    assert custom_objects.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, m.LWS_PLURAL, "kimi-base")["spec"]["replicas"] == 1
    assert group_pods(core_v1, namespace, "kimi-base").keys() == {"kimi-base-0", "kimi-base-0-1"}
    assert core_v1.read_namespaced_service("kimi", namespace).spec.selector == {**m.selector_labels("kimi", "base"), m.LABEL_ROLE: m.ROLE_LEADER}
    # The ranks of each group ran on distinct Blackwell nodes (the group's anti-affinity, gpuFamily's affinity).
    for lws_name in ("kimi-base", "kimi-spec"):
        leader, worker = nodes.get(f"{lws_name}-0"), nodes.get(f"{lws_name}-0-1")
        assert leader and worker and leader != worker, nodes
        for node in (leader, worker):
            assert core_v1.read_node(node).metadata.labels["nvidia.com/gpu.family"] == "blackwell"


def test_nodes_1_to_2_replaces_the_deployments_with_leaderworkersets_and_deletes_them_once_a_group_serves(
    lws: Any, operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any
) -> None:
    lws()
    base = sims.start("llama31-8b-base", time_scale=10.0)
    spec_sim = sims.start("llama31-8b-eagle3", time_scale=10.0)
    operator.map("grow-base", base.url)
    operator.map("grow-spec", spec_sim.url)
    # Decided on scripted evidence (the profile's truth, about 2x): the test is about the change of kind that follows.
    operator.script("grow", **LLAMA_EAGLE3_SCRIPT)
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

    # The controller makes the groups' pods (kwok runs them). The Services move, and the Deployments go, once the new
    # kind serves the ACTIVE variant (reconcile/retire.py): grow-spec's group after a promotion, grow-base's after a
    # rollback. (This test once watched grow-base's whatever the decision, and failed when grow-spec's group was Ready
    # first.)
    active = "grow-spec" if status(custom_objects, namespace, "grow").get("activeVariant") == "speculative" else "grow-base"

    def leader_ready() -> bool:
        pod = group_pods(core_v1, namespace, active).get(f"{active}-0")  # none until the controller makes it
        return pod is not None and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

    # Poll until the Deployments are gone: they must still exist while the active variant's group is not Ready. The
    # Service is read before the pod: a group Ready once stays Ready here, so a moved Service with the group not Ready
    # after it is a Service that moved too early.
    deadline = time.monotonic() + 90
    while apps_v1.list_namespaced_deployment(namespace).items:
        assert time.monotonic() < deadline, "the Deployments were never deleted"
        selector = core_v1.read_namespaced_service("grow", namespace).spec.selector
        if not leader_ready():
            assert selector == stable_before, f"the stable Service left the Deployments' pods before {active}'s group was Ready: {selector}"
        time.sleep(0.2)
    assert leader_ready(), f"the Deployments were deleted before {active}'s group was Ready"
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
