"""reconcile(): the lifecycle as a pure function of (spec, observed cluster, last status, now)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from specdec_operator import manifests as m
from specdec_operator.monitor import Sample
from specdec_operator.reconcile import Observed, merge_patch, parse_validator_report, reconcile
from specdec_operator.resource import parse_spec, speculative_revision
from tests.support.world import COMPATIBLE, INCOMPATIBLE, NOW, UID, World, conditions, llama_spec, promote_result, reasons, to_promoted

# ---------------------------------------------------------------------------------------------------------


def test_first_step_creates_five_children_and_the_stable_service_selects_base() -> None:
    world = World(llama_spec())
    plan = world.step()
    assert not plan.switch_first  # nothing exists yet: all five are created in one round trip
    assert sorted((o["kind"], o["metadata"]["name"]) for o in plan.apply) == [
        ("Deployment", "llama-base"),
        ("Deployment", "llama-spec"),
        ("Service", "llama"),
        ("Service", "llama-base"),
        ("Service", "llama-spec"),
    ]
    assert plan.status["phase"] == "Pending"
    assert plan.status["activeVariant"] == "base"
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert not plan.starts_probe
    # Conditions are set on the first visit, Unknown where nothing is known yet.
    conds = conditions(plan.status)
    assert set(conds) == {"DrafterCompatible", "BaseReady", "SpeculativeReady", "SpeedupVerified", "Ready"}
    assert conds["DrafterCompatible"]["status"] == "Unknown"
    assert all(c["observedGeneration"] == 1 for c in conds.values())
    # Applying what was planned converges: the next step changes nothing.
    assert world.step().apply == []


def test_incompatible_drafter_is_invalid_scales_the_speculative_server_to_zero_and_base_keeps_serving() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"init": (1, INCOMPATIBLE)})
    plan = world.step()
    assert plan.status["phase"] == "Invalid"
    assert plan.status["reason"] == "HiddenSizeMismatch"
    cond = conditions(plan.status)["DrafterCompatible"]
    assert cond["status"] == "False" and cond["reason"] == "HiddenSizeMismatch" and "VocabSizeMismatch" in cond["message"]
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0
    assert world.deployments["llama-base"]["spec"]["replicas"] == 1
    assert plan.status["activeVariant"] == "base" and conditions(plan.status)["Ready"]["status"] == "True"
    assert "DrafterIncompatible" in reasons(plan)
    assert not plan.starts_probe
    # The verdict is stored: once the pod is gone (scaled to 0) the phase stays Invalid, without a second Event.
    world.pods = [p for p in world.pods if p["metadata"]["labels"]["specdec.io/variant"] == "base"]
    again = world.step()
    assert again.status["phase"] == "Invalid" and again.events == [] and again.apply == []


def test_compatible_with_warnings_shows_them_and_reports_loading_progress() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(
        base={"running_since": NOW - timedelta(minutes=6, seconds=10)},
        speculative={"init": (0, COMPATIBLE), "running_since": NOW - timedelta(seconds=45)},
    )
    plan = world.step()
    cond = conditions(plan.status)["DrafterCompatible"]
    assert cond["status"] == "True" and "HiddenStateSourceMismatch" in cond["message"]
    assert any(e.reason == "DrafterCompatible" and "HiddenStateSourceMismatch" in e.message for e in plan.events)
    assert plan.status["phase"] == "Deploying"
    assert "loading weights since 2026-12-02T09:53:50Z" in plan.status["message"]  # 6m10s before NOW
    assert conditions(plan.status)["SpeculativeReady"]["message"] == "loading weights since 2026-12-02T09:59:15Z"
    assert conditions(plan.status)["BaseReady"]["reason"] == "Loading"
    assert not plan.starts_probe
    # Later steps write nothing while nothing changes: the text names when loading started, not how long ago (a
    # status patch wakes the next step, and a text that followed the clock made every loading server write).
    for seconds in (4, 6, 60, 600):
        again = world.step(now=NOW + timedelta(seconds=seconds))
        assert not merge_patch(plan.status, again.status) and again.apply == [], seconds


def test_both_ready_starts_the_probe_once_and_a_promotion_switches_the_stable_service() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert plan.status["phase"] == "Probing" and plan.starts_probe and "ProbeStarted" in reasons(plan)
    assert plan.status["probe"] == {"revision": plan.revision, "startedAt": "2026-12-02T10:00:00Z"}
    world.probe_running = plan.revision
    running = world.step(now=NOW + timedelta(seconds=30), probe_progress="round 2 of up to 6: chat 1.90x")
    assert not running.starts_probe and running.status["phase"] == "Probing" and running.events == []
    assert running.status["message"].endswith("since 2026-12-02T10:00:00Z; round 2 of up to 6: chat 1.90x")
    assert running.status["probe"]["startedAt"] == "2026-12-02T10:00:00Z"
    # A result for another revision is ignored.
    stale = world.step(probe_result=promote_result("0000000000000000"))
    assert stale.status["phase"] == "Probing"
    done = world.step(probe_result=promote_result(plan.revision))
    assert done.status["phase"] == "Promoted" and done.status["activeVariant"] == "speculative"
    assert done.status["speedup"] == 1.9 and done.status["acceptLength"] == 2.9
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert conditions(done.status)["SpeedupVerified"]["status"] == "True"
    assert {"SpeedupConfirmed", "TrafficSwitched"} <= set(reasons(done))
    assert done.stops_probe  # the task that produced it is finished; nothing may keep running


def test_a_restarted_operator_reads_the_decision_back_and_repeats_nothing() -> None:
    world = World(llama_spec())
    to_promoted(world)
    world.probe_running = None  # a new process: no probe task, the status is all it has
    plan = world.step(now=NOW + timedelta(minutes=5))
    assert plan.status["phase"] == "Promoted" and not plan.starts_probe
    assert plan.apply == [] and plan.events == []


def test_a_probe_interrupted_by_a_restart_is_run_again() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    first = world.step()
    world.probe_running = first.revision
    world.step()
    world.probe_running = None  # the operator died mid-probe
    plan = world.step(now=NOW + timedelta(minutes=1))
    assert plan.starts_probe and plan.status["phase"] == "Probing"
    assert plan.status["probe"]["startedAt"] == "2026-12-02T10:01:00Z"


def test_unrelated_edits_keep_the_decision_drafter_edits_revalidate_and_reprobe() -> None:
    world = World(llama_spec())
    promoted = to_promoted(world)
    world.spec_dict = llama_spec(**{"monitor.window": 8, "podMetadata": {"annotations": {"owner": "team-a"}}})
    world.generation = 2
    same = world.step()
    assert same.revision == promoted.revision
    assert same.status["phase"] == "Promoted" and same.events == [] and same.status["observedGeneration"] == 2
    # Both pod templates changed (podMetadata). The base's is applied; the speculative server keeps its old template
    # (and the traffic) until the base serves on its new one and the stable Service selects it.
    assert world.template("base")["metadata"]["annotations"]["owner"] == "team-a"
    assert all(o["metadata"]["name"] != "llama-spec" for o in same.apply)
    assert "owner" not in world.template("speculative")["metadata"]["annotations"]
    world.pods = [p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] != "base"]
    world.add_pod("base", ready=True)
    switched = world.step()
    assert [(e.reason, e.message) for e in switched.events] == [("TrafficSwitched", "stable Service llama now selects the base server")]
    assert "owner" not in world.template("speculative")["metadata"]["annotations"]
    assert world.step().status["phase"] == "Promoted"  # the Service selects the base: the template changes now
    assert world.template("speculative")["metadata"]["annotations"]["owner"] == "team-a"
    base_template = world.template("base")
    world.probe_running = None
    # The speculative pod of the podMetadata edit, Ready: the promoted server serves again.
    world.pods = [p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] != "speculative"]
    world.add_pod("speculative", ready=True, init=(0, COMPATIBLE))
    world.step()
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    world.spec_dict = llama_spec(**{"drafter.numSteps": 4, "monitor.window": 8, "podMetadata": {"annotations": {"owner": "team-a"}}})
    world.generation = 3
    held = world.step()  # the old speculative server answers until the base takes the traffic
    assert held.status["phase"] == "Deploying" and held.status["reason"] == "WalkingToBase" and held.status["activeVariant"] == "base"
    assert world.template("speculative")["metadata"]["annotations"][m.ANNOTATION_REVISION] == promoted.revision
    changed = world.step()
    assert world.template("base") == base_template  # the base keeps serving: its pod is not restarted
    assert changed.revision != promoted.revision
    assert changed.status["phase"] == "Validating"
    assert changed.status["activeVariant"] == "base"  # the new speculative server is not the one that was measured
    assert changed.status["probe"] is None and changed.status["validation"] is None
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert world.deployments["llama-spec"]["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_REVISION] == changed.revision


def test_a_probe_for_an_old_revision_is_cancelled() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    old = world.step()
    world.probe_running = old.revision
    world.spec_dict = llama_spec(**{"drafter.path": "eagle3/other"})
    plan = world.step()
    assert plan.stops_probe and not plan.starts_probe


def test_keep_base_warm_false_scales_the_loser_once_the_winner_serves() -> None:
    world = World(llama_spec(**{"rollout.keepBaseWarm": False}))
    promoted = to_promoted(world)
    # The step that switches the stable Service also scales the base to 0: the Service is applied first, so
    # traffic has left the base before its pod goes away.
    applied = [(o["kind"], o["metadata"]["name"]) for o in promoted.apply]
    assert ("Service", "llama") in applied and ("Deployment", "llama-base") in applied
    assert applied.index(("Service", "llama")) < applied.index(("Deployment", "llama-base"))
    assert promoted.switch_first  # the handlers apply this plan's Services, then its Deployments
    assert world.deployments["llama-base"]["spec"]["replicas"] == 0
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1
    rolled = World(llama_spec(**{"rollout.keepBaseWarm": False}))
    rolled.step()
    rolled.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = rolled.step()
    result = {**promote_result(plan.revision), "decision": "rollback", "reason": "SpeedupBelowThreshold", "message": "0.99x"}
    rolled.step(probe_result=result)
    assert rolled.status["phase"] == "RolledBack" and rolled.status["reason"] == "SpeedupBelowThreshold"
    assert rolled.deployments["llama-spec"]["spec"]["replicas"] == 0 and rolled.deployments["llama-base"]["spec"]["replicas"] == 1


def test_acceptance_drift_rolls_back_after_the_window_and_never_repromotes() -> None:
    world = World(llama_spec())  # monitor: floor 1.5, window 4, interval 15
    promoted = to_promoted(world)
    assert promoted.monitor_due
    t = NOW
    for i in range(3):
        t += timedelta(seconds=15)
        plan = world.step(
            now=t,
            scrape=Sample(time=t.isoformat(), accept_length=1.2, verify_calls=10.0 * (i + 1)),
            previous_scrape=Sample(time="", verify_calls=10.0 * i),
        )
        assert plan.status["phase"] == "Promoted" and plan.status["monitor"]["belowFloorCount"] == i + 1
    assert world.step(now=t + timedelta(seconds=5)).monitor_due is False  # not due before the interval
    t += timedelta(seconds=15)
    plan = world.step(
        now=t, scrape=Sample(time=t.isoformat(), accept_length=1.2, verify_calls=40.0), previous_scrape=Sample(time="", verify_calls=30.0)
    )
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "AcceptanceDrift"
    assert plan.status["activeVariant"] == "base"
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert "AcceptanceDrift" in reasons(plan) and "TrafficSwitched" in reasons(plan)
    assert plan.status["probe"]["decision"] == "rollback" and plan.status["probe"]["speedup"] == 1.9
    # No flapping: good scrapes or even a fresh promote result for the same revision change nothing.
    again = world.step(now=t + timedelta(minutes=5), scrape=Sample(time="x", accept_length=3.0), probe_result=promote_result(plan.revision))
    assert again.status["phase"] == "RolledBack" and again.events == [] and not again.monitor_due and not again.starts_probe
    assert again.status["monitor"]["belowFloorCount"] == 4 and again.status["acceptLength"] == 1.2  # the evidence stays


def test_drift_with_a_cold_base_keeps_serving_speculative_until_base_is_ready() -> None:
    world = World(llama_spec(**{"rollout.keepBaseWarm": False, "monitor.window": 1}))
    to_promoted(world)
    world.pods = [p for p in world.pods if p["metadata"]["labels"]["specdec.io/variant"] == "speculative"]  # base scaled away
    plan = world.step(now=NOW + timedelta(seconds=20), scrape=Sample(time="x", accept_length=1.0))
    assert plan.status["phase"] == "RolledBack"
    assert world.deployments["llama-base"]["spec"]["replicas"] == 1  # base comes back
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1  # still serving until base is ready
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    world.add_pod("base", ready=True)
    world.step(now=NOW + timedelta(minutes=3))
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0


def test_a_crash_looping_speculative_server_is_given_up_and_scaled_to_zero() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"init": (0, COMPATIBLE), "crash_restarts": 1})
    assert world.step().status["phase"] == "Deploying"
    assert "crash-looping (OOMKilled" in world.status["message"]
    world.set_pods(base={"ready": True}, speculative={"init": (0, COMPATIBLE), "crash_restarts": 3})
    plan = world.step()
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "ProbeFailed"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0
    assert conditions(plan.status)["SpeculativeReady"]["reason"] == "ScaledDown"


def test_children_not_owned_by_the_resource_are_never_touched_or_probed() -> None:
    world = World(llama_spec())
    foreign = m.service("llama", "ns", "base")
    foreign["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    world.services["llama"] = foreign
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "NameConflict"
    assert world.services["llama"] is not None and world.services["llama"]["metadata"]["ownerReferences"] == [{"uid": "someone-else"}]
    assert all(o["metadata"]["name"] != "llama" for o in plan.apply)
    assert not plan.starts_probe


def test_parse_validator_report_exit_codes() -> None:
    assert parse_validator_report(0, COMPATIBLE, "r").compatible is True
    bad = parse_validator_report(1, INCOMPATIBLE, "r")
    assert bad.compatible is False and [f.code for f in bad.findings] == ["HiddenSizeMismatch", "VocabSizeMismatch"]
    unusable = parse_validator_report(2, "specdec validate: error: /models/x: no config.json", "r")
    assert unusable.compatible is False and unusable.findings[0].code == "ValidatorInputError"
    assert "no config.json" in unusable.findings[0].message
    killed = parse_validator_report(137, "", "r")
    assert killed.findings[0].code == "ValidatorFailed"
    garbage = parse_validator_report(1, "{not json", "r")
    assert garbage.compatible is False and garbage.findings[0].code == "DrafterIncompatible"


def test_revision_and_helpers() -> None:
    assert speculative_revision(parse_spec(llama_spec())) == speculative_revision(parse_spec(llama_spec(**{"monitor.window": 9})))
    assert merge_patch({"a": 1, "p": {"x": 1, "y": 2}, "kopf": {}}, {"a": 1, "p": {"x": 1}}) == {"p": {"y": None}}
    assert merge_patch({"a": 1}, {"a": 1}) is None


def test_a_restarting_promoted_server_fails_over_to_base_and_back_without_a_new_decision() -> None:
    world = World(llama_spec())
    promoted = to_promoted(world)
    world.pods = [p for p in world.pods if p["metadata"]["labels"]["specdec.io/variant"] == "base"]
    world.add_pod("speculative", init=(0, COMPATIBLE), running_since=NOW)  # restarted, loading again
    down = world.step(now=NOW + timedelta(seconds=10))
    assert down.status["phase"] == "Promoted" and down.status["probe"]["decision"] == "promote"
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    world.pods[-1]["status"]["conditions"][-1]["status"] = "True"
    up = world.step(now=NOW + timedelta(minutes=2))
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert not up.starts_probe and up.revision == promoted.revision
    assert [e.reason for e in up.events] == ["TrafficSwitched"]


def test_a_validator_that_cannot_start_says_why() -> None:
    world = World(llama_spec())
    world.step()
    pod = world.add_pod("speculative")
    pod["status"]["initContainerStatuses"] = [
        {"name": m.VALIDATOR_CONTAINER, "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "specdec:bad"'}}}
    ]
    plan = world.step()
    assert plan.status["phase"] == "Validating"
    assert f'of container {m.VALIDATOR_CONTAINER} cannot be pulled: ImagePullBackOff (Back-off pulling image "specdec:bad")' in plan.status["message"]
    speculative_ready = next(c for c in plan.status["conditions"] if c["type"] == "SpeculativeReady")
    assert speculative_ready["reason"] == "ImageNotPulled"
    pod["status"]["initContainerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
    assert "validating the drafter against the target" in world.step().status["message"]


def test_settled_only_once_decided_with_every_running_server_ready() -> None:
    """A settled resource is only stepped on events and the slow resync; anything that changes with time is not settled."""
    world = World(llama_spec())
    assert not world.step().settled  # creating the children
    world.set_pods(base={"running_since": NOW - timedelta(seconds=30)}, speculative={"init": (0, COMPATIBLE), "running_since": NOW})
    assert not world.step().settled  # loading: the message carries elapsed time
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    probing = world.step()
    assert probing.starts_probe and not probing.settled
    world.probe_running = probing.revision
    decided = world.step(probe_result=promote_result(probing.revision))
    assert decided.status["phase"] == "Promoted"
    assert not decided.settled and decided.apply  # the base is being scaled to 0: not settled until applied
    world.probe_running = None
    assert world.step().settled
    world.set_pods(speculative={"running_since": NOW, "init": (0, COMPATIBLE)})  # the winner's pod restarts
    assert not world.step().settled


def test_ready_waits_for_the_stable_service_which_may_trail_the_servers() -> None:
    world = World(llama_spec())
    world.step()
    del world.services["llama"]  # its creation (beside the steps) has not landed yet
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    ready = conditions(plan.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ServicePending" and "llama" in ready["message"]
    assert any(o["kind"] == "Service" and o["metadata"]["name"] == "llama" for o in plan.apply)
    assert plan.starts_probe  # nothing in the lifecycle waits for that Service
    assert conditions(world.step(probe_running=plan.revision).status)["Ready"]["status"] == "True"  # applied: served


def test_invalid_is_settled_only_when_the_base_serves() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"running_since": NOW}, speculative={"init": (2, INCOMPATIBLE)})
    loading = world.step()
    assert loading.status["phase"] == "Invalid" and not loading.settled
    world.set_pods(base={"ready": True})
    assert world.step().settled


def test_pod_templates_are_rendered_once_per_generation_when_the_caller_keeps_them() -> None:
    from specdec_operator.reconcile import _default_render

    world = World(llama_spec())
    calls = []

    def counting_render(spec, variant, **options):
        calls.append(variant)
        return _default_render(spec, variant, **options)

    obs = Observed(name="llama", namespace="ns", uid=UID, generation=1, deployments={}, services={}, pods=[])
    first = reconcile(world.spec, obs, {}, NOW, render_argv=counting_render)
    again = reconcile(world.spec, obs, first.status, NOW + timedelta(seconds=30), render_argv=counting_render, rendered=first.rendered)
    fresh = reconcile(world.spec, obs, {}, NOW)
    assert sorted(calls) == ["base", "speculative"]  # two steps, one rendering of each variant
    assert first.apply == fresh.apply == again.apply  # the same children as rendering every time


@pytest.mark.parametrize(
    ("drafter", "says"),
    [
        ({"algorithm": "NGRAM", "numSteps": 3}, "NGRAM drafts from the prompt and the output so far"),
        ({"algorithm": "NEXTN", "numSteps": 1}, "NEXTN drafts with the target's own layers"),
    ],
)
def test_a_method_without_a_drafter_model_is_compatible_and_says_what_drafts(drafter, says) -> None:
    world = World(llama_spec(drafter=drafter))
    plan = world.step()
    (finding,) = plan.status["validation"]["findings"]
    assert plan.status["validation"]["compatible"] is True and finding["code"] == "NoSeparateDrafter"
    assert finding["message"].startswith(says), finding
