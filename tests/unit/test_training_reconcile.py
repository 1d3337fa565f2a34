"""spec.retraining.training in reconcile (docs/retraining.md): a drift rollback starts the training Job
``<name>-train-<n>`` by itself, once; the cooldown, maxPerDay, the cluster's cap and the captured traffic hold the
next one; the Job's progress and failure reach status.retraining.training and the RetrainStarted / RetrainFailed
Events; serving is never touched by a training Job. Driven through the World (reconcile with applied children)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta

from specdec_operator.monitor import Sample
from specdec_operator.reconcile import Plan
from specdec_operator.trainjob import LABEL_RETRAIN
from tests.support.world import NOW, World, llama_spec, reasons, to_promoted

NAME = "llama"
CAPTURE = {"enabled": True, "sampleShare": 0.05}


def training_spec(**training) -> dict:
    return llama_spec(**{"monitor.window": 1, "retraining": {"capture": CAPTURE, "training": training}})


def training(plan: Plan) -> dict:
    return (plan.status.get("retraining") or {}).get("training") or {}


def jobs(plan: Plan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.apply if o["kind"] == "Job"]


def drifted(world: World, samples: int | None = 500) -> tuple[Plan, datetime]:
    """Promote, then one scrape under the floor (window 1): the drift rollback's step."""
    to_promoted(world)
    t = NOW + timedelta(seconds=20)
    plan = world.step(now=t, scrape=Sample(time=t.isoformat(), accept_length=1.0), captured_samples=samples)
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "AcceptanceDrift"
    return plan, t


def fail(world: World, job: str, at: datetime) -> None:
    """The Job controller gave up on the Job (retries spent), its pod's train stage out of memory."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    world.jobs[job]["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": stamp}],
        "failed": 2,
    }


def failed_pod(job: str) -> dict:
    return {
        "metadata": {"name": f"{job}-abcde", "labels": {"batch.kubernetes.io/job-name": job}, "creationTimestamp": "2026-12-02T10:01:00Z"},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "gather", "state": {"terminated": {"exitCode": 0}}},
                {"name": "regenerate", "state": {"terminated": {"exitCode": 0}}},
                {"name": "capture", "state": {"terminated": {"exitCode": 0}}},
                {"name": "train", "state": {"terminated": {"exitCode": 1, "message": "torch.OutOfMemoryError: CUDA out of memory"}}},
            ],
        },
    }


def without_retraining(status: dict) -> dict:
    return {k: v for k, v in status.items() if k != "retraining"}


def test_a_drift_starts_the_training_job_once_with_its_deterministic_name() -> None:
    world = World(training_spec())
    plan, t = drifted(world)
    assert jobs(plan) == ["llama-train-1"]
    job = world.jobs["llama-train-1"]
    assert job["metadata"]["labels"][LABEL_RETRAIN] == "1" and job["spec"]["template"]["spec"]["priorityClassName"] == "specdec-training"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    record = training(plan)
    assert record["job"] == "llama-train-1" and record["trigger"] == "Drift" and record["state"] == "Pending"
    assert record["jobsStarted"] == 1 and record["samplesAtStart"] == 500 and len(record["recentStarts"]) == 1
    assert "RetrainStarted" in reasons(plan) and "AcceptanceDrift" in reasons(plan)
    # The next step sees the Job: none other starts, and nothing is announced again.
    again = world.step(now=t + timedelta(seconds=30), captured_samples=900)
    assert jobs(again) == [] and "RetrainStarted" not in reasons(again)
    assert training(again)["waiting"] == "TrainingRunning" and training(again)["jobsStarted"] == 1
    assert list(world.jobs) == ["llama-train-1"]


def test_a_restarted_operator_adopts_the_job_it_did_not_record() -> None:
    world = World(training_spec())
    _, t = drifted(world)
    world.status["retraining"]["training"] = None  # the Job was created; the status write was lost with the process
    plan = world.step(now=t + timedelta(seconds=5), captured_samples=500)
    assert jobs(plan) == [] and list(world.jobs) == ["llama-train-1"]
    assert training(plan)["job"] == "llama-train-1" and training(plan)["jobsStarted"] == 1 and training(plan)["trigger"] == "Drift"


def test_a_failed_job_shows_in_status_and_events_and_serving_is_untouched() -> None:
    world = World(training_spec())
    _, t = drifted(world)
    serving = copy.deepcopy((world.deployments, world.services))
    before = without_retraining(world.status)
    fail(world, "llama-train-1", t + timedelta(minutes=40))
    plan = world.step(now=t + timedelta(minutes=41), training_pods=[failed_pod("llama-train-1")], captured_samples=500)
    record = training(plan)
    assert record["state"] == "Failed" and record["reason"] == "TrainingFailed" and record["outcome"] == "Failed"
    assert "stage train" in record["message"] and "out of memory" in record["message"]
    assert record["finishedAt"] == (t + timedelta(minutes=40)).strftime("%Y-%m-%dT%H:%M:%SZ")
    failed = [e for e in plan.events if e.reason == "RetrainFailed"]
    assert len(failed) == 1 and failed[0].type == "Warning" and "llama-train-1" in failed[0].message
    # Serving: the same children, phase, decision and conditions; only status.retraining moved. (The capture's claim is
    # applied again at each step while no capture pod is Ready: capture.py, not the Job.)
    assert [o["kind"] for o in plan.apply] == ["PersistentVolumeClaim"] and (world.deployments, world.services) == serving
    assert without_retraining(plan.status) == before
    # The cooldown holds the next Job (default 360 minutes after the failure), and says until when.
    assert jobs(plan) == [] and record["waiting"] == "Cooldown"
    assert record["nextStartAfter"] == (t + timedelta(minutes=40 + 360)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert plan.next_step_in is not None and abs(plan.next_step_in - (359 * 60)) < 1
    quiet = world.step(now=t + timedelta(minutes=42), captured_samples=500)
    assert "RetrainFailed" not in reasons(quiet) and jobs(quiet) == []
    # Past the cooldown the drift still stands: the second Job.
    later = world.step(now=t + timedelta(minutes=40 + 361), captured_samples=500)
    assert jobs(later) == ["llama-train-2"] and training(later)["jobsStarted"] == 2 and training(later).get("outcome") is None


def test_a_succeeded_job_is_announced_and_holds_the_next_until_its_revision_is_judged() -> None:
    world = World(training_spec(cooldownMinutes=0))
    _, t = drifted(world)
    done = (t + timedelta(minutes=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    world.jobs["llama-train-1"]["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1, "completionTime": done}
    from tests.unit.test_revision_reconcile import publish_pod, report

    plan = world.step(now=t + timedelta(minutes=91), captured_samples=500, training_pods=[publish_pod("llama-train-1", report("llama-train-1"))])
    record = training(plan)
    assert record["state"] == "Succeeded" and record["reason"] == "TrainingSucceeded" and record["finishedAt"] == done
    assert record.get("outcome") is None and [e.type for e in plan.events if e.reason == "RetrainSucceeded"] == ["Normal"]
    # The drift still stands and no cooldown holds, but the published revision passed offline and races first
    # (test_revision_reconcile.py): no Job starts while its outcome is open.
    later = world.step(now=t + timedelta(days=2), captured_samples=5000)
    assert jobs(later) == [] and training(later)["waiting"] == "RevisionUnjudged" and "RetrainSucceeded" not in reasons(later)


def test_a_quota_refusing_the_pod_shows_in_status_from_the_jobs_events() -> None:
    world = World(training_spec())
    _, t = drifted(world)
    refused = {
        "type": "Warning",
        "reason": "FailedCreate",
        "involvedObject": {"kind": "Job", "name": "llama-train-1"},
        "message": 'Error creating: pods "llama-train-1-x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1',
    }
    other = {**refused, "involvedObject": {"kind": "Job", "name": "other-train-1"}, "message": "forbidden: exceeded quota: cpu"}
    plan = world.step(now=t + timedelta(seconds=30), captured_samples=500, training_events=[other, refused])
    record = training(plan)
    assert record["state"] == "Pending" and record["reason"] == "TrainingQuotaRefused" and "requests.nvidia.com/gpu=1" in record["message"]
    assert "cpu" not in record["message"] and jobs(plan) == [] and record["waiting"] == "TrainingRunning"


def test_max_per_day_holds_the_third_job_of_a_day() -> None:
    world = World(training_spec(cooldownMinutes=0, maxPerDay=2))
    _, t = drifted(world)
    fail(world, "llama-train-1", t + timedelta(minutes=10))
    second = world.step(now=t + timedelta(minutes=11), captured_samples=500)
    assert jobs(second) == ["llama-train-2"]
    fail(world, "llama-train-2", t + timedelta(minutes=20))
    held = world.step(now=t + timedelta(minutes=21), captured_samples=500)
    assert jobs(held) == [] and training(held)["waiting"] == "MaxPerDay" and training(held)["state"] == "Failed"
    assert training(held)["nextStartAfter"] == (t + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # A day after the first start the window admits one more.
    third = world.step(now=t + timedelta(days=1, seconds=1), captured_samples=500)
    assert jobs(third) == ["llama-train-3"] and len(training(third)["recentStarts"]) == 2


def test_the_cluster_cap_and_too_little_traffic_hold_the_job() -> None:
    world = World(training_spec())
    to_promoted(world)
    t = NOW + timedelta(seconds=20)
    plan = world.step(now=t, scrape=Sample(time=t.isoformat(), accept_length=1.0), captured_samples=500, training_jobs_running=1)
    assert plan.status["reason"] == "AcceptanceDrift" and jobs(plan) == [] and training(plan)["waiting"] == "ClusterCap"
    few = world.step(now=t + timedelta(seconds=10), captured_samples=10)
    assert jobs(few) == [] and training(few)["waiting"] == "NotEnoughTraffic" and "10 of minSamples 200" in training(few)["waitingMessage"]
    freed = world.step(now=t + timedelta(seconds=20), captured_samples=500, training_jobs_running=0)
    assert jobs(freed) == ["llama-train-1"]


def test_without_capture_or_training_no_job_starts() -> None:
    no_capture = World(llama_spec(**{"monitor.window": 1, "retraining": {"training": {}}}))
    plan, _ = drifted(no_capture)
    assert jobs(plan) == [] and training(plan)["waiting"] == "NotEnoughTraffic"
    off = World(llama_spec(**{"monitor.window": 1}))
    plan, _ = drifted(off)
    assert jobs(plan) == [] and "retraining" not in {k for k, v in plan.status.items() if v}


def test_in_a_race_the_candidate_in_the_slot_is_the_one_retrained() -> None:
    from specdec_operator.api import RaceStatus, SpeculativeServerStatus
    from specdec_operator.reconcile.training import served_spec
    from specdec_operator.resource import parse_spec

    raw = training_spec()
    raw["candidates"] = [{"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 10}]
    spec = parse_spec(raw)
    won = SpeculativeServerStatus(race=RaceStatus(revision="r", state="Decided", winner="ngram", current="ngram"))
    assert served_spec(spec, won).drafter.algorithm == "NGRAM"  # decide_retrain: never, NoDrafterToTrain
    assert served_spec(spec, SpeculativeServerStatus(race=RaceStatus(revision="r", state="Running", current="eagle3"))).drafter.algorithm == "EAGLE3"
    assert served_spec(spec, SpeculativeServerStatus()) is spec
