"""When to retrain the drafter on captured traffic (issue 36, item 2): start a training Job, wait (and why), or never.

A pure function of what the operator knows: the retraining settings (api_retraining_job.RetrainingTraining), the
serving drafter's validation and decision, what it remembers of its own retraining (RetrainHistory), how much traffic
the capture holds, and how many training Jobs run in the whole cluster. The rules, in the order they are applied:

never (this drafter, as it is, will not be retrained; a new revision is judged afresh)
* retraining is off, or the method has no drafter this pipeline trains (only EAGLE3: NEXTN's layers are the target's,
  NGRAM and SUFFIX draft from the text);
* the drafter is misconfigured: the validator refused it, or found it trained on other layers, exported for the other
  engine or for another target's tokenizer (MISCONFIGURED). Retraining from such a drafter learns the wrong thing again;
* it never accepted: DrafterNotAccepting from a drafter that was never promoted nor measured at or above the floor.
  Acceptance of 1.0 from the first probe is a wrong layer id or another target, not stale traffic.

wait (reason, and when known the time to look again)
* TrainingRunning: a Job of this resource runs;
* RevisionUnjudged: the last Job published a revision that is not judged yet (item 3: evaluated, raced, then promoted
  or lost); training again before that would spend GPUs on a question still open;
* NoTrigger: no trigger fired. The triggers: drift (the monitor's AcceptanceDrift rollback: acceptance under the floor
  over its window), rollback (SpeedupBelowThreshold, NoLoadWithSpeedup or DrafterNotAccepting of a drafter that once
  accepted; not ProbeFailed, OutputMismatch, DatasetInvalid, Inconclusive or a rollback by hand, which say nothing of the
  drafter's quality), schedule (scheduleHours since the last Job started, or since the drafter began serving);
* RetrainedDrafterLost: the last retrained drafter lost; no Job starts until minSamples new conversations were captured
  since it started (the same data would train the same loser);
* Cooldown: cooldownMinutes since the last Job ended;
* MaxPerDay: maxPerDay Jobs started in the last 24 hours;
* NotEnoughTraffic: fewer than minSamples captured conversations;
* ClusterCap: the cluster already runs the operator's cap of training Jobs (one traffic shift must not start one Job
  per resource).

start (trigger, and the Job's number: RetrainHistory.count + 1, which names the Job, trainjob.job_name)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..api import Decision, ProbeStatus, Reason, ValidationStatus
from ..api_retraining_job import RetrainingTraining

DAY_S = 24 * 3600
# The only method this pipeline trains (drafter_training: EAGLE-3 drafts).
TRAINABLE_ALGORITHMS = frozenset({"EAGLE3"})
# Validator findings, at any severity, that mean the drafter was built wrong for this server: other layers, the other
# engine's layer ids, another target (its tokenizer, vocabulary or width), or no drafter weights to start from.
MISCONFIGURED = frozenset(
    {
        "AuxLayersNotTrained",
        "AuxLayerOutOfRange",
        "DrafterExportedForOtherEngine",
        "TokenizerMismatch",
        "VocabSizeMismatch",
        "HiddenSizeMismatch",
        "DrafterWeightShapeMismatch",
        "MissingDrafterWeights",
    }
)
# Rollbacks that say the drafter drafts too little for the traffic; the probe's other outcomes say nothing of it.
LOW_ACCEPTANCE_OR_SPEEDUP = frozenset({Reason.SPEEDUP_BELOW_THRESHOLD, Reason.NO_LOAD_WITH_SPEEDUP, Reason.DRAFTER_NOT_ACCEPTING})


class Action(StrEnum):
    START = "start"
    WAIT = "wait"
    NEVER = "never"


class Trigger(StrEnum):
    DRIFT = "Drift"
    ROLLBACK = "Rollback"
    SCHEDULE = "Schedule"


class RetrainReason(StrEnum):
    RETRAINING_OFF = "RetrainingOff"
    NO_DRAFTER_TO_TRAIN = "NoDrafterToTrain"
    DRAFTER_MISCONFIGURED = "DrafterMisconfigured"
    DRAFTER_NEVER_ACCEPTED = "DrafterNeverAccepted"
    TRAINING_RUNNING = "TrainingRunning"
    REVISION_UNJUDGED = "RevisionUnjudged"
    NO_TRIGGER = "NoTrigger"
    RETRAINED_DRAFTER_LOST = "RetrainedDrafterLost"
    COOLDOWN = "Cooldown"
    MAX_PER_DAY = "MaxPerDay"
    NOT_ENOUGH_TRAFFIC = "NotEnoughTraffic"
    CLUSTER_CAP = "ClusterCap"
    TRIGGERED = "Triggered"


class Outcome(StrEnum):
    PROMOTED = "Promoted"  # the retrained drafter won and serves
    LOST = "Lost"  # it did not beat the serving drafter (offline margin, validation or the live race)
    FAILED = "Failed"  # the Job failed: nothing was trained


@dataclass(frozen=True)
class RetrainHistory:
    """What the operator remembers of this resource's retraining (to be kept in status.retraining)."""

    count: int = 0  # Jobs started so far; the next is number count + 1
    started_at_s: tuple[float, ...] = ()  # when Jobs started (those of the last 24 hours matter)
    running: bool = False
    unjudged: bool = False  # the last Job succeeded and its revision has no outcome yet (item 3 gives it one)
    last_finished_at_s: float | None = None
    last_outcome: Outcome | None = None
    samples_at_last_start: int = 0  # captured conversations when the last Job started
    # Captured since the last Job started, as the proxies count them by the records' time (None: not known; the
    # difference of the two whole counts stands in, which retention deleting old files can lower)
    samples_since_last_start: int | None = None


@dataclass(frozen=True)
class Serving:
    """The drafter that serves (or served until its rollback) and what was decided for it."""

    algorithm: str
    validation: ValidationStatus | None
    decision: ProbeStatus | None
    accept_length_floor: float  # rollout.acceptLengthFloor: at or below it a drafter is not accepting
    accepted_before: bool = False  # an earlier decision of this drafter promoted it or measured it above the floor
    serving_since_s: float | None = None  # when it began serving (the schedule's origin before any Job)


@dataclass(frozen=True)
class Cluster:
    jobs_running: int  # the operator's training Jobs running in the whole cluster
    cap: int  # at most this many at once (an operator setting)


@dataclass(frozen=True)
class RetrainVerdict:
    action: Action
    reason: RetrainReason
    message: str
    trigger: Trigger | None = None
    job_number: int | None = None  # with start: the Job's number
    retry_at_s: float | None = None  # with a timed wait: when the rule may change its answer


def decide_retrain(
    settings: RetrainingTraining | None, serving: Serving, history: RetrainHistory, samples: int | None, cluster: Cluster, now_s: float
) -> RetrainVerdict:
    """Start a training Job, wait, or never (the module docstring gives the rules in order). ``samples``: the captured
    conversations, None when not counted (minSamples is then left to the Job's gather stage, which refuses a capture with
    no chat request; after a lost retrain nothing starts, as no new conversation can be shown)."""
    refused = _never(settings, serving)
    if refused is not None:
        return refused
    assert settings is not None
    if history.running:
        return _wait(RetrainReason.TRAINING_RUNNING, f"training Job {history.count} runs")
    if history.unjudged:
        message = f"training Job {history.count} published a revision not judged yet (evaluated, raced, promoted or lost); none starts before"
        return _wait(RetrainReason.REVISION_UNJUDGED, message)
    trigger, why = _trigger(settings, serving, history, now_s)
    if trigger is None:
        return _wait(RetrainReason.NO_TRIGGER, why)
    held = _held(settings, history, samples, now_s)
    if held is not None:
        return held
    if cluster.jobs_running >= cluster.cap:
        return _wait(RetrainReason.CLUSTER_CAP, f"{cluster.jobs_running} training Job(s) run in the cluster, the operator's cap is {cluster.cap}")
    number = history.count + 1
    counted = f"{samples} captured conversations" if samples is not None else "the captured conversations (not counted)"
    return RetrainVerdict(Action.START, RetrainReason.TRIGGERED, f"{why}: training Job {number} on {counted}", trigger, number)


def _never(settings: RetrainingTraining | None, serving: Serving) -> RetrainVerdict | None:
    if settings is None:
        return RetrainVerdict(Action.NEVER, RetrainReason.RETRAINING_OFF, "spec.retraining.training is not set")
    if serving.algorithm not in TRAINABLE_ALGORITHMS:
        message = f"{serving.algorithm} has no drafter this pipeline trains (it trains EAGLE3 drafters)"
        return RetrainVerdict(Action.NEVER, RetrainReason.NO_DRAFTER_TO_TRAIN, message)
    validation = serving.validation
    if validation is not None:
        wrong = sorted({f.code for f in validation.findings if f.code in MISCONFIGURED or f.severity == "error"})
        if wrong or validation.compatible is False:
            found = ", ".join(wrong) or "incompatible"
            message = f"the drafter is misconfigured ({found}): retraining it would learn the same mistake; fix the drafter"
            return RetrainVerdict(Action.NEVER, RetrainReason.DRAFTER_MISCONFIGURED, message)
    decision = serving.decision
    if decision is not None and decision.reason == Reason.DRAFTER_NOT_ACCEPTING and not serving.accepted_before:
        message = (
            f"the drafter never accepted (acceptance length {decision.accept_length} at or below {serving.accept_length_floor:g} from its first "
            "probe): a wrong layer id or another target, not stale traffic"
        )
        return RetrainVerdict(Action.NEVER, RetrainReason.DRAFTER_NEVER_ACCEPTED, message)
    return None


def _trigger(settings: RetrainingTraining, serving: Serving, history: RetrainHistory, now_s: float) -> tuple[Trigger | None, str]:
    """The trigger that fired and why, or None and why none did."""
    triggers = settings.triggers
    decision = serving.decision
    reason = decision.reason if decision is not None and decision.decision == Decision.ROLLBACK else None
    held = None  # why a rollback that could have triggered did not
    if reason == Reason.ACCEPTANCE_DRIFT:
        if triggers.on_drift:
            return Trigger.DRIFT, "the drift monitor rolled the drafter back (acceptance under the floor over its window)"
        held = "the drift rollback does not trigger: triggers.onDrift is false"
    elif reason in LOW_ACCEPTANCE_OR_SPEEDUP:
        measured = decision.accept_length if decision is not None else None
        if not (serving.accepted_before or (measured is not None and measured > serving.accept_length_floor)):
            held = f"the rollback ({reason}) is of a drafter not known to have accepted; only one that once accepted is retrained"
        elif not triggers.on_rollback:
            held = f"the rollback ({reason}) does not trigger: triggers.onRollback is false"
        else:
            return Trigger.ROLLBACK, f"a probe rolled back ({reason}) a drafter that once accepted"
    elif reason is not None:
        held = f"the rollback ({reason}) says nothing of the drafter's acceptance"
    if triggers.schedule_hours is not None:
        origin = max(history.started_at_s) if history.started_at_s else serving.serving_since_s
        if origin is not None and now_s - origin >= triggers.schedule_hours * 3600:
            since = "the last Job started" if history.started_at_s else "serving began"
            return Trigger.SCHEDULE, f"scheduleHours {triggers.schedule_hours} passed since {since}"
    return None, held or "no trigger: no drift, no rollback for low acceptance or speedup, no schedule due"


def _held(settings: RetrainingTraining, history: RetrainHistory, samples: int | None, now_s: float) -> RetrainVerdict | None:
    """The limits on how often: a lost retrain, the cooldown, the daily maximum, enough traffic."""
    if history.last_outcome == Outcome.LOST:
        if history.samples_since_last_start is not None:
            fresh = history.samples_since_last_start
        else:
            fresh = samples - history.samples_at_last_start if samples is not None else 0
        if fresh < settings.min_samples:
            message = f"the last retrained drafter lost; {fresh} of minSamples {settings.min_samples} new conversations captured since"
            return _wait(RetrainReason.RETRAINED_DRAFTER_LOST, message)
    ended = history.last_finished_at_s
    cooldown_s = settings.cooldown_minutes * 60
    if ended is not None and now_s - ended < cooldown_s:
        return _wait(RetrainReason.COOLDOWN, f"cooldownMinutes {settings.cooldown_minutes} since the last Job ended", ended + cooldown_s)
    recent = sorted(t for t in history.started_at_s if now_s - t < DAY_S)
    if len(recent) >= settings.max_per_day:
        # The window admits one more once enough of its oldest starts are a day old.
        free_at = recent[len(recent) - settings.max_per_day] + DAY_S
        return _wait(RetrainReason.MAX_PER_DAY, f"maxPerDay {settings.max_per_day}: {len(recent)} Job(s) started in the last 24 hours", free_at)
    if samples is not None and samples < settings.min_samples:
        return _wait(RetrainReason.NOT_ENOUGH_TRAFFIC, f"{samples} of minSamples {settings.min_samples} conversations captured")
    return None


def _wait(reason: RetrainReason, message: str, retry_at_s: float | None = None) -> RetrainVerdict:
    return RetrainVerdict(Action.WAIT, reason, message, retry_at_s=retry_at_s)


def offline_gain_passes(new_accept_length: float, serving_accept_length: float, min_gain: float) -> bool:
    """Whether a retrained drafter beats the serving one offline by spec.retraining.training.minAcceptanceGain: its acceptance
    length on the held-out slice at least (1 + min_gain) times the serving drafter's (item 3 races only those)."""
    # A hair of tolerance: 2.31 is 5 % above 2.2, which floating point puts at 2.3100000000000005.
    return new_accept_length >= serving_accept_length * (1.0 + min_gain) - 1e-9
