"""Decisions made by hand (steering.py reads them from the specdec.io/* annotations) and how they meet the
operator's own: retry drops what was decided for the revision before anything is settled, abort and promote
replace the decision after it is settled, and a lifted override gives the revision back to the probe.

Abort and promote hold while their annotation is present: a promotion by hand is not undone by the drift monitor
(status.monitor still says what it measures), an abort keeps the base whatever a probe said. An incompatible
drafter stays Invalid under a promote: the override skips the probe, not the validator.
"""

from __future__ import annotations

from ..api import Decision, ProbeStatus, Reason, SpeculativeServerStatus, SteeringStatus
from ..steering import Steering
from ..textutil import clip

# Decisions only a person makes: when the annotation that made one is gone, the revision is undecided again.
BY_HAND = frozenset({Reason.ABORTED.value, Reason.PROMOTED_BY_HAND.value})
# What a retry clears besides a decision: a validator verdict that was an input error or a failure of the run,
# not a finding about the drafter (a drafter found incompatible stays so until it changes).
RETRIED_VALIDATION = frozenset({Reason.VALIDATOR_INPUT_ERROR.value, Reason.VALIDATOR_FAILED.value, Reason.VALIDATOR_OOM_KILLED.value})


def before_settling(prev: SpeculativeServerStatus, asked: Steering, revision: str) -> SpeculativeServerStatus:
    """The stored status as the step should read it: without the revision's decision when a retry asks for a new
    probe, and without a hand-made decision whose annotation is gone."""
    probe = prev.probe if prev.probe is not None and prev.probe.revision == revision else None
    drop_probe = probe is not None and (
        asked.retry is not None or (probe.reason in BY_HAND and not (asked.abort if probe.reason == Reason.ABORTED else asked.promote))
    )
    validation = prev.validation
    drop_validation = (
        asked.retry is not None
        and validation is not None
        and validation.revision == revision
        and any(f.code in RETRIED_VALIDATION for f in validation.findings if f.severity == "error")
    )
    if not drop_probe and not drop_validation:
        return prev
    update: dict = {}
    if drop_probe:
        update.update(probe=None, monitor=None)
    if drop_validation:
        update["validation"] = None
    return prev.model_copy(update=update)


def override(decision: ProbeStatus | None, asked: Steering, revision: str, now: str, incompatible: bool) -> ProbeStatus | None:
    """The decision in force: the settled one, or the abort or promotion a person asked for."""
    if asked.abort is not None:
        if decision is not None and decision.reason == Reason.ABORTED and decision.message == _abort_message(asked.abort):
            return decision
        return _by_hand(decision, Decision.ROLLBACK, Reason.ABORTED, _abort_message(asked.abort), revision, now)
    if asked.promote is not None and not incompatible:
        if decision is not None and decision.reason == Reason.PROMOTED_BY_HAND and decision.message == _promote_message(asked.promote, None):
            return decision
        if decision is not None and decision.reason == Reason.PROMOTED_BY_HAND:
            return _by_hand(decision, Decision.PROMOTE, Reason.PROMOTED_BY_HAND, _promote_message(asked.promote, None), revision, now)
        return _by_hand(decision, Decision.PROMOTE, Reason.PROMOTED_BY_HAND, _promote_message(asked.promote, decision), revision, now)
    return decision


def _abort_message(reason: str) -> str:
    return clip(f"aborted by hand: {reason}; the base serves until specdec.io/abort is removed (kubectl specdec resume)")


def _promote_message(reason: str, measured: ProbeStatus | None) -> str:
    verdict = f" (the probe had decided {measured.decision}, {measured.reason})" if measured is not None and measured.decision else ""
    return clip(f"promoted by hand: {reason}{verdict}; the probe and the drift monitor do not decide while specdec.io/promote is set")


def _by_hand(measured: ProbeStatus | None, decision: Decision, reason: Reason, message: str, revision: str, now: str) -> ProbeStatus:
    """A hand-made decision, keeping what a probe measured (speedup, workloads) for the record."""
    base = measured if measured is not None else ProbeStatus(revision=revision)
    return base.model_copy(update={"decision": decision, "reason": reason, "message": message, "revision": revision, "finished_at": now})


def steering_status(prev: SpeculativeServerStatus, asked: Steering, decision: ProbeStatus | None, walks: bool) -> SteeringStatus | None:
    """status.steering: the retry token acted on (kept), the override in force, a paused walk."""
    retried = asked.retry or (prev.steering.retried if prev.steering is not None else None)
    in_force = decision is not None and decision.reason in BY_HAND
    kind = ("abort" if decision.reason == Reason.ABORTED else "promote") if in_force and decision is not None else None
    reason = (asked.abort if kind == "abort" else asked.promote) if kind else None
    paused = True if asked.paused and walks else None
    if retried is None and kind is None and paused is None:
        return None
    return SteeringStatus(retried=retried, override=kind, reason=reason, paused=paused)
