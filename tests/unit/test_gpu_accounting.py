"""status.gpus from what the operator really holds: its Kopf index copies of the pods (kopf_tuning.slim_pod), which
keep each container's extended resources and nothing else of the pod spec (issue 33: they kept no spec, so every
count was 0 in the running operator)."""

from __future__ import annotations

from specdec_operator import manifests as m
from specdec_operator.controller.kopf_tuning import extended_resource, slim_pod
from specdec_operator.reconcile.gpus import pod_gpus
from tests.support.world import COMPATIBLE, World, llama_spec, promote_result, to_promoted


def rendered_pod(world: World, variant: str) -> dict:
    """A pod as the API server hands it to the operator: the rendered template's spec, whole."""
    template = world.template(variant)
    return {"metadata": {"name": f"{variant}-0", "labels": dict(template["metadata"]["labels"])}, "spec": template["spec"], "status": {}}


def test_the_index_copy_keeps_the_gpus_a_rendered_pod_asks_for_and_nothing_else_of_its_spec():
    world = World(llama_spec(**{"resources.gpus": 8, "resources.cpu": "16", "resources.memory": "64Gi"}))
    world.step()
    full = rendered_pod(world, "speculative")
    assert full["spec"]["initContainers"] and full["spec"]["volumes"]  # what the copy drops
    slim = slim_pod(full)
    assert pod_gpus(slim) == 8
    (container,) = slim["spec"]["containers"]
    assert container["resources"] == {"limits": {m.GPU_RESOURCE: "8"}, "requests": {m.GPU_RESOURCE: "8"}}
    assert set(slim["spec"]) == {"containers"} and set(container) == {"name", "resources"}


def test_a_pod_without_extended_resources_keeps_no_spec_and_holds_no_gpu():
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "init", "resources": {"limits": {m.GPU_RESOURCE: "1"}}}],
            "containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "1Gi"}}}],
        },
        "status": {"phase": "Running"},
    }
    slim = slim_pod(pod)
    assert "spec" not in slim and pod_gpus(slim) == 0


def test_gpus_are_read_from_limits_or_else_requests_summed_over_containers():
    pod = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {m.GPU_RESOURCE: "2"}}},
                {"name": "b", "resources": {"limits": {m.GPU_RESOURCE: 4, "example.com/rdma": "1"}}},
                {"name": "c", "resources": {"limits": {"cpu": "2"}}},
            ]
        }
    }
    slim = slim_pod(pod)
    assert pod_gpus(slim) == 6
    assert [c["name"] for c in slim["spec"]["containers"]] == ["a", "b"]
    assert slim["spec"]["containers"][1]["resources"]["limits"] == {m.GPU_RESOURCE: "4", "example.com/rdma": "1"}


def test_extended_resources_are_domain_prefixed_names_outside_kubernetes_io():
    assert extended_resource("nvidia.com/gpu") and extended_resource("rdma/hca_shared_devices_a")
    assert not any(extended_resource(n) for n in ("cpu", "memory", "ephemeral-storage", "hugepages-1Gi", "kubernetes.io/x", "node.kubernetes.io/y"))


def test_a_promoted_server_with_a_warm_base_shows_the_base_gpus_as_idle():
    world = World(llama_spec(**{"resources.gpus": 4}))  # keepBaseWarm true (the default)
    promoted = to_promoted(world)
    assert promoted.status["phase"] == "Promoted"
    assert promoted.status["gpus"] == {"base": 4, "speculative": 4, "idle": 4}


def test_while_probing_both_servers_hold_their_gpus_and_none_is_idle():
    world = World(llama_spec(**{"resources.gpus": 4}))
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert plan.starts_probe
    world.probe_running = plan.revision
    probing = world.step()
    assert probing.status["phase"] == "Probing"
    assert probing.status["gpus"] == {"base": 4, "speculative": 4, "idle": 0}


def test_a_promoted_server_without_a_warm_base_holds_idle_gpus_only_while_the_base_pod_goes():
    world = World(llama_spec(**{"resources.gpus": 4, "rollout.keepBaseWarm": False}))
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    world.probe_running = plan.revision
    promoted = world.step(probe_result=promote_result(plan.revision))
    world.probe_running = None
    assert promoted.status["phase"] == "Promoted" and world.deployments["llama-base"]["spec"]["replicas"] == 0
    base = next(p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == "base")
    base["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:05Z"  # scaled to 0: terminating, still holding its GPUs
    assert world.step().status["gpus"] == {"base": 4, "speculative": 4, "idle": 4}
    world.pods.remove(base)
    assert world.step().status["gpus"] == {"base": 0, "speculative": 4, "idle": 0}


def test_a_terminating_pod_of_an_older_template_counts_with_its_own_gpus():
    world = World(llama_spec(**{"resources.gpus": 4}))
    to_promoted(world)
    world.spec_dict["resources"]["gpus"] = 8  # a new revision: new templates ask for 8
    world.generation += 1
    world.step()
    assert world.template("base")["spec"]["containers"][0]["resources"]["limits"][m.GPU_RESOURCE] == "8"
    old_base = next(p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == "base")
    old_base["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:05Z"
    world.add_pod("base", ready=True)  # the new template's pod
    validating = world.step().status
    assert validating["phase"] == "Validating" and validating["activeVariant"] == "base"
    # Base: the old pod's own 4 (idle while it goes) and the new one's 8; the speculative server of the old
    # revision (4) serves no traffic and is not probed while the new one validates: idle.
    assert validating["gpus"] == {"base": 4 + 8, "speculative": 4, "idle": 4 + 4}
