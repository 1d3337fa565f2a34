"""spec.retraining.training in a step (docs/retraining.md): whether a training Job starts now, the Job to apply, how
the current one is doing, status.retraining.training and its Events. Pure, like capture.py beside it.

Each step of a resource with spec.retraining.training (or a recorded training status) reads the stored
status.retraining.training, adopts a Job of this resource that the status does not know yet (an operator that stopped
between creating a Job and recording it: the Job's name is the whole identity, so it is never made twice), reads the
current Job's state from the Job and its pods (retrain_progress.job_progress), then asks retrain.decide_retrain with
this step's decision and validation, the history in the status, the captured conversations and the cluster's count of
active training Jobs. On start it applies trainjob.training_job's Job and records it.

A training Job never touches serving: nothing here changes a child, the phase or the decision; a failed Job only
says so in status.retraining.training and a RetrainFailed Event. What a succeeded Job published is judged by
revision.py (``judged``): offline from the publish container's report, then in a live race; the revisions claim is
applied with each Job (``revisions_claim_object``).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from .. import manifests as m
from ..api import Decision, SpeculativeServerSpec, SpeculativeServerStatus, names_more_than_the_drafter, spec_for_candidate
from ..api_retraining import RetrainingStatus, capture_on
from ..api_retraining_job import PIN_DRAFTER, RetrainingTraining, TrainingStatus
from ..textutil import clip, parse_time, rfc3339
from ..trainjob import ANNOTATION_TRIGGER, COMPONENT, LABEL_RETRAIN, RevisionsKept, TrainingData, training_job
from . import revision
from .capture_objects import capture_name
from .events import revision_events, training_events
from .model import Observed, Plan, Settings
from .retrain import DAY_S, Action, Cluster, Outcome, RetrainHistory, RetrainVerdict, Serving, decide_retrain
from .retrain_progress import JobState, job_progress

ACTIVE = (JobState.PENDING.value, JobState.RUNNING.value)
ENDED = (JobState.SUCCEEDED.value, JobState.FAILED.value)
# A recorded Job not in the index this long after it started was deleted (before that, the index may not have it yet).
GONE_AFTER_S = 120.0
JOB_GONE = "TrainingJobGone"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set on a Job's pods by the Job controller (and the older job-name)
# A running Job's pods are read by the step (training pods are not watched): at least this often while one is active.
POLL_ACTIVE_S = 60.0
# A succeeded Job whose pods were not read (a failed list, a restart) is judged unreadable only this long after it ended.
REPORT_WAIT_S = 120.0


def settings_of(spec: SpeculativeServerSpec) -> RetrainingTraining | None:
    retraining = getattr(spec, "retraining", None)
    return retraining.training if retraining is not None else None


def stored_training(status: SpeculativeServerStatus) -> TrainingStatus | None:
    return status.retraining.training if status.retraining is not None else None


def revisions_claim(name: str) -> str:
    """The claim the Job publishes revisions to (created with each Job: revisions_claim_object)."""
    return m.revisions_claim_name(name)


def job_number(job: dict[str, Any]) -> int | None:
    value = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_RETRAIN, "")
    return int(value) if value.isdigit() else None


def job_pods(observed: Observed, job: str) -> list[dict[str, Any]]:
    def named(pod: dict[str, Any]) -> str | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return labels.get(JOB_NAME_LABEL) or labels.get("job-name")

    return [p for p in observed.training_pods if named(p) == job]


def adopt(stored: TrainingStatus, observed: Observed, now: datetime) -> TrainingStatus:
    """The stored status, or the newest Job of this resource numbered above jobsStarted as its current Job: created
    by an operator that stopped before recording it."""
    numbered = {n: job for job in observed.training_jobs.values() if (n := job_number(job)) is not None}
    top = max(numbered, default=0)
    if top <= stored.jobs_started:
        return stored
    meta = numbered[top].get("metadata") or {}
    started = meta.get("creationTimestamp") or rfc3339(now)
    return stored.model_copy(
        update={
            "jobs_started": top,
            "job": meta.get("name"),
            "trigger": (meta.get("annotations") or {}).get(ANNOTATION_TRIGGER),
            "state": JobState.PENDING.value,
            "reason": "TrainingStarting",
            "message": "created before the operator restarted; adopted",
            "started_at": started,
            "finished_at": None,
            "outcome": None,
            "samples_at_start": None,
            "recent_starts": [*stored.recent_starts, started],
        }
    )


def _ended_at(job: dict[str, Any], now: datetime) -> str:
    status = job.get("status") or {}
    ended = [
        c.get("lastTransitionTime") for c in status.get("conditions") or [] if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
    ]
    return status.get("completionTime") or next((t for t in ended if t), None) or rfc3339(now)


def progress(stored: TrainingStatus, observed: Observed, now: datetime) -> TrainingStatus:
    """The current Job's state read from it and its pods; a Job deleted before it ended is Failed (TrainingJobGone)."""
    if stored.job is None or stored.state not in ACTIVE:
        return stored
    job = observed.training_jobs.get(stored.job)
    if job is None:
        started = parse_time(stored.started_at)
        if started is None or (now - started).total_seconds() < GONE_AFTER_S:
            return stored
        message = "the Job was deleted before it ended; nothing was published"
        return stored.model_copy(
            update={"state": "Failed", "reason": JOB_GONE, "message": message, "finished_at": rfc3339(now), "outcome": Outcome.FAILED.value}
        )
    events = [e for e in observed.training_events if ((e.get("involvedObject") or {}).get("name")) == stored.job]
    found = job_progress(job, job_pods(observed, stored.job), events)
    update: dict[str, Any] = {"state": found.state.value, "reason": found.reason.value, "message": clip(found.message, 1024)}
    if found.state.value in ENDED:
        update["finished_at"] = _ended_at(job, now)
        update["outcome"] = Outcome.FAILED.value if found.state == JobState.FAILED else None  # a success is judged by item 3
    return stored.model_copy(update=update)


def history_of(stored: TrainingStatus) -> RetrainHistory:
    starts = tuple(t.timestamp() for t in map(parse_time, stored.recent_starts) if t is not None)
    finished = parse_time(stored.finished_at)
    outcomes = {o.value for o in Outcome}
    return RetrainHistory(
        count=stored.jobs_started,
        started_at_s=starts,
        running=stored.state in ACTIVE,
        unjudged=stored.state == JobState.SUCCEEDED.value and stored.outcome is None,
        last_finished_at_s=finished.timestamp() if finished is not None else None,
        last_outcome=Outcome(stored.outcome) if stored.outcome in outcomes else None,
        samples_at_last_start=stored.samples_at_start or 0,
    )


def served_spec(spec: SpeculativeServerSpec, status: SpeculativeServerStatus) -> SpeculativeServerSpec:
    """The spec whose drafter is retrained: in a race of candidates, the one in the speculative slot (the winner once
    decided; status.probe is its decision), as spec_for_candidate renders it; otherwise the spec itself."""
    race = status.race
    slot = (race.winner or race.current) if race is not None else None
    if not names_more_than_the_drafter(spec) or not slot:
        return spec
    try:
        return spec_for_candidate(spec, slot)
    except ValueError:  # a candidate the spec no longer names
        return spec


def serving_of(spec: SpeculativeServerSpec, status: SpeculativeServerStatus) -> Serving:
    """This step's drafter, its validation and decision. It once accepted when it was promoted: the monitor (which runs
    only after a promotion) has a record, or the decision promotes."""
    probe = status.probe
    promoted = probe is not None and probe.decision == Decision.PROMOTE
    since = parse_time(probe.finished_at) if probe is not None and promoted else None
    return Serving(
        algorithm=spec.drafter.algorithm,
        validation=status.validation,
        decision=probe,
        accept_length_floor=spec.rollout.accept_length_floor,
        accepted_before=promoted or status.monitor is not None,
        serving_since_s=since.timestamp() if since is not None else None,
    )


def samples_of(spec: SpeculativeServerSpec, observed: Observed) -> int | None:
    """Captured conversations: none without capture (the Job would have nothing to read), else as counted."""
    return observed.captured_samples if capture_on(getattr(spec, "retraining", None)) is not None else 0


def started(current: TrainingStatus, job: dict[str, Any], verdict: RetrainVerdict, samples: int | None, now: datetime) -> TrainingStatus:
    at = rfc3339(now)
    return current.model_copy(
        update={
            "jobs_started": verdict.job_number,
            "job": job["metadata"]["name"],
            "trigger": verdict.trigger.value if verdict.trigger is not None else None,
            "state": JobState.PENDING.value,
            "reason": "TrainingStarting",
            "message": clip(verdict.message, 1024),
            "started_at": at,
            "finished_at": None,
            "outcome": None,
            "samples_at_start": samples,
            "recent_starts": [*current.recent_starts, at],
        }
    )


def with_verdict(current: TrainingStatus, verdict: RetrainVerdict, now: datetime) -> TrainingStatus:
    """The rule's answer while no Job starts, the starts of the last 24 hours, and when the next may start."""
    recent = [t for t in current.recent_starts if (p := parse_time(t)) is not None and (now - p).total_seconds() < DAY_S]
    waiting = verdict.reason.value if verdict.action != Action.START else None
    next_at = datetime.fromtimestamp(verdict.retry_at_s, tz=now.tzinfo) if verdict.retry_at_s is not None else None
    return current.model_copy(
        update={
            "recent_starts": recent,
            "waiting": waiting,
            "waiting_message": clip(verdict.message, 1024) if waiting else None,
            "next_start_after": rfc3339(next_at) if next_at is not None else None,
        }
    )


def revisions_claim_object(name: str, namespace: str, training: RetrainingTraining, spec: SpeculativeServerSpec, size: str | None) -> dict[str, Any]:
    """The claim ``<name>-revisions`` the Jobs publish to and a speculative pod serves a revision from: revisionsStorage
    (or the size it was created with), the capture claim's storage class and access mode when capture is set. Applied
    with each Job (a claim deleted meanwhile is made again); owned by the resource, so it goes with it."""
    capture = capture_on(getattr(spec, "retraining", None))
    claim_spec: dict[str, Any] = {
        "accessModes": [capture.access_mode if capture is not None else "ReadWriteOnce"],
        "resources": {"requests": {"storage": size or training.revisions_storage}},
    }
    if capture is not None and capture.storage_class_name:
        claim_spec["storageClassName"] = capture.storage_class_name
    labels = {**m.instance_labels(name), m.LABEL_MANAGED_BY: m.MANAGED_BY, m.LABEL_COMPONENT: COMPONENT}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": revisions_claim(name), "namespace": namespace, "labels": labels},
        "spec": claim_spec,
    }


def start_job(
    protected: tuple[str, ...],
    current: TrainingStatus,
    spec: SpeculativeServerSpec,
    served: SpeculativeServerSpec,
    observed: Observed,
    verdict: RetrainVerdict,
    settings: Settings,
    samples: int | None,
    now: datetime,
) -> tuple[TrainingStatus, list[dict[str, Any]]]:
    """The revisions claim and the Job to apply, and the status recording the start. ``protected``: the revisions the
    Job's publish never prunes (the one serving and the one spec.retraining.revision pins)."""
    training = settings_of(spec)
    assert training is not None and verdict.job_number is not None
    data = TrainingData(capture_claim=capture_name(observed.name), revisions_claim=revisions_claim(observed.name))
    trigger = verdict.trigger.value if verdict.trigger is not None else ""
    job = training_job(
        observed.name,
        observed.namespace,
        observed.uid,
        served,
        training,
        data,
        verdict.job_number,
        trigger,
        settings.training,
        settings.manifests,
        RevisionsKept(training.max_revisions, protected),
    )
    size = current.revisions_claim_size or training.revisions_storage
    claim = revisions_claim_object(observed.name, observed.namespace, training, spec, size)
    return started(current, job, verdict, samples, now).model_copy(update={"revisions_claim_size": size}), [claim, job]


def report_pending(status: SpeculativeServerStatus | None) -> str | None:
    """The Job whose revision's publish report is still to be read (it succeeded, no outcome, no row yet): the runtime
    lists its pods, as for an active Job."""
    current = stored_training(status) if status is not None else None
    if current is None or current.job is None or current.state != JobState.SUCCEEDED.value or current.outcome is not None:
        return None
    return current.job if status is not None and revision.find(revision.retraining_of(status).revisions, current.job) is None else None


def report_readable(current: TrainingStatus, pods: list[dict[str, Any]], now: datetime) -> bool:
    """Whether to judge the succeeded Job's revision now: its pods were read, or REPORT_WAIT_S passed since it ended
    without any (the pods were not listed: a failed list, a restart; after that the report counts as unreadable)."""
    ended = parse_time(current.finished_at)
    return bool(pods) or ended is None or (now - ended).total_seconds() >= REPORT_WAIT_S


def judged(
    plan: Plan, spec: SpeculativeServerSpec, observed: Observed, prev: SpeculativeServerStatus, current: TrainingStatus, now: datetime
) -> tuple[TrainingStatus, RetrainingStatus, revision.RaceVerdict]:
    """The revisions' part of the step: a succeeded Job's revision judged offline, a racing one judged by its decided
    race, the drafter serving, and why a pin is refused. Returns the training status (its outcome once judged), the
    new status.retraining without its training section, and the race's verdict (the decision that stands after a lost
    race, and a decided race of the spec's own candidates in the next step's shape)."""
    stored = revision.retraining_of(prev)
    training = settings_of(spec)
    rows = stored.revisions
    pods = job_pods(observed, current.job) if current.job is not None else []
    if training is not None and current.job is not None and report_readable(current, pods, now):
        current, rows = revision.judge_offline(spec, training, current, stored, pods)
    stored = stored.model_copy(update={"revisions": rows})
    chosen = revision.choose_serving(spec, stored)  # a row Racing since this step races from the next one
    race = revision.judge_race(stored, chosen, plan.new_status)
    row = revision.find(race.rows, current.job)
    if current.outcome is None and current.state == JobState.SUCCEEDED.value and row is not None and row.outcome != "Racing":
        current = current.model_copy(update={"outcome": Outcome.PROMOTED.value if row.outcome == "Promoted" else Outcome.LOST.value})
    serving = race.serving if chosen.pin_refused is None else stored.serving
    retraining = (plan.new_status.retraining or RetrainingStatus()).model_copy(
        update={"serving": serving, "revisions": race.rows, "pin_refused": chosen.pin_refused}
    )
    return current, retraining, race


def finish(plan: Plan, spec: SpeculativeServerSpec, observed: Observed, prev: SpeculativeServerStatus, now: datetime, settings: Settings) -> Plan:
    """A step's plan with status.retraining (the training Job, the revisions, the drafter serving), its Events, and the
    revisions claim and training Job to apply when one starts. ``spec``: the user's (reconcile runs the lifecycle with
    revision.effective_spec of it)."""
    training = settings_of(spec)
    before = stored_training(prev)
    stored = revision.retraining_of(prev)
    if plan.refused or (
        training is None and before is None and not observed.training_jobs and not stored.revisions and revision.pin_of(spec) is None
    ):
        return plan
    served = served_spec(revision.effective_spec(spec, prev, observed.name), plan.new_status)
    current = progress(adopt(before or TrainingStatus(), observed, now), observed, now)
    current, retraining, raced = judged(plan, spec, observed, prev, current, now)
    samples = samples_of(spec, observed)
    cluster = Cluster(observed.training_jobs_running, settings.training.cluster_cap)
    history = history_of(current)
    counted = observed.captured_since
    if counted is not None and counted[0] == current.started_at:
        history = dataclasses.replace(history, samples_since_last_start=counted[1])
    verdict = decide_retrain(training, serving_of(served, plan.new_status), history, samples, cluster, now.timestamp())
    apply: list[dict[str, Any]] = []
    if verdict.action == Action.START and training is not None and verdict.job_number is not None:
        pin = revision.pin_of(spec)
        protected = tuple(sorted({r for r in (retraining.serving, pin) if r and r != PIN_DRAFTER}))
        current, apply = start_job(protected, current, spec, served, observed, verdict, settings, samples, now)
    current = with_verdict(current, verdict, now)
    retraining = retraining.model_copy(update={"training": current if training is not None or before is not None else None})
    wake = verdict.retry_at_s - now.timestamp() if verdict.retry_at_s is not None else None
    if current.state in ACTIVE or report_pending(plan.new_status.model_copy(update={"retraining": retraining})):
        # A Job's stage, or its pods for the report, move without an event the operator sees.
        wake = min(wake, POLL_ACTIVE_S) if wake is not None else POLL_ACTIVE_S
    update: dict[str, Any] = {"retraining": retraining}
    if raced.probe is not None:  # a lost race: the decision that stands (not the revision's rollback)
        update["probe"] = raced.probe
    if raced.candidates is not None:  # the spec's own race goes on without the revision (or with it as spec.drafter)
        update.update(candidates=raced.candidates, race=raced.race)
    events = [*training_events(before, current), *revision_events(prev.retraining, retraining)]
    return dataclasses.replace(
        plan,
        apply=[*plan.apply, *apply],
        new_status=plan.new_status.model_copy(update=update),
        events=[*plan.events, *events],
        next_step_in=max(0.0, wake) if wake is not None else plan.next_step_in,
        settled=plan.settled and not apply,
    )
