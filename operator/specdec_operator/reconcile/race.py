"""The decision of a probe of one or more arms against one base: pure, from the evidence so far (probe/evidence.py).

``decide(evidence, rules, arms, workloads)`` returns what to measure next (:class:`Continue`: which arms, which of
their workloads) or the decision (:class:`Decided`: the winning arm or none, with its Reason and message). Nothing here
talks to a server or reads a clock: the same evidence always gives the same answer, so a test drives it with scripted
rounds, and a restarted operator that resumes the evidence (evidence.from_compact) decides as the first one would have.

The rules are the probe's (probe/decide.py), applied per arm at each look with the anytime-valid levels of
probe/sequential.py, the error budget shared by the arms:

* An arm **passes** when its policy's interval (every workload's under ``all``, the weighted mix's under ``weighted``)
  has its low end above ``min_speedup``, from the second round, within the width bound; it **fails** when the high end
  is below (from the first round); it is **futile** when the estimate is too close to the threshold for the rounds left
  to decide (decide.futile, projected to decide.futility_horizon); it **does not accept** when its acceptance length
  is at or below the floor.
* An arm still undecided whose interval's high end is below the best passing arm's low end **cannot win** and stops.
* The race goes on while any arm is undecided and the budget has rounds left; then the passing arm with the highest
  estimate wins (every passing arm is faster than the threshold at the race's confidence: each arm spends
  ``1 / arms`` of the budget, so picking the best of N promotes a slower-than-threshold arm no more often than
  ``1 - confidence``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ..api import Decision, Reason
from ..probe.decide import MAX_WIDTH, Verdict, combine_all, drafter_not_accepting, futile, futility_horizon, judge_paired, width
from ..probe.evidence import Evidence
from ..probe.sequential import look_levels
from ..probe.stats import RatioInterval, sequential_interval, weighted_paired_round


class ArmOutcome(StrEnum):
    UNDECIDED = "Undecided"
    PASSED = "Passed"
    FAILED = "Failed"
    FUTILE = "Futile"
    NOT_ACCEPTING = "NotAccepting"
    CANNOT_WIN = "CannotWin"
    INCONCLUSIVE = "Inconclusive"  # undecided when the budget ran out


@dataclass(frozen=True)
class RaceRules:
    """What ``spec.rollout`` says about deciding (``policy``: "all" or "weighted")."""

    min_speedup: float = 1.0
    confidence: float = 0.998
    max_rounds: int = 6
    policy: str = "all"
    weights: Mapping[str, float] = field(default_factory=dict)  # workload -> weight (weighted policy; default 1)
    accept_length_floor: float | None = 1.1


@dataclass(frozen=True)
class ArmState:
    arm: str
    outcome: ArmOutcome
    rounds: int
    interval: RatioInterval | None  # the policy's: the worst workload's (all) or the weighted mix's
    workloads: Mapping[str, RatioInterval] = field(default_factory=dict)
    wide: tuple[str, ...] = ()  # workloads whose intervals are wider than the bound: measured again before a decision
    next_workloads: tuple[str, ...] = ()  # what another round of this arm measures (while it is undecided)


@dataclass(frozen=True)
class Continue:
    """Measure another round of these arms, each on these workloads."""

    workloads: Mapping[str, tuple[str, ...]]  # arm -> workloads
    arms: Mapping[str, ArmState]


@dataclass(frozen=True)
class Decided:
    decision: Decision
    reason: Reason
    message: str
    winner: str | None
    arms: Mapping[str, ArmState]


def arm_state(evidence: Evidence, arm: str, workloads: Sequence[str], rules: RaceRules, arms: int) -> ArmState:
    """Where one arm stands after its rounds. Under ``all`` each workload's interval is at the look of its own rounds (a
    workload that passed is not measured again); under ``weighted`` the mix's is at the look of the complete rounds."""
    accept = evidence.accept_length.get(arm)
    counts = {w: len(evidence.paired(arm, w)) for w in workloads}
    rounds = max(counts.values(), default=0)
    if drafter_not_accepting(accept, rules.accept_length_floor):
        return ArmState(arm, ArmOutcome.NOT_ACCEPTING, rounds, None)
    if min(counts.values(), default=0) == 0:
        return ArmState(arm, ArmOutcome.UNDECIDED, rounds, None, next_workloads=tuple(workloads))
    per = {w: sequential_interval(evidence.paired(arm, w), look_levels(rules.confidence, counts[w], arms)) for w in workloads}
    wide = tuple(w for w in workloads if width(per[w]) > MAX_WIDTH)
    horizon = futility_horizon(rules.max_rounds)
    last_level = look_levels(rules.confidence, horizon, arms).low_level
    if rules.policy == "weighted":
        n = min(counts.values())
        weights = {w: rules.weights.get(w, 1.0) for w in workloads}
        series = [weighted_paired_round({w: evidence.paired(arm, w)[i] for w in workloads}, weights) for i in range(n)]
        interval: RatioInterval = sequential_interval(series, look_levels(rules.confidence, n, arms))
        verdict = judge_paired(interval, rules.min_speedup)
        undecided = [interval] if verdict is Verdict.UNDECIDED else []
        next_workloads = tuple(workloads)
        final = n >= rules.max_rounds
    else:
        verdicts = {w: judge_paired(per[w], rules.min_speedup) for w in workloads}
        verdict = combine_all(verdicts)
        interval = min(per.values(), key=lambda iv: iv.estimate)
        undecided = [per[w] for w in workloads if verdicts[w] is Verdict.UNDECIDED]
        next_workloads = tuple(w for w in workloads if verdicts[w] is not Verdict.PASS or w in wide)
        final = all(counts[w] >= rules.max_rounds for w in next_workloads)
    if verdict is not Verdict.UNDECIDED and wide:
        # A decision reports every workload's interval within the bound: the wide ones are measured again first.
        return ArmState(arm, ArmOutcome.INCONCLUSIVE if final else ArmOutcome.UNDECIDED, rounds, interval, per, wide, wide)
    if verdict is Verdict.UNDECIDED and not wide and not final and any(futile(iv, rules.min_speedup, horizon, last_level) for iv in undecided):
        return ArmState(arm, ArmOutcome.FUTILE, rounds, interval, per)
    outcome = {Verdict.PASS: ArmOutcome.PASSED, Verdict.FAIL: ArmOutcome.FAILED}.get(verdict, ArmOutcome.UNDECIDED)
    if outcome is ArmOutcome.UNDECIDED and final:
        outcome = ArmOutcome.INCONCLUSIVE
    return ArmState(arm, outcome, rounds, interval, per, wide, next_workloads)


def decide(evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
    """The next step of a probe of ``arms`` on ``workloads``, from all the evidence so far."""
    if not arms or not workloads:
        raise ValueError("a probe needs at least one arm and one workload")
    states = {arm: arm_state(evidence, arm, workloads, rules, len(arms)) for arm in arms}
    passed = [s for s in states.values() if s.outcome is ArmOutcome.PASSED and s.interval is not None]
    if passed:
        best_low = max(s.interval.low for s in passed if s.interval is not None)
        for arm, s in states.items():
            if s.outcome is ArmOutcome.UNDECIDED and s.interval is not None and s.interval.high < best_low:
                states[arm] = ArmState(arm, ArmOutcome.CANNOT_WIN, s.rounds, s.interval, s.workloads, s.wide)
    running = {arm: s.next_workloads for arm, s in states.items() if s.outcome is ArmOutcome.UNDECIDED}
    if running:
        return Continue(running, states)
    return _decided(states, rules)


def _decided(states: Mapping[str, ArmState], rules: RaceRules) -> Decided:
    passed = [s for s in states.values() if s.outcome is ArmOutcome.PASSED and s.interval is not None]
    detail = "; ".join(_describe(s) for s in states.values())
    threshold = f" vs min speedup {rules.min_speedup:g}"
    if passed:
        best = max(passed, key=lambda s: (s.interval.estimate if s.interval else 0.0, s.interval.low if s.interval else 0.0))
        prefix = "" if len(states) == 1 else f"arm {best.arm} wins: "
        return Decided(Decision.PROMOTE, Reason.SPEEDUP_CONFIRMED, f"speedup confirmed: {prefix}{detail}{threshold}", best.arm, states)
    outcomes = {s.outcome for s in states.values()}
    if outcomes == {ArmOutcome.NOT_ACCEPTING}:
        reason, what = Reason.DRAFTER_NOT_ACCEPTING, "drafter not accepting"
    elif outcomes <= {ArmOutcome.FAILED, ArmOutcome.NOT_ACCEPTING, ArmOutcome.CANNOT_WIN}:
        reason, what = Reason.SPEEDUP_BELOW_THRESHOLD, "speedup below threshold"
    else:
        reason, what = Reason.INCONCLUSIVE, "inconclusive"
    return Decided(Decision.ROLLBACK, reason, f"{what}: {detail}{threshold}", None, states)


def _describe(s: ArmState) -> str:
    iv = s.interval
    if iv is None:
        return f"{s.arm} {s.outcome.value} after {s.rounds} round(s)"
    high = "inf" if not math.isfinite(iv.high) else f"{iv.high:.3f}"
    return f"{s.arm} {s.outcome.value} {iv.estimate:.3f}x [{iv.low:.3f}, {high}] after {s.rounds} round(s)"
