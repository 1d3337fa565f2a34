"""The retraining Job's settings (issue 36, item 2): what `spec.retraining.training` will hold beside the capture.

Types only, like api.py: the budget a training Job runs within, the triggers that start one, and the limits on how
often, and status.retraining.training (TrainingStatus). The rule that reads them is reconcile/retrain.py, called in each
step by reconcile/training.py; the Job they shape is trainjob.py.

api.py's conventions (camelCase on the wire, unknown fields refused, no coercion, null is unset) through a base of its
own: api.py is to import api_retraining, which is to import this module, so neither may import their bases.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .apimodel import StrictModel

# The documented default of minAcceptanceGain: a retrained drafter must beat the serving one's offline acceptance length
# on the held-out slice of recent traffic by 5 % before it is raced live (item 3 uses it; retrain.offline_gain_passes).
DEFAULT_MIN_ACCEPTANCE_GAIN = 0.05
# Revisions kept on the claim <name>-revisions (the Job's publish prunes the oldest beyond it, never the serving or the
# pinned one), the claim's size, and the rows of status.retraining.revisions kept (newest last).
DEFAULT_MAX_REVISIONS = 3
DEFAULT_REVISIONS_STORAGE = "20Gi"
MAX_REVISION_ROWS = 10
# spec.retraining.revision's value that pins spec.drafter itself (a revision's name is its Job's, <name>-train-<n>).
PIN_DRAFTER = "drafter"
RevisionOutcome = Literal["Evaluated", "Racing", "Promoted", "Lost", "Retired", "Pruned"]


class TrainingBudget(StrictModel):
    gpus: int = Field(
        1,
        description="GPUs of the training Job's pod (nvidia.com/gpu on its capture and train stages). 0 trains on CPU, in the CPU "
        "variant of the drafter-training image when the operator names one (tiny models, tests).",
        ge=0,
        le=8,
    )
    max_steps: int = Field(
        2000, alias="maxSteps", description="Optimizer steps of the warm-started training (specdec-train train --max-steps).", ge=1, le=1_000_000
    )
    max_minutes: int = Field(
        180,
        alias="maxMinutes",
        description="Wall time of the whole Job, every stage and retry included (its activeDeadlineSeconds): past it the Job fails "
        "and nothing it wrote is used.",
        ge=5,
        le=7 * 24 * 60,
    )
    backoff_limit: int = Field(
        1,
        alias="backoffLimit",
        description="Failed pods the Job retries before it fails (its backoffLimit; each stage resumes where the failed pod left it). "
        "Bad input (exit 2) fails the Job at once, and a pod preempted by serving is not counted.",
        ge=0,
        le=5,
    )
    max_samples: int = Field(
        5000,
        alias="maxSamples",
        description="The captured conversations a Job trains on, at most: each is regenerated once on the serving base server. "
        "Where the capture holds more, recentShare of them are the newest and the rest are spread over the older ones.",
        ge=1,
        le=10_000_000,
    )
    recent_share: float = Field(
        0.5,
        alias="recentShare",
        description="Of maxSamples, the share taken from the newest captured conversations (the held-out slice the revision is "
        "evaluated and raced on comes from these); the rest are spread evenly over the older conversations the capture keeps, "
        "so a drafter retrained after a traffic shift keeps what it knew of the traffic before it. 1: the newest only.",
        ge=0.05,
        le=1,
    )
    regenerate_concurrency: int = Field(
        4,
        alias="regenerateConcurrency",
        description="The load budget on the serving target: concurrent requests with which the Job regenerates the captured prompts' "
        "responses on the base server (same engine, quantization and chat template as serving).",
        ge=1,
        le=64,
    )


class RetrainTriggers(StrictModel):
    on_drift: bool = Field(
        True, alias="onDrift", description="Retrain when the drift monitor rolls the drafter back (acceptance under the floor over its window)."
    )
    on_rollback: bool = Field(
        True,
        alias="onRollback",
        description="Retrain when a probe rolls back, for low acceptance or speedup, a drafter that validated and once accepted (never "
        "for a drafter that never accepted: wrong layer ids or another target is not fixed by retraining it).",
    )
    schedule_hours: int | None = Field(
        None,
        alias="scheduleHours",
        description="Also retrain every this many hours (counted from the last Job's start, or from when the drafter began serving). "
        "Unset: no schedule.",
        ge=1,
        le=90 * 24,
    )


class RetrainingTraining(StrictModel):
    budget: TrainingBudget = Field(default_factory=TrainingBudget, description="What one training Job may use.")
    triggers: RetrainTriggers = Field(default_factory=RetrainTriggers, description="What starts a training Job.")
    cooldown_minutes: int = Field(
        360,
        alias="cooldownMinutes",
        description="Minutes after a training Job ends (whatever its outcome) before another starts.",
        ge=0,
        le=30 * 24 * 60,
    )
    max_per_day: int = Field(2, alias="maxPerDay", description="Training Jobs started in any 24 hours, at most.", ge=1, le=24)
    min_samples: int = Field(
        200,
        alias="minSamples",
        description="Captured conversations a Job needs, and new ones needed after a retrained drafter lost before another Job starts.",
        ge=1,
        le=10_000_000,
    )
    min_acceptance_gain: float = Field(
        DEFAULT_MIN_ACCEPTANCE_GAIN,
        alias="minAcceptanceGain",
        description="The margin a retrained drafter must beat the serving one by, offline, before it is raced: its acceptance length on "
        "the held-out slice of recent traffic at least (1 + this) times the serving drafter's. Default 0.05 (5 %).",
        ge=0,
        le=10,
    )
    max_revisions: int = Field(
        DEFAULT_MAX_REVISIONS,
        alias="maxRevisions",
        description="Revisions kept on the claim <name>-revisions: the training Job's publish removes the oldest beyond it, never "
        "the one serving or the one spec.retraining.revision pins.",
        ge=1,
        le=20,
    )
    revisions_storage: str = Field(
        DEFAULT_REVISIONS_STORAGE,
        alias="revisionsStorage",
        description="The size of the claim <name>-revisions the Jobs publish revisions to (the capture's storage class and access "
        "mode). The claim keeps the size it was created with.",
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$",
        max_length=16,
    )


class RevisionStatus(StrictModel):
    """One row of status.retraining.revisions: a trained revision (the directory /revisions/<name> on the claim) and its figures."""

    model_config = ConfigDict(strict=False)
    name: str = Field(description="The revision's name: its training Job's (<name>-train-<n>), its directory /revisions/<name>.")
    created_at: str | None = Field(None, alias="createdAt", description="When its Job finished.")
    trigger: str | None = Field(None, description="What started its Job: Drift, Rollback or Schedule.")
    heldout: int | None = Field(None, description="Held-out conversations of recent traffic it was evaluated on offline.")
    offline_accept_length: float | None = Field(
        None, alias="offlineAcceptLength", description="Its acceptance length on the held-out slice (the Job's evaluate stage)."
    )
    serving_offline_accept_length: float | None = Field(
        None, alias="servingOfflineAcceptLength", description="The serving drafter's acceptance length on the same slice."
    )
    accept_length: float | None = Field(None, alias="acceptLength", description="Its acceptance length live, from its probe in the race.")
    speedup: float | None = Field(None, description="Its speedup over the base live, the race's decision's.")
    outcome: RevisionOutcome = Field(
        description="Evaluated (judged offline, not raced), Racing (raced live against the base and the serving drafter), Promoted "
        "(won: it serves unless spec.retraining.revision pins another), Lost (not promoted), Retired (a later revision was "
        "promoted), Pruned (removed from the claim by a later Job's storage cap)."
    )
    reason: str | None = Field(None, description="Why, in one word (e.g. OfflineGainBelowMargin, RevisionInvalid, RaceLost).")
    message: str | None = Field(None, description="For humans: the figures behind the outcome, never a prompt.", max_length=512)


class TrainingStatus(StrictModel):
    """status.retraining.training: the current or last training Job and the history the rule needs (reconcile/training.py)."""

    model_config = ConfigDict(strict=False)
    jobs_started: int = Field(
        0, alias="jobsStarted", description="Training Jobs started for this resource so far; the next is number jobsStarted + 1.", ge=0
    )
    job: str | None = Field(None, description="The current or last training Job (<name>-train-<n>).")
    trigger: str | None = Field(None, description="What started it: Drift, Rollback or Schedule.")
    state: str | None = Field(None, description="The Job's state: Pending, Running, Succeeded or Failed.")
    reason: str | None = Field(
        None,
        description="Why, in one word: the Job's (TrainingStarting, TrainingUnschedulable, TrainingQuotaRefused, TrainingPodRefused, TrainingRunning, TrainingSucceeded, "
        "TrainingTimedOut, TrainingBadInput, TrainingVolumeFull, TrainingFailed, TrainingJobGone).",
    )
    message: str | None = Field(
        None, description="The Job's state for humans: the stage running or the one that failed, never a prompt.", max_length=1024
    )
    started_at: str | None = Field(None, alias="startedAt", description="When the operator started the Job.")
    finished_at: str | None = Field(None, alias="finishedAt", description="When it succeeded or failed.")
    outcome: str | None = Field(
        None,
        description="Failed (nothing was trained; serving was not touched); Promoted or Lost once its revision is judged "
        "(status.retraining.revisions).",
    )
    revisions_claim_size: str | None = Field(
        None, alias="revisionsClaimSize", description="The claim <name>-revisions' storage request as created (revisionsStorage then)."
    )
    samples_at_start: int | None = Field(None, alias="samplesAtStart", description="Captured conversations counted when it started, if counted.")
    recent_starts: list[str] = Field(
        default_factory=list, alias="recentStarts", description="When Jobs started in the last 24 hours (maxPerDay counts them).", max_length=24
    )
    waiting: str | None = Field(
        None,
        description="While no Job starts: the rule's reason (NoTrigger, Cooldown, MaxPerDay, NotEnoughTraffic, ClusterCap, "
        "RetrainedDrafterLost, TrainingRunning, RevisionUnjudged, or a never: RetrainingOff, NoDrafterToTrain, DrafterMisconfigured, DrafterNeverAccepted).",
    )
    waiting_message: str | None = Field(None, alias="waitingMessage", description="The rule's words for it.", max_length=1024)
    next_start_after: str | None = Field(
        None, alias="nextStartAfter", description="The earliest time the next Job may start (the cooldown's or maxPerDay's end), when known."
    )
