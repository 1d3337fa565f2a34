"""Decision rules of the probe: pure functions from intervals and acceptance to promote/rollback and a reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ..api import Decision, Reason
from .stats import RatioInterval


class Verdict(StrEnum):
    """Where one interval stands against the threshold."""

    PASS = "pass"  # the whole interval is above min_speedup
    FAIL = "fail"  # the whole interval is below min_speedup
    UNDECIDED = "undecided"


POLICY_ALIASES = {
    "all": "all",
    "allworkloads": "all",
    "weighted": "weighted",
    "weightedmix": "weighted",
}

# Rounds before any interval is trusted: with n - 1 = 2 degrees of freedom the t-interval is already
# conservative; with one degree of freedom its quantiles are absurd (t(0.9958, 1) ~ 76).
MIN_ROUNDS = 3


# The within-round method (probe/stats.py paired_interval): a clear loss may roll back after one round (a
# wrong rollback costs a missed speedup, and the base keeps serving); a promotion needs both orders of the
# servers (rounds alternate which goes first) and a between-round spread to check the blocks' variance against.
PROMOTE_MIN_ROUNDS = 2
REJECT_MIN_ROUNDS = 1


def judge_paired(interval: RatioInterval | None, min_speedup: float) -> Verdict:
    """:func:`judge` with the within-round method's minimum rounds: PASS from round 2, FAIL from round 1
    (MIN_ROUNDS for both when the interval is the round-level one: a measurement had too few events for blocks)."""
    if interval is None:
        return Verdict.UNDECIDED
    if not getattr(interval, "within", True):
        return judge(interval, min_speedup)
    if interval.n >= PROMOTE_MIN_ROUNDS and interval.low > min_speedup:
        return Verdict.PASS
    if interval.n >= REJECT_MIN_ROUNDS and interval.high < min_speedup:
        return Verdict.FAIL
    return Verdict.UNDECIDED


def normalize_policy(policy: str) -> str:
    """Map the CLI's all/weighted and the CR's AllWorkloads/WeightedMix onto "all" or "weighted"."""
    key = str(policy).replace("-", "").replace("_", "").lower()
    if key not in POLICY_ALIASES:
        raise ValueError(f"policy {policy!r}: use all|weighted (AllWorkloads|WeightedMix)")
    return POLICY_ALIASES[key]


def judge(interval: RatioInterval | None, min_speedup: float, min_rounds: int = MIN_ROUNDS) -> Verdict:
    """PASS when the low end is above ``min_speedup``, FAIL when the high end is below it.

    Both comparisons are strict: an interval that touches the threshold (say a noiseless simulator at
    exactly 1.00x against min_speedup 1.0) is not evidence of a speedup.
    """
    if interval is None or interval.n < min_rounds:
        return Verdict.UNDECIDED
    if interval.low > min_speedup:
        return Verdict.PASS
    if interval.high < min_speedup:
        return Verdict.FAIL
    return Verdict.UNDECIDED


def combine_all(verdicts: dict[str, Verdict]) -> Verdict:
    """Policy all: one failing workload fails the speculative server; all must pass to promote."""
    if any(v is Verdict.FAIL for v in verdicts.values()):
        return Verdict.FAIL
    if verdicts and all(v is Verdict.PASS for v in verdicts.values()):
        return Verdict.PASS
    return Verdict.UNDECIDED


def drafter_not_accepting(accept_length: float | None, floor: float | None) -> bool:
    """True when the speculative server's measured acceptance length is at or below the floor (None: no floor)."""
    return floor is not None and accept_length is not None and math.isfinite(accept_length) and accept_length <= floor


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    reason: Reason
    message: str


def outcome_for(verdict: Verdict, *, final: bool, detail: str) -> Outcome | None:
    """The probe's outcome for a combined verdict; None means "run another round"."""
    if verdict is Verdict.PASS:
        return Outcome(Decision.PROMOTE, Reason.SPEEDUP_CONFIRMED, f"speedup confirmed: {detail}")
    if verdict is Verdict.FAIL:
        return Outcome(Decision.ROLLBACK, Reason.SPEEDUP_BELOW_THRESHOLD, f"speedup below threshold: {detail}")
    if final:
        return Outcome(Decision.ROLLBACK, Reason.INCONCLUSIVE, f"inconclusive after the last round: {detail}")
    return None
