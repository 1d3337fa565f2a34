"""Decision rules of the probe: pure verdicts from intervals and acceptance (reconcile/race.py turns them into a decision and a reason)."""

from __future__ import annotations

import math
from enum import StrEnum

from .sequential import DESIGN_LOOKS
from .stats import RatioInterval, t_quantile


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


# The within-round method (probe/stats.py paired_interval): a clear loss may roll back after one round when the
# interval has a between-round variance to stand on there (a prior from earlier probes of the same servers:
# stats.sequential_interval bounds nothing after one round without one); a promotion needs both orders of the
# servers (rounds alternate which goes first) and a between-round spread to check the blocks' variance against.
PROMOTE_MIN_ROUNDS = 2
REJECT_MIN_ROUNDS = 1

# Sharpness: a decision reports intervals no wider than [est / MAX_WIDTH, est * MAX_WIDTH]. A verdict whose
# interval is wider waits for more rounds (until max_rounds: then Inconclusive).
MAX_WIDTH = 2.0

# Futility (an early "neither faster nor slower"): stop when the estimate is so close to min_speedup that, if the
# truth were FUTILITY_SE standard errors above it (or below it), the interval projected to the last round would still
# contain min_speedup: neither a promotion nor a clear rollback is in reach. It only ever ends a probe with a
# rollback (Inconclusive), so it cannot add a wrong promotion; what it costs is power on small speedups
# (docs/probe.md has the measured rates).
FUTILITY_SE = 1.0


def width(interval: RatioInterval | None) -> float:
    """``max(high / estimate, estimate / low)``: 2.0 is an interval of exactly [0.5x, 2x] of its estimate."""
    if interval is None or not interval.estimate > 0 or not interval.low > 0 or not math.isfinite(interval.high):
        return math.inf
    return max(interval.high / interval.estimate, interval.estimate / interval.low)


def _min_rounds(interval: RatioInterval) -> int:
    return PROMOTE_MIN_ROUNDS if getattr(interval, "within", True) else MIN_ROUNDS


def judge_paired(interval: RatioInterval | None, min_speedup: float) -> Verdict:
    """:func:`judge` with the within-round method's minimum rounds (PASS from round 2, FAIL from round 1 where the
    interval is bounded there: stats.sequential_interval; MIN_ROUNDS
    for both when the interval is the round-level one: a measurement had too few events for blocks) and the width
    bound: an interval wider than MAX_WIDTH decides nothing."""
    if interval is None or width(interval) > MAX_WIDTH:
        return Verdict.UNDECIDED
    if not getattr(interval, "within", True):
        return judge(interval, min_speedup)
    if interval.n >= PROMOTE_MIN_ROUNDS and interval.low > min_speedup:
        return Verdict.PASS
    if interval.n >= REJECT_MIN_ROUNDS and interval.high < min_speedup:
        return Verdict.FAIL
    return Verdict.UNDECIDED


# Futility projects the interval to at most this many rounds (the looks the error-spending design spends in equal parts,
# probe/sequential.py) while the probe is within them, and FUTILITY_AHEAD rounds ahead after that: a larger budget
# (rollout.maxRounds) never delays the early stop of a probe that cannot decide (the horizon at round n does not depend on
# the budget unless the budget ends first), and a probe past round 6 that still cannot decide stops instead of running
# to a large budget's end.
FUTILITY_HORIZON = DESIGN_LOOKS
FUTILITY_AHEAD = 3


def futility_horizon(max_rounds: int, rounds: int = 0) -> int:
    """The round futility projects to after ``rounds`` rounds: FUTILITY_HORIZON, or FUTILITY_AHEAD rounds ahead once
    past it, never beyond the budget's last round."""
    return min(max_rounds, max(FUTILITY_HORIZON, rounds + FUTILITY_AHEAD if rounds >= FUTILITY_HORIZON else 0))


def futile(interval: RatioInterval | None, min_speedup: float, max_rounds: int = 6, last_level: float | None = None) -> bool:
    """True when more rounds would most likely decide nothing: from the minimum rounds to promote, with an interval
    within the width bound, ``|log(estimate / min_speedup)| <= h_last - FUTILITY_SE * se``, where ``h_last`` is the
    interval's half width projected to ``max_rounds`` (``t * se * sqrt(n / max_rounds)``, the df grown in
    proportion) at ``last_level`` (that look's level; default the interval's own). Never true at or after
    ``max_rounds`` (the horizon: the probe's last round, or decide.futility_horizon's)."""
    if interval is None or not hasattr(interval, "se") or width(interval) > MAX_WIDTH:
        return False
    n, se = interval.n, float(getattr(interval, "se", math.inf))
    if n < _min_rounds(interval) or n >= max_rounds or not math.isfinite(se) or se <= 0:
        return False
    df = float(getattr(interval, "df", n - 1)) * max_rounds / n
    level = interval.level if last_level is None else last_level
    h_last = t_quantile(1.0 - (1.0 - level) / 2.0, max(1.0, df)) * se * math.sqrt(n / max_rounds)
    return abs(math.log(interval.estimate / min_speedup)) <= h_last - FUTILITY_SE * se


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
