"""Trained revisions (issue 36, items 3-4): which drafter serves, how a new revision is judged, and its rows.

A revision is the directory a training Job ``<name>-train-<n>`` publishes, ``/revisions/<job>`` on the claim
``<name>-revisions``; its name is the Job's. Pure, like training.py, which calls it:

* **the served drafter** (``choose_serving``): ``spec.retraining.revision`` pins one (a revision's name, or
  ``drafter`` for spec.drafter); unset, the newest Promoted revision serves, else spec.drafter. A pin to a revision the
  status does not know (or one pruned) changes nothing: the drafter serving stays, and ``pinRefused`` says why.
* **the effective spec** (``effective_spec``): the user's spec with the served revision's directory as spec.drafter's
  path (the speculative pod mounts the claim read-only at /revisions: manifests.serves_a_revision), the user's own
  candidates kept as they are, and, while a revision races, that revision as one more candidate (``train-<n>``) after
  the user's: the race of candidate_race.py measures the served drafter, the user's candidates and the revision against
  the same warm base. The operator never writes the spec; this copy lives only in the step.
* **the race's workloads** (``race_workloads``): the spec's, and the racing revision's held-out slice of recent
  traffic (``<revision>/heldout.jsonl`` on the claim), so that the race measures both drafters on what users send now.
* **the offline gate** (``judge_offline``): when the Job succeeded, the publish container's termination message
  (schema 1, docs/retraining.md) says what the Job's evaluate stage found. Unreadable: Lost, RevisionReportUnreadable.
  The validator's findings at error severity (RevisionInvalid), no offline figures (OfflineEvaluationMissing) or a gain
  below spec.retraining.training.minAcceptanceGain (OfflineGainBelowMargin, retrain.offline_gain_passes): Lost.
  Otherwise it races (Racing), unless a pin leaves nothing to race it for, or a candidate of the spec already has the
  name the race would give it (Evaluated: its figures kept, never served unless pinned).
* **the race's verdict** (``judge_race``): once the race is decided, the revision is Promoted only when it is the
  race's winner (confirmed faster than the base, and the fastest of the passing candidates); otherwise Lost, and the
  race's own decision stands: its winner serves, or with none passing, the best measured candidate's rollback (the
  serving drafter's when the revision was the best of the losers: the next step no longer races the revision). When
  the spec has candidates of its own, the next step is still a race, of the user's candidates with the revision in
  spec.drafter's place if it won: the verdict rewrites the decided race's table and summary into that race's shape
  (``race_after``), so it is not run again; a later change of the candidates (the spec's, a new revision) re-races.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api import (
    Candidate,
    CandidateStatus,
    Drafter,
    ProbeStatus,
    RaceStatus,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
    Workload,
    names_more_than_the_drafter,
    resolve_candidates,
)
from ..api_retraining import RetrainingStatus
from ..api_retraining_job import MAX_REVISION_ROWS, PIN_DRAFTER, RetrainingTraining, RevisionStatus, TrainingStatus
from ..manifests import REVISIONS_MOUNT, revisions_claim_name
from ..textutil import clip
from .candidate_race import PASSED, best_measured, race_revision, told_decision
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
NAME_TAKEN = "CandidateNameTaken"  # a spec candidate has the name the race gives the revision (train-<n>)
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
    """Which drafter serves this step: a revision's name (None: spec.drafter), the revision racing (if any), why a
    pin is not honoured (if so), and whether the spec races candidates of its own (the race of the revision has more
    than two rows, and the next step is a race too)."""

    revision: str | None
    racing: str | None = None
    pin_refused: str | None = None
    own_candidates: bool = False


def pin_of(spec: SpeculativeServerSpec) -> str | None:
    retraining = getattr(spec, "retraining", None)
    return retraining.revision if retraining is not None else None


def choose_serving(spec: SpeculativeServerSpec, stored: RetrainingStatus) -> Serving:
    """The pin when it names a known revision (or spec.drafter); unset, the newest Promoted revision, else spec.drafter.
    A pin to an unknown revision leaves the drafter serving as it was. A revision races only without a pin, beside the
    user's own candidates if the spec has any, unless one of them has its name (Racing rows are judged to Evaluated
    then: judge_offline, abandoned)."""
    rows = stored.revisions
    pin = pin_of(spec)
    retraining = getattr(spec, "retraining", None)
    if pin is None and (retraining is None or retraining.training is None):
        return Serving(None)  # retraining turned off: spec.drafter serves (the revisions stay on the claim)
    racing = next((r.name for r in reversed(rows) if r.outcome == "Racing"), None)
    if pin is not None or (racing is not None and name_taken(spec, racing)):
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
    return Serving(promoted, racing, own_candidates=names_more_than_the_drafter(spec))


def name_taken(spec: SpeculativeServerSpec, revision: str) -> bool:
    """Whether a candidate of the spec already has the name the race gives ``revision`` (a user may name one train-1)."""
    return candidate_name(revision) in {c.name for c in resolve_candidates(spec)}


def _drafter_at(drafter: Drafter, revision: str) -> dict[str, Any]:
    return {**drafter.model_dump(by_alias=True, exclude_none=True), "path": revision_path(revision)}


def effective_spec(spec: SpeculativeServerSpec, status: SpeculativeServerStatus, name: str) -> SpeculativeServerSpec:
    """The spec the lifecycle runs this step: the served revision in spec.drafter's place (the user's own candidates
    stay: they race it as they raced spec.drafter) and, while one races, the racing revision as one more candidate
    after the user's (the same method and settings as the served drafter, its own directory) and its held-out traffic
    as one more workload of the race (race_workloads). Unchanged when spec.drafter serves and nothing races.
    ``name``: the resource's (its revisions claim is ``<name>-revisions``)."""
    stored = retraining_of(status)
    chosen = choose_serving(spec, stored)
    out = spec
    if chosen.revision is not None:
        drafter = Drafter.model_validate(_drafter_at(spec.drafter, chosen.revision))
        out = spec.model_copy(update={"drafter": drafter})
    if chosen.racing is not None:
        candidate = Candidate.model_validate({**_drafter_at(out.drafter, chosen.racing), "name": candidate_name(chosen.racing)})
        rollout = out.rollout.model_copy(update={"workloads": race_workloads(out, name, find(stored.revisions, chosen.racing))})
        out = out.model_copy(update={"candidates": [*(out.candidates or []), candidate], "rollout": rollout})
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
    """A Racing row with nothing to race it for: a pin (the user chose the drafter), or a candidate of the spec with
    the name the race would give it. Evaluated, its figures kept; it serves only if pinned."""
    if row.outcome != "Racing":
        return row
    pin = pin_of(spec)
    if pin is not None:
        reason, why = PINNED, f"not raced: spec.retraining.revision pins {pin!r}; pin {row.name!r} to serve it, or remove the pin"
    elif name_taken(spec, row.name):
        taken = candidate_name(row.name)
        reason, why = NAME_TAKEN, f"not raced: spec.candidates has a candidate named {taken!r}, the name the race gives it; rename that candidate"
    else:
        return row
    return row.model_copy(update={"outcome": "Evaluated", "reason": reason, "message": clip(f"{row.message or ''}; {why}", ROW_MESSAGE_CHARS)})


@dataclass(frozen=True)
class RaceVerdict:
    rows: list[RevisionStatus]
    serving: str | None  # the revision serving after it (None: spec.drafter)
    outcome: str | None  # Promoted or Lost once decided, else None
    probe: ProbeStatus | None  # with Lost: the decision that stands when this step stored another (the revision's rollback)
    # A race of the spec's own candidates, decided: its table and summary in the shape of the next step's race (race_after).
    candidates: list[CandidateStatus] | None = None
    race: RaceStatus | None = None


def judge_race(stored: RetrainingStatus, chosen: Serving, status: SpeculativeServerStatus) -> RaceVerdict:
    """The racing revision's verdict once the race of this step is decided: Promoted only when it is the race's winner
    (confirmed faster than the base, the fastest of the passing candidates); else Lost, and the race's decision stands
    (its winner, or with none passing the best measured other candidate's rollback)."""
    rows = [not_raced_abandoned(r, chosen) for r in stored.revisions]
    racing = chosen.racing
    race, table = status.race, status.candidates or []
    mine = next((c for c in table if racing is not None and c.name == candidate_name(racing)), None)
    if racing is None or race is None or race.state != "Decided" or mine is None:
        return RaceVerdict(rows, chosen.revision, None, None)
    others = [c for c in table if c.name != mine.name]
    figures = {"accept_length": mine.accept_length, "speedup": mine.speedup}
    after = race_after(race, table, mine) if chosen.own_candidates else (None, None)
    if race.winner == mine.name:
        rows = [_retired(r, racing) if r.name == chosen.revision and r.outcome == "Promoted" else r for r in rows]
        row = RevisionStatus.model_validate({**find(rows, racing).model_dump(), **figures, "outcome": "Promoted", "reason": RACE_WON})  # type: ignore[union-attr]
        row = row.model_copy(update={"message": clip(won_message(mine, others), ROW_MESSAGE_CHARS)})
        return RaceVerdict(_with_row(rows, row, (stored.serving,)), racing, Outcome.PROMOTED.value, None, *after)
    row = RevisionStatus.model_validate({**find(rows, racing).model_dump(), **figures, "outcome": "Lost", "reason": RACE_LOST})  # type: ignore[union-attr]
    row = row.model_copy(update={"message": clip(lost_message(mine, table, race.winner), ROW_MESSAGE_CHARS)})
    standing = next((c for c in others if c.name == race.winner), None) or (best_measured(others) if others else None)
    keep = None
    if standing is not None and standing.finished_at is not None and status.probe is not None and status.probe.revision != standing.revision:
        keep = told_decision(standing, len(table), standing.state in PASSED)
    return RaceVerdict(_with_row(rows, row, (stored.serving,)), chosen.revision, Outcome.LOST.value, keep, *after)


def _speed(row: CandidateStatus) -> str:
    return f"{row.name} {row.speedup}x" if row.speedup is not None else f"{row.name} not measured ({row.reason or row.state})"


def won_message(mine: CandidateStatus, others: list[CandidateStatus]) -> str:
    """The row's message of a revision that won: its speedup, and the other candidates' (the serving drafter first)."""
    if len(others) == 1:
        beaten = f"faster than the serving drafter ({others[0].speedup}x)" if others[0].speedup is not None else "the serving drafter not measured"
        return f"won the race: {mine.speedup}x over the base, {beaten}"
    rest = "".join(f", {_speed(c)}" for c in others[1:])
    return f"won the race of {len(others) + 1} candidates: {mine.speedup}x over the base (the serving drafter {_speed(others[0])}{rest})"


def lost_message(mine: CandidateStatus, table: list[CandidateStatus], winner: str | None) -> str:
    """Why a revision lost: its validator, the candidate that won (the serving drafter is the table's first), or that
    nothing was confirmed faster than the base."""
    if mine.state == "Invalid":
        return f"lost the race: its speculative pod's validator refused it ({mine.message or mine.reason})"
    won = next((c for c in table if c.name == winner), None)
    if won is not None and won.name == table[0].name:
        return f"lost the race: the serving drafter was faster ({won.speedup}x vs {mine.speedup}x over the base)"
    if won is not None:
        return f"lost the race: candidate {won.name} ({won.algorithm}) won, {won.speedup}x vs {mine.speedup}x over the base; {won.name} serves"
    if len(table) > 2:
        return f"lost the race: no candidate was confirmed faster than the base (its {mine.reason}, {mine.speedup}x); the race's rollback stands"
    return f"lost the race: not confirmed faster than the base ({mine.reason}, {mine.speedup}x); the serving drafter's result stands"


def race_after(race: RaceStatus, table: list[CandidateStatus], mine: CandidateStatus) -> tuple[list[CandidateStatus], RaceStatus]:
    """A decided race of the spec's own candidates and a revision, as the next step's race has it: the user's candidates,
    with the revision in spec.drafter's place (the table's first row, its name) if it won, else without it. Its revision
    hashes the rows kept (candidate_race.race_revision), so candidate_race takes it as the race already decided: the
    same candidates and speculative revisions (the race's held-out workload is not part of one), and the same winner,
    and serves its decision without measuring anyone again."""
    won = race.winner == mine.name
    first = mine.model_copy(update={"name": table[0].name}) if won else table[0]
    rest = [first, *(c for c in table[1:] if c.name != mine.name)]
    winner = first.name if won else race.winner
    current = winner or best_measured(rest).name
    revision = race_revision({c.name: c.revision or "" for c in rest})
    return rest, race.model_copy(update={"revision": revision, "current": current, "winner": winner})


def _retired(row: RevisionStatus, by: str) -> RevisionStatus:
    return row.model_copy(update={"outcome": "Retired", "reason": REPLACED, "message": clip(f"replaced by {by}", ROW_MESSAGE_CHARS)})


def not_raced_abandoned(row: RevisionStatus, chosen: Serving) -> RevisionStatus:
    """A row left Racing when its race can no longer run (a pin set meanwhile, retraining turned off, or a candidate
    of the spec named as the race would name it): Evaluated."""
    if row.outcome != "Racing" or chosen.racing == row.name:
        return row
    message = f"{row.message or ''}; not raced: the race was called off (spec.retraining.revision pinned, retraining off, or a spec candidate named {candidate_name(row.name)!r})"
    return row.model_copy(update={"outcome": "Evaluated", "reason": PINNED, "message": clip(message, ROW_MESSAGE_CHARS)})
