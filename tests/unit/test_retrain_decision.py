"""When to retrain (reconcile/retrain.py, issue 36 item 2): one table per rule, each row the evidence and the answer.

Every row is a pure call with scripted evidence (a decision, a validation, the history, the captured samples, the
cluster's running Jobs, the clock): nothing measured, nothing timed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from specdec_operator.api import Finding, ProbeStatus, ValidationStatus
from specdec_operator.api_retraining_job import DEFAULT_MIN_ACCEPTANCE_GAIN, RetrainingTraining
from specdec_operator.reconcile.retrain import (
    DAY_S,
    Action,
    Cluster,
    Outcome,
    RetrainHistory,
    RetrainReason,
    Serving,
    Trigger,
    decide_retrain,
    offline_gain_passes,
)

NOW = 10 * DAY_S
HOUR = 3600.0
FLOOR = 1.2
OK_VALIDATION = ValidationStatus(compatible=True, revision="r1", findings=[Finding(severity="info", code="AuxLayers", message="")])


def probe(reason: str, decision: str = "rollback", accept: float | None = 2.1) -> ProbeStatus:
    return ProbeStatus(decision=decision, reason=reason, accept_length=accept, revision="r1")


DRIFT = probe("AcceptanceDrift", accept=2.4)
SLOW = probe("SpeedupBelowThreshold", accept=1.9)
SETTINGS = RetrainingTraining.model_validate({"cooldownMinutes": 60, "maxPerDay": 2, "minSamples": 100})
SERVING = Serving(algorithm="EAGLE3", validation=OK_VALIDATION, decision=DRIFT, accept_length_floor=FLOOR, serving_since_s=NOW - 30 * HOUR)
FREE = Cluster(jobs_running=0, cap=1)


def verdict(settings=SETTINGS, serving=SERVING, history=RetrainHistory(), samples=500, cluster=FREE, now=NOW):
    return decide_retrain(settings, serving, history, samples, cluster, now)


def test_a_drift_with_room_to_run_starts_job_one_and_the_next_number_follows_the_history():
    v = verdict()
    assert (v.action, v.reason, v.trigger, v.job_number) == (Action.START, RetrainReason.TRIGGERED, Trigger.DRIFT, 1)
    assert "500 captured conversations" in v.message
    later = verdict(history=RetrainHistory(count=4, started_at_s=(NOW - 3 * DAY_S,), last_finished_at_s=NOW - 2 * DAY_S))
    assert (later.action, later.job_number) == (Action.START, 5)


@pytest.mark.parametrize(
    ("case", "settings", "serving", "reason"),
    [
        ("retraining off", None, SERVING, RetrainReason.RETRAINING_OFF),
        ("n-gram drafts from the text", SETTINGS, replace(SERVING, algorithm="NGRAM"), RetrainReason.NO_DRAFTER_TO_TRAIN),
        ("NEXTN: the target's own layers", SETTINGS, replace(SERVING, algorithm="NEXTN"), RetrainReason.NO_DRAFTER_TO_TRAIN),
        (
            "trained on other layers (a warning is enough)",
            SETTINGS,
            replace(SERVING, validation=ValidationStatus(compatible=True, findings=[Finding(severity="warning", code="AuxLayersNotTrained")])),
            RetrainReason.DRAFTER_MISCONFIGURED,
        ),
        (
            "exported for the other engine",
            SETTINGS,
            replace(
                SERVING, validation=ValidationStatus(compatible=True, findings=[Finding(severity="warning", code="DrafterExportedForOtherEngine")])
            ),
            RetrainReason.DRAFTER_MISCONFIGURED,
        ),
        (
            "another target's tokenizer",
            SETTINGS,
            replace(SERVING, validation=ValidationStatus(compatible=False, findings=[Finding(severity="error", code="TokenizerMismatch")])),
            RetrainReason.DRAFTER_MISCONFIGURED,
        ),
        (
            "refused by the validator for any error",
            SETTINGS,
            replace(SERVING, validation=ValidationStatus(compatible=False, findings=[Finding(severity="error", code="SomethingNew")])),
            RetrainReason.DRAFTER_MISCONFIGURED,
        ),
        (
            "not accepting from its first probe",
            SETTINGS,
            replace(SERVING, decision=probe("DrafterNotAccepting", accept=1.0)),
            RetrainReason.DRAFTER_NEVER_ACCEPTED,
        ),
    ],
)
def test_never(case, settings, serving, reason):
    v = verdict(settings=settings, serving=serving)
    assert (v.action, v.reason, v.job_number) == (Action.NEVER, reason, None), case
    # Never is about the drafter: no amount of traffic, time or free capacity changes it.
    assert verdict(settings=settings, serving=serving, samples=10**6, now=NOW + 30 * DAY_S).action == Action.NEVER


@pytest.mark.parametrize(
    ("case", "serving", "trigger"),
    [
        ("drift rollback", SERVING, Trigger.DRIFT),
        ("low speedup of a drafter that accepted in that probe", replace(SERVING, decision=SLOW), Trigger.ROLLBACK),
        ("load-aware found no load with speedup", replace(SERVING, decision=probe("NoLoadWithSpeedup", accept=1.8)), Trigger.ROLLBACK),
        (
            "not accepting now, accepted before (traffic moved)",
            replace(SERVING, decision=probe("DrafterNotAccepting", accept=1.05), accepted_before=True),
            Trigger.ROLLBACK,
        ),
        (
            "low speedup with no acceptance measured, but promoted before",
            replace(SERVING, decision=probe("SpeedupBelowThreshold", accept=None), accepted_before=True),
            Trigger.ROLLBACK,
        ),
    ],
)
def test_triggers_that_start(case, serving, trigger):
    v = verdict(serving=serving)
    assert (v.action, v.trigger) == (Action.START, trigger), case


@pytest.mark.parametrize(
    ("case", "settings", "serving", "words"),
    [
        ("promoted and healthy", SETTINGS, replace(SERVING, decision=probe("SpeedupConfirmed", "promote")), "no drift"),
        ("the server failed", SETTINGS, replace(SERVING, decision=probe("ProbeFailed", accept=None)), "ProbeFailed"),
        ("outputs differ: an engine fault", SETTINGS, replace(SERVING, decision=probe("OutputMismatch")), "OutputMismatch"),
        ("inconclusive", SETTINGS, replace(SERVING, decision=probe("Inconclusive")), "Inconclusive"),
        ("aborted by hand", SETTINGS, replace(SERVING, decision=probe("Aborted")), "Aborted"),
        ("onDrift off", RetrainingTraining.model_validate({"triggers": {"onDrift": False}}), SERVING, "onDrift"),
        ("onRollback off", RetrainingTraining.model_validate({"triggers": {"onRollback": False}}), replace(SERVING, decision=SLOW), "onRollback"),
        (
            "low speedup, acceptance unknown, never accepted",
            SETTINGS,
            replace(SERVING, decision=probe("SpeedupBelowThreshold", accept=None)),
            "not known to have accepted",
        ),
        ("nothing decided yet", SETTINGS, replace(SERVING, decision=None), "no drift"),
    ],
)
def test_no_trigger_waits(case, settings, serving, words):
    v = verdict(settings=settings, serving=serving)
    assert (v.action, v.reason, v.trigger) == (Action.WAIT, RetrainReason.NO_TRIGGER, None), case
    assert words in v.message, (case, v.message)


def test_the_schedule_counts_from_the_last_job_or_from_when_serving_began():
    every_day = RetrainingTraining.model_validate({"triggers": {"scheduleHours": 24}, "cooldownMinutes": 0})
    healthy = replace(SERVING, decision=probe("SpeedupConfirmed", "promote"), serving_since_s=NOW - 25 * HOUR)
    first = verdict(settings=every_day, serving=healthy)
    assert (first.action, first.trigger) == (Action.START, Trigger.SCHEDULE) and "since serving began" in first.message
    assert verdict(settings=every_day, serving=replace(healthy, serving_since_s=NOW - 23 * HOUR)).reason == RetrainReason.NO_TRIGGER
    assert verdict(settings=every_day, serving=replace(healthy, serving_since_s=None)).reason == RetrainReason.NO_TRIGGER
    ran = RetrainHistory(count=1, started_at_s=(NOW - 20 * HOUR,), last_finished_at_s=NOW - 19 * HOUR, last_outcome=Outcome.PROMOTED)
    assert verdict(settings=every_day, serving=healthy, history=ran).reason == RetrainReason.NO_TRIGGER
    due = replace(ran, started_at_s=(NOW - 24 * HOUR,))
    assert (
        verdict(settings=every_day, serving=healthy, history=due).trigger,
        verdict(settings=every_day, serving=healthy, history=due).job_number,
    ) == (
        Trigger.SCHEDULE,
        2,
    )


@pytest.mark.parametrize(
    ("case", "history", "samples", "cluster", "reason", "retry_at"),
    [
        ("a Job runs", RetrainHistory(count=1, started_at_s=(NOW - HOUR,), running=True), 500, FREE, RetrainReason.TRAINING_RUNNING, None),
        (
            "the last Job's revision is not judged yet",
            RetrainHistory(count=1, started_at_s=(NOW - 30 * HOUR,), last_finished_at_s=NOW - 29 * HOUR, unjudged=True),
            500,
            FREE,
            RetrainReason.REVISION_UNJUDGED,
            None,
        ),
        (
            "cooling down",
            RetrainHistory(count=1, started_at_s=(NOW - 2 * HOUR,), last_finished_at_s=NOW - 1800),
            500,
            FREE,
            RetrainReason.COOLDOWN,
            NOW + 1800,
        ),
        (
            "two Jobs in the last day",
            RetrainHistory(count=2, started_at_s=(NOW - 20 * HOUR, NOW - 10 * HOUR), last_finished_at_s=NOW - 9 * HOUR),
            500,
            FREE,
            RetrainReason.MAX_PER_DAY,
            NOW + 4 * HOUR,
        ),
        ("too little traffic", RetrainHistory(), 99, FREE, RetrainReason.NOT_ENOUGH_TRAFFIC, None),
        ("the cluster's cap is reached", RetrainHistory(), 500, Cluster(jobs_running=1, cap=1), RetrainReason.CLUSTER_CAP, None),
        ("over the cap (it was lowered)", RetrainHistory(), 500, Cluster(jobs_running=5, cap=2), RetrainReason.CLUSTER_CAP, None),
    ],
)
def test_limits_wait(case, history, samples, cluster, reason, retry_at):
    v = verdict(history=history, samples=samples, cluster=cluster)
    assert (v.action, v.reason, v.retry_at_s, v.job_number) == (Action.WAIT, reason, retry_at, None), case


def test_each_limit_lets_go_at_its_time():
    cooled = RetrainHistory(count=1, started_at_s=(NOW - 3 * HOUR,), last_finished_at_s=NOW - 3600)
    assert verdict(history=cooled).action == Action.START  # exactly cooldownMinutes (60) later
    day = RetrainHistory(count=2, started_at_s=(NOW - 20 * HOUR, NOW - 10 * HOUR), last_finished_at_s=NOW - 9 * HOUR)
    assert verdict(history=day, now=NOW + 4 * HOUR).action == Action.START  # the oldest start is a day old
    assert verdict(samples=100).action == Action.START
    assert verdict(cluster=Cluster(jobs_running=1, cap=2)).action == Action.START


def test_a_retrained_drafter_that_lost_does_not_start_another_until_new_traffic():
    lost = RetrainHistory(
        count=1, started_at_s=(NOW - 3 * DAY_S,), last_finished_at_s=NOW - 2 * DAY_S, last_outcome=Outcome.LOST, samples_at_last_start=450
    )
    # The serving drafter's drift is still the evidence, cooldown and daily maximum are long past: still no Job.
    v = verdict(history=lost, samples=500)
    assert (v.action, v.reason) == (Action.WAIT, RetrainReason.RETRAINED_DRAFTER_LOST) and "50 of minSamples 100" in v.message
    schedule = RetrainingTraining.model_validate({"triggers": {"scheduleHours": 1}, "minSamples": 100})
    assert verdict(settings=schedule, history=lost, samples=500).reason == RetrainReason.RETRAINED_DRAFTER_LOST
    again = verdict(history=lost, samples=550)
    assert (again.action, again.job_number) == (Action.START, 2)
    # A failed Job is not a loss: once cooled down it may run again on the same data.
    failed = replace(lost, last_outcome=Outcome.FAILED)
    assert verdict(history=failed, samples=500).action == Action.START


def test_new_traffic_after_a_loss_is_counted_by_time_when_retention_holds_the_whole_count_flat():
    """A claim at its size cap (or retention) deletes old files as new conversations arrive: the whole count stays
    flat, and its difference would hold the next Job forever. The proxies' count since the last start says better."""
    lost = RetrainHistory(
        count=1, started_at_s=(NOW - 3 * DAY_S,), last_finished_at_s=NOW - 2 * DAY_S, last_outcome=Outcome.LOST, samples_at_last_start=500
    )
    assert verdict(history=lost, samples=500).reason == RetrainReason.RETRAINED_DRAFTER_LOST  # the difference: 0 new
    counted = verdict(history=replace(lost, samples_since_last_start=120), samples=500)
    assert (counted.action, counted.job_number) == (Action.START, 2)
    few = verdict(history=replace(lost, samples_since_last_start=30), samples=900)  # the count rose, yet only 30 are new
    assert few.reason == RetrainReason.RETRAINED_DRAFTER_LOST and "30 of minSamples 100" in few.message


def test_settings_defaults_and_bounds():
    s = RetrainingTraining()
    assert (s.budget.gpus, s.budget.max_steps, s.budget.max_minutes, s.budget.backoff_limit) == (1, 2000, 180, 1)
    assert (s.triggers.on_drift, s.triggers.on_rollback, s.triggers.schedule_hours) == (True, True, None)
    assert (s.cooldown_minutes, s.max_per_day, s.min_acceptance_gain) == (360, 2, DEFAULT_MIN_ACCEPTANCE_GAIN) and DEFAULT_MIN_ACCEPTANCE_GAIN == 0.05
    wire = RetrainingTraining.model_validate({"budget": {"gpus": 0, "maxSteps": 10, "maxMinutes": 5}, "triggers": {"scheduleHours": None}})
    assert wire.model_dump(by_alias=True)["budget"] == {
        "gpus": 0,
        "maxSteps": 10,
        "maxMinutes": 5,
        "backoffLimit": 1,
        "maxSamples": 5000,
        "recentShare": 0.5,
        "regenerateConcurrency": 4,
    }
    for bad in (
        {"budget": {"gpus": "1"}},
        {"budget": {"maxMinutes": 1}},
        {"maxPerDay": 0},
        {"triggers": {"onDraft": True}},
        {"minAcceptanceGain": -0.1},
    ):
        with pytest.raises(ValidationError):
            RetrainingTraining.model_validate(bad)


def test_the_offline_margin():
    assert offline_gain_passes(2.10, 2.0, 0.05) and not offline_gain_passes(2.09, 2.0, 0.05)
    assert offline_gain_passes(2.0, 2.0, 0.0) and not offline_gain_passes(1.99, 2.0, 0.0)
