"""The race of a SpeculativeServer's candidates (issue 35): a layer around the one-drafter lifecycle.

A spec that names more than spec.drafter (spec.candidates, spec.includeDrafterFree) is a race. Its candidates take
the speculative server's slot one after another, in their order, each as the spec with that candidate in
spec.drafter's place (``api.spec_for_candidate``): each is validated, deployed, probed against the same warm base and
decided by the one-drafter lifecycle (``reconcile._serve``) exactly as a spec of that drafter alone would be, under its
own speculative revision. This module only says which candidate the lifecycle runs this step and what it is told:

* **measuring**: the first candidate not measured yet. Its lifecycle's decision is recorded in the race's table
  (status.candidates) and never acted on while others are still to be measured: the same step runs the lifecycle again
  for the next candidate, whose revision has no decision, so the stable Service stays on the base and the slot's server
  is re-rendered for it. Its pods are the only speculative pods the lifecycle sees (a pod of another candidate's
  revision going away is no server of this one; its GPUs are still counted).
* **one error guarantee over the race**: each candidate's probe decides at ``1 - (1 - confidence) / N`` for N
  candidates (StartProbe.family, RaceRules.family), so the chance that any candidate slower than rollout.minSpeedup
  passes is at most ``1 - confidence`` (Bonferroni), and picking the best of the passing ones inherits it.
* **elimination**: a candidate whose interval's high end falls below the lowest workload low end of the best candidate
  that passed before it stops as soon as that is so (CannotWin, StartProbe.bar).
* **budget**: spec.race.gpuSecondsBudget bounds the GPU-seconds of the race's probes; candidates whose turn comes after
  it is spent are Skipped (GpuBudgetSpent). Settings.max_concurrent_races bounds the races running at once over the
  operator: a new race waits Queued (the base serves, no speculative server) until one ends.
* **plain probes**: a candidate is measured with rollout.loadAware Off (its plain decision is its row); load-aware
  speculation is the served candidate's business, as for a single drafter.
* **decided**: the passing candidate with the highest speedup under rollout.policy (the smallest workload's, or the
  weighted one) wins and is served: the lifecycle runs it with its recorded decision, so it is re-deployed in the slot
  if another candidate was measured after it, promoted once Ready, walked through a fleet, and given its own load-aware
  table, all as today. With none passing, the best measured candidate's decision (a rollback) stands and the base serves.
* **drift**: when the winner's acceptance drifts (AcceptanceDrift), the runner-up (the next best passing candidate) is
  measured again before anything else serves; with no runner-up the base serves.

A new race starts when any candidate's revision changes (the race's revision hashes them all: a spec or an engine
image change). Everything here is pure; the race's state is status.candidates and status.race.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import manifests as m
from ..api import (
    CandidateStatus,
    Decision,
    LoadAware,
    Phase,
    ProbeStatus,
    RaceStatus,
    Reason,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
    Variant,
    resolve_candidates,
    spec_for_candidate,
)
from ..probe.result import DEFAULT_CONFIDENCE
from ..resource import speculative_revision
from ..textutil import clip
from .diff import annotations_of, labels_of
from .events import candidate_measured_event, race_decided_event, race_queued_event
from .model import Event, Observed, Plan, StartProbe

# Each candidate's probe message in the table, shortened: the table stays a small share of the status's byte budget.
MESSAGE_CHARS = 160
OPEN = ("Waiting", "Measuring")  # candidates still to be measured
PASSED = ("Passed", "Serving")

# (spec, observed, prev, rendered) -> the plan of the one-drafter lifecycle (reconcile._serve, its other arguments bound)
Lifecycle = Callable[[SpeculativeServerSpec, Observed, SpeculativeServerStatus, Mapping[str, Any]], Plan]


def revisions(spec: SpeculativeServerSpec) -> dict[str, str]:
    """Each candidate's speculative revision, in the race's order."""
    return {c.name: speculative_revision(spec_for_candidate(spec, c.name)) for c in resolve_candidates(spec)}


def race_revision(revs: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(list(revs.items()), separators=(",", ":")).encode()).hexdigest()[:16]


def race_confidence(confidence: float, candidates: int) -> float:
    """Each candidate's confidence: the race's error budget split evenly over its candidates."""
    return 1.0 - (1.0 - confidence) / max(1, candidates)


def fresh_table(spec: SpeculativeServerSpec, revs: Mapping[str, str]) -> list[CandidateStatus]:
    return [CandidateStatus(name=c.name, algorithm=c.drafter.algorithm, state="Waiting", revision=revs[c.name]) for c in resolve_candidates(spec)]


def stored_table(
    spec: SpeculativeServerSpec, prev: SpeculativeServerStatus, revs: Mapping[str, str]
) -> tuple[list[CandidateStatus], RaceStatus | None]:
    """The stored table and race when they are this race's (same revision, same candidates); else a fresh table."""
    race = prev.race
    table = list(prev.candidates or [])
    if race is not None and race.revision == race_revision(revs) and [(c.name, c.revision) for c in table] == list(revs.items()):
        return table, race
    return fresh_table(spec, revs), None


def recorded(row: CandidateStatus, decision: ProbeStatus) -> CandidateStatus:
    """A candidate's row with its lifecycle's decision."""
    if decision.reason == Reason.CANNOT_WIN:
        state = "Eliminated"
    elif decision.decision == Decision.PROMOTE:
        state = "Passed"
    else:
        state = "Lost"
    # A runner-up measured again after a drift: the race paid for both of its probes.
    cost = decision.gpu_seconds
    if row.finished_at is not None and row.gpu_seconds is not None:
        cost = row.gpu_seconds + (cost or 0.0)
    return row.model_copy(
        update={
            "state": state,
            "reason": decision.reason,
            "message": clip(decision.message or "", MESSAGE_CHARS) or None,
            "rounds": decision.rounds,
            "accept_length": decision.accept_length,
            "speedup": decision.speedup,
            "workloads": decision.workloads,
            "break_even": decision.break_even,
            "gpu_seconds": cost,
            "finished_at": decision.finished_at,
        }
    )


def invalid(row: CandidateStatus, message: str | None) -> CandidateStatus:
    return row.model_copy(update={"state": "Invalid", "reason": Reason.DRAFTER_INCOMPATIBLE, "message": clip(message or "", MESSAGE_CHARS) or None})


def spent(table: Sequence[CandidateStatus]) -> float:
    return sum(r.gpu_seconds or 0.0 for r in table)


def bar(table: Sequence[CandidateStatus]) -> float | None:
    """The best low end a passing candidate has: the lowest workload low end of each (never above its policy's own
    interval's, so a candidate is eliminated only when it truly cannot win), the best of those."""
    lows = []
    for row in table:
        if row.state in PASSED and row.workloads:
            ends = [w.speedup_low for w in row.workloads if w.speedup_low is not None]
            if ends:
                lows.append(min(ends))
    return max(lows) if lows else None


def winner(table: Sequence[CandidateStatus]) -> CandidateStatus | None:
    """The passing candidate with the highest speedup under rollout.policy (status.probe.speedup's rule); the earlier one
    on a tie. A candidate promoted by hand (specdec.io/promote while it was in the slot) wins whatever was measured."""
    passing = [r for r in table if r.state in PASSED]
    return max(passing, key=lambda r: (r.reason == Reason.PROMOTED_BY_HAND, r.speedup or 0.0)) if passing else None


def ended_by_hand(table: list[CandidateStatus], row: CandidateStatus) -> list[CandidateStatus]:
    """specdec.io/abort or specdec.io/promote decided the candidate in the slot: the race ends there, the candidates not
    measured yet are not measured (the abort's rollback, or the promoted candidate, is served)."""
    if row.reason not in (Reason.ABORTED, Reason.PROMOTED_BY_HAND):
        return table
    message = f"not measured: the race ended by hand ({row.reason} of {row.name})"
    return [r.model_copy(update={"state": "Skipped", "reason": row.reason, "message": message}) if r.state in OPEN else r for r in table]


def best_measured(table: Sequence[CandidateStatus]) -> CandidateStatus:
    """The candidate whose decision stands when none passed: the fastest measured one (else the first)."""
    measured = [r for r in table if r.finished_at is not None and r.state not in ("Invalid", "Skipped")]
    return max(measured, key=lambda r: r.speedup or 0.0) if measured else table[0]


def told_decision(row: CandidateStatus, candidates: int, promote: bool, whole: ProbeStatus | None = None) -> ProbeStatus:
    """The lifecycle's stored decision for a decided race's candidate: its probe's whole decision when it came this step,
    else rebuilt from its row; the message says it is a race's."""
    prefix = f"race of {candidates} candidates: {row.name} " + ("wins" if promote else "was the best, none was faster")
    if whole is not None:
        return whole.model_copy(update={"message": clip(f"{prefix}: {whole.message or ''}")})
    return ProbeStatus(
        decision=Decision.PROMOTE if promote else Decision.ROLLBACK,
        reason=row.reason if row.reason else (Reason.SPEEDUP_CONFIRMED if promote else Reason.INCONCLUSIVE),
        message=clip(f"{prefix}: {row.message or ''}"),
        rounds=row.rounds,
        accept_length=row.accept_length,
        speedup=row.speedup,
        workloads=row.workloads,
        break_even=row.break_even,
        gpu_seconds=row.gpu_seconds,
        revision=row.revision,
        finished_at=row.finished_at,
    )


def with_budget(table: list[CandidateStatus], budget: float | None) -> list[CandidateStatus]:
    """Candidates still waiting once the GPU budget is spent are not measured."""
    if budget is None or spent(table) < budget:
        return table
    message = f"not measured: the race's probes spent {spent(table):.0f} GPU-seconds of spec.race.gpuSecondsBudget {budget:g}"
    return [
        r.model_copy(update={"state": "Skipped", "reason": Reason.GPU_BUDGET_SPENT, "message": message}) if r.state == "Waiting" else r for r in table
    ]


def after_drift(table: list[CandidateStatus], prev: SpeculativeServerStatus) -> list[CandidateStatus]:
    """The winner drifted (its stored decision is now AcceptanceDrift): it is Drifted, and the runner-up waits to be
    measured again."""
    serving = next((r for r in table if r.state == "Serving"), None)
    probe = prev.probe
    if serving is None or probe is None or probe.revision != serving.revision or probe.reason != Reason.ACCEPTANCE_DRIFT:
        return table
    runner_up = winner([r for r in table if r.name != serving.name])
    out = []
    for r in table:
        if r.name == serving.name:
            r = r.model_copy(update={"state": "Drifted", "reason": Reason.ACCEPTANCE_DRIFT, "message": clip(probe.message or "", MESSAGE_CHARS)})
        elif runner_up is not None and r.name == runner_up.name:
            r = r.model_copy(update={"state": "Waiting", "message": f"measured again: the winner {serving.name} drifted"})
        out.append(r)
    return out


def lifecycle_view(observed: Observed, revision: str, keep_result: bool) -> Observed:
    """What the lifecycle of one candidate sees: the speculative pods of its revision (a pod of another candidate's is
    no server of this one), and the probe result only when it is this candidate's."""
    pods = [
        p
        for p in observed.pods
        if labels_of(p).get(m.LABEL_VARIANT) != Variant.SPECULATIVE.value or annotations_of(p).get(m.ANNOTATION_REVISION, revision) == revision
    ]
    result = observed.probe_result if keep_result and observed.probe_result is not None and observed.probe_result.revision == revision else None
    return replace(observed, pods=pods, probe_result=result)


def run(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    rendered: Mapping[str, Any],
    lifecycle: Lifecycle,
    queue_full: bool,
) -> Plan:
    """One step of a race: record what the candidate in the slot decided, choose the candidate the lifecycle runs, run it."""
    revs = revisions(spec)
    table, race = stored_table(spec, prev, revs)
    events: list[Event] = []
    measured: list[str] = []
    if (race is None or race.state == "Queued") and queue_full:
        return queued(spec, observed, prev, rendered, lifecycle, table, race_revision(revs))
    table = after_drift(table, prev) if race is not None and race.state == "Decided" else table
    decisions: dict[str, ProbeStatus] = {}  # this step's decisions, whole (the table keeps their figures)
    # The candidate in the slot decides: record it, and go on with the next one in the same step.
    while True:
        table = with_budget(table, spec.race.gpu_seconds_budget if spec.race else None)
        measuring = next((r for r in table if r.state in OPEN), None)
        if measuring is None:
            break
        plan = _measure(spec, observed, prev, rendered, lifecycle, measuring, len(table), bar(table))
        table = [r.model_copy(update={"state": "Measuring"}) if r.name == measuring.name else r for r in table]
        row = _decided_row(plan, measuring)
        if row is None:
            return finish(plan, table, _race(revs, "Running", measuring.name, table, spec, stored=race), events, measured)
        table = ended_by_hand([row if r.name == row.name else r for r in table], row)
        events.append(candidate_measured_event(row, len(table)))
        measured.append(measuring.revision or "")
        if plan.new_status.probe is not None:
            decisions[row.name] = plan.new_status.probe
    return _serve_decided(spec, observed, prev, rendered, lifecycle, table, revs, events, measured, race, decisions)


def _measure(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    rendered: Mapping[str, Any],
    lifecycle: Lifecycle,
    row: CandidateStatus,
    candidates: int,
    bar_now: float | None,
) -> Plan:
    """The lifecycle of the candidate being measured; its probe carries the race's share of the error budget and bar.

    A decision stored for its revision before its turn (the drafter of a spec that had no candidates yet, promoted at
    the whole confidence) is not taken over: it is measured again at the race's share, or the guarantee would not hold."""
    revision = row.revision or ""
    if row.state == "Waiting" and prev.probe is not None and prev.probe.revision == revision:
        prev = prev.model_copy(update={"probe": None})
    measured = measured_spec(spec, row.name)
    plan = lifecycle(measured, lifecycle_view(observed, revision, True), prev, rendered.get(revision) or {})
    if isinstance(plan.probe, StartProbe):
        plan.probe = replace(plan.probe, family=candidates, bar=bar_now, candidate=row.name, spec=measured)
    return plan


def measured_spec(spec: SpeculativeServerSpec, name: str) -> SpeculativeServerSpec:
    """The spec a candidate is measured with: its own in spec.drafter's place, decided on the plain probe
    (rollout.loadAware Off). Load-aware speculation is the served candidate's, as for a single drafter: the winner's, or
    with none passing, the best measured one's, whose plain curve may still ask for a trial."""
    candidate = spec_for_candidate(spec, name)
    if candidate.rollout.load_aware == LoadAware.OFF:
        return candidate
    return candidate.model_copy(update={"rollout": candidate.rollout.model_copy(update={"load_aware": LoadAware.OFF.value})})


def _decided_row(plan: Plan, row: CandidateStatus) -> CandidateStatus | None:
    """The row of the candidate being measured once its lifecycle decided it (validator refusal, probe decision,
    crash loop, deadline, by hand); None while it is still being validated, deployed or probed. A load-aware table is
    the winner's business: only a plain decision ends a candidate's turn."""
    status = plan.new_status
    if status.validation is not None and status.validation.revision == row.revision and status.validation.compatible is False:
        return invalid(row, status.message)
    probe = status.probe
    if probe is None or probe.revision != row.revision or not probe.decision:
        return None
    if probe.load_aware is not None and probe.load_aware.plain_probe is not None:
        return recorded(row, ProbeStatus.model_validate(probe.load_aware.plain_probe.model_dump()))
    return recorded(row, probe)


def _serve_decided(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    rendered: Mapping[str, Any],
    lifecycle: Lifecycle,
    table: list[CandidateStatus],
    revs: Mapping[str, str],
    events: list[Event],
    measured: list[str],
    stored_race: RaceStatus | None,
    decisions: Mapping[str, ProbeStatus],
) -> Plan:
    """Every candidate decided: serve the winner (its recorded decision, promoted once its server is Ready again), or
    let the best measured candidate's rollback stand."""
    aborted = next((r for r in table if r.reason == Reason.ABORTED and r.state == "Lost"), None)
    best = winner(table) if aborted is None else None
    drifted = next((r for r in table if r.state == "Drifted"), None)
    if aborted is not None:
        chosen, promote = aborted, False  # specdec.io/abort: no candidate is served, whatever passed before it
    elif best is None and drifted is not None:
        chosen, promote = drifted, False  # the winner drifted and nothing can take its place: its rollback stands
    else:
        chosen, promote = (best, True) if best is not None else (best_measured(table), False)
    table = [r.model_copy(update={"state": "Serving"}) if promote and r.name == chosen.name else r for r in table]
    revision = chosen.revision or ""
    stored = prev.probe if prev.probe is not None and prev.probe.revision == revision and prev.probe.decision else None
    told = stored if stored is not None else told_decision(chosen, len(table), promote, decisions.get(chosen.name))
    plan = _serve_told(spec, observed, prev, rendered, lifecycle, chosen, told)
    if stored_race is None or stored_race.state != "Decided" or stored_race.winner != (chosen.name if promote else None):
        events.append(race_decided_event(chosen, len(table), promote))
    return finish(plan, table, _race(revs, "Decided", chosen.name, table, spec, chosen.name if promote else None, stored_race), events, measured)


def _serve_told(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    rendered: Mapping[str, Any],
    lifecycle: Lifecycle,
    row: CandidateStatus,
    told: ProbeStatus,
) -> Plan:
    """The lifecycle of candidate ``row`` given ``told`` as its revision's stored decision (no probe result of its own)."""
    revision = row.revision or ""
    return lifecycle(
        spec_for_candidate(spec, row.name),
        lifecycle_view(observed, revision, False),
        prev.model_copy(update={"probe": told}),
        rendered.get(revision) or {},
    )


def queued(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    rendered: Mapping[str, Any],
    lifecycle: Lifecycle,
    table: list[CandidateStatus],
    revision: str,
) -> Plan:
    """No race slot: the base serves and no speculative server runs (the first candidate's slot at 0, as after a
    rollback) until a race elsewhere ends."""
    first = table[0]
    message = "waiting for a race slot: the operator's races at once (--max-concurrent-races) are running; the base serves"
    told = ProbeStatus(decision=Decision.ROLLBACK, reason=Reason.RACE_QUEUED, message=message, revision=first.revision)
    plan = _serve_told(spec, observed, prev, rendered, lifecycle, first, told)
    race = RaceStatus(revision=revision, state="Queued", confidence=race_confidence(DEFAULT_CONFIDENCE, len(table)))
    plan.new_status = plan.new_status.model_copy(
        update={"phase": Phase.PENDING, "reason": Reason.RACE_QUEUED, "message": message, "probe": prev.probe, "candidates": table, "race": race}
    )
    stored_queued = prev.race is not None and prev.race.state == "Queued" and prev.race.revision == revision
    plan.events = [] if stored_queued else [race_queued_event(message)]
    plan.probe = None
    plan.settled = False
    return plan


def _race(
    revs: Mapping[str, str],
    state: str,
    current: str | None,
    table: Sequence[CandidateStatus],
    spec: SpeculativeServerSpec,
    won: str | None = None,
    stored: RaceStatus | None = None,
) -> RaceStatus:
    """The race's summary. ``stored``: this race's stored summary (stored_table's), whose GPU-seconds and confidence
    stand when its table has fewer rows than it measured: a revision's race rewritten by revision.race_after keeps the
    user's candidates only, yet its probes cost the whole race's GPU time and decided at the whole race's confidence
    (within one race the candidates do not change, and GPU-seconds only grow: a runner-up measured again adds its probe)."""
    gpu_seconds = round(spent(table), 3) if any(r.gpu_seconds is not None for r in table) else None
    confidence = race_confidence(DEFAULT_CONFIDENCE, len(table))
    if stored is not None:
        if stored.gpu_seconds is not None:
            gpu_seconds = max(gpu_seconds or 0.0, stored.gpu_seconds)
        confidence = stored.confidence if stored.confidence is not None else confidence
    return RaceStatus.model_validate(
        {"revision": race_revision(revs), "state": state, "current": current, "winner": won, "gpuSeconds": gpu_seconds, "confidence": confidence}
    )


def finish(plan: Plan, table: list[CandidateStatus], race: RaceStatus, events: list[Event], measured: list[str]) -> Plan:
    """The lifecycle's plan with the race's table and summary in its status, and the race's Events before its own."""
    plan.new_status = plan.new_status.model_copy(update={"candidates": table, "race": race})
    plan.events = events + plan.events
    plan.measured = tuple(measured)
    plan.rendered = {plan.revision: plan.rendered}
    return plan
