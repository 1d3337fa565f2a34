"""A fleet (spec.replicas >= 2) through reconcile(): canary, walk, rollback, kubectl scale, against a model of the
ReplicaSet controller, with the two invariants checked at every tick (the real control plane: test_fleet_cluster.py)."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from specdec_operator import manifests as m
from specdec_operator.monitor import Sample
from specdec_operator.reconcile import Plan
from tests.support.world import COMPATIBLE, NOW, World, conditions, llama_spec, promote_result, to_promoted


class Fleet(World):
    """World plus a ReplicaSet controller: pods are created for missing replicas (Ready `ready_ticks` later) and
    deleted (not-Ready first) for surplus ones; a deleted pod terminates for `term_ticks` ticks, holding its GPUs."""

    def __init__(self, spec: dict, ready_ticks: int = 2, term_ticks: int = 1) -> None:
        super().__init__(spec)
        self.ready_ticks, self.term_ticks = ready_ticks, term_ticks
        self.ages: dict[str, int] = {}
        self.serial = 0
        self.max_requested = 0
        self.min_serving: int | None = None  # Ready servers behind the stable Service, since watch_serving()
        self.min_ready: int | None = None  # Ready servers of both variants, once set
        self.events: list[str] = []
        self.now = NOW

    def variant_pods(self, variant: str, *, terminating: bool | None = None) -> list[dict]:
        pods = [p for p in self.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == variant]
        if terminating is None:
            return pods
        return [p for p in pods if bool(p["metadata"].get("deletionTimestamp")) == terminating]

    def controller(self) -> None:
        for pod in list(self.pods):  # time passes: terminating pods go, new ones become Ready
            name = pod["metadata"]["name"]
            self.ages[name] += 1
            if pod["metadata"].get("deletionTimestamp"):
                if self.ages[name] >= self.term_ticks:
                    self.pods.remove(pod)
            elif self.ages[name] >= self.ready_ticks:
                for cond in pod["status"]["conditions"]:
                    if cond["type"] == "Ready":
                        cond["status"] = "True"
        for variant in ("base", "speculative"):
            deployment = self.deployments.get(m.child_name(self.name, variant))
            if deployment is None:
                continue
            want = deployment["spec"]["replicas"]
            template_hash = deployment["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH]
            old = [p for p in self.variant_pods(variant) if p["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] != template_hash]
            rolls = deployment["spec"]["strategy"]["type"] == "RollingUpdate"
            if rolls and any(not p["metadata"].get("deletionTimestamp") for p in old):
                self.rolling_update(variant, deployment, template_hash)
                continue
            if old and not rolls:  # strategy Recreate: every pod of an older template goes, and new ones come only once they are gone
                for pod in old:
                    if not pod["metadata"].get("deletionTimestamp"):
                        pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
                        self.ages[pod["metadata"]["name"]] = 0
                continue
            alive = self.variant_pods(variant, terminating=False)
            for _ in range(want - len(alive)):
                pod = self.add_pod(variant, init=(0, COMPATIBLE) if variant == "speculative" else None, running_since=NOW)
                self.serial += 1
                pod["metadata"]["name"] = f"{variant}-{self.serial}"
                self.ages[pod["metadata"]["name"]] = 0
            surplus = sorted(alive, key=lambda p: (is_ready(p), -self.ages[p["metadata"]["name"]]))[: max(0, len(alive) - want)]
            for pod in surplus:
                pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
                self.ages[pod["metadata"]["name"]] = 0
        self.max_requested = max(self.max_requested, len(self.pods))
        if self.min_serving is not None:
            self.min_serving = min(self.min_serving, self.serving())
        if self.min_ready is not None:
            self.min_ready = min(self.min_ready, self.ready_servers())

    def new_pod(self, variant: str) -> None:
        pod = self.add_pod(variant, init=(0, COMPATIBLE) if variant == "speculative" else None, running_since=NOW)
        self.serial += 1
        pod["metadata"]["name"] = f"{variant}-{self.serial}"
        self.ages[pod["metadata"]["name"]] = 0

    def delete(self, pod: dict) -> None:
        pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
        self.ages[pod["metadata"]["name"]] = 0

    def rolling_update(self, variant: str, deployment: dict, template_hash: str) -> None:
        """The Deployment controller's rolling update (pkg/controller/deployment/rolling.go): the new ReplicaSet
        grows while all pods stay within replicas + maxSurge; the old ones shrink, not-Ready ones first, while the
        available pods stay above replicas - maxUnavailable (minus the new ReplicaSet's unavailable ones). A
        scale-down of the Deployment mid-rollout takes a Ready old pod first (the worst that proportional scaling
        may do)."""
        want = deployment["spec"]["replicas"]
        strategy = deployment["spec"]["strategy"]["rollingUpdate"]
        alive = self.variant_pods(variant, terminating=False)
        new = [p for p in alive if p["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == template_hash]
        old = [p for p in alive if p not in new]
        for pod in sorted(old, key=lambda p: not is_ready(p))[: max(0, len(alive) - want - strategy["maxSurge"])]:
            self.delete(pod)
            old.remove(pod)
            alive.remove(pod)
        for _ in range(max(0, min(want - len(new), want + strategy["maxSurge"] - len(alive)))):
            self.new_pod(variant)
        alive = self.variant_pods(variant, terminating=False)
        new_unavailable = sum(1 for p in alive if p not in old and not is_ready(p))
        allowed = len(alive) - (want - strategy["maxUnavailable"]) - new_unavailable
        for pod in [p for p in old if not is_ready(p)][: max(0, allowed)]:  # cleanupUnhealthyReplicas
            self.delete(pod)
            old.remove(pod)
        available = sum(1 for p in self.variant_pods(variant, terminating=False) if is_ready(p))
        for pod in [p for p in old if is_ready(p)][: max(0, available - (want - strategy["maxUnavailable"]))]:
            self.delete(pod)

    def ready_servers(self) -> int:
        """Ready servers of both variants (not being deleted), whatever the stable Service selects."""
        return sum(1 for p in self.pods if is_ready(p) and not p["metadata"].get("deletionTimestamp"))

    def serving(self) -> int:
        """Ready servers the stable Service selects."""
        selector = self.services[self.name]["spec"]["selector"]
        return sum(
            1
            for p in self.pods
            if is_ready(p) and not p["metadata"].get("deletionTimestamp") and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
        )

    def tick(self, **observed) -> Plan:
        self.now += timedelta(seconds=10)
        plan = self.step(now=self.now, **observed)
        self.events += [e.reason for e in plan.events]
        self.controller()
        return plan

    def run(self, until, limit: int = 200, **observed) -> Plan:
        for _ in range(limit):
            plan = self.tick(**observed)
            if until(plan):
                return plan
        raise AssertionError(f"not reached in {limit} ticks: {self.status.get('rolloutProgress')} {self.status.get('message')}")

    def counts(self) -> tuple[int, int]:
        return tuple(self.deployments[m.child_name(self.name, v)]["spec"]["replicas"] for v in ("base", "speculative"))  # type: ignore[return-value]

    def to_probing(self) -> Plan:
        plan = self.run(lambda p: p.starts_probe)
        self.probe_running = plan.revision
        return plan

    def promote(self) -> Plan:
        plan = self.to_probing()
        return self.tick(probe_result=promote_result(plan.revision))


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])


def fleet_spec(replicas: int, surge: int = 0, unavailable: int = 1, **changes) -> dict:
    return llama_spec(
        replicas=replicas, **{"rollout.maxSurge": surge, "rollout.maxUnavailable": unavailable, "rollout.keepBaseWarm": False}, **changes
    )


def test_probing_a_fleet_runs_one_canary_that_serves_its_share_once_ready() -> None:
    fleet = Fleet(fleet_spec(6))
    fleet.run(lambda p: any(m.selects_both(s) for s in [fleet.services["llama"]]) or p.starts_probe)
    plan = fleet.step(now=fleet.now)
    assert plan.starts_probe or fleet.status["phase"] == "Probing"
    assert fleet.counts() == (5, 1)  # maxSurge 0: the canary replaces a base server
    assert fleet.max_requested <= 6
    # The canary serves beside the base servers (the probe then compares two servers under the same live load).
    assert m.selects_both(fleet.services["llama"]) and fleet.serving() == 6
    assert plan.status["rolloutProgress"] == "1/6 speculative" and plan.status["replicas"] == 6 and plan.status["readyReplicas"] == 6
    assert plan.status["selector"] == m.fleet_selector("llama")
    assert "RolledOut" not in conditions(plan.status)  # no walk before a decision
    with_surge = Fleet(fleet_spec(6, surge=1))
    with_surge.to_probing()
    assert with_surge.counts() == (6, 1)  # maxSurge 1: the canary is the one extra server


@pytest.mark.parametrize(
    ("replicas", "surge", "unavailable", "ready_ticks", "term_ticks"), [(6, 0, 1, 2, 1), (8, 0, 2, 3, 2), (4, 1, 0, 1, 0), (5, 2, 1, 2, 3)]
)
def test_a_promoted_fleet_walks_to_the_drafter_within_its_budget_and_floor(replicas, surge, unavailable, ready_ticks, term_ticks) -> None:
    fleet = Fleet(fleet_spec(replicas, surge, unavailable), ready_ticks=ready_ticks, term_ticks=term_ticks)
    fleet.to_probing()
    fleet.max_requested = 0
    fleet.min_serving = fleet.serving()
    promoted = fleet.tick(probe_result=promote_result(fleet.status["probe"]["revision"]))
    assert promoted.status["phase"] == "Promoted"
    assert conditions(promoted.status)["RolledOut"]["reason"] == "WalkingToSpeculative"
    assert not promoted.settled
    seen_both = False
    for _ in range(200):
        plan = fleet.tick()
        seen_both |= m.selects_both(fleet.services["llama"])
        if plan.settled:
            break
        assert fleet.status["rolloutProgress"].endswith(f"/{replicas} speculative")
    assert plan.settled and fleet.counts() == (0, replicas)
    assert fleet.max_requested <= replicas + surge
    assert fleet.min_serving >= replicas - unavailable
    assert seen_both  # mixed: the stable Service selected both variants
    assert fleet.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "speculative"  # all one variant again
    assert plan.status["rolloutProgress"] == f"{replicas}/{replicas} speculative" and plan.status["speculativeReplicas"] == replicas
    assert conditions(plan.status)["RolledOut"]["status"] == "True"
    assert fleet.events.count("WalkStarted") == 1 and fleet.events.count("WalkFinished") == 1
    assert fleet.events.count("SpeedupConfirmed") == 1
    assert fleet.tick().apply == [] and fleet.events.count("WalkFinished") == 1  # nothing more to do or to say


def drift_scrapes(fleet: Fleet, n: int = 4) -> Plan:
    plan = None
    for i in range(n):
        plan = fleet.tick(
            scrape=Sample(time=f"t{i}", accept_length=1.2, verify_calls=10.0 * (i + 1)), previous_scrape=Sample(time="", verify_calls=10.0 * i)
        )
    assert plan is not None
    return plan


def test_a_drift_mid_walk_walks_back_at_once_from_where_the_walk_is() -> None:
    fleet = Fleet(fleet_spec(6))
    fleet.promote()
    fleet.run(lambda p: fleet.status["speculativeReplicas"] >= 3)
    fleet.max_requested = 0
    fleet.min_serving = fleet.serving()
    plan = drift_scrapes(fleet)
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "AcceptanceDrift"
    assert conditions(plan.status)["RolledOut"]["reason"] == "WalkingToBase"
    assert fleet.events.count("WalkStarted") == 2  # out, and back
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (6, 0) and fleet.max_requested <= 6 and fleet.min_serving >= 5
    assert plan.status["rolloutProgress"] == "0/6 speculative"
    assert fleet.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "base"
    assert fleet.events.count("WalkFinished") == 1 and fleet.events.count("AcceptanceDrift") == 1


def test_kubectl_scale_mid_walk_changes_the_goal() -> None:
    fleet = Fleet(fleet_spec(6))
    fleet.promote()
    fleet.run(lambda p: fleet.status["speculativeReplicas"] >= 2)
    fleet.spec_dict["replicas"] = 3
    fleet.generation += 1
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, 3) and len(fleet.pods) == 3
    assert plan.status["rolloutProgress"] == "3/3 speculative" and plan.status["replicas"] == 3
    fleet.spec_dict["replicas"] = 7
    fleet.generation += 1
    fleet.max_requested = 0
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, 7) and fleet.max_requested == 7


def test_a_losing_canary_leaves_the_stable_service_at_once_and_is_removed() -> None:
    fleet = Fleet(fleet_spec(4))
    plan = fleet.to_probing()
    lost = dict(promote_result(plan.revision), decision="rollback", reason="SpeedupBelowThreshold", speedup=0.9)
    fleet.tick(probe_result=lost)
    for _ in range(20):
        plan = fleet.tick()  # out of the stable Service at once
        assert not m.selects_both(fleet.services["llama"]) and fleet.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "base"
        if plan.settled:
            break
    assert plan.settled and fleet.counts() == (4, 0) and fleet.max_requested <= 4


def test_an_invalid_drafter_in_a_fleet_keeps_every_base_server() -> None:
    fleet = Fleet(fleet_spec(4))
    fleet.tick()
    fleet.controller()
    for pod in fleet.variant_pods("speculative"):
        pod["status"]["initContainerStatuses"] = [
            {
                "name": m.VALIDATOR_CONTAINER,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "{}"}},
            }
        ]
    plan = fleet.tick()
    assert plan.status["phase"] == "Invalid"
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (4, 0) and fleet.serving() == 4


def template_hashes(fleet: Fleet, variant: str) -> set[str]:
    return {p["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] for p in fleet.variant_pods(variant)}


@pytest.mark.parametrize(("replicas", "surge", "unavailable"), [(4, 0, 1), (6, 1, 0), (5, 0, 2)])
def test_a_new_drafter_of_a_walked_fleet_walks_back_to_the_base_before_the_speculative_template_changes(replicas, surge, unavailable) -> None:
    fleet = Fleet(fleet_spec(replicas, surge, unavailable))
    fleet.promote()
    fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, replicas)
    (old_hash,) = template_hashes(fleet, "speculative")
    fleet.spec_dict["drafter"]["path"] = "eagle3/llama-v2"
    fleet.generation += 1
    fleet.probe_running = None
    fleet.max_requested, fleet.min_serving = 0, fleet.serving()
    first = fleet.tick()
    assert first.status["phase"] == "Deploying" and first.status["reason"] == "WalkingToBase"
    assert "before the speculative pod template changes" in conditions(first.status)["RolledOut"]["message"]
    assert fleet.template("speculative")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == old_hash  # not changed yet
    walked_back = False
    for _ in range(200):
        hashes = template_hashes(fleet, "speculative")
        if old_hash not in hashes:
            walked_back = True
        else:  # no speculative pod of the new template while one of the old template exists
            assert hashes == {old_hash}, hashes
        plan = fleet.tick()
        if plan.starts_probe:
            break
    assert walked_back and plan.starts_probe and plan.status["phase"] == "Probing"
    assert fleet.counts() == (replicas - 1 if surge == 0 else replicas, 1)  # the new revision's canary
    assert fleet.max_requested <= replicas + surge and fleet.min_serving >= replicas - unavailable
    fleet.probe_running = plan.revision
    promoted = fleet.tick(probe_result=promote_result(plan.revision))
    assert promoted.status["phase"] == "Promoted"
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, replicas) and old_hash not in template_hashes(fleet, "speculative")
    assert fleet.max_requested <= replicas + surge and fleet.min_serving >= replicas - unavailable
    assert fleet.events.count("WalkStarted") == 3 and fleet.events.count("SpeedupConfirmed") == 2  # out, back, out again


def test_without_the_walk_back_the_new_template_would_leave_the_fleet_without_a_server() -> None:
    """The model of the Deployment controller is what makes the test above able to fail: a template change of the
    walked fleet's speculative Deployment, written directly, replaces every server at once."""
    fleet = Fleet(fleet_spec(4))
    fleet.promote()
    fleet.run(lambda p: p.settled)
    fleet.spec_dict["drafter"]["path"] = "eagle3/llama-v2"
    fleet.generation += 1
    fleet.step(now=fleet.now)  # the walk back: the template stays
    spec = fleet.deployments["llama-spec"]
    spec["spec"]["template"] = copy.deepcopy(spec["spec"]["template"])
    spec["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] = "changed"
    fleet.controller()
    assert fleet.serving() == 0


def test_a_one_server_resource_keeps_its_old_speculative_server_until_the_base_serves() -> None:
    fleet = Fleet(fleet_spec(1))  # keepBaseWarm false: after the promotion only the speculative server runs
    fleet.promote()
    fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, 1)
    (old_hash,) = template_hashes(fleet, "speculative")
    fleet.spec_dict["drafter"]["path"] = "eagle3/llama-v2"
    fleet.generation += 1
    fleet.probe_running = None
    fleet.max_requested, fleet.min_serving = 0, fleet.serving()
    for _ in range(50):
        plan = fleet.tick()
        hashes = template_hashes(fleet, "speculative")
        if old_hash in hashes:
            assert hashes == {old_hash}
        if plan.starts_probe:
            break
    assert plan.starts_probe and fleet.min_serving == 1  # the old speculative server answered until the base did
    assert fleet.max_requested <= 2  # the trial's two servers, as for any one-server revision
    assert fleet.services["llama"]["spec"]["selector"][m.LABEL_VARIANT] == "base"


def test_a_fleets_traffic_switched_event_says_what_moved() -> None:
    fleet = Fleet(fleet_spec(4))
    fleet.to_probing()
    promoted = fleet.tick(probe_result=promote_result(fleet.status["probe"]["revision"]))
    (switched,) = [e for e in promoted.events if e.reason == "TrafficSwitched"]
    # At the promotion the canary is the fleet's one speculative server; the base servers still answer beside it.
    assert switched.message == (
        "stable Service llama now selects the fleet's speculative servers and, while the fleet walks, its base servers "
        "(1/4 speculative, 4 servers Ready)"
    )
    one = World(llama_spec())
    done = to_promoted(one)
    (single,) = [e for e in done.events if e.reason == "TrafficSwitched"]
    assert single.message == "stable Service llama now selects the speculative server"


def test_a_new_drafter_while_the_canary_is_probed_replaces_the_canary_at_once() -> None:
    fleet = Fleet(fleet_spec(4))
    fleet.to_probing()
    assert fleet.counts() == (3, 1)
    (old_hash,) = template_hashes(fleet, "speculative")
    fleet.spec_dict["drafter"]["path"] = "eagle3/llama-v2"
    fleet.generation += 1
    fleet.probe_running = None
    fleet.min_serving = fleet.serving()
    plan = fleet.tick()
    # The 3 Ready base servers keep the floor without the canary: no walk back, the template changes now.
    assert fleet.template("speculative")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] != old_hash
    assert plan.status["reason"] != "WalkingToBase" and "RolledOut" not in conditions(plan.status)
    plan = fleet.run(lambda p: p.starts_probe)
    assert fleet.counts() == (3, 1) and fleet.min_serving >= 3 and "WalkStarted" not in fleet.events


NEW_IMAGE = "mirror.example/lmsysorg/sglang:v0.5.23-cu130"  # a base template change (the release stays v0.5.23)


def fleet_in(state: str, replicas: int, surge: int, unavailable: int) -> Fleet:
    fleet = Fleet(fleet_spec(replicas, surge, unavailable))
    if state == "canary":
        fleet.to_probing()
    elif state == "rolled-back":
        plan = fleet.to_probing()
        fleet.tick(probe_result=dict(promote_result(plan.revision), decision="rollback", reason="SpeedupBelowThreshold", speedup=0.9))
        fleet.run(lambda p: p.settled)
    elif state == "promoted":
        fleet.promote()
        fleet.run(lambda p: p.settled)
    else:  # mid-walk toward the drafter
        fleet.promote()
        fleet.run(lambda p: fleet.status["speculativeReplicas"] >= replicas // 2)
    return fleet


@pytest.mark.parametrize("state", ["rolled-back", "canary", "promoted", "mid-walk"])
@pytest.mark.parametrize(("replicas", "surge", "unavailable"), [(6, 0, 1), (6, 1, 0), (8, 0, 2)])
def test_a_new_base_image_never_takes_a_fleet_under_its_floor(state: str, replicas: int, surge: int, unavailable: int) -> None:
    """A new image changes both pod templates: the base Deployment rolls (RollingUpdate within maxSurge and
    maxUnavailable), the speculative one is recreated, and the new revision gets its canary and its walk. The walk
    waits for the base rollout, and the base template waits until its rollout cannot take the fleet under
    spec.replicas - maxUnavailable Ready servers, counted over both variants at every tick."""
    fleet = fleet_in(state, replicas, surge, unavailable)
    old_hashes = template_hashes(fleet, "base") | template_hashes(fleet, "speculative")
    floor = replicas - unavailable
    assert fleet.ready_servers() >= floor
    fleet.spec_dict["image"] = NEW_IMAGE
    fleet.generation += 1
    fleet.probe_running = None
    fleet.min_ready, fleet.max_requested = fleet.ready_servers(), 0
    for _ in range(300):
        plan = fleet.tick()
        if plan.starts_probe:
            break
    assert plan.starts_probe, fleet.status
    fleet.probe_running = plan.revision
    promoted = fleet.tick(probe_result=promote_result(plan.revision))
    assert promoted.status["phase"] == "Promoted"
    plan = fleet.run(lambda p: p.settled)
    assert fleet.counts() == (0, replicas)
    assert not (template_hashes(fleet, "speculative") & old_hashes)
    assert fleet.template("base")["spec"]["containers"][0]["image"] == NEW_IMAGE  # the base got the new image too
    assert fleet.min_ready >= floor, f"{fleet.min_ready} Ready servers of {replicas} (floor {floor})"
    # The base rollout's own surge comes on top of the walk's budget (as on main; docs/operability.md says so):
    # a canary that holds the fleet's maxSurge and a base pod of the new template beside it.
    assert fleet.max_requested <= replicas + 2 * surge, fleet.max_requested


def test_a_new_base_image_on_a_walked_back_fleet_rolls_every_base_server_before_the_canary() -> None:
    fleet = fleet_in("rolled-back", 6, 0, 1)
    assert fleet.counts() == (6, 0)
    (old_hash,) = template_hashes(fleet, "base")
    fleet.spec_dict["image"] = NEW_IMAGE
    fleet.generation += 1
    fleet.min_ready = fleet.ready_servers()
    first = fleet.tick()
    # The fleet is at rest: the new base template goes at once (the rollout takes one server, 5 stay Ready), and the
    # new revision's canary waits for the rollout (no base server is scaled down beside it).
    assert fleet.template("base")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] != old_hash
    assert fleet.counts() == (6, 0) and first.status["message"]

    def old_base_pods() -> int:
        return sum(1 for p in fleet.variant_pods("base", terminating=False) if p["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == old_hash)

    while old_base_pods():
        assert fleet.counts() == (6, 0)  # the walk to the canary waits for the base rollout
        fleet.tick()
    fleet.run(lambda p: p.starts_probe)
    assert fleet.counts() == (5, 1) and fleet.min_ready >= 5


def test_a_new_base_image_while_the_canary_is_probed_holds_the_base_template_until_the_new_canary_is_ready() -> None:
    fleet = fleet_in("canary", 6, 0, 1)
    assert fleet.counts() == (5, 1)
    (old_base,) = template_hashes(fleet, "base")
    (old_canary,) = template_hashes(fleet, "speculative")
    fleet.spec_dict["image"] = NEW_IMAGE
    fleet.generation += 1
    fleet.probe_running = None
    fleet.min_ready = fleet.ready_servers()
    plan = fleet.tick()
    # The 5 base servers keep the floor: the canary is recreated now, and the base template waits for it
    # (a replicas-only write): a base rollout beside it would leave 4 Ready servers.
    assert fleet.template("speculative")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] != old_canary
    assert fleet.template("base")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == old_base
    assert not any(o["kind"] == "Deployment" and o["metadata"]["name"] == "llama-base" and "template" in o["spec"] for o in plan.apply)
    while fleet.template("base")["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] == old_base:
        assert old_canary in template_hashes(fleet, "speculative") or fleet.ready_servers() >= 5
        fleet.tick()
    assert any(is_ready(p) for p in fleet.variant_pods("speculative", terminating=False))  # the new canary serves
    fleet.run(lambda p: p.starts_probe)
    assert fleet.min_ready >= 5
