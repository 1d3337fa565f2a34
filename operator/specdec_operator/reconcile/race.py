"""The decision of a probe of one or more arms against one base: pure, from the evidence so far (probe/evidence.py).

``decide(evidence, rules, arms, workloads)`` returns what to measure next (:class:`Continue`: which arms, which of
their workloads) or the decision (:class:`Decided`: the winning arm or none, with its Reason and message). Nothing here
talks to a server or reads a clock: the same evidence always gives the same answer, so a test drives it with scripted
rounds, and a restarted operator that resumes the evidence (evidence.from_compact) decides as the first one would have.

The rules are the probe's (probe/decide.py), applied per arm at each look with the anytime-valid levels of
probe/sequential.py, the error budget shared by the arms:

* An arm **passes** when its policy's interval (every workload's under ``all``, the weighted mix's under ``weighted``)
  has its low end above ``min_speedup``, from the second round, within the width bound; it **fails** when the high end
  is below (from the first look whose interval is bounded: round 2, or round 1 with ``rules.round_priors``); it is **futile** when the estimate is too close to the threshold for the rounds left
  to decide (decide.futile, projected to decide.futility_horizon: round 6, or 3 rounds ahead after it); it **does not accept** when its acceptance length
  is at or below the floor.
* An arm still undecided whose interval's high end is below the best passing arm's low end **cannot win** and stops
  (so does one below ``rules.bar``: the best low end of a candidate of the same race measured before, reason CannotWin).
* The race goes on while any arm is undecided and the budget has rounds left; then the passing arm with the highest
  estimate wins (every passing arm is faster than the threshold at the race's confidence: each arm spends
  ``1 / arms`` of the budget, so picking the best of N promotes a slower-than-threshold arm no more often than
  ``1 - confidence``). A race of candidates measured one probe after another shares the budget the same way:
  ``rules.family`` is the number of arms over the whole race.

The run's facts that are not rounds (``evidence.facts``, probe/evidence.py RunFacts) come first and are turned into
the decision by reconcile/probe_outcome.py: a failure is ProbeFailed whatever was measured; a spent time budget is
Inconclusive with the intervals so far; an output comparison below its threshold turns the speed decision into
OutputMismatch. So every Reason a probe can end with is set in reconcile/.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..api import Decision, Reason
from ..probe.decide import MAX_WIDTH, Verdict, combine_all, drafter_not_accepting, futile, futility_horizon, judge_paired, width
from ..probe.evidence import ArmOutcome, ArmState, Continue, Decided, Evidence, RaceRules
from ..probe.sequential import look_levels
from ..probe.stats import WEIGHTED_MIX, RatioInterval, sequential_interval, weighted_paired_round
from .probe_outcome import probe_failed, time_budget_spent, with_notes, with_output_check

__all__ = ["ArmOutcome", "ArmState", "Continue", "Decided", "RaceRules", "arm_state", "decide"]


def arm_state(evidence: Evidence, arm: str, workloads: Sequence[str], rules: RaceRules, arms: int) -> ArmState:
    """Where one arm stands after its rounds. Under ``all`` each workload's interval is at the look of its own rounds (a
    workload that passed is not measured again); under ``weighted`` the mix's is at the look of the complete rounds."""
    accept = evidence.accept_length.get(arm)
    paired = {w: evidence.paired(arm, w) for w in workloads}
    counts = {w: len(paired[w]) for w in workloads}
    rounds = evidence.rounds(arm)
    if drafter_not_accepting(accept, rules.accept_length_floor):
        return ArmState(arm, ArmOutcome.NOT_ACCEPTING, rounds, None)
    if min(counts.values(), default=0) == 0:
        return ArmState(arm, ArmOutcome.UNDECIDED, rounds, None, next_workloads=tuple(workloads))
    per = {w: sequential_interval(paired[w], look_levels(rules.confidence, counts[w], arms), rules.round_priors.get(w)) for w in workloads}
    wide = tuple(w for w in workloads if width(per[w]) > MAX_WIDTH)

    def cannot_decide(iv: RatioInterval) -> bool:
        horizon = futility_horizon(rules.max_rounds, iv.n)
        return futile(iv, rules.min_speedup, horizon, look_levels(rules.confidence, horizon, arms).low_level)

    if rules.policy == "weighted":
        n = min(counts.values())
        weights = {w: rules.weights.get(w, 1.0) for w in workloads}
        series = [weighted_paired_round({w: paired[w][i] for w in workloads}, weights) for i in range(n)]
        interval: RatioInterval = sequential_interval(series, look_levels(rules.confidence, n, arms), rules.round_priors.get(WEIGHTED_MIX))
        verdict = judge_paired(interval, rules.min_speedup)
        undecided = [interval] if verdict is Verdict.UNDECIDED else []
        next_workloads = tuple(workloads)
        final = n >= rules.max_rounds
    else:
        verdicts = {w: judge_paired(per[w], rules.min_speedup) for w in workloads}
        verdict = combine_all(verdicts)
        interval = min(per.values(), key=lambda iv: iv.estimate)
        undecided = [per[w] for w in workloads if verdicts[w] is Verdict.UNDECIDED]
        # A workload already confirmed needs no more GPU time; the undecided (and too wide) ones go on.
        next_workloads = tuple(w for w in workloads if verdicts[w] is not Verdict.PASS or w in wide)
        # The budget is the arm's rounds: a workload that failed is not measured again while a wide one is (below), so
        # counting each workload's own rounds kept a probe of one failed and one wide workload going past maxRounds.
        final = rounds >= rules.max_rounds or all(counts[w] >= rules.max_rounds for w in next_workloads)
    if verdict is not Verdict.UNDECIDED and wide and not final:
        # A decision reports every workload's interval within the bound: the wide ones are measured again first
        # (under `all` only those; a weighted mix measures them all). At the last round the verdict stands as it is.
        again = next_workloads if rules.policy == "weighted" else wide
        return ArmState(arm, ArmOutcome.UNDECIDED, rounds, interval, per, wide, again)
    if verdict is Verdict.UNDECIDED and not wide and not final and any(cannot_decide(iv) for iv in undecided):
        return ArmState(arm, ArmOutcome.FUTILE, rounds, interval, per, wide)
    outcome = {Verdict.PASS: ArmOutcome.PASSED, Verdict.FAIL: ArmOutcome.FAILED}.get(verdict, ArmOutcome.UNDECIDED)
    if outcome is ArmOutcome.UNDECIDED and final:
        outcome = ArmOutcome.INCONCLUSIVE
    return ArmState(arm, outcome, rounds, interval, per, wide, next_workloads)


def decide(evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
    """The next step of a probe of ``arms`` on ``workloads``, from all the evidence so far and the run's facts."""
    if not arms or not workloads:
        raise ValueError("a probe needs at least one arm and one workload")
    facts = evidence.facts
    if facts.failure is not None:
        return probe_failed(facts.failure)
    step = _race(evidence, rules, arms, workloads)
    if facts.time_budget is not None:
        step = time_budget_spent(facts.time_budget, step.arms, _details(step.arms, rules))
    if isinstance(step, Continue):
        return step
    step = with_notes(step, facts.accept_read, rules.max_rounds)
    return with_output_check(step, facts.outputs) if facts.outputs is not None else step


def _race(evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
    """The race on the rounds alone: every arm's state, what to measure next, or the speed decision."""
    states = {arm: arm_state(evidence, arm, workloads, rules, max(len(arms), rules.family)) for arm in arms}
    passed = [s for s in states.values() if s.outcome is ArmOutcome.PASSED and s.interval is not None]
    bars = [s.interval.low for s in passed if s.interval is not None] + ([rules.bar] if rules.bar is not None else [])
    if bars:
        best_low = max(bars)
        for arm, s in states.items():
            if s.outcome is ArmOutcome.UNDECIDED and s.interval is not None and s.interval.high < best_low:
                states[arm] = ArmState(arm, ArmOutcome.CANNOT_WIN, s.rounds, s.interval, s.workloads, s.wide)
    running = {arm: s.next_workloads for arm, s in states.items() if s.outcome is ArmOutcome.UNDECIDED}
    if running:
        return Continue(running, states)
    return _decided(states, rules, evidence)


def _decided(states: dict[str, ArmState], rules: RaceRules, evidence: Evidence) -> Decided:
    passed = [s for s in states.values() if s.outcome is ArmOutcome.PASSED and s.interval is not None]
    single = len(states) == 1
    detail = _details(states, rules)
    if passed:
        best = max(passed, key=lambda s: (s.interval.estimate if s.interval else 0.0, s.interval.low if s.interval else 0.0))
        prefix = "" if single else f"arm {best.arm} wins: "
        return Decided(Decision.PROMOTE, Reason.SPEEDUP_CONFIRMED, f"speedup confirmed: {prefix}{detail}", best.arm, states)
    outcomes = {s.outcome for s in states.values()}
    rounds = max((s.rounds for s in states.values()), default=0)
    if outcomes == {ArmOutcome.NOT_ACCEPTING}:
        accepts = ", ".join(f"{'' if single else a + ' '}{evidence.accept_length[a]:.3f}" for a in states if a in evidence.accept_length)
        message = (
            f"drafter not accepting: acceptance length {accepts} <= floor {rules.accept_length_floor:g} "
            f"(1.00 = no draft token accepted); the base keeps serving"
        )
        return Decided(Decision.ROLLBACK, Reason.DRAFTER_NOT_ACCEPTING, message, None, states)
    if outcomes == {ArmOutcome.CANNOT_WIN} and rules.bar is not None:
        message = f"cannot win the race: its interval's high end is below {rules.bar:.3f}, the best low end of a candidate measured before: {detail}"
        return Decided(Decision.ROLLBACK, Reason.CANNOT_WIN, message, None, states)
    if outcomes <= {ArmOutcome.FAILED, ArmOutcome.NOT_ACCEPTING, ArmOutcome.CANNOT_WIN}:
        return Decided(Decision.ROLLBACK, Reason.SPEEDUP_BELOW_THRESHOLD, f"speedup below threshold: {detail}", None, states)
    if ArmOutcome.INCONCLUSIVE in outcomes:
        return Decided(Decision.ROLLBACK, Reason.INCONCLUSIVE, f"inconclusive after the last round: {detail}", None, states)
    message = (
        f"inconclusive, stopped early after {rounds} round(s): the estimate is too close to min speedup for more rounds "
        f"to decide (futility): {detail}"
    )
    return Decided(Decision.ROLLBACK, Reason.INCONCLUSIVE, message, None, states)


def _interval(iv: RatioInterval) -> str:
    high = "inf" if not math.isfinite(iv.high) else f"{iv.high:.3f}"
    return f"{iv.estimate:.3f}x [{iv.low:.3f}, {high}]"


def _details(states: Mapping[str, ArmState], rules: RaceRules) -> str:
    """Every arm's intervals against the threshold, as the decision's messages give them."""
    single = len(states) == 1
    return "; ".join(_detail(s, rules, single) for s in states.values()) + f" vs min speedup {rules.min_speedup:g}"


def _detail(s: ArmState, rules: RaceRules, single: bool) -> str:
    """One arm's intervals as the probe has always reported them: the weighted mix's first (policy weighted), then each
    workload's; a race names the arm and its outcome."""
    parts = []
    if rules.policy == "weighted" and s.interval is not None:
        parts.append(f"weighted speedup {_interval(s.interval)}")
    parts += [f"{rules.labels.get(w, w)} {_interval(iv)}" for w, iv in s.workloads.items()]
    body = "; ".join(parts) if parts else f"no complete round after {s.rounds} round(s)"
    return body if single else f"{s.arm} ({s.outcome.value}, {s.rounds} round(s)): {body}"
