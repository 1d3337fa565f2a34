"""Multi-node servers in the lifecycle: each variant a LeaderWorkerSet, Services selecting leaders, a group judged
by its leader; without the LeaderWorkerSet CRD the spec is refused (LeaderWorkerSetMissing) and nothing is written."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from specdec_operator import manifests as m
from specdec_operator.controller.kopf_tuning import slim_leader_worker_set, slim_pod
from specdec_operator.reconcile import Observed, reconcile
from specdec_operator.reconcile.diff import needs_apply
from specdec_operator.resource import parse_spec
from tests.support.multinode import KIMI, kubelet_expand, parsed
from tests.support.runtime import LOG, Cluster
from tests.support.world import NOW, UID, promote_result

COMPATIBLE = json.dumps({"compatible": True, "findings": []})


class GroupWorld:
    """Children applied by plans (by kind), group pods made from the LeaderWorkerSets' templates by the test."""

    def __init__(self, spec: dict, name: str = "kimi") -> None:
        self.spec = parse_spec(spec)
        self.name = name
        self.status: dict = {}
        self.children: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []
        self.probe_running: str | None = None

    def step(self, **observed: Any):
        servers = {n: obj for (kind, n), obj in self.children.items() if kind == m.LWS_KIND}
        services = {n: obj for (kind, n), obj in self.children.items() if kind == "Service"}
        obs = Observed(
            name=self.name,
            namespace="ns",
            uid=UID,
            generation=1,
            deployments=copy.deepcopy(servers),
            services=copy.deepcopy(services),
            pods=copy.deepcopy(self.pods),
            probe_running=observed.pop("probe_running", self.probe_running),
            **observed,
        )
        plan = reconcile(self.spec, obs, copy.deepcopy(self.status), NOW)
        for obj in plan.apply:
            obj = copy.deepcopy(obj)
            if m.is_replicas_only(obj):  # a merge patch of spec.replicas (kubewriter): the templates stay
                self.children[(obj["kind"], obj["metadata"]["name"])]["spec"]["replicas"] = obj["spec"]["replicas"]
                continue
            obj["metadata"]["ownerReferences"] = [{"uid": UID}]
            self.children[(obj["kind"], obj["metadata"]["name"])] = obj
        self.status = plan.status
        return plan

    def group_pods(self, variant: str, *, ready: bool, group: int = 0) -> None:
        lws = self.children[(m.LWS_KIND, m.child_name(self.name, variant))]
        lwt = lws["spec"]["leaderWorkerTemplate"]
        for rank in range(lwt["size"]):
            template = lwt["leaderTemplate"] if rank == 0 else lwt["workerTemplate"]
            status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}], "podIP": f"10.0.{group}.{rank}"}
            if variant == "speculative" and rank == 0:
                status["initContainerStatuses"] = [{"name": m.VALIDATOR_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": COMPATIBLE}}}]
            labels = {**template["metadata"]["labels"], m.LWS_LABEL_GROUP_INDEX: str(group), m.LWS_LABEL_WORKER_INDEX: str(rank)}
            name = f"{lws['metadata']['name']}-{group}" + (f"-{rank}" if rank else "")
            self.pods.append(
                {"metadata": {"name": name, "labels": labels, "annotations": dict(template["metadata"]["annotations"])}, "status": status}
            )


def test_a_multi_node_spec_gets_a_leaderworkerset_per_variant_and_services_that_select_leaders(server_parser) -> None:
    world = GroupWorld(KIMI)
    plan = world.step()
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in plan.apply)
    assert kinds == [(m.LWS_KIND, "kimi-base"), (m.LWS_KIND, "kimi-spec"), ("Service", "kimi"), ("Service", "kimi-base"), ("Service", "kimi-spec")]
    for svc in ("kimi", "kimi-base", "kimi-spec"):
        assert world.children[("Service", svc)]["spec"]["selector"][m.LABEL_ROLE] == m.ROLE_LEADER
    for variant in ("base", "speculative"):
        lws = world.children[(m.LWS_KIND, m.child_name("kimi", variant))]
        assert lws["apiVersion"] == m.LWS_API_VERSION and lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        # Each rank's command, expanded as the kubelet does with what the LeaderWorkerSet webhook injects, is one
        # SGLang's parser accepts with that rank.
        for rank, template in enumerate(
            (lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"], lws["spec"]["leaderWorkerTemplate"]["workerTemplate"])
        ):
            env = {"LWS_LEADER_ADDRESS": "kimi-spec-0.kimi-spec.ns", "LWS_WORKER_INDEX": str(rank)}
            args = parsed(server_parser, world.spec, kubelet_expand(template["spec"]["containers"][0]["command"], env))
            assert (args.nnodes, args.node_rank, args.tp_size) == (2, rank, 16)
    # Nothing changes: nothing is applied again (the slim copy the index keeps says so too).
    assert world.step().apply == []
    for (kind, _), obj in world.children.items():
        if kind == m.LWS_KIND:
            assert not needs_apply(obj, slim_leader_worker_set(obj))


def test_a_group_is_judged_by_its_leader_and_a_rollback_scales_the_speculative_set_to_zero() -> None:
    world = GroupWorld({**KIMI, "rollout": {"keepBaseWarm": False}})
    world.step()
    # Workers Ready, leaders not: no server is Ready.
    world.group_pods("base", ready=False)
    world.group_pods("speculative", ready=False)
    for pod in world.pods:
        if pod["metadata"]["labels"][m.LABEL_ROLE] == m.ROLE_WORKER:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    plan = world.step()
    assert not plan.starts_probe and world.status["phase"] != "Probing"
    world.pods = []
    world.group_pods("base", ready=True)
    world.group_pods("speculative", ready=True)
    plan = world.step()
    assert plan.starts_probe and world.status["phase"] == "Probing"
    world.probe_running = plan.revision
    result = {**promote_result(plan.revision), "decision": "rollback", "reason": "SpeedupBelowThreshold", "message": "0.9x"}
    plan = world.step(probe_result=result)
    assert world.status["phase"] == "RolledBack"
    # The speculative group goes as one: its LeaderWorkerSet asks for no group (the controller deletes the leader and
    # its workers together); the base keeps its group.
    assert world.children[(m.LWS_KIND, "kimi-spec")]["spec"]["replicas"] == 0
    assert world.children[(m.LWS_KIND, "kimi-base")]["spec"]["replicas"] == 1
    assert world.children[("Service", "kimi")]["spec"]["selector"] == {**m.selector_labels("kimi", "base"), m.LABEL_ROLE: m.ROLE_LEADER}


class GroupCluster(Cluster):
    """test_execute's Cluster whose API server serves LeaderWorkerSets or not."""

    def __init__(self, spec: dict, served: bool) -> None:
        super().__init__(spec)
        self.served = served
        self.asked = 0

        async def served_fn(group_version: str, plural: str) -> bool:
            self.asked += 1
            assert (group_version, plural) == (m.LWS_API_VERSION, m.LWS_PLURAL)
            return self.served

        self.writer.served = served_fn  # type: ignore[attr-defined]

    def step(self):
        async def run():
            body = {**self.body, "status": copy.deepcopy(self.writer.status)}
            servers = [c for c in self.writer.children.values() if c["kind"] in ("Deployment", m.LWS_KIND)]
            services = [c for c in self.writer.children.values() if c["kind"] == "Service"]
            return await self.runtime.step(body, [], copy.deepcopy(servers), copy.deepcopy(services), LOG)

        return asyncio.run(run())


def test_without_the_crd_a_multi_node_spec_is_refused_with_a_condition_and_nothing_is_written() -> None:
    spec = copy.deepcopy(KIMI)
    cluster = GroupCluster(spec, served=False)
    assert cluster.step() is None and cluster.step() is None
    st = cluster.writer.status
    assert st["phase"] == "Failed" and st["reason"] == "LeaderWorkerSetMissing"
    assert m.LWS_CRD_NAME in st["message"] and "install the LeaderWorkerSet controller" in st["message"]
    (ready,) = [c for c in st["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "LeaderWorkerSetMissing" and ready["message"] == st["message"]
    assert [(e.type, e.reason) for e in cluster.writer.events] == [("Warning", "LeaderWorkerSetMissing")]
    assert cluster.writer.children == {}  # no child created
    assert cluster.asked == 1  # discovery is cached
    # The CRD is installed: once the cached answer is old, the spec is served.
    cluster.served = True
    cluster.runtime._lws_served = None
    plan = cluster.step()
    assert plan is not None
    assert {k for k in cluster.writer.children if k[0] == m.LWS_KIND} == {(m.LWS_KIND, "llama-base"), (m.LWS_KIND, "llama-spec")}
    assert not any(k[0] == "Deployment" for k in cluster.writer.children)
    assert cluster.writer.status["phase"] != "Failed"


def test_an_existing_single_node_fleet_is_left_as_it_is_when_nodes_goes_up_without_the_crd() -> None:
    from tests.support.runtime import llama_spec

    spec = llama_spec()
    cluster = GroupCluster(spec, served=False)
    cluster.step()
    before = copy.deepcopy(cluster.writer.children)
    assert ("Deployment", "llama-base") in before
    calls = len(cluster.writer.calls)
    cluster.body = {
        **cluster.body,
        "metadata": {**cluster.body["metadata"], "generation": 2},
        "spec": {**spec, "resources": {**spec["resources"], "nodes": 2}},
    }
    assert cluster.step() is None
    assert cluster.writer.children == before  # the base (and everything else) untouched
    assert [c for c in cluster.writer.calls[calls:] if c[0] not in ("status", "event")] == []
    assert cluster.writer.status["reason"] == "LeaderWorkerSetMissing"


def test_group_state_counts_groups_by_their_leaders_for_the_walk() -> None:
    from specdec_operator import rollout
    from specdec_operator.api import Variant
    from specdec_operator.reconcile.pods import group_state

    def pod(group: int, role: str, ready: bool, deleting: bool = False) -> dict:
        labels = {m.LABEL_VARIANT: "speculative", m.LABEL_ROLE: role, m.LWS_LABEL_GROUP_INDEX: str(group)}
        meta = {"name": f"g{group}-{role}", "labels": labels, **({"deletionTimestamp": "x"} if deleting else {})}
        return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    pods = [pod(0, "leader", True), pod(0, "worker", True), pod(1, "leader", False), pod(1, "worker", True), pod(2, "leader", True)]
    state = group_state(3, pods, Variant.SPECULATIVE)
    assert (state.desired, state.pods, state.ready, state.terminating) == (3, 3, 2, 0)
    assert state.ready_by_index == (True, False, True)
    # A LeaderWorkerSet scaled to 2 removes group 2, Ready or not: one Ready group is left, not two.
    assert state.ready_kept(2) == 1
    # So the walk does not shrink it below the floor (3 servers, maxUnavailable 1: 2 Ready at least).
    fleet = rollout.FleetState(base=rollout.VariantState(desired=0, pods=0, ready=0), speculative=state)
    assert rollout.plan_step(rollout.Counts(base=0, speculative=2), fleet, replicas=3, max_surge=0, max_unavailable=1).speculative == 3
    leaving = group_state(2, [pod(0, "leader", True), pod(1, "leader", True, deleting=True)], Variant.SPECULATIVE)
    assert (leaving.pods, leaving.ready, leaving.terminating, leaving.ready_by_index) == (2, 1, 1, (True, False))


class KindWorld:
    """Children of both kinds (by kind and name), as the handlers observe them: the spec's kind as the servers, the
    other kind as retiring; deleting an object takes its pods with it (the garbage collector)."""

    def __init__(self, spec: dict, name: str = "llama") -> None:
        self.spec_dict = spec
        self.name = name
        self.status: dict = {}
        self.children: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []
        self.deleted: list[tuple[str, str]] = []

    def step(self, **observed: Any):
        spec = parse_spec(self.spec_dict)
        serving = m.LWS_KIND if m.multi_node(spec) else "Deployment"
        servers = {n: o for (k, n), o in self.children.items() if k == serving}
        retiring = {n: o for (k, n), o in self.children.items() if k in ("Deployment", m.LWS_KIND) and k != serving}
        services = {n: o for (k, n), o in self.children.items() if k == "Service"}
        obs = Observed(
            name=self.name,
            namespace="ns",
            uid=UID,
            generation=1,
            deployments=copy.deepcopy(servers),
            retiring=copy.deepcopy(retiring),
            services=copy.deepcopy(services),
            pods=copy.deepcopy(self.pods),
            **observed,
        )
        plan = reconcile(spec, obs, copy.deepcopy(self.status), NOW)
        for obj in plan.apply:
            obj = copy.deepcopy(obj)
            obj["metadata"]["ownerReferences"] = [{"uid": UID}]
            self.children[(obj["kind"], obj["metadata"]["name"])] = obj
        for obj in plan.delete:
            self.deleted.append((obj["kind"], obj["metadata"]["name"]))
            self.children.pop((obj["kind"], obj["metadata"]["name"]), None)
        self.status = plan.status
        return plan

    def deployment_pod(self, variant: str) -> None:
        template = self.children[("Deployment", m.child_name(self.name, variant))]["spec"]["template"]
        status = {"conditions": [{"type": "Ready", "status": "True"}]}
        if variant == "speculative":
            status["initContainerStatuses"] = [{"name": m.VALIDATOR_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": COMPATIBLE}}}]
        meta = {"name": f"{variant}-pod", "labels": dict(template["metadata"]["labels"]), "annotations": dict(template["metadata"]["annotations"])}
        self.pods.append(slim_pod({"metadata": meta, "spec": template["spec"], "status": status}))  # the operator's index copy

    def group_pods(self, variant: str) -> None:
        lwt = self.children[(m.LWS_KIND, m.child_name(self.name, variant))]["spec"]["leaderWorkerTemplate"]
        for rank in range(lwt["size"]):
            template = lwt["leaderTemplate"] if rank == 0 else lwt["workerTemplate"]
            labels = {**template["metadata"]["labels"], m.LWS_LABEL_GROUP_INDEX: "0", m.LWS_LABEL_WORKER_INDEX: str(rank)}
            meta = {"name": f"{variant}-0-{rank}", "labels": labels, "annotations": dict(template["metadata"]["annotations"])}
            self.pods.append(slim_pod({"metadata": meta, "spec": template["spec"], "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))

    def gone(self, kind: str) -> None:
        """The garbage collector removed the pods of the deleted objects."""
        self.pods = [p for p in self.pods if (m.LABEL_ROLE in p["metadata"]["labels"]) == (kind == "Deployment")]


def one_node(**changes: Any) -> dict:
    from tests.support.world import llama_spec

    return llama_spec(**{"rollout.keepBaseWarm": False, **changes})


def two_nodes(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    spec.setdefault("resources", {}).update({"nodes": 2, "gpus": 4, "gpuFamily": "blackwell"})
    return spec


def test_nodes_1_to_2_with_max_surge_0_deletes_the_deployments_first_and_asks_for_groups_once_their_pods_are_gone() -> None:
    world = KindWorld(one_node())
    world.step()
    world.deployment_pod("base")
    world.deployment_pod("speculative")
    world.step()
    world.spec_dict = two_nodes(world.spec_dict)
    plan = world.step()
    assert sorted(world.deleted) == [("Deployment", "llama-base"), ("Deployment", "llama-spec")]
    groups = {n: o["spec"]["replicas"] for (k, n), o in world.children.items() if k == m.LWS_KIND}
    assert groups == {"llama-base": 0, "llama-spec": 0}  # the Deployments' pods still hold their GPUs
    assert "no room for the LeaderWorkerSets beside the Deployments" in plan.status["message"]
    # and status.gpus counts them, each with its own (1 GPU, not the 2 x 4 of the new spec)
    assert (plan.status["gpus"]["base"], plan.status["gpus"]["speculative"]) == (1, 1)
    world.gone("Deployment")
    plan = world.step()
    groups = {n: o["spec"]["replicas"] for (k, n), o in world.children.items() if k == m.LWS_KIND}
    assert groups == {"llama-base": 1, "llama-spec": 1} and not plan.delete
    assert world.children[("Service", "llama")]["spec"]["selector"][m.LABEL_ROLE] == m.ROLE_LEADER
    assert "resources.nodes changed" not in plan.status["message"]


def test_nodes_1_to_2_with_room_keeps_the_deployments_serving_until_a_group_is_ready_and_back() -> None:
    world = KindWorld(one_node(**{"rollout.maxSurge": 1}))
    world.step()
    world.deployment_pod("base")
    world.deployment_pod("speculative")
    world.step()
    stable = copy.deepcopy(world.children[("Service", "llama")])
    world.spec_dict = two_nodes(world.spec_dict)
    plan = world.step()
    assert not plan.delete and not world.deleted
    groups = {n: o["spec"]["replicas"] for (k, n), o in world.children.items() if k == m.LWS_KIND}
    assert groups == {"llama-base": 1, "llama-spec": 1}  # beside the Deployments
    assert world.children[("Service", "llama")] == stable  # still the Deployments' pods
    assert "come up beside the Deployments" in plan.status["message"]
    world.group_pods("speculative")
    assert not world.step().delete  # a speculative group Ready is not the base that serves while undecided
    world.group_pods("base")
    plan = world.step()
    assert sorted(world.deleted) == [("Deployment", "llama-base"), ("Deployment", "llama-spec")]
    assert world.children[("Service", "llama")]["spec"]["selector"] == {**m.selector_labels("llama", "base"), m.LABEL_ROLE: m.ROLE_LEADER}
    # Services first, then the deletions (controller/execute.py deletes after the applies).
    assert any(o["kind"] == "Service" and o["metadata"]["name"] == "llama" for o in plan.apply)
    world.gone("Deployment")
    # And back to one node: the LeaderWorkerSets serve until a Deployment's base pod is Ready.
    world.deleted = []
    world.spec_dict = one_node(**{"rollout.maxSurge": 1})
    plan = world.step()
    assert not plan.delete and ("Deployment", "llama-base") in world.children
    assert world.children[("Service", "llama")]["spec"]["selector"][m.LABEL_ROLE] == m.ROLE_LEADER
    world.deployment_pod("base")
    plan = world.step()
    assert sorted(world.deleted) == [(m.LWS_KIND, "llama-base"), (m.LWS_KIND, "llama-spec")]
    assert world.children[("Service", "llama")]["spec"]["selector"] == m.selector_labels("llama", "base")
