"""The first week of a platform team, on the in-memory World: every wait names its cause and ends at the progress
deadline, a speculative server that lost holds no GPUs, and people steer with annotations (retry, abort, promote,
pause, resume)."""

import copy
from datetime import timedelta

from specdec_operator import manifests as m
from specdec_operator import steering
from tests.support.world import COMPATIBLE, NOW, World, conditions, llama_spec, promote_result, reasons, to_promoted

DEADLINE = 600


def lost(world: World) -> None:
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    world.probe_running = plan.revision
    result = {**promote_result(plan.revision), "decision": "rollback", "reason": "SpeedupBelowThreshold", "message": "0.99x"}
    world.step(probe_result=result)
    world.probe_running = None


def test_a_speculative_server_that_lost_holds_no_gpus_by_default():
    world = World(llama_spec())  # keepBaseWarm true (default), keepSpeculativeWarm false (default)
    lost(world)
    assert world.status["phase"] == "RolledBack"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0 and world.deployments["llama-base"]["spec"]["replicas"] == 1
    kept = World(llama_spec(**{"rollout.keepSpeculativeWarm": True}))
    lost(kept)
    assert kept.deployments["llama-spec"]["spec"]["replicas"] == 1


def test_status_counts_the_gpus_each_variant_holds_and_the_idle_ones():
    world = World(llama_spec())
    promoted = to_promoted(world)
    gpus = world.spec.resources.gpus
    # World's pods are the operator's index copies (kopf_tuning.slim_pod) of pods of the rendered templates.
    # Promoted with keepBaseWarm (the default): the warm base serves no traffic and is not probed.
    assert promoted.status["gpus"] == {"base": gpus, "speculative": gpus, "idle": gpus}


def test_a_volume_that_does_not_mount_is_named_and_ends_at_the_deadline():
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    world.add_pod("base", ready=True)
    pod = world.add_pod("speculative")
    pod["metadata"]["uid"] = "pod-uid"
    pod["status"]["initContainerStatuses"] = [{"name": m.VALIDATOR_CONTAINER, "state": {"waiting": {"reason": "PodInitializing"}}}]
    event = {
        "type": "Warning",
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "models" : hostPath type check failed: /models is not a directory',
        "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "uid": "pod-uid"},
    }
    first = world.step(pod_events=[event])
    assert first.status["phase"] == "Validating"
    assert conditions(first.status)["SpeculativeReady"]["reason"] == "VolumeNotMounted"
    assert "volume models is not mounted" in first.status["message"]
    assert first.status["waitingFor"] == "the drafter validator (VolumeNotMounted)" and first.status["waitingSince"] == "2026-12-02T10:00:00Z"
    assert "VolumeNotMounted" in reasons(first)  # a Warning Event, once
    assert all(e.type == "Warning" for e in first.events if e.reason == "VolumeNotMounted")
    later = world.step(now=NOW + timedelta(seconds=DEADLINE - 1), pod_events=[event])
    assert later.status["phase"] == "Validating" and "VolumeNotMounted" not in reasons(later)
    assert later.status["waitingSince"] == "2026-12-02T10:00:00Z"
    expired = world.step(now=NOW + timedelta(seconds=DEADLINE + 1), pod_events=[event])
    assert expired.status["phase"] == "RolledBack" and expired.status["reason"] == "ProgressDeadlineExceeded"
    assert "volume models is not mounted" in expired.status["message"]
    assert expired.status["activeVariant"] == "base"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0  # the stuck pod holds no GPUs
    assert "ProgressDeadlineExceeded" in reasons(expired)
    # Retry: the same revision again, without touching the base.
    base_template = world.template("base")
    world.pods = [p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == "base"]
    retried = world.step(now=NOW + timedelta(seconds=DEADLINE + 10), annotations={steering.RETRY: "t1"})
    assert retried.status["phase"] == "Validating" and retried.status["steering"]["retried"] == "t1"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1 and world.template("base") == base_template
    assert "RetryRequested" in reasons(retried)
    again = world.step(now=NOW + timedelta(seconds=DEADLINE + 20), annotations={steering.RETRY: "t1"})
    assert "RetryRequested" not in reasons(again) and again.status["phase"] == "Validating"  # one retry per token


def test_progress_resets_the_deadline():
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    world.add_pod("base", ready=True)
    world.add_pod("speculative", init=(0, COMPATIBLE), running_since=NOW)
    loading = world.step()
    assert loading.status["waitingFor"] == "the speculative server (Loading)"
    # The validator finished long ago (a new thing to wait for): the clock starts again.
    assert world.step(now=NOW + timedelta(seconds=DEADLINE // 2)).status["waitingSince"] == loading.status["waitingSince"]
    world.pods[-1]["status"]["containerStatuses"] = [
        {"name": "sglang", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1}}}
    ]
    crashing = world.step(now=NOW + timedelta(seconds=DEADLINE // 2 + 5))
    assert crashing.status["waitingFor"] == "the speculative server (CrashLoop)"
    assert crashing.status["waitingSince"] == "2026-12-02T10:05:05Z"


def test_a_base_that_exits_at_start_reaches_the_deadline_although_the_kubelet_runs_it_between_back_offs():
    """What the real node showed (tests/cluster/test_realnode_stuck.py): between CrashLoopBackOff waits the container
    runs for a moment (Starting, Loading); that is not progress."""
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    pod = world.add_pod("base", running_since=NOW)
    states = [
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
        {"running": {"startedAt": "2026-12-02T10:00:20Z"}},
        {"waiting": {"reason": "ContainerCreating"}},
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
    ]
    seen = set()
    for i in range(DEADLINE // 10 + 2):
        state = states[i % len(states)]
        pod["status"]["containerStatuses"] = [
            {"name": "sglang", "restartCount": 1 + i // 4, "state": state, "lastState": {"terminated": {"exitCode": 1, "message": "no such profile"}}}
        ]
        plan = world.step(now=NOW + timedelta(seconds=10 * i))
        seen.add(plan.status.get("waitingFor"))
    assert seen == {"the base server (CrashLoop)"}
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "ProgressDeadlineExceeded", plan.status
    assert "no such profile" in plan.status["message"], plan.status["message"]  # the last words, whatever the moment


def test_a_base_that_never_comes_fails_at_the_deadline_and_recovers_by_itself():
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    pod = world.add_pod("base")
    pod["status"]["conditions"][0] = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    world.step()
    failed = world.step(now=NOW + timedelta(seconds=DEADLINE + 1))
    assert failed.status["phase"] == "Failed" and failed.status["reason"] == "ProgressDeadlineExceeded"
    assert "not enough nvidia.com/gpu" in failed.status["message"]
    assert "ProgressDeadlineExceeded" in reasons(failed)
    world.set_pods(base={"ready": True})
    assert world.step(now=NOW + timedelta(seconds=DEADLINE + 30)).status["phase"] != "Failed"


def test_abort_goes_back_to_the_base_and_stays_until_resumed():
    world = World(llama_spec())
    promoted = to_promoted(world)
    assert promoted.status["phase"] == "Promoted"
    world.probe_running = None
    aborted = world.step(annotations={steering.ABORT: "p99 latency regression"})
    assert aborted.status["phase"] == "RolledBack" and aborted.status["reason"] == "Aborted"
    assert aborted.status["activeVariant"] == "base"
    assert "p99 latency regression" in aborted.status["message"]
    assert aborted.status["steering"]["override"] == "abort" and aborted.status["steering"]["reason"] == "p99 latency regression"
    assert [e.type for e in aborted.events if e.reason == "Aborted"] == ["Warning"]
    assert aborted.status["probe"]["speedup"] == 1.9  # what the probe measured stays on the record
    held = world.step(annotations={steering.ABORT: "p99 latency regression"})
    assert held.status["reason"] == "Aborted" and not held.events
    resumed = world.step()  # the annotation is gone: the revision is undecided again and probed
    assert resumed.status["phase"] == "Probing" and (resumed.status["probe"] or {}).get("decision") is None
    assert resumed.starts_probe and (resumed.status["steering"] or {}).get("override") is None


def test_promote_by_hand_skips_the_probe_with_a_warning_and_the_reason():
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    probing = world.step()
    assert probing.starts_probe
    world.probe_running = probing.revision
    promoted = world.step(annotations={steering.PROMOTE: "measured on the canary by hand"})
    assert promoted.status["phase"] == "Promoted" and promoted.status["reason"] == "PromotedByHand"
    assert promoted.stops_probe and promoted.status["activeVariant"] == "speculative"
    (event,) = [e for e in promoted.events if e.reason == "PromotedByHand"]
    assert event.type == "Warning" and "measured on the canary by hand" in event.message


def test_promote_by_hand_at_creation_is_deploying_until_the_speculative_server_serves():
    world = World(llama_spec())
    created = world.step(annotations={steering.PROMOTE: "measured elsewhere"})
    assert created.status["phase"] == "Deploying" and created.status["reason"] == "PromotedByHand", created.status
    assert "waiting for the speculative server" in created.status["message"]
    world.set_pods(base={"ready": True}, speculative={"init": (0, COMPATIBLE), "running_since": NOW})
    loading = world.step(annotations={steering.PROMOTE: "measured elsewhere"})
    assert loading.status["phase"] == "Deploying" and loading.status["activeVariant"] == "base"
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    serving = world.step(annotations={steering.PROMOTE: "measured elsewhere"})
    assert serving.status["phase"] == "Promoted" and serving.status["activeVariant"] == "speculative"
    assert not serving.starts_probe
    # Once it has served, a restart of the promoted server keeps the phase (the base answers meanwhile).
    world.set_pods(base={"ready": True}, speculative={"init": (0, COMPATIBLE), "running_since": NOW})
    restarting = world.step(annotations={steering.PROMOTE: "measured elsewhere"})
    assert restarting.status["phase"] == "Promoted" and restarting.status["activeVariant"] == "base"


def test_promote_does_not_override_an_incompatible_drafter():
    from tests.support.world import INCOMPATIBLE

    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"init": (1, INCOMPATIBLE)})
    plan = world.step(annotations={steering.PROMOTE: "ship it"})
    assert plan.status["phase"] == "Invalid" and plan.status["activeVariant"] == "base"


def test_pause_holds_a_fleet_walk_and_resume_continues_it():
    from tests.support.world import World as Fleet

    world = Fleet(llama_spec(replicas=4, **{"rollout.maxSurge": 0, "rollout.maxUnavailable": 1}))
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.add_pod("base", ready=True)
    world.add_pod("base", ready=True)
    plan = world.step()
    world.probe_running = plan.revision
    walking = world.step(probe_result=promote_result(plan.revision))
    asked = (world.deployments["llama-base"]["spec"]["replicas"], world.deployments["llama-spec"]["spec"]["replicas"])
    assert conditions(walking.status)["RolledOut"]["reason"] == "WalkingToSpeculative"
    world.probe_running = None
    # The base server the first step let go is gone: without the pause the walk would take its next step now.
    base_pods = [p for p in world.pods if p["metadata"]["labels"][m.LABEL_VARIANT] == "base"]
    world.pods.remove(base_pods[-1])
    unpaused = copy.deepcopy(world)
    unpaused.step()
    assert (unpaused.deployments["llama-base"]["spec"]["replicas"], unpaused.deployments["llama-spec"]["spec"]["replicas"]) != asked
    paused = world.step(annotations={steering.PAUSED: "true"})
    assert (world.deployments["llama-base"]["spec"]["replicas"], world.deployments["llama-spec"]["spec"]["replicas"]) == asked
    assert conditions(paused.status)["RolledOut"]["reason"] == "WalkPaused"
    assert "WalkPaused" in reasons(paused) and paused.status["steering"]["paused"] is True
    resumed = world.step()
    assert "WalkResumed" in reasons(resumed) and conditions(resumed.status)["RolledOut"]["reason"] == "WalkingToSpeculative"
    assert (world.deployments["llama-base"]["spec"]["replicas"], world.deployments["llama-spec"]["spec"]["replicas"]) == (
        unpaused.deployments["llama-base"]["spec"]["replicas"],
        unpaused.deployments["llama-spec"]["spec"]["replicas"],
    )
