"""Events, derived in one place from the stored and the new status.

An Event announces a transition: something in the new status that the stored status did not say yet. Because
the stored status is what a restarted operator reads back, a restart repeats no Event (a decision already
stored is not announced again), and a step that changes nothing announces nothing.

A race of candidates (candidate_race.py) asks here for its own Events when it records a candidate's decision or
decides (CandidateMeasured, RaceWon, RaceQueued): its stored table says what was announced already.

One Event announces an action instead: ProbeStarted, when this step starts a probe. A probe started again (by a
restarted operator, or by the replica that took over from a leader) is new GPU time and is announced, even when
it starts within the second the stored probe started, which the status cannot tell apart (times are seconds).
"""

from __future__ import annotations

from ..api import CandidateStatus, Condition, ConditionType, Decision, Phase, ProbeStatus, Reason, SpeculativeServerStatus, ValidationStatus
from ..api_retraining import RetrainingStatus
from ..api_retraining_job import TrainingStatus
from ..textutil import clip
from .model import Event
from .pods import finding_summary


def transition_events(
    prev: SpeculativeServerStatus,
    new: SpeculativeServerStatus,
    *,
    name: str,
    workloads: list[str],
    probe_starting: bool = False,
    replicas: int = 1,
    both: bool = False,
) -> list[Event]:
    """The Events for the step from ``prev`` (stored) to ``new``; ``probe_starting``: the step starts a probe.

    ``name``, ``workloads``, ``replicas`` (spec.replicas) and ``both`` (the stable Service selects both variants
    while a fleet walks) only word them."""
    events: list[Event] = []
    if new.validation is not None and not _validated(prev.validation, new.validation.revision):
        events.append(_validation_event(new.validation))
    if _load_aware_probe_started(prev.probe, new.probe):
        assert new.probe is not None and new.probe.load_aware is not None
        events.append(Event("Normal", Reason.LOAD_AWARE_TRIAL, f"{new.probe.load_aware.message}; restarting it to measure it against the base again"))
    if new.probe is not None and new.probe.decision and _is_new_decision(prev.probe, new.probe):
        events.append(_decision_event(new.probe))
        if new.probe.synthetic_traffic:
            events.append(
                Event(
                    "Warning",
                    Reason.SYNTHETIC_TRAFFIC,
                    f"the probe of revision {new.probe.revision} measured random token ids, not prompts ({new.probe.traffic}): "
                    f"acceptance, and so the speedup, differs on real traffic; give rollout.workloads[].prompts a dataset",
                )
            )
    events += _sick_pod_events(prev, new)
    events += _stuck_events(prev, new)
    if new.steering is not None and new.steering.retried and new.steering.retried != (prev.steering.retried if prev.steering else None):
        events.append(
            Event("Normal", Reason.RETRY_REQUESTED, f"retry {new.steering.retried} (specdec.io/retry): revision {_revision(new)} is tried again")
        )
    if probe_starting and new.probe is not None:
        events.append(
            Event("Normal", Reason.PROBE_STARTED, f"both servers are ready: measuring {', '.join(workloads)} (revision {new.probe.revision})")
        )
    if prev.active_variant and new.active_variant and prev.active_variant != new.active_variant and new.reason != Reason.NAME_CONFLICT:
        events.append(Event("Normal", Reason.TRAFFIC_SWITCHED, _switched_message(new, name, replicas, both)))
    events.extend(_walk_events(prev, new))
    if new.phase == Phase.FAILED and (prev.phase, prev.reason, prev.message) != (new.phase, new.reason, new.message):
        events.append(Event("Warning", new.reason or Phase.FAILED, new.message or ""))
    return events


def _switched_message(new: SpeculativeServerStatus, name: str, replicas: int, both: bool) -> str:
    """What the stable Service selects now: one server's variant, or a fleet's, with how far its walk is."""
    variant = str(new.active_variant or "")
    if replicas < 2:
        return f"stable Service {name} now selects the {variant} server"
    progress = (
        f"{new.rollout_progress}, {new.ready_replicas or 0} servers Ready" if new.rollout_progress else f"{new.ready_replicas or 0} servers Ready"
    )
    if both:
        other = "base" if variant == "speculative" else "speculative"
        return f"stable Service {name} now selects the fleet's {variant} servers and, while the fleet walks, its {other} servers ({progress})"
    return f"stable Service {name} now selects the fleet's {variant} servers ({progress})"


def _sick_pod_events(prev: SpeculativeServerStatus, new: SpeculativeServerStatus) -> list[Event]:
    """A Warning for each speculative pod the monitor newly judged sick (status.monitor.sickPods)."""
    if new.monitor is None:
        return []
    before = {p.name for p in prev.monitor.sick_pods} if prev.monitor is not None else set()
    fleet = new.monitor.accept_length
    return [
        Event(
            "Warning",
            Reason.SPECULATIVE_POD_SICK,
            f"speculative pod {pod.name}: acceptance length {pod.accept_length} is far below its peers' {pod.peers_accept_length} "
            f"(under half their accepted draft tokens per verify step); the fleet's {fleet} is what the drift rule judges, so it is "
            "not rolled back for one pod: check the pod's node and GPUs, or delete the pod to replace it",
        )
        for pod in new.monitor.sick_pods
        if pod.name not in before
    ]


def _validated(validation: ValidationStatus | None, revision: str | None) -> bool:
    return validation is not None and validation.revision == revision and validation.compatible is not None


def _validation_event(validation: ValidationStatus) -> Event:
    if validation.compatible:
        warnings = finding_summary(validation, ("warning",))
        return Event(
            "Warning" if warnings else "Normal",
            Reason.DRAFTER_COMPATIBLE,
            f"drafter is compatible with the target{'; warnings: ' + warnings if warnings else ''}",
        )
    return Event(
        "Warning",
        Reason.DRAFTER_INCOMPATIBLE,
        f"{finding_summary(validation, ('error',))}; speculative server scaled to 0, the base server keeps serving",
    )


def _load_aware_probe_started(prev: ProbeStatus | None, new: ProbeStatus | None) -> bool:
    """A load-aware probe begins: the new status has the plain probe of a load-aware probe that the stored one did not."""
    load_aware_probe = new.load_aware if new is not None else None
    if load_aware_probe is None or load_aware_probe.plain_probe is None or load_aware_probe.reason != Reason.LOAD_AWARE_TRIAL:
        return False
    before = prev.load_aware if prev is not None and prev.revision == new.revision else None  # type: ignore[union-attr]
    return before is None or before.plain_probe is None or before.config != load_aware_probe.config


def _is_new_decision(prev: ProbeStatus | None, new: ProbeStatus) -> bool:
    return prev is None or (prev.revision, prev.decision, prev.reason) != (new.revision, new.decision, new.reason)


def _decision_event(decision: ProbeStatus) -> Event:
    detail = decision.message or ""
    if decision.reason == Reason.PROMOTED_BY_HAND:  # no probe vouches for it: a Warning, with the reason given
        return Event("Warning", Reason.PROMOTED_BY_HAND, detail)
    if decision.decision == Decision.PROMOTE:
        return Event("Normal", decision.reason or Reason.SPEEDUP_CONFIRMED, f"promoted: {detail}" if detail else "promoted")
    if decision.reason == Reason.ACCEPTANCE_DRIFT:  # its message says what happens next
        return Event("Warning", Reason.ACCEPTANCE_DRIFT, f"rolled back: {detail}", rollback=True)
    text = f"rolled back: {detail}; the base server keeps serving" if detail else "rolled back: the base server keeps serving"
    return Event("Warning", decision.reason or Reason.INCONCLUSIVE, text, rollback=True)


_WALKING = (Reason.WALKING_TO_SPECULATIVE, Reason.WALKING_TO_BASE)


def _rolled_out(status: SpeculativeServerStatus) -> Condition | None:
    return next((c for c in status.conditions if c.type == ConditionType.ROLLED_OUT), None)


def _walk_events(prev: SpeculativeServerStatus, new: SpeculativeServerStatus) -> list[Event]:
    """A fleet's walk (the RolledOut condition): WalkStarted when it sets out toward a variant (or turns back),
    WalkFinished when it arrives."""
    before, after = _rolled_out(prev), _rolled_out(new)
    if after is None:
        return []
    if after.reason == Reason.WALK_PAUSED and (before is None or before.reason != Reason.WALK_PAUSED):
        return [Event("Normal", Reason.WALK_PAUSED, after.message)]
    if before is not None and before.reason == Reason.WALK_PAUSED and after.reason in _WALKING:
        return [Event("Normal", Reason.WALK_RESUMED, f"resumed: {after.message}")]
    if after.reason in _WALKING and (before is None or before.reason != after.reason):
        turned = before is not None and before.reason in _WALKING
        return [Event("Normal", Reason.WALK_STARTED, f"{'turned back, ' if turned else ''}{after.message}")]
    if after.status == "True" and before is not None and (before.reason in _WALKING or before.reason == Reason.WALK_PAUSED):
        return [Event("Normal", Reason.WALK_FINISHED, f"walk finished: {after.message}")]
    return []


# Server condition reasons that name the cause of a wait (reconcile/stuck.py): each is announced once, as a Warning.
_STUCK = frozenset({Reason.VOLUME_NOT_MOUNTED, Reason.IMAGE_NOT_PULLED, Reason.CONTAINER_CONFIG_ERROR, Reason.UNSCHEDULABLE, Reason.CRASH_LOOP})


def _stuck_events(prev: SpeculativeServerStatus, new: SpeculativeServerStatus) -> list[Event]:
    """A Warning when a server's condition turns to a cause of a wait (a volume not mounted, an image not pulled, ...)."""
    events = []
    for ctype in (ConditionType.BASE_READY, ConditionType.SPECULATIVE_READY):
        before = next((c for c in prev.conditions if c.type == ctype), None)
        after = next((c for c in new.conditions if c.type == ctype), None)
        if after is not None and after.reason in _STUCK and (before is None or before.reason != after.reason):
            events.append(Event("Warning", after.reason, after.message or ""))
    return events


def _revision(status: SpeculativeServerStatus) -> str:
    return (status.probe.revision if status.probe is not None else None) or (status.validation.revision if status.validation else None) or "?"


# --- a race of candidates (candidate_race.py)
def candidate_measured_event(row: CandidateStatus, candidates: int) -> Event:
    speed = f" at {row.speedup:.2f}x" if row.speedup is not None else ""
    return Event(
        "Normal" if row.state in ("Passed", "Serving") else "Warning",
        Reason.CANDIDATE_MEASURED,
        clip(f"candidate {row.name} ({row.algorithm}) of {candidates}: {row.state}{speed} ({row.reason}): {row.message or ''}"),
    )


def race_decided_event(row: CandidateStatus, candidates: int, promote: bool) -> Event:
    if promote:
        return Event(
            "Normal",
            Reason.RACE_WON,
            clip(f"candidate {row.name} ({row.algorithm}) won the race of {candidates} at {row.speedup or 0:.2f}x: serving it"),
        )
    return Event(
        "Warning", Reason.RACE_WON, clip(f"no candidate of {candidates} was confirmed faster (best: {row.name}, {row.reason}): the base serves")
    )


def race_queued_event(message: str) -> Event:
    return Event("Normal", Reason.RACE_QUEUED, message)


def training_events(before: TrainingStatus | None, after: TrainingStatus | None) -> list[Event]:
    """RetrainStarted, RetrainSucceeded, RetrainFailed: a change of status.retraining.training's Job or its state
    (derived from the stored status: a restart repeats none). Job names, stages and the tools' lines, never a prompt."""
    if after is None or after.job is None:
        return []
    events = []
    new_job = before is None or before.job != after.job
    if new_job:
        message = f"training Job {after.job} started (trigger {after.trigger}); serving is not touched while it runs"
        events.append(Event("Normal", Reason.RETRAIN_STARTED, message))
    ended = after.state in ("Succeeded", "Failed") and (new_job or (before is not None and before.state not in ("Succeeded", "Failed")))
    if ended and after.state == "Succeeded":
        events.append(Event("Normal", Reason.RETRAIN_SUCCEEDED, clip(f"training Job {after.job} succeeded: {after.message or ''}")))
    elif ended:
        message = f"training Job {after.job} failed ({after.reason}): {after.message or ''}; nothing was published and serving is not touched"
        events.append(Event("Warning", Reason.RETRAIN_FAILED, clip(message)))
    return events


def revision_events(before: RetrainingStatus | None, after: RetrainingStatus | None) -> list[Event]:
    """RevisionPromoted, RevisionLost (Warning) when a revision's row reaches that outcome, and RevisionPinRefused
    (Warning) when spec.retraining.revision names a revision that cannot serve. Figures and names, never a prompt."""
    if after is None:
        return []
    known = {r.name: r.outcome for r in before.revisions} if before is not None else {}
    events = []
    for row in after.revisions:
        if row.outcome == known.get(row.name):
            continue
        if row.outcome == "Promoted":
            events.append(Event("Normal", Reason.REVISION_PROMOTED, clip(f"revision {row.name} promoted: {row.message or ''}")))
        elif row.outcome == "Lost":
            events.append(Event("Warning", Reason.REVISION_LOST, clip(f"revision {row.name} not promoted ({row.reason}): {row.message or ''}")))
    if after.pin_refused and (before is None or before.pin_refused != after.pin_refused):
        events.append(Event("Warning", Reason.REVISION_PIN_REFUSED, clip(after.pin_refused)))
    return events
