"""Trained revisions (issue 36, items 3-4): which drafter serves, how a new revision is judged, and its rows.

A revision is the directory a training Job ``<name>-train-<n>`` publishes, ``/revisions/<job>`` on the claim
``<name>-revisions``; its name is the Job's. Pure, like training.py, which calls it:

* **the served drafter** (``choose_serving``): ``spec.retraining.revision`` pins one (a revision's name, or
  ``drafter`` for spec.drafter); unset, the newest Promoted revision serves, else spec.drafter. A pin to a revision the
  status does not know (or one pruned) changes nothing: the drafter serving stays, and ``pinRefused`` says why.
* **the effective spec** (``effective_spec``): the user's spec with the served revision's directory as spec.drafter's
  path (the speculative pod mounts the claim read-only at /revisions: manifests.serves_a_revision), and, while a
  revision races, that revision as a second candidate beside the served drafter: the race of candidate_race.py
  measures both against the same warm base. The operator never writes the spec; this copy lives only in the step.
* **the race's workloads** (``race_workloads``): the spec's, and the racing revision's held-out slice of recent
  traffic (``<revision>/heldout.jsonl`` on the claim), so that the race measures both drafters on what users send now.
* **the offline gate** (``judge_offline``): when the Job succeeded, the publish container's termination message
  (schema 1, docs/retraining.md) says what the Job's evaluate stage found. Unreadable: Lost, RevisionReportUnreadable.
  The validator's findings at error severity (RevisionInvalid), no offline figures (OfflineEvaluationMissing) or a gain
  below spec.retraining.training.minAcceptanceGain (OfflineGainBelowMargin, retrain.offline_gain_passes): Lost.
  Otherwise it races (Racing), unless a pin or a race of the user's own candidates leaves nothing to race it for
  (Evaluated: its figures kept, never served unless pinned).
* **the race's verdict** (``judge_race``): once the race is decided, the revision is Promoted only when it won (a
  confirmed speedup over the base, and faster than the serving drafter); otherwise Lost, and the serving drafter's
  result stands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api import Candidate, Drafter, ProbeStatus, SpeculativeServerSpec, SpeculativeServerStatus, Workload, names_more_than_the_drafter
from ..api_retraining import RetrainingStatus
from ..api_retraining_job import MAX_REVISION_ROWS, PIN_DRAFTER, RetrainingTraining, RevisionStatus, TrainingStatus
from ..manifests import REVISIONS_MOUNT, revisions_claim_name
from ..textutil import clip
from .candidate_race import PASSED, told_decision
from .retrain import Outcome, offline_gain_passes

PUBLISH_CONTAINER = "publish"
REPORT_SCHEMA = 1
ROW_MESSAGE_CHARS = 240  # ten rows stay a small share of the status's byte budget
# Reasons of a revision's row (status.retraining.revisions[].reason).
UNREADABLE = "RevisionReportUnreadable"
INVALID = "RevisionInvalid"
MISSING = "OfflineEvaluationMissing"
BELOW_MARGIN = "OfflineGainBelowMargin"
OFFLINE_PASSED = "OfflineGainPassed"
RACE_WON = "RaceWon"
RACE_LOST = "RaceLost"
PINNED = "ServingPinned"
CANDIDATES = "RaceOfCandidates"
REPLACED = "Replaced"
PRUNED = "PrunedByStorageCap"
HELDOUT_WORKLOAD = "held-out-traffic"  # the race's workload of the racing revision's held-out slice (race_workloads)
HELDOUT_FILE = "heldout.jsonl"  # in the revision's directory (drafter_training/publish.py HELDOUT)
MAX_WORKLOADS = 16  # rollout.workloads' maxItems


def revision_path(revision: str) -> str:
    return f"{REVISIONS_MOUNT}/{revision}"


def candidate_name(revision: str) -> str:
    """A revision's name among the race's candidates (a DNS label of at most 20 characters): ``train-<n>``."""
    return "train-" + revision.rsplit("-", 1)[-1]


def retraining_of(status: SpeculativeServerStatus) -> RetrainingStatus:
    return status.retraining or RetrainingStatus()


def find(rows: list[RevisionStatus], name: str | None) -> RevisionStatus | None:
    return next((r for r in reversed(rows) if r.name == name), None) if name else None


@dataclass(frozen=True)
class Serving:
    """Which drafter serves this step: a revision's name (None: spec.drafter), the revision racing (if any), and why a
    pin is not honoured (if so)."""

    revision: str | None
    racing: str | None = None
    pin_refused: str | None = None


def pin_of(spec: SpeculativeServerSpec) -> str | None:
    retraining = getattr(spec, "retraining", None)
    return retraining.revision if retraining is not None else None


def choose_serving(spec: SpeculativeServerSpec, stored: RetrainingStatus) -> Serving:
    """The pin when it names a known revision (or spec.drafter); unset, the newest Promoted revision, else spec.drafter.
    A pin to an unknown revision leaves the drafter serving as it was. A revision races only without a pin and without
    the user's own candidates (Racing rows are judged to Evaluated then: judge_offline, abandoned)."""
    rows = stored.revisions
    pin = pin_of(spec)
    retraining = getattr(spec, "retraining", None)
    if pin is None and (retraining is None or retraining.training is None):
        return Serving(None)  # retraining turned off: spec.drafter serves (the revisions stay on the claim)
    racing = next((r.name for r in reversed(rows) if r.outcome == "Racing"), None)
    if pin is not None or names_more_than_the_drafter(spec):
        racing = None
    if pin == PIN_DRAFTER:
        return Serving(None)
    if pin is not None:
        row = find(rows, pin)
        if row is not None and row.outcome != "Pruned":
            return Serving(pin)
        known = ", ".join(r.name for r in rows if r.outcome != "Pruned") or "none yet"
        why = "was pruned from the claim" if row is not None else "is not a revision of this resource"
        refused = (
            f"spec.retraining.revision {pin!r} {why} (revisions: {known}); set it to one of them or {PIN_DRAFTER!r}, or remove it to let "
            "the operator choose; the drafter serving is unchanged"
        )
        return Serving(stored.serving, pin_refused=refused)
    promoted = next((r.name for r in reversed(rows) if r.outcome == "Promoted"), None)
    return Serving(promoted, racing)


def _drafter_at(drafter: Drafter, revision: str) -> dict[str, Any]:
    return {**drafter.model_dump(by_alias=True, exclude_none=True), "path": revision_path(revision)}


def effective_spec(spec: SpeculativeServerSpec, status: SpeculativeServerStatus, name: str) -> SpeculativeServerSpec:
    """The spec the lifecycle runs this step: the served revision in spec.drafter's place and, while one races, the
    racing revision as a candidate beside it (the same method and settings, its own directory) and its held-out
    traffic as one more workload of the race (race_workloads). Unchanged when spec.drafter serves and nothing races.
    ``name``: the resource's (its revisions claim is ``<name>-revisions``)."""
    stored = retraining_of(status)
    chosen = choose_serving(spec, stored)
    out = spec
    if chosen.revision is not None:
        drafter = Drafter.model_validate(_drafter_at(spec.drafter, chosen.revision))
        out = spec.model_copy(update={"drafter": drafter, "candidates": None, "include_drafter_free": None})
    if chosen.racing is not None:
        candidate = Candidate.model_validate({**_drafter_at(out.drafter, chosen.racing), "name": candidate_name(chosen.racing)})
        rollout = out.rollout.model_copy(update={"workloads": race_workloads(out, name, find(stored.revisions, chosen.racing))})
        out = out.model_copy(update={"candidates": [candidate], "include_drafter_free": None, "rollout": rollout})
    return out


def race_workloads(spec: SpeculativeServerSpec, name: str, racing: RevisionStatus | None) -> list[Workload]:
    """The race's workloads: the spec's, and the racing revision's held-out slice of recent traffic (the conversations
    its Job held out of training, published as ``<revision>/heldout.jsonl`` on the revisions claim) sent the way the
    spec's lowest-concurrency workload sends its prompts (``held-out-traffic``, weight 1). A revision trained for traffic
    that shifted away from what the spec's prompts stand for is raced on what users send now; the serving drafter is
    measured on the same prompts. The spec's workloads alone when its Job held nothing out, or when the spec already has
    the most workloads a rollout allows."""
    workloads = list(spec.rollout.workloads)
    if racing is None or not racing.heldout or len(workloads) >= MAX_WORKLOADS:
        return workloads
    shape = min(workloads, key=lambda w: w.concurrency)
    taken = {w.name for w in workloads}
    label = next(n for n in (HELDOUT_WORKLOAD, *(f"{HELDOUT_WORKLOAD}-{i}" for i in range(2, MAX_WORKLOADS + 2))) if n not in taken)
    file = {"path": f"{racing.name}/{HELDOUT_FILE}", "claimName": revisions_claim_name(name)}
    prompts = {"source": "File", "file": file, "format": "Chat", "outputLength": "Fixed"}
    fields = {"concurrency": shape.concurrency, "outputTokens": shape.output_tokens, "requests": shape.requests, "weight": 1.0}
    return [*workloads, Workload.model_validate({"name": label, **fields, "prompts": prompts})]


@dataclass(frozen=True)
class Report:
    """What the publish container's termination message says (schema 1; docs/retraining.md)."""

    heldout: int | None
    offline: float | None  # the revision's acceptance length on the held-out slice
    serving_offline: float | None  # the serving drafter's on the same slice
    valid: bool | None
    codes: tuple[str, ...]
    pruned: tuple[str, ...]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_report(pods: list[dict[str, Any]], job: str) -> Report | str:
    """The report of Job ``job``'s publish container from its pods' status, or why it cannot be read."""
    messages = [
        ((s.get("state") or {}).get("terminated") or {}).get("message")
        for pod in pods
        for s in (pod.get("status") or {}).get("containerStatuses") or []
        if s.get("name") == PUBLISH_CONTAINER and ((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0
    ]
    found = [m for m in messages if m]
    if not found:
        return f"no terminated {PUBLISH_CONTAINER} container with a termination message among the Job's pods"
    try:
        data = json.loads(found[-1])
    except ValueError as exc:
        return f"the {PUBLISH_CONTAINER} container's termination message is not JSON ({exc})"
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA or data.get("revision") != job:
        return f"the {PUBLISH_CONTAINER} container's termination message is not a schema {REPORT_SCHEMA} report of revision {job}"
    offline: dict[str, Any] = data["offline"] if isinstance(data.get("offline"), dict) else {}
    validation: dict[str, Any] = data["validation"] if isinstance(data.get("validation"), dict) else {}

    def accept(side: str) -> float | None:
        entry = offline.get(side)
        return _number(entry.get("acceptLength")) if isinstance(entry, dict) else None

    heldout = data.get("heldout")
    passed = validation.get("passed")
    return Report(
        heldout=heldout if isinstance(heldout, int) and not isinstance(heldout, bool) else None,
        offline=accept("revision"),
        serving_offline=accept("serving"),
        valid=passed if isinstance(passed, bool) else None,
        codes=tuple(str(c) for c in validation.get("codes") or [] if isinstance(c, str)),
        pruned=tuple(str(p) for p in data.get("pruned") or [] if isinstance(p, str)),
    )


def offline_gate(report: Report, min_gain: float) -> tuple[str | None, str]:
    """(None, why it passes) or (the reason it loses, why): the validator, the offline figures, the margin."""
    if report.valid is not True:
        found = ", ".join(report.codes) or "no validation result"
        return INVALID, f"the validator refused the revision ({found})"
    new, old = report.offline, report.serving_offline
    if new is None or old is None:
        return MISSING, "no offline acceptance length on the held-out slice (no held-out conversation, or the evaluate stage had none)"
    figures = f"offline acceptance length {new:.3f} vs the serving drafter's {old:.3f} on {report.heldout or 0} held-out conversations"
    if not offline_gain_passes(new, old, min_gain):
        return BELOW_MARGIN, f"{figures}: below minAcceptanceGain {min_gain:g} (needs {old * (1 + min_gain):.3f})"
    return None, f"{figures}: passes minAcceptanceGain {min_gain:g}"


def _with_row(rows: list[RevisionStatus], row: RevisionStatus, keep: tuple[str | None, ...] = ()) -> list[RevisionStatus]:
    """The rows with ``row`` in its name's place (or last), at most MAX_REVISION_ROWS: the oldest dropped first, never
    a Promoted or Racing one nor one named in ``keep`` (the revision serving, the pinned one), which a pin or the
    choice of the serving drafter reads."""
    out = [row if r.name == row.name else r for r in rows]
    if not any(r.name == row.name for r in rows):
        out.append(row)
    kept = {name for name in keep if name}
    while len(out) > MAX_REVISION_ROWS:
        oldest = next((r for r in out if r.outcome not in ("Promoted", "Racing") and r.name not in kept and r.name != row.name), None)
        if oldest is None:
            break
        out.remove(oldest)
    return out


def judge_offline(
    spec: SpeculativeServerSpec, training: RetrainingTraining, current: TrainingStatus, stored: RetrainingStatus, pods: list[dict[str, Any]]
) -> tuple[TrainingStatus, list[RevisionStatus]]:
    """A Job that succeeded and whose revision has no row yet: its row from the publish report and the offline gate.
    A Lost revision ends the Job's outcome (retrain.py's RetrainedDrafterLost); a Racing one leaves it open (RevisionUnjudged)."""
    rows = stored.revisions
    job = current.job
    if job is None or current.state != "Succeeded" or current.outcome is not None or find(rows, job) is not None:
        return current, rows
    report = read_report(pods, job)
    row = RevisionStatus(name=job, created_at=current.finished_at, trigger=current.trigger, outcome="Lost")
    if isinstance(report, str):
        row = row.model_copy(update={"reason": UNREADABLE, "message": clip(f"{report}: not judged, not served", ROW_MESSAGE_CHARS)})
        return current.model_copy(update={"outcome": Outcome.LOST.value}), _with_row(rows, row, (stored.serving, pin_of(spec)))
    pruned = set(report.pruned)
    rows = [r.model_copy(update={"outcome": "Pruned", "reason": PRUNED}) if r.name in pruned and r.outcome != "Pruned" else r for r in rows]
    lost, why = offline_gate(report, training.min_acceptance_gain)
    row = row.model_copy(
        update={
            "heldout": report.heldout,
            "offline_accept_length": report.offline,
            "serving_offline_accept_length": report.serving_offline,
            "reason": lost or OFFLINE_PASSED,
            "outcome": "Lost" if lost else "Racing",
            "message": clip(why, ROW_MESSAGE_CHARS),
        }
    )
    row = not_raced(spec, row)
    outcome = Outcome.LOST.value if row.outcome in ("Lost", "Evaluated") else None
    return current.model_copy(update={"outcome": outcome}), _with_row(rows, row, (stored.serving, pin_of(spec)))


def not_raced(spec: SpeculativeServerSpec, row: RevisionStatus) -> RevisionStatus:
    """A Racing row with nothing to race it for: a pin (the user chose the drafter) or a race of the user's own
    candidates (not raced against them yet). Evaluated, its figures kept; it serves only if pinned."""
    if row.outcome != "Racing":
        return row
    pin = pin_of(spec)
    if pin is not None:
        reason, why = PINNED, f"not raced: spec.retraining.revision pins {pin!r}; pin {row.name!r} to serve it, or remove the pin"
    elif names_more_than_the_drafter(spec):
        reason, why = CANDIDATES, "not raced: the spec races its own candidates, and revisions are not raced against them yet"
    else:
        return row
    return row.model_copy(update={"outcome": "Evaluated", "reason": reason, "message": clip(f"{row.message or ''}; {why}", ROW_MESSAGE_CHARS)})


@dataclass(frozen=True)
class RaceVerdict:
    rows: list[RevisionStatus]
    serving: str | None  # the revision serving after it (None: spec.drafter)
    outcome: str | None  # Promoted or Lost once decided, else None
    probe: ProbeStatus | None  # with Lost: the serving drafter's decision to keep (its rollback or promotion), if measured


def judge_race(stored: RetrainingStatus, chosen: Serving, status: SpeculativeServerStatus) -> RaceVerdict:
    """The racing revision's verdict once the race of this step is decided: Promoted only when it won (confirmed faster
    than the base and than the serving drafter); else Lost, and the serving drafter's measured decision stands."""
    rows = [not_raced_abandoned(r, chosen) for r in stored.revisions]
    racing = chosen.racing
    race, table = status.race, status.candidates or []
    mine = next((c for c in table if racing is not None and c.name == candidate_name(racing)), None)
    if racing is None or race is None or race.state != "Decided" or mine is None:
        return RaceVerdict(rows, chosen.revision, None, None)
    served = next((c for c in table if c.name != mine.name), None)
    figures = {"accept_length": mine.accept_length, "speedup": mine.speedup}
    if race.winner == mine.name:
        message = f"won the race: {mine.speedup}x over the base, faster than the serving drafter"
        if served is not None and served.speedup is not None:
            message += f" ({served.speedup}x)"
        rows = [_retired(r, racing) if r.name == chosen.revision and r.outcome == "Promoted" else r for r in rows]
        row = RevisionStatus.model_validate({**find(rows, racing).model_dump(), **figures, "outcome": "Promoted", "reason": RACE_WON})  # type: ignore[union-attr]
        row = row.model_copy(update={"message": clip(message, ROW_MESSAGE_CHARS)})
        return RaceVerdict(_with_row(rows, row, (stored.serving,)), racing, Outcome.PROMOTED.value, None)
    if mine.state == "Invalid":
        message = f"lost the race: its speculative pod's validator refused it ({mine.message or mine.reason})"
    elif served is not None and race.winner == served.name:
        message = f"lost the race: the serving drafter was faster ({served.speedup}x vs {mine.speedup}x over the base)"
    else:
        message = f"lost the race: not confirmed faster than the base ({mine.reason}, {mine.speedup}x); the serving drafter's result stands"
    row = RevisionStatus.model_validate({**find(rows, racing).model_dump(), **figures, "outcome": "Lost", "reason": RACE_LOST})  # type: ignore[union-attr]
    row = row.model_copy(update={"message": clip(message, ROW_MESSAGE_CHARS)})
    keep = None
    if served is not None and served.finished_at is not None and status.probe is not None and status.probe.revision != served.revision:
        keep = told_decision(served, len(table), served.state in PASSED)
    return RaceVerdict(_with_row(rows, row, (stored.serving,)), chosen.revision, Outcome.LOST.value, keep)


def _retired(row: RevisionStatus, by: str) -> RevisionStatus:
    return row.model_copy(update={"outcome": "Retired", "reason": REPLACED, "message": clip(f"replaced by {by}", ROW_MESSAGE_CHARS)})


def not_raced_abandoned(row: RevisionStatus, chosen: Serving) -> RevisionStatus:
    """A row left Racing when its race can no longer run (a pin set meanwhile, or candidates added): Evaluated."""
    if row.outcome != "Racing" or chosen.racing == row.name:
        return row
    message = f"{row.message or ''}; not raced: the race was called off (spec.retraining.revision pinned, or spec candidates)"
    return row.model_copy(update={"outcome": "Evaluated", "reason": PINNED, "message": clip(message, ROW_MESSAGE_CHARS)})
