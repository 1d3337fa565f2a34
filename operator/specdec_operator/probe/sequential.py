"""Anytime-valid error spending for the probe's looks: the guarantee never depends on the round budget.

The probe looks at its evidence after every round and stops as soon as it is decisive. Until 2026-12 each look's
interval had the level ``1 - (1 - confidence) / max_rounds`` (Bonferroni over the looks the budget allowed): a valid
guarantee, but one that made every look stricter when ``rollout.maxRounds`` grew, so a larger budget made every
decision slower (a 2.37x win took 2 rounds at ``maxRounds`` 6 and 5 at 24).

Here each look ``k`` gets its own share of the error budget from a fixed schedule whose sum over *all* looks, however
many there are, is the budget (an alpha-spending design; the union bound over every look makes any stopping rule
valid, including one that stops at the first decisive look):

* The two ways a decision can be wrong are bounded separately, each by ``alpha = 1 - confidence``: a false promotion
  (the interval's low end above the truth while the truth is at or below ``minSpeedup``) and a false rollback (its
  high end below the truth). Only the low end can promote and only the high end can roll back, so each is a one-sided
  bound: ``confidence`` is the chance that a promotion is right, and separately that a rollback for speed is.
* Each side's ``alpha`` is shared by the ``arms`` compared against one base (a race of candidates: picking the best of
  N must not inflate false promotions; Bonferroni over the arms).
* The schedule of a side whose first possible look is ``first`` (2 for promotions: both orders of the servers must be
  measured, probe/decide.py; 1 for rollbacks): its first ``DESIGN_LOOKS - first + 1`` looks, the rounds of the API's
  default budget, spend ``(1 - LATE_SHARE) * alpha`` in equal parts; every look after them spends from
  ``LATE_SHARE * alpha`` as ``LATE_SHARE * alpha / (j (j + 1))`` at its ``j``-th late look (``sum_j 1 / (j (j + 1))
  = 1``). The schedule is the same for every budget.

So look ``k``'s interval is the same whatever ``maxRounds`` is: raising it never makes a decision slower, it only gives
probes that are still undecided more rounds. Against the rule it replaced at ``maxRounds`` 6 (each tail
``alpha / 12`` at every look): each look of the first six is more lenient (promotion ``alpha / 6``, rollback
``5 alpha / 36``), so no decision there is slower; looks 7, 8, 9 spend ``alpha / 12``, ``/ 36``, ``/ 72`` on the
promotion side. docs/probe.md has the argument and the simulation study (benchmarks/probe_study.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# The first look at which a promotion is possible (probe/decide.py PROMOTE_MIN_ROUNDS: both server orders measured).
PROMOTE_FROM_LOOK = 2
# The looks spent in equal parts: the API's default rollout.maxRounds (a probe within it is never slower than under the
# Bonferroni rule this replaced), and the share of alpha kept for every look after them.
DESIGN_LOOKS = 6
LATE_SHARE = 1.0 / 6.0


def spend(alpha: float, look: int, first: int = 1) -> float:
    """The error spent at ``look`` (1-based) by a side whose whole budget is ``alpha`` and whose first look is ``first``.

    Summed over every look, however many, it is ``alpha``; 0 before ``first``."""
    if look < first:
        return 0.0
    design = DESIGN_LOOKS - first + 1
    j = look - first + 1
    if j <= design:
        return (1.0 - LATE_SHARE) * alpha / design
    late = j - design
    return LATE_SHARE * alpha / (late * (late + 1))


@dataclass(frozen=True)
class LookLevels:
    """Two-sided levels whose one tail is the error this look spends on each side.

    ``low_level``: the level of the interval whose low end may promote (its lower tail ``(1 - low_level) / 2`` is the
    promotion side's spend); ``high_level``: the one whose high end may roll back."""

    look: int
    low_level: float
    high_level: float


def look_levels(confidence: float, look: int, arms: int = 1) -> LookLevels:
    """The levels of look ``look`` of a probe with ``arms`` arms (candidates against one base) at ``confidence``.

    A side that spends nothing at this look (the promotion side before PROMOTE_FROM_LOOK) gets a level as close to 1 as
    floats allow: its bound is uninformative, never a decision."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be within (0, 1)")
    if look < 1:
        raise ValueError("look must be >= 1")
    if arms < 1:
        raise ValueError("arms must be >= 1")
    alpha = (1.0 - confidence) / arms
    return LookLevels(look, _two_sided(spend(alpha, look, PROMOTE_FROM_LOOK)), _two_sided(spend(alpha, look, 1)))


# The level of a side that spends nothing at a look: its bound decides nothing there (stats.sequential_interval).
NOTHING_SPENT = 1.0 - 1e-15


def _two_sided(tail: float) -> float:
    return 1.0 - 2.0 * tail if tail > 0 else NOTHING_SPENT


def spent(confidence: float, looks: int, arms: int = 1) -> tuple[float, float]:
    """The error the first ``looks`` looks spend, over all arms: (promotion side, rollback side). Each stays at or below
    ``1 - confidence`` for every ``looks``: the guarantee (tests/unit/test_probe_stats.py checks it)."""
    alpha = (1.0 - confidence) / arms
    promote = arms * sum(spend(alpha, k, PROMOTE_FROM_LOOK) for k in range(1, looks + 1))
    rollback = arms * sum(spend(alpha, k, 1) for k in range(1, looks + 1))
    return promote, rollback
