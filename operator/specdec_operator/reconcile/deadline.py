"""No wait without an end: what the resource waits for, since when, and what happens past the progress deadline.

A step names what it waits for (``waiting_for``): the base server, the speculative server (the validator runs in
its pod), or a fleet's walk, with the reason the server gives (Loading, VolumeNotMounted, Unschedulable, ...).
A change of that name is progress, except a change from one cause that is no progress to another for the same
server (Unschedulable, then ImageNotPulled: the clock keeps running); status.waitingSince keeps the time of the
last progress. Past
spec.progressDeadlineSeconds without progress:

- waiting for the speculative side (its validator, its load, a walk toward it): the revision is rolled back with
  reason ProgressDeadlineExceeded, as a crash-looping speculative server is, so it holds no GPUs; the base serves.
  `kubectl specdec retry` (or a new revision) tries again.
- waiting for the base: nothing to fall back to. The phase is Failed with ProgressDeadlineExceeded, the message
  names the cause, and an older base pod that still serves keeps serving; the wait ends by itself when the base
  comes (the phase follows the servers again).

A probe running in this process is not a wait: it has its own timeout (--probe-timeout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from .. import rollout
from ..api import Decision, Phase, ProbeStatus, Reason, SpeculativeServerStatus, ValidationStatus, Variant
from ..textutil import clip, parse_time
from .decision import is_invalid, is_promoted
from .facts import BASE, SPECULATIVE, Facts
from .fleet import Fleet
from .pods import ServerState
from .status import PhaseOutcome


@dataclass(frozen=True)
class Wait:
    """What a step waits for: the side whose server is awaited, a name (its change is progress), the cause."""

    side: Variant
    what: str
    cause: str


def _named(server: ServerState) -> str:
    """The reason a wait is named by. A server that has restarted and is starting or loading again is still in its
    crash loop: between two CrashLoopBackOff waits the kubelet runs the container for a moment, and a name that
    changed with each restart would be progress, so a server that exits at start would never reach the deadline
    (seen on the real node: CrashLoop, Loading, Starting, CrashLoop, ...)."""
    if server.restarts > 0 and server.reason in (Reason.LOADING, Reason.STARTING):
        return Reason.CRASH_LOOP.value
    return server.reason.value


def waiting_for(facts: Facts, validation: ValidationStatus | None, decision: ProbeStatus | None, fleet: Fleet) -> Wait | None:
    """What this step waits for, or None when nothing is awaited (decided and arrived, or a probe measures)."""
    if facts.conflicts or is_invalid(validation):
        return None
    base, speculative = facts.servers[BASE], facts.servers[SPECULATIVE]
    if fleet[BASE] > 0 and not base.ready:
        return Wait(BASE, f"the base server ({_named(base)})", base.message)
    if fleet.walks and not fleet.done and fleet.toward is not None:
        progress = rollout.progress(fleet.replicas, fleet.state)
        server = facts.servers[fleet.toward]
        return Wait(fleet.toward, f"the walk to {fleet.toward.value} ({progress})", f"{fleet.toward.value}: {server.message}")
    if (decision is None or is_promoted(decision)) and fleet[SPECULATIVE] > 0 and not speculative.ready:
        what = "the drafter validator" if validation is None else "the speculative server"
        return Wait(SPECULATIVE, f"{what} ({_named(speculative)})", speculative.message)
    return None


# The causes of a wait that are no progress (stuck.py's, and the crash loop): a change from one to another (no node
# fits, then the image is not pulled; a volume that mounts, then one that does not) keeps the clock running.
_STUCK = frozenset(
    r.value for r in (Reason.UNSCHEDULABLE, Reason.VOLUME_NOT_MOUNTED, Reason.IMAGE_NOT_PULLED, Reason.CONTAINER_CONFIG_ERROR, Reason.CRASH_LOOP)
)
_NAMED = re.compile(r"^(?P<subject>.*) \((?P<cause>[A-Za-z]+)\)$")


def _stuck_on(what: str | None) -> tuple[str, str] | None:
    """("the base server", "Unschedulable") of a wait named by a cause that is no progress, else None."""
    found = _NAMED.match(what or "")
    return (found["subject"], found["cause"]) if found and found["cause"] in _STUCK else None


def waiting_since(prev: SpeculativeServerStatus, wait: Wait | None, now: str) -> str | None:
    """The stored time while the step waits for the same thing, or for the same server stuck on another cause (no
    progress: the clock keeps running); now when it waits for something new."""
    if wait is None:
        return None
    if not prev.waiting_since:
        return now
    if prev.waiting_for == wait.what:
        return prev.waiting_since
    before, after = _stuck_on(prev.waiting_for), _stuck_on(wait.what)
    return prev.waiting_since if before is not None and after is not None and before[0] == after[0] else now


def passed(since: str | None, now: datetime, seconds: int) -> bool:
    start = parse_time(since)
    return start is not None and (now - start).total_seconds() > seconds


def _expired_message(facts: Facts, wait: Wait, since: str) -> str:
    seconds = facts.spec.progress_deadline_seconds
    return clip(f"no progress for {seconds}s (spec.progressDeadlineSeconds) waiting for {wait.what} since {since}: {wait.cause}")


def speculative_expired(facts: Facts, wait: Wait, since: str) -> ProbeStatus:
    """The rollback of a revision whose speculative side waited past the deadline (retry: kubectl specdec retry)."""
    message = _expired_message(facts, wait, since) + "; the speculative server is given up for this revision, the base serves"
    return ProbeStatus(
        decision=Decision.ROLLBACK,
        reason=Reason.PROGRESS_DEADLINE_EXCEEDED,
        rounds=0,
        revision=facts.revision,
        finished_at=facts.now_s,
        message=message,
    )


def base_expired(facts: Facts, wait: Wait, since: str, outcome: PhaseOutcome) -> PhaseOutcome:
    """Phase Failed while the base waits past the deadline; what a still-serving older base pod does is said too."""
    if outcome.phase in (Phase.FAILED, Phase.INVALID):
        return outcome
    serving = "; a base pod of the older template keeps serving" if facts.servers[BASE].any_ready else ""
    return PhaseOutcome(Phase.FAILED, Reason.PROGRESS_DEADLINE_EXCEEDED, clip(_expired_message(facts, wait, since) + serving))
