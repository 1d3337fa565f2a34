"""Trained revisions in reconcile (issue 36, items 3-4; reconcile/revision.py): a succeeded training Job's revision is
judged offline from its publish container's termination message, raced live against the base and the serving drafter
(scripted probe results: decisions, not timings), promoted only when it wins, and served from the revisions claim;
spec.retraining.revision pins an earlier one or spec.drafter. Driven through the World."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from specdec_operator import manifests as m
from specdec_operator.api_retraining import RetrainingStatus
from specdec_operator.api_retraining_job import RetrainingTraining
from specdec_operator.reconcile import Plan, StartProbe
from specdec_operator.reconcile.candidate_race import revisions
from specdec_operator.reconcile.revision import Report, effective_spec, offline_gate, read_report
from specdec_operator.reconcile.status import STATUS_BYTES_BUDGET
from tests.support.world import COMPATIBLE, INCOMPATIBLE, World, llama_spec, reasons, to_promoted
from tests.unit.test_candidate_race import lost, passed
from tests.unit.test_training_reconcile import drifted, training

WORKLOADS = ["chat", "batch-32"]  # llama_spec's
CAPTURE = {"enabled": True, "sampleShare": 0.05, "storageClassName": "fast-rwx", "accessMode": "ReadWriteMany"}


def spec_with(**changes) -> dict:
    training = {"cooldownMinutes": 0, **changes.pop("training", {})}
    return llama_spec(**{"monitor.window": 1, "retraining": {"capture": CAPTURE, "training": training, **changes}})


def report(job: str, new: float | None = 2.6, old: float | None = 2.2, passed_: bool = True, codes=(), pruned=()) -> dict:
    out: dict = {
        "schema": 1,
        "revision": job,
        "path": job,
        "heldout": 40,
        "validation": {"passed": passed_, "codes": list(codes)},
        "trainSamples": 400,
        "steps": 200,
        "bytes": 1 << 20,
        "pruned": list(pruned),
    }
    if new is not None and old is not None:
        out["offline"] = {"revision": {"acceptLength": new}, "serving": {"acceptLength": old}}
    return out


def publish_pod(job: str, message: dict | str | None) -> dict:
    terminated: dict = {"exitCode": 0}
    if message is not None:
        terminated["message"] = message if isinstance(message, str) else json.dumps(message)
    return {
        "metadata": {"name": f"{job}-pod", "labels": {"batch.kubernetes.io/job-name": job}},
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "publish", "state": {"terminated": terminated}}]},
    }


def succeed(world: World, job: str, at: datetime, message: dict | str | None) -> Plan:
    """Job ``job`` completed at ``at``; the step that reads it (its pod listed, as while it was active)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    world.jobs[job]["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1, "completionTime": stamp}
    return world.step(now=at + timedelta(seconds=30), training_pods=[publish_pod(job, message)], captured_samples=500)


def rows(world: World) -> list[tuple[str, str, str | None]]:
    return [(r["name"], r["outcome"], r.get("reason")) for r in world.status["retraining"].get("revisions") or []]


def racing(world: World, message: dict | None = None) -> tuple[datetime, dict[str, str]]:
    """A drift, Job 1 trains, its revision passes offline: Racing; the next step starts the race. The candidates'
    revisions by name."""
    _, t = drifted(world)
    plan = succeed(world, "llama-train-1", t + timedelta(minutes=30), message or report("llama-train-1"))
    assert rows(world) == [("llama-train-1", "Racing", "OfflineGainPassed")] and training(plan).get("outcome") is None
    return t, revisions(effective_spec(world.spec, _status(world), world.name))


def _status(world: World):
    from specdec_operator.reconcile import read_status

    return read_status(world.status)


def serve_slot(world: World) -> StartProbe:
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.probe_running = None
    plan = world.step(captured_samples=500)
    assert isinstance(plan.probe, StartProbe), (world.status["phase"], world.status.get("message"))
    world.probe_running = plan.probe.probe_id
    return plan.probe


def spec_pod(world: World) -> dict:
    return world.deployments["llama-spec"]["spec"]["template"]["spec"]


# --- the offline gate --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("new", "old", "valid", "codes", "reason"),
    [
        (2.6, 2.2, True, (), None),  # 2.6 >= 2.2 * 1.05
        (2.31, 2.2, True, (), None),  # exactly at the margin passes
        (2.3, 2.2, True, (), "OfflineGainBelowMargin"),  # better, but by less than 5 %
        (2.0, 2.2, True, (), "OfflineGainBelowMargin"),
        (2.6, 2.2, False, ("AuxLayersNotTrained",), "RevisionInvalid"),
        (2.6, 2.2, None, (), "RevisionInvalid"),  # no validation result is no pass
        (None, 2.2, True, (), "OfflineEvaluationMissing"),
        (2.6, None, True, (), "OfflineEvaluationMissing"),
    ],
)
def test_the_offline_gate(new, old, valid, codes, reason) -> None:
    lost_reason, why = offline_gate(Report(40, new, old, valid, tuple(codes), ()), RetrainingTraining().min_acceptance_gain)
    assert lost_reason == reason
    if reason == "RevisionInvalid" and codes:
        assert "AuxLayersNotTrained" in why


def test_the_report_is_read_from_the_publish_container_or_is_unreadable() -> None:
    good = read_report([publish_pod("llama-train-1", report("llama-train-1", pruned=["llama-train-0"]))], "llama-train-1")
    assert isinstance(good, Report) and good.offline == 2.6 and good.serving_offline == 2.2 and good.pruned == ("llama-train-0",)
    assert isinstance(read_report([], "llama-train-1"), str)
    assert "not JSON" in str(read_report([publish_pod("llama-train-1", "Traceback (most recent")], "llama-train-1"))
    assert "schema 1" in str(read_report([publish_pod("llama-train-1", report("llama-train-2"))], "llama-train-1"))  # another Job's
    missing = read_report([publish_pod("llama-train-1", report("llama-train-1", new=None))], "llama-train-1")
    assert isinstance(missing, Report) and missing.offline is None


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (None, "RevisionReportUnreadable"),
        ("not json", "RevisionReportUnreadable"),
        ({"schema": 1, "revision": "llama-train-1"}, "RevisionInvalid"),  # no validation, no offline figures
        ("below", "OfflineGainBelowMargin"),
        ("invalid", "RevisionInvalid"),
        ("missing", "OfflineEvaluationMissing"),
    ],
)
def test_a_revision_failing_offline_is_lost_and_never_raced(message, reason) -> None:
    world = World(spec_with())
    _, t = drifted(world)
    serving = (world.deployments["llama-spec"]["spec"]["template"], world.services["llama"]["spec"])
    job = "llama-train-1"
    scripted = {"below": report(job, new=2.25), "invalid": report(job, passed_=False, codes=["TokenizerMismatch"]), "missing": report(job, new=None)}
    if isinstance(message, str) and message in scripted:
        message = scripted[message]
    plan = succeed(world, job, t + timedelta(minutes=30), message)
    assert rows(world) == [(job, "Lost", reason)] and training(plan)["outcome"] == "Lost"
    lost_events = [e for e in plan.events if e.reason == "RevisionLost"]
    assert len(lost_events) == 1 and lost_events[0].type == "Warning" and job in lost_events[0].message
    # Not raced, nothing served from it, and no retrain at once (RetrainedDrafterLost: the capture's count has not grown).
    later = world.step(now=t + timedelta(hours=2), captured_samples=500)
    assert "candidates" not in {k for k, v in world.status.items() if v} and "/revisions/" not in json.dumps(world.deployments)
    assert (world.deployments["llama-spec"]["spec"]["template"], world.services["llama"]["spec"]) == serving
    assert training(later)["waiting"] == "RetrainedDrafterLost" and [o for o in later.apply if o["kind"] == "Job"] == []
    assert "RevisionLost" not in reasons(later)  # said once


def test_after_a_loss_the_conversations_counted_since_the_jobs_start_let_the_next_job_start() -> None:
    """The capture at its cap keeps the whole count flat (500 before, 500 after): the proxies' count of conversations
    captured since the lost Job's start (Observed.captured_since) is what the rule reads, and only for that start."""
    world = World(spec_with())
    _, t = drifted(world)
    job = "llama-train-1"
    succeed(world, job, t + timedelta(minutes=30), report(job, new=2.25))
    started = world.status["retraining"]["training"]["startedAt"]
    later = t + timedelta(hours=8)  # past the cooldown and within the day's maximum
    other = world.step(now=later, captured_samples=500, captured_since=("2026-01-01T00:00:00Z", 5000))
    assert training(other)["waiting"] == "RetrainedDrafterLost"  # a count since another time says nothing of this Job
    flat = world.step(now=later + timedelta(seconds=5), captured_samples=500, captured_since=(started, 150))
    assert training(flat)["waiting"] == "RetrainedDrafterLost" and "150 of minSamples 200" in training(flat)["waitingMessage"]
    plan = world.step(now=later + timedelta(seconds=10), captured_samples=500, captured_since=(started, 250))
    assert [o["metadata"]["name"] for o in plan.apply if o["kind"] == "Job"] == ["llama-train-2"]


# --- the live race -----------------------------------------------------------------------------------------------


def test_a_revision_that_wins_the_race_is_promoted_served_from_the_claim_and_watched() -> None:
    world = World(spec_with())
    _, revs = racing(world)
    assert list(revs) == ["eagle3", "train-1"]
    world.step(captured_samples=500)
    assert [(c["name"], c["state"]) for c in world.status["candidates"]] == [("eagle3", "Measuring"), ("train-1", "Waiting")]
    # The serving drafter is measured again against the warm base, then the revision; each decision is scripted.
    probe = serve_slot(world)
    assert probe.revision == revs["eagle3"] and probe.family == 2
    # Both drafters are measured on the spec's workloads and on the revision's held-out slice of recent traffic.
    heldout = {"path": "llama-train-1/heldout.jsonl", "claimName": "llama-revisions"}
    assert probe.spec is not None and [w.name for w in probe.spec.rollout.workloads] == [*WORKLOADS, "held-out-traffic"]
    assert probe.spec.rollout.workloads[-1].prompts.file.model_dump(by_alias=True) == heldout  # type: ignore[union-attr]
    world.step(probe_result=passed(revs["eagle3"], 1.4, 1.2, 1.7), captured_samples=500)
    probe = serve_slot(world)
    assert probe.revision == revs["train-1"]
    assert probe.spec is not None and probe.spec.rollout.workloads[-1].prompts.file.model_dump(by_alias=True) == heldout  # type: ignore[union-attr]
    pod = spec_pod(world)  # the revision's server and validator read it from the claim, read-only
    assert {"name": m.REVISIONS_VOLUME, "persistentVolumeClaim": {"claimName": "llama-revisions", "readOnly": True}} in pod["volumes"]
    assert any(v["mountPath"] == "/revisions" and v["readOnly"] for v in pod["containers"][0]["volumeMounts"])
    assert any(v["mountPath"] == "/revisions" for v in pod["initContainers"][0]["volumeMounts"])
    assert "/revisions/llama-train-1" in json.dumps(pod["containers"][0]["command"])
    assert "/revisions" not in json.dumps(world.template("base"))  # the base is not restarted
    plan = world.step(probe_result=passed(revs["train-1"], 1.9, 1.6, 2.3), captured_samples=500)
    assert rows(world) == [("llama-train-1", "Promoted", "RaceWon")] and world.status["retraining"]["serving"] == "llama-train-1"
    row = world.status["retraining"]["revisions"][0]
    assert row["speedup"] == 1.9 and row["acceptLength"] == 2.5 and row["offlineAcceptLength"] == 2.6 and "1.4x" in row["message"]
    assert training(plan)["outcome"] == "Promoted" and "RevisionPromoted" in reasons(plan)
    # Then it is served alone (the effective spec): promoted once Ready, never probed again, and the monitor watches it.
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.probe_running = None
    plan = world.step(captured_samples=500)
    assert world.status["phase"] == "Promoted" and world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert not plan.starts_probe and "/revisions/llama-train-1" in json.dumps(spec_pod(world)["containers"][0]["command"])
    assert world.step(captured_samples=500).events == []
    assert world.status.get("candidates") is None and world.status.get("race") is None  # the race is over
    assert world.spec_dict["retraining"].get("revision") is None  # the spec is never written
    assert len(json.dumps(world.status)) < STATUS_BYTES_BUDGET
    # Retraining turned off: spec.drafter serves again (the revisions stay on the claim, their rows in status).
    del world.spec_dict["retraining"]["training"]
    settle(world)
    assert "/revisions" not in json.dumps(world.deployments) and world.status["retraining"].get("serving") is None
    assert rows(world) == [("llama-train-1", "Promoted", "RaceWon")]


def test_a_revision_that_loses_the_race_is_not_promoted_and_no_retrain_starts_at_once() -> None:
    world = World(spec_with())
    t, revs = racing(world)
    world.step(captured_samples=500)
    serve_slot(world)
    world.step(probe_result=passed(revs["eagle3"], 1.8, 1.5, 2.2), captured_samples=500)
    serve_slot(world)
    plan = world.step(probe_result=lost(revs["train-1"], reason="CannotWin", speedup=1.3), captured_samples=500)
    assert rows(world) == [("llama-train-1", "Lost", "RaceLost")] and world.status["retraining"].get("serving") is None
    assert "the serving drafter was faster" in world.status["retraining"]["revisions"][0]["message"]
    assert training(plan)["outcome"] == "Lost" and [e.type for e in plan.events if e.reason == "RevisionLost"] == ["Warning"]
    # The serving drafter's result stands: it serves again, from the model volume.
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.probe_running = None
    later = world.step(now=t + timedelta(hours=3), captured_samples=500)
    assert world.status["phase"] == "Promoted" and "/revisions" not in json.dumps(world.deployments) and not later.starts_probe
    assert training(later)["waiting"] == "NoTrigger" and [o for o in later.apply if o["kind"] == "Job"] == []  # no drift now


def test_a_revision_no_faster_than_the_base_loses_and_the_serving_drafters_decision_stands() -> None:
    world = World(spec_with())
    t, revs = racing(world)
    world.step(captured_samples=500)
    serve_slot(world)
    world.step(probe_result=lost(revs["eagle3"], speedup=0.9), captured_samples=500)
    serve_slot(world)
    world.step(probe_result=lost(revs["train-1"], reason="Inconclusive", speedup=1.05), captured_samples=500)
    assert rows(world) == [("llama-train-1", "Lost", "RaceLost")]
    # The revision was the best measured, but the decision kept is the serving drafter's (no new probe of it).
    assert world.status["probe"]["revision"] == revs["eagle3"] and world.status["probe"]["decision"] == "rollback"
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.probe_running = None
    after = world.step(now=t + timedelta(hours=1), captured_samples=500)
    assert world.status["phase"] == "RolledBack" and not after.starts_probe
    # The serving drafter's rollback (SpeedupBelowThreshold) would trigger a retrain, but the revision just lost: none
    # starts until minSamples new conversations are captured.
    assert training(after)["waiting"] == "RetrainedDrafterLost" and [o for o in after.apply if o["kind"] == "Job"] == []
    fresh = world.step(now=t + timedelta(hours=1), captured_samples=500 + 200)
    assert [o["metadata"]["name"] for o in fresh.apply if o["kind"] == "Job"] == ["llama-train-2"]


# --- a spec with candidates of its own ----------------------------------------------------------------------------

NGRAM = {"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 10}


def racing_beside_candidates(world: World, candidates: list[dict] | None = None) -> tuple[datetime, dict[str, str]]:
    """As racing(), the user having added spec.candidates (an ngram candidate) while Job 1 trained: the revision races
    too, as one more candidate after the user's. The candidates' revisions by name."""
    _, t = drifted(world)
    world.spec_dict["candidates"] = [dict(c) for c in candidates or [NGRAM]]
    succeed(world, "llama-train-1", t + timedelta(minutes=30), report("llama-train-1"))
    assert rows(world) == [("llama-train-1", "Racing", "OfflineGainPassed")]
    return t, revisions(effective_spec(world.spec, _status(world), world.name))


def race_of_three(world: World, results: dict[str, dict]) -> Plan:
    """The race measures the serving drafter, the user's ngram candidate and the revision in turn, each on the spec's
    workloads and the revision's held-out traffic, at a third of the error budget; ``results`` scripts each decision."""
    world.step(captured_samples=500)
    assert [(c["name"], c["state"]) for c in world.status["candidates"]] == [("eagle3", "Measuring"), ("ngram", "Waiting"), ("train-1", "Waiting")]
    plan = None
    for name in ("eagle3", "ngram", "train-1"):
        probe = serve_slot(world)
        assert probe.candidate == name and probe.family == 3 and probe.spec is not None
        assert [w.name for w in probe.spec.rollout.workloads] == [*WORKLOADS, "held-out-traffic"]
        plan = world.step(probe_result=results[name], captured_samples=500)
    assert plan is not None and world.status["race"]["state"] == "Decided"
    return plan


def race_table(world: World) -> list[tuple[str, str]]:
    return [(c["name"], c["state"]) for c in world.status["candidates"]]


def steady(world: World, steps: int = 3) -> list[Plan]:
    """Steps with every server Ready and no probe running: what the operator does once the race is over."""
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.probe_running = None
    return [world.step(captured_samples=500) for _ in range(steps)]


def test_a_revision_races_the_specs_own_candidates_wins_is_served_in_spec_drafters_place_and_is_not_raced_again() -> None:
    world = World(spec_with())
    _, revs = racing_beside_candidates(world)
    assert list(revs) == ["eagle3", "ngram", "train-1"]
    results = {
        "eagle3": passed(revs["eagle3"], 1.4, 1.2, 1.7),
        "ngram": lost(revs["ngram"], speedup=1.1),
        "train-1": passed(revs["train-1"], 1.9, 1.6, 2.3),
    }
    plan = race_of_three(world, results)
    assert rows(world) == [("llama-train-1", "Promoted", "RaceWon")] and world.status["retraining"]["serving"] == "llama-train-1"
    message = world.status["retraining"]["revisions"][0]["message"]
    assert "race of 3 candidates" in message and "eagle3 1.4x" in message and "ngram 1.1x" in message
    assert training(plan)["outcome"] == "Promoted" and "RevisionPromoted" in reasons(plan)
    # The race as the next step has it: the revision in spec.drafter's place (eagle3's name), the user's ngram beside it.
    assert race_table(world) == [("eagle3", "Serving"), ("ngram", "Lost")]
    assert world.status["candidates"][0]["revision"] == revs["train-1"] and world.status["race"]["winner"] == "eagle3"
    assert world.status["probe"]["revision"] == revs["train-1"] and world.status["probe"]["decision"] == "promote"
    decided = dict(world.status["race"])
    # What the race cost and the confidence its probes decided at are the race of three's, not the two rows kept.
    assert decided["gpuSeconds"] == pytest.approx(3 * 120.0) and decided["confidence"] == pytest.approx(1 - 0.002 / 3)
    # No new race: the revision serves with the race's decision, promoted once Ready, and nothing is measured again.
    later = steady(world)
    assert not any(p.starts_probe for p in later) and all(e.reason != "RaceDecided" for p in later for e in p.events)
    assert world.status["phase"] == "Promoted" and world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert "/revisions/llama-train-1" in json.dumps(spec_pod(world)["containers"][0]["command"])
    assert race_table(world) == [("eagle3", "Serving"), ("ngram", "Lost")]
    assert (world.status["race"]["revision"], world.status["race"]["winner"], world.status["race"]["state"]) == (
        decided["revision"],
        "eagle3",
        "Decided",
    )
    assert (world.status["race"]["gpuSeconds"], world.status["race"]["confidence"]) == (decided["gpuSeconds"], decided["confidence"])
    assert rows(world) == [("llama-train-1", "Promoted", "RaceWon")] and world.spec_dict["retraining"].get("revision") is None
    assert len(json.dumps(world.status)) < STATUS_BYTES_BUDGET
    # The user's candidates stay theirs: a change of one re-races them against the revision serving as spec.drafter.
    world.spec_dict["candidates"][0]["numDraftTokens"] = 8
    world.step(captured_samples=500)
    assert race_table(world) == [("eagle3", "Measuring"), ("ngram", "Waiting")] and world.status["race"]["state"] == "Running"
    assert world.status["candidates"][0]["revision"] == revs["train-1"]  # eagle3 is the revision (its directory)


def test_a_revision_beaten_by_a_candidate_of_the_spec_loses_and_that_candidate_serves() -> None:
    world = World(spec_with())
    _, revs = racing_beside_candidates(world)
    results = {
        "eagle3": passed(revs["eagle3"], 1.4, 1.2, 1.7),
        "ngram": passed(revs["ngram"], 1.8, 1.5, 2.2),
        "train-1": lost(revs["train-1"], reason="CannotWin", speedup=1.3),
    }
    plan = race_of_three(world, results)
    assert rows(world) == [("llama-train-1", "Lost", "RaceLost")] and world.status["retraining"].get("serving") is None
    message = world.status["retraining"]["revisions"][0]["message"]
    assert "candidate ngram (NGRAM) won" in message and "1.8x vs 1.3x" in message
    assert training(plan)["outcome"] == "Lost" and [e.type for e in plan.events if e.reason == "RevisionLost"] == ["Warning"]
    # The race's decision stands: ngram serves, the user's race goes on without the revision and is not run again.
    assert race_table(world) == [("eagle3", "Passed"), ("ngram", "Serving")] and world.status["race"]["winner"] == "ngram"
    assert world.status["probe"]["revision"] == revs["ngram"] and world.status["probe"]["decision"] == "promote"
    later = steady(world)
    assert not any(p.starts_probe for p in later) and world.status["phase"] == "Promoted"
    assert race_table(world) == [("eagle3", "Passed"), ("ngram", "Serving")] and world.status["probe"]["revision"] == revs["ngram"]
    assert "/revisions" not in json.dumps(world.deployments) and '"NGRAM"' in json.dumps(spec_pod(world)["containers"][0]["command"])
    # What is retrained is the drafter in the slot: ngram has none, so no Job starts.
    assert training(later[-1])["waiting"] == "NoDrafterToTrain" and [o for p in later for o in p.apply if o["kind"] == "Job"] == []


def test_a_race_of_candidates_none_faster_than_the_base_the_revision_loses_and_the_races_rollback_stands() -> None:
    world = World(spec_with())
    _, revs = racing_beside_candidates(world)
    results = {
        "eagle3": lost(revs["eagle3"], speedup=0.9),
        "ngram": lost(revs["ngram"], speedup=0.95),
        "train-1": lost(revs["train-1"], reason="Inconclusive", speedup=1.05),
    }
    race_of_three(world, results)
    assert rows(world) == [("llama-train-1", "Lost", "RaceLost")]
    assert "no candidate was confirmed faster than the base" in world.status["retraining"]["revisions"][0]["message"]
    # The revision was the best measured, but it no longer races: the best of the user's candidates' rollback stands.
    assert race_table(world) == [("eagle3", "Lost"), ("ngram", "Lost")] and world.status["race"].get("winner") is None
    assert world.status["race"]["current"] == "ngram"
    spent = world.status["race"]["gpuSeconds"]
    assert world.status["probe"]["revision"] == revs["ngram"] and world.status["probe"]["decision"] == "rollback"
    later = steady(world)
    assert not any(p.starts_probe for p in later) and world.status["phase"] == "RolledBack"
    assert world.status["probe"]["revision"] == revs["ngram"] and race_table(world) == [("eagle3", "Lost"), ("ngram", "Lost")]
    assert world.status["race"]["gpuSeconds"] == spent == pytest.approx(3 * 120.0)  # the revision's probe was paid for
    # The slot's candidate (ngram, whose rollback stands) has no drafter to retrain: no Job starts.
    assert training(later[-1])["waiting"] == "NoDrafterToTrain" and [o for p in later for o in p.apply if o["kind"] == "Job"] == []


def test_a_spec_candidate_with_the_revisions_race_name_leaves_it_evaluated_not_raced() -> None:
    world = World(spec_with())
    _, t = drifted(world)
    world.spec_dict["candidates"] = [{"name": "train-1", "algorithm": "NGRAM"}]
    succeed(world, "llama-train-1", t + timedelta(minutes=30), report("llama-train-1"))
    assert rows(world) == [("llama-train-1", "Evaluated", "CandidateNameTaken")]
    assert "rename that candidate" in world.status["retraining"]["revisions"][0]["message"]
    world.step(captured_samples=500)
    assert [c["name"] for c in world.status["candidates"]] == ["eagle3", "train-1"]  # the user's race alone


# --- the pin -----------------------------------------------------------------------------------------------------


def promoted_twice(world: World) -> None:
    """Revisions 1 and 2, each promoted in its race (the status as the operator wrote it), revision 2 serving."""
    status = _status(world)
    rows_ = [
        {"name": "llama-train-1", "outcome": "Retired", "reason": "Replaced", "speedup": 1.7},
        {"name": "llama-train-2", "outcome": "Promoted", "reason": "RaceWon", "speedup": 1.9},
    ]
    retraining = (status.retraining or RetrainingStatus()).model_dump(by_alias=True, exclude_none=True)
    world.status["retraining"] = {**retraining, "revisions": rows_, "serving": "llama-train-2"}


def settle(world: World) -> Plan:
    """Steps until the children stop changing (a drafter change walks the traffic back before its template changes)."""
    for _ in range(4):
        plan = world.step()
        if all(o["kind"] == "PersistentVolumeClaim" for o in plan.apply):  # the capture's claim, applied while no proxy is Ready
            return plan
    raise AssertionError(f"still applying {[o['metadata']['name'] for o in plan.apply]}")


def test_a_pin_to_an_older_revision_restores_it_and_drafter_pins_spec_drafter() -> None:
    world = World(spec_with())
    to_promoted(world)
    promoted_twice(world)
    settle(world)
    assert "/revisions/llama-train-2" in json.dumps(spec_pod(world)["containers"][0]["command"])
    world.spec_dict["retraining"]["revision"] = "llama-train-1"
    plan = world.step()
    assert "RevisionPinRefused" not in reasons(plan)
    settle(world)
    assert "/revisions/llama-train-1" in json.dumps(spec_pod(world)["containers"][0]["command"])
    assert world.status["retraining"]["serving"] == "llama-train-1" and not world.status["retraining"].get("pinRefused")
    # The restored revision is validated and probed as any new drafter (a decision is per speculative revision).
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    assert world.step().starts_probe
    world.probe_running = None
    world.spec_dict["retraining"]["revision"] = "drafter"
    settle(world)
    assert "/revisions" not in json.dumps(world.deployments) and world.status["retraining"].get("serving") is None
    # Unpinned: the newest promoted revision serves again.
    del world.spec_dict["retraining"]["revision"]
    settle(world)
    assert "/revisions/llama-train-2" in json.dumps(spec_pod(world)["containers"][0]["command"])


def test_a_pin_to_an_unknown_revision_is_refused_once_and_serving_is_unchanged() -> None:
    world = World(spec_with())
    to_promoted(world)
    promoted_twice(world)
    settle(world)
    before = json.dumps(world.deployments, sort_keys=True)
    world.spec_dict["retraining"]["revision"] = "llama-train-9"
    plan = world.step()
    refused = [e for e in plan.events if e.reason == "RevisionPinRefused"]
    assert len(refused) == 1 and refused[0].type == "Warning"
    assert "spec.retraining.revision 'llama-train-9'" in refused[0].message and "llama-train-1, llama-train-2" in refused[0].message
    assert world.status["retraining"]["pinRefused"] == refused[0].message
    assert json.dumps(world.deployments, sort_keys=True) == before and world.status["retraining"]["serving"] == "llama-train-2"
    assert "RevisionPinRefused" not in reasons(world.step())  # said once
    # A pruned revision is refused the same way.
    world.status["retraining"]["revisions"][0]["outcome"] = "Pruned"
    world.spec_dict["retraining"]["revision"] = "llama-train-1"
    assert "was pruned" in world.step().events[0].message


def test_the_revisions_claim_is_created_with_the_job_in_the_capture_claims_class() -> None:
    world = World(spec_with(training={"revisionsStorage": "50Gi"}))
    plan, _ = drifted(world)
    claims = [o for o in plan.apply if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "llama-revisions"]
    names = [o["metadata"]["name"] for o in plan.apply]
    assert len(claims) == 1 and names.index("llama-revisions") < names.index("llama-train-1")  # the claim before the Job mounting it
    assert claims[0]["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}, "storageClassName": "fast-rwx"}
    assert training(plan)["revisionsClaimSize"] == "50Gi"


def test_a_drift_of_a_served_revision_retrains_from_it_and_publish_protects_it() -> None:
    world = World(spec_with())
    world.status = {
        "retraining": {
            "revisions": [
                {"name": "llama-train-1", "outcome": "Retired", "reason": "Replaced"},
                {"name": "llama-train-2", "outcome": "Promoted", "reason": "RaceWon"},
            ],
            "serving": "llama-train-2",
            "training": {"jobsStarted": 2, "job": "llama-train-2", "state": "Succeeded", "outcome": "Promoted", "finishedAt": "2026-12-01T10:00:00Z"},
        }
    }
    plan, _ = drifted(world)  # the revision is promoted, then its acceptance drifts: the monitor watches it
    assert "/revisions/llama-train-2" in json.dumps(spec_pod(world)["containers"][0]["command"])
    job = world.jobs["llama-train-3"]
    pod = job["spec"]["template"]["spec"]
    commands = {c["name"]: c["command"] for c in [*pod["initContainers"], *pod["containers"]]}
    assert "/revisions/llama-train-2" in commands["train"]  # warm-started from the revision that served
    publish = commands["publish"]
    assert publish[publish.index("--protect") + 1 :][:1] == ["llama-train-2"] and publish[publish.index("--keep") + 1] == "3"
    assert training(plan)["trigger"] == "Drift"


def test_a_report_not_read_with_the_success_is_read_at_a_later_step_else_unreadable() -> None:
    from specdec_operator.reconcile import read_status
    from specdec_operator.reconcile.training import report_pending

    for pods_later, outcome in (([publish_pod("llama-train-1", report("llama-train-1"))], "Racing"), ([], "Lost")):
        world = World(spec_with())
        _, t = drifted(world)
        done = t + timedelta(minutes=30)
        world.jobs["llama-train-1"]["status"] = {
            "conditions": [{"type": "Complete", "status": "True"}],
            "succeeded": 1,
            "completionTime": done.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        plan = world.step(now=done + timedelta(seconds=5), training_pods=[], captured_samples=500)  # the pod list failed
        assert rows(world) == [] and training(plan)["waiting"] == "RevisionUnjudged" and training(plan).get("outcome") is None
        assert report_pending(read_status(world.status)) == "llama-train-1"  # the runtime lists its pods at the next step
        assert plan.next_step_in is not None and plan.next_step_in <= 60
        world.step(now=done + timedelta(minutes=3), training_pods=pods_later, captured_samples=500)
        assert [r[1] for r in rows(world)] == [outcome]
        assert report_pending(read_status(world.status)) is None


def test_the_rows_keep_the_newest_ten_but_never_drop_the_serving_or_the_pinned_revision() -> None:
    from specdec_operator.api_retraining_job import RevisionStatus, TrainingStatus
    from specdec_operator.reconcile.revision import judge_offline
    from specdec_operator.resource import parse_spec

    raw = spec_with()
    raw["retraining"]["revision"] = "llama-train-3"  # pinned
    spec = parse_spec(raw)
    outcomes = {1: "Promoted", 3: "Retired"}
    stored = RetrainingStatus(
        serving="llama-train-1",
        revisions=[RevisionStatus(name=f"llama-train-{n}", outcome=outcomes.get(n, "Lost")) for n in range(1, 11)],  # type: ignore[arg-type]
    )
    current = TrainingStatus(jobs_started=11, job="llama-train-11", state="Succeeded", finished_at="2026-12-02T10:00:00Z")
    pods = [publish_pod("llama-train-11", report("llama-train-11", new=2.0))]
    judged, rows_ = judge_offline(spec, spec.retraining.training, current, stored, pods)
    names = [r.name for r in rows_]
    assert len(names) == 10 and names[-1] == "llama-train-11" and judged.outcome == "Lost"
    assert "llama-train-1" in names and "llama-train-3" in names and "llama-train-2" not in names  # the oldest other one went


def test_a_revision_its_speculative_pods_validator_refuses_loses_the_race() -> None:
    world = World(spec_with())
    _, revs = racing(world)
    world.step(captured_samples=500)
    serve_slot(world)
    world.step(probe_result=passed(revs["eagle3"], 1.6, 1.3, 2.0), captured_samples=500)
    world.set_pods(base={"ready": True}, speculative={"ready": False, "init": (1, INCOMPATIBLE)})
    world.probe_running = None
    plan = world.step(captured_samples=500)
    assert rows(world) == [("llama-train-1", "Lost", "RaceLost")] and "validator refused" in world.status["retraining"]["revisions"][0]["message"]
    assert "RevisionLost" in reasons(plan) and world.status["retraining"].get("serving") is None


def _spec_and_row(workloads: list[dict] | None = None, heldout: int | None = 40):
    from specdec_operator.api_retraining_job import RevisionStatus
    from specdec_operator.resource import parse_spec

    raw = spec_with()
    if workloads is not None:
        raw["rollout"]["workloads"] = workloads
    return parse_spec(raw), RevisionStatus.model_validate({"name": "llama-train-3", "outcome": "Racing", "heldout": heldout})


def _workload(name: str, concurrency: int, output: int = 64) -> dict:
    return {"name": name, "concurrency": concurrency, "requests": 2 * concurrency, "outputTokens": output}


def test_the_race_adds_the_revisions_held_out_traffic_in_the_shape_of_the_specs_lowest_concurrency_workload() -> None:
    from specdec_operator.reconcile.revision import race_workloads

    spec, row = _spec_and_row([_workload("chat-8", 8, 200), _workload("chat-2", 2, 96)])
    out = race_workloads(spec, "llama", row)
    assert [w.name for w in out] == ["chat-8", "chat-2", "held-out-traffic"]
    added = out[-1]
    assert (added.concurrency, added.requests, added.output_tokens, added.weight) == (2, 4, 96, 1.0)
    assert added.prompts.source == "File" and added.prompts.format == "Chat" and added.prompts.output_length == "Fixed"
    assert added.prompts.file is not None and (added.prompts.file.path, added.prompts.file.claim_name) == (
        "llama-train-3/heldout.jsonl",
        "llama-revisions",
    )
    # A name the spec already uses is not taken twice.
    spec, row = _spec_and_row([_workload("held-out-traffic", 4)])
    assert [w.name for w in race_workloads(spec, "llama", row)] == ["held-out-traffic", "held-out-traffic-2"]


@pytest.mark.parametrize("heldout", [None, 0])
def test_a_revision_whose_job_held_nothing_out_races_on_the_specs_workloads_alone(heldout) -> None:
    from specdec_operator.reconcile.revision import race_workloads

    spec, row = _spec_and_row(heldout=heldout)
    assert [w.name for w in race_workloads(spec, "llama", row)] == WORKLOADS
    assert [w.name for w in race_workloads(spec, "llama", None)] == WORKLOADS
    full, row = _spec_and_row([_workload(f"w{i}", 1 + i) for i in range(16)])
    assert len(race_workloads(full, "llama", row)) == 16  # rollout.workloads' limit: nothing added


def test_a_pinned_revision_stands_in_spec_drafters_place_beside_the_specs_candidates_and_races_no_new_revision() -> None:
    from specdec_operator.reconcile.revision import choose_serving
    from specdec_operator.resource import parse_spec

    raw = spec_with(revision="llama-train-1")
    raw["candidates"] = [dict(NGRAM)]
    spec = parse_spec(raw)
    world = World(raw)
    world.status = {
        "retraining": {
            "revisions": [
                {"name": "llama-train-1", "outcome": "Retired", "reason": "Replaced"},
                {"name": "llama-train-2", "outcome": "Racing", "reason": "OfflineGainPassed"},
            ]
        }
    }
    status = _status(world)
    chosen = choose_serving(spec, status.retraining)  # type: ignore[arg-type]
    assert (chosen.revision, chosen.racing) == ("llama-train-1", None)  # the user chose: no race of llama-train-2
    out = effective_spec(spec, status, "llama")
    assert out.drafter.path == "/revisions/llama-train-1" and [c.name for c in out.candidates or []] == ["ngram"]
    assert list(revisions(out)) == ["eagle3", "ngram"]
