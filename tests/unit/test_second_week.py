"""What a platform team hits in its second week (issue 34, item 1), each through the operator's own reconcile
(tests/support/world.py): the cause named, not a silent wait."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from specdec_operator import manifests as m
from specdec_operator.api import NEXTN_PATH_MESSAGE
from tests.support.world import COMPATIBLE, INCOMPATIBLE, NOW, World, conditions, llama_spec, promote_result, to_promoted

ROOT = Path(__file__).resolve().parents[2]


def _crd_messages() -> set[str]:
    crd = yaml.safe_load((ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text())
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                found.add(rule["message"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return found


def test_a_nextn_drafter_with_a_path_admitted_under_an_older_crd_is_refused_in_the_admission_rules_words():
    world = World(llama_spec(**{"drafter.algorithm": "NEXTN"}))  # drafter.path stays: the older CRD let it in
    assert world.spec.drafter.path
    plan = world.step()
    assert plan.refused and not plan.apply
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec", plan.status
    assert plan.status["message"] == NEXTN_PATH_MESSAGE
    assert NEXTN_PATH_MESSAGE in _crd_messages(), "the same words as admission"
    ready = conditions(plan.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    # Even where both servers were made and are Ready (admitted and served by an older operator): still refused.
    world = World(llama_spec(**{"drafter.algorithm": "NEXTN"}))
    world.spec_dict = llama_spec()
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.spec_dict = llama_spec(**{"drafter.algorithm": "NEXTN"})
    world.generation = 2
    plan = world.step()
    assert plan.status["phase"] == "Failed" and plan.status["message"] == NEXTN_PATH_MESSAGE


def _unschedulable(pod: dict) -> dict:
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available",
            }
        ],
    }
    return pod


def _holding_gpus(pod: dict, gpus: int = 1) -> dict:
    pod["spec"] = {"containers": [{"name": "sglang", "resources": {"limits": {m.GPU_RESOURCE: str(gpus)}}}]}
    return pod


def _promoted_alone(**changes) -> World:
    """A promoted one-server resource whose base was scaled to 0 (keepBaseWarm false): only the speculative pod runs."""
    world = World(llama_spec(**{"rollout.keepBaseWarm": False, **changes}))
    to_promoted(world)
    world.step()
    assert world.deployments["llama-base"]["spec"]["replicas"] == 0
    world.pods = [_holding_gpus(p) for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == "speculative"]
    world.step()
    return world


def _new_image(world: World, **changes) -> None:
    world.spec_dict = {**world.spec_dict, "image": "lmsysorg/sglang:v0.5.23-cu129"}
    for key, value in changes.items():
        world.spec_dict["rollout"][key] = value
    world.generation += 1


def test_a_new_image_on_a_promoted_one_server_resource_on_a_full_cluster_fails_fast_naming_the_old_pod_and_its_gpus():
    world = _promoted_alone()
    old_spec = world.template("speculative")
    _new_image(world)
    held = world.step()  # the new base beside the old speculative server, which serves until the base does
    assert world.deployments["llama-base"]["spec"]["replicas"] == 1
    assert held.status["phase"] == "Deploying" and held.status["reason"] == "WalkingToBase"
    world.add_pod("base")
    _unschedulable(world.pods[-1])
    blocked = world.step()
    assert blocked.status["phase"] == "Failed" and blocked.status["reason"] == "UpdateBlocked", blocked.status
    message = blocked.status["message"]
    assert "old speculative pod llama-speculative-1 (1 nvidia.com/gpu) holds its GPUs" in message, message
    assert "Insufficient nvidia.com/gpu" in message and "updateStrategy: Recreate" in message
    assert ("Warning", "UpdateBlocked") in [(e.type, e.reason) for e in blocked.events]
    # Nothing is taken from what serves: the old speculative server keeps its template and the traffic.
    assert world.template("speculative") == old_spec and world.deployments["llama-spec"]["spec"]["replicas"] == 1
    assert world.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "speculative"
    assert conditions(blocked.status)["Ready"]["status"] == "True"
    assert not [e for e in world.step().events if e.reason == "UpdateBlocked"], "announced once"


def test_update_strategy_recreate_frees_the_old_servers_gpus_first_then_the_base_then_the_speculative_server():
    world = _promoted_alone()
    old_spec = world.template("speculative")
    _new_image(world, updateStrategy="Recreate")
    plan = world.step()
    # The old server goes first (its template kept: a replicas-only write); the new base is asked for.
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0 and world.template("speculative") == old_spec
    assert world.deployments["llama-base"]["spec"]["replicas"] == 1
    assert plan.status["reason"] != "UpdateBlocked"
    world.pods = []  # the old pod is gone; the new base pod loads
    world.add_pod("base")
    loading = world.step()
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0, "the speculative server waits for the base"
    assert conditions(loading.status)["Ready"]["status"] == "False"  # the documented downtime
    world.pods = []
    world.add_pod("base", ready=True)
    serving = world.step()
    assert world.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "base"
    assert conditions(serving.status)["Ready"]["status"] == "True"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1 and world.template("speculative") != old_spec


def test_update_strategy_defaults_to_rolling_update_and_is_in_the_crd():
    assert World(llama_spec()).spec.rollout.update_strategy == "RollingUpdate"
    crd = yaml.safe_load((ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text())
    rollout = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rollout"]["properties"]
    assert rollout["updateStrategy"]["enum"] == ["RollingUpdate", "Recreate"]
    assert "downtime" in rollout["updateStrategy"]["description"]


def test_a_change_of_cause_without_progress_keeps_the_deadline_clock_running():
    deadline = 3600
    world = World(llama_spec(progressDeadlineSeconds=deadline))
    world.step()
    pod = _unschedulable(world.add_pod("base"))
    first = world.step()
    assert first.status["waitingFor"] == "the base server (Unschedulable)"
    # Scheduled at last, but its image cannot be pulled: another cause, no progress.
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "sglang", "image": "registry.example/sglang:bad", "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
    }
    moved = world.step(now=NOW + timedelta(seconds=deadline * 2 // 3))
    assert moved.status["waitingFor"] == "the base server (ImageNotPulled)"
    assert moved.status["waitingSince"] == first.status["waitingSince"], "the clock keeps running"
    failed = world.step(now=NOW + timedelta(seconds=deadline + 10))
    assert failed.status["phase"] == "Failed" and failed.status["reason"] == "ProgressDeadlineExceeded", failed.status
    assert "ImageNotPulled" in failed.status["message"] or "cannot be pulled" in failed.status["message"]
    # Real progress (the server loads) starts the clock again.
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "sglang", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-02T11:00:20Z"}}}],
    }
    loading = world.step(now=NOW + timedelta(seconds=deadline + 20))
    assert loading.status["waitingFor"] == "the base server (Loading)"
    assert loading.status["waitingSince"] != first.status["waitingSince"]


def test_the_runtime_reads_events_of_the_waiting_pods_each_variants_newest_first():
    """Runtime.pod_events hands the writer the waiting pods themselves (it selects their Events on the API server):
    each variant's newest pod first, so stuck.py's pod is always among them."""
    import asyncio

    from specdec_operator.controller.kubewriter import MAX_DIAGNOSED_PODS
    from specdec_operator.controller.runtime import Runtime

    asked: list[list[str]] = []

    class Writer:
        async def pod_warnings(self, namespace, pods):
            asked.append([p["metadata"]["name"] for p in pods])
            return []

    def pod(name: str, variant: str, created: str) -> dict:
        labels = {m.LABEL_VARIANT: variant}
        return {"metadata": {"name": name, "uid": f"u-{name}", "labels": labels, "creationTimestamp": created}, "status": {"phase": "Pending"}}

    runtime = Runtime.__new__(Runtime)
    runtime.writer = Writer()
    pods = [pod(f"base-{i}", "base", f"2026-12-02T10:{i:02d}:00Z") for i in range(MAX_DIAGNOSED_PODS + 4)]
    pods.append(pod("spec-old", "speculative", "2026-12-02T09:00:00Z"))
    pods.append(pod("spec-new", "speculative", "2026-12-02T09:30:00Z"))
    asyncio.run(runtime.pod_events("ns", pods))
    (names,) = asked
    assert len(names) == MAX_DIAGNOSED_PODS
    assert set(names[:2]) == {"spec-new", f"base-{MAX_DIAGNOSED_PODS + 3}"}
    assert "spec-old" not in names


def test_a_loser_scaled_to_0_says_why_not_keep_base_warm():
    # One server rolled back: the speculative server lost; keepBaseWarm has nothing to do with it.
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    world.probe_running = plan.revision
    lost = {**promote_result(plan.revision, speedup=0.8), "decision": "rollback", "reason": "SpeedupBelowThreshold", "message": "speedup 0.8x"}
    rolled = world.step(probe_result=lost)
    assert rolled.status["phase"] == "RolledBack" and world.deployments["llama-spec"]["spec"]["replicas"] == 0
    world.probe_running = None
    world.set_pods(base={"ready": True})  # the speculative pod is gone
    rolled = world.step()
    speculative = conditions(rolled.status)["SpeculativeReady"]
    assert speculative["reason"] == "ScaledDown"
    assert speculative["message"] == "scaled to 0: rolled back (SpeedupBelowThreshold); rollout.keepSpeculativeWarm is false", speculative
    # A promoted fleet's base: walked to the speculative servers although keepBaseWarm is true (the default).
    from tests.unit.test_fleet import Fleet, fleet_spec

    fleet = Fleet(fleet_spec(2))
    fleet.spec_dict["rollout"]["keepBaseWarm"] = True
    fleet.promote()
    done = fleet.run(lambda p: p.settled)
    base = conditions(done.status)["BaseReady"]
    assert base["reason"] == "ScaledDown" and "keepBaseWarm is false" not in base["message"], base
    assert "the fleet walked to the speculative servers" in base["message"]


def test_an_empty_model_volume_is_named_as_such_not_as_an_incompatible_drafter():
    from specdec_operator.validator.report import unusable_message

    line = "target.path /models/llama-3.1-8b does not exist: is the model volume empty? (stage the weights before applying)"
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"init": (2, unusable_message(line))})
    plan = world.step()
    assert plan.status["phase"] == "Invalid" and plan.status["reason"] == "ValidatorInputError", plan.status
    assert "drafter incompatible" not in plan.status["message"]
    assert "could not be validated (ValidatorInputError: target.path /models/llama-3.1-8b does not exist" in plan.status["message"]
    world.step()
    speculative = conditions(world.status)["SpeculativeReady"]
    assert speculative["reason"] == "ScaledDown" and "drafter incompatible" not in speculative["message"], speculative
    assert "model volume empty" in speculative["message"]
    # A drafter that was checked and found incompatible is still called so.
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"init": (1, INCOMPATIBLE)})
    assert world.step().status["message"].startswith("drafter incompatible (HiddenSizeMismatch, VocabSizeMismatch)")


def test_pause_says_it_does_nothing_to_one_server():
    from specdec_operator.cli.kubectl_specdec import pause_does_nothing

    assert "does nothing to one server" in (pause_does_nothing("llama", llama_spec()) or "")
    assert "spec.replicas 0" in (pause_does_nothing("llama", llama_spec(replicas=0)) or "")
    assert pause_does_nothing("llama", llama_spec(replicas=4)) is None


def test_status_says_a_paused_annotation_does_nothing_to_one_server():
    """A specdec.io/paused carried from Git (not through `kubectl specdec pause`) on one server: the plugin says so."""
    from specdec_operator import steering
    from specdec_operator.api import SpeculativeServerStatus
    from specdec_operator.cli.kubectl_specdec import describe

    one = describe("llama", SpeculativeServerStatus(phase="Promoted", replicas=1), {steering.PAUSED: "true"})
    assert "paused does nothing to one server" in one
    fleet = describe("llama", SpeculativeServerStatus(phase="Promoted", replicas=4), {steering.PAUSED: "true"})
    assert "(paused)" in fleet and "does nothing" not in fleet


def test_a_blocked_update_is_named_for_a_revision_decided_by_hand_too():
    """specdec.io/promote holds every revision promoted: the new one is decided at once, and the old speculative
    server is still kept until the new base serves, so the same deadlock is named."""
    from specdec_operator import steering

    world = _promoted_alone()
    _new_image(world)
    hand = {steering.PROMOTE: "validated offline"}
    world.step(annotations=hand)
    world.add_pod("base")
    _unschedulable(world.pods[-1])
    blocked = world.step(annotations=hand)
    assert blocked.status["probe"]["reason"] == "PromotedByHand"
    assert blocked.status["phase"] == "Failed" and blocked.status["reason"] == "UpdateBlocked", blocked.status
