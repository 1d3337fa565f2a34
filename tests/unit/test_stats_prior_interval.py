"""With a prior, the rounds' spread alone when it has more degrees of freedom than the sum with the blocks
(stats._prior_interval; docs/probe.md, "With a prior, the rounds' spread alone when it has more df").

The between-round variance of a round's log ratio is a round's whole noise, the blocks' part included. Without a prior it
has 1 df at round 2 and the blocks' variance (added to it) is what gives the first looks their df; with a prior of 5 df
it has 6 at round 2, more than the sum's Satterthwaite df where the blocks have few (a short workload's pooled blocks),
and alone it is the exact t-interval for normal rounds. The study (docs/benchmarks/probe-study.md, "What the best test
could do") found quiet/eagle3/batch-32's 1.5x truth promoted at round 2 in 80.8 % of probes with the sum, 99.7 % with
this. Synthetic rounds of that shape, and that recorded trace.
"""

from __future__ import annotations

import math
import random

import pytest

from specdec_operator.api import Reason
from specdec_operator.probe.sequential import look_levels
from specdec_operator.probe.stats import PairedRound, RoundPrior, between_round, paired_interval, round_variance, sequential_interval, t_quantile
from specdec_operator.reconcile.race import RaceRules
from tests.support.trace_replay import replay, trace_named
from tests.unit.test_race_prior import _previous_probe

# A quiet short workload (docs/benchmarks/probe-study.md, quiet/eagle3/batch-32): each server's log tok/s moves by ~0.024
# between rounds (a round's log ratio by ~0.034), and each server's pooled blocks (one estimate over all its
# measurements, stats.pooled_block_variance: its df count once) estimate its measurement's variance with ~2 df (the
# speculative server) and ~4 df (the base): a chi-square draw per probe around the true 2e-4 and 8e-5.
SERVER_SD = 0.024
BLOCKS = (("speculative", 2e-4, 2.0), ("base", 8e-5, 4.0))


def _rounds(rng: random.Random, truth: float, n: int, blocks_df: float | None = None) -> list[PairedRound]:
    parts = tuple((key, var * rng.gammavariate((blocks_df or df) / 2, 2) / (blocks_df or df), blocks_df or df) for key, var, df in BLOCKS)
    out = []
    for _ in range(n):
        s, b = 7.0 + math.log(truth) + rng.gauss(0.0, SERVER_SD), 7.0 + rng.gauss(0.0, SERVER_SD)
        out.append(PairedRound(s - b, sum(v for _, v, _ in parts), min(d for _, _, d in parts), parts, (s, b)))
    return out


def _prior(rng: random.Random, rounds: int = 6) -> RoundPrior:
    """What an earlier probe of ``rounds`` rounds of the same servers leaves (probe/priors.py: round_variance, n - 1 df)."""
    return RoundPrior(round_variance(_rounds(rng, 1.0, rounds)), float(rounds - 1))


def test_with_a_prior_the_rounds_spread_alone_decides_where_the_blocks_have_few_df():
    # Two rounds whose pooled blocks came out noisy (the speculative server's 2 df estimate at 2e-3, ten times its usual),
    # and a prior of 5 df (an earlier six-round probe): the blocks' term would dominate the sum with ~2 df.
    parts = (("speculative", 2e-3, 1.9), ("base", 1e-4, 4.3))
    rounds = [PairedRound(s - b, 2.1e-3, 1.9, parts, (s, b)) for s, b in ((7.41, 7.0), (7.38, 6.99))]
    prior = RoundPrior(0.03**2, 5.0)
    level = look_levels(0.998, 2).low_level
    iv = paired_interval(rounds, level, prior=prior)
    between, df = between_round(rounds, prior=prior) or (math.nan, math.nan)
    assert df == 6.0 and iv.df == df
    assert iv.se == pytest.approx(math.sqrt(between / 2))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * iv.se
    assert iv.low == pytest.approx(iv.estimate * math.exp(-half))
    # The blocks' variance does not enter: the same rounds with blocks twice as noisy give the same interval.
    noisier = [PairedRound(r.log_ratio, 4 * r.var, r.df, tuple((k, 4 * v, d) for k, v, d in r.parts), r.levels) for r in rounds]
    assert paired_interval(noisier, level, prior=prior).low == pytest.approx(iv.low)
    # Without the prior the sum stays, with fewer df than the prior's 6 (the between-round term has 1 at round 2).
    assert paired_interval(rounds, level).df < 6.0


def test_with_a_prior_the_blocks_stay_where_they_give_more_df():
    # Blocks with 200 df each (a long workload's own blocks): the sum's Satterthwaite df exceed the prior's 5 + 1, so the
    # blocks' variance stays in the interval, and a noisier block variance widens it.
    rng = random.Random(4)
    rounds, prior = _rounds(rng, 1.5, 2, blocks_df=200.0), RoundPrior(0.03**2, 5.0)
    level = look_levels(0.998, 2).low_level
    iv = paired_interval(rounds, level, prior=prior)
    assert iv.df > 6.0
    noisier = [PairedRound(r.log_ratio, 4 * r.var, r.df, tuple((k, 4 * v, d) for k, v, d in r.parts), r.levels) for r in rounds]
    assert paired_interval(noisier, level, prior=prior).low < iv.low


def test_a_clear_win_on_the_quiet_short_workload_is_promoted_at_round_two_with_a_prior():
    # The idle machine's eagle3 batch-32 pair (docs/benchmarks/probe-study.md): with the sum of the blocks' variance and
    # the prior-pooled between-round one, 80.8 % of 1.5x probes promoted within 2 rounds (a short workload's pooled blocks
    # of two measurements, ~2 df, that came out large dragged the sum's df below the prior's); with the between-round
    # term alone where it has more df, at least 90 of 100 replayed probes (each with its own earlier probe's prior) do.
    trace = trace_named("quiet/eagle3/batch-32")
    rng = random.Random("prior-interval/quiet/eagle3/batch-32")
    quick = 0
    for _ in range(100):
        rules = RaceRules(round_priors={trace.name: _previous_probe(trace, rng)})
        decided, rounds = replay(trace, 1.5, rules, random.Random(rng.random()))
        quick += decided.reason is Reason.SPEEDUP_CONFIRMED and rounds <= 2
    assert quick >= 90, quick


@pytest.mark.parametrize("look", [2, 3])
def test_with_a_prior_the_promotion_bound_keeps_its_level_at_the_threshold(look):
    # At confidence 0.9 each promotion look spends 0.1 / 6 = 1.7 %: over 4,000 seeded probes of equal servers the low end
    # lies above 1.0 at most that often (plus three standard errors of the count), the servers' floor included.
    rng = random.Random(look)
    levels = look_levels(0.9, look)
    draws = 4000
    above = sum(sequential_interval(_rounds(rng, 1.0, look), levels, _prior(rng)).low > 1.0 for _ in range(draws))
    spend = (1.0 - levels.low_level) / 2.0
    assert above <= draws * spend + 3.0 * math.sqrt(draws * spend), (above, draws * spend)
