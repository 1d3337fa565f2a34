"""Tests of the probe's within-round statistics (probe/stats.py) and the paired decision rule.

Deterministic and fast: synthetic block rates with known noise and a known speedup, seeded, so every number is
the same on every run; reference values are textbook tables or closed forms, not scipy. The last test runs the
round loop against in-process simulators (~10 s).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections import Counter
from contextlib import AsyncExitStack

import pytest

from specdec_operator.cli.probe import run_probe
from specdec_operator.probe.decide import (
    MAX_WIDTH,
    Verdict,
    futile,
    futility_horizon,
    judge_paired,
    width,
)
from specdec_operator.probe.evidence import SPECULATIVE, Evidence
from specdec_operator.probe.sequential import PROMOTE_FROM_LOOK, look_levels, spent
from specdec_operator.probe.stats import (
    HETEROGENEITY_P,
    LogRate,
    PairedRound,
    RoundPrior,
    block_rates,
    blocks_for,
    chi2_sf,
    log_rate,
    log_ratio_interval,
    paired_interval,
    paired_round,
    per_look_level,
    pooled_block_variance,
    pooled_blocks_for,
    pooled_satterthwaite,
    satterthwaite,
    sequential_interval,
    t_quantile,
    weighted_paired_round,
    with_pooled_variance,
)
from specdec_operator.reconcile.race import RaceRules
from specdec_operator.simulator import SimulatorServer, profile_from_dict
from tests.support.benchmarks import load_benchmark
from tests.support.trace_replay import ReplayedProbe, recorded_traces, replay, trace_named

UNUSED_URL = "http://127.0.0.1:9"  # a replayed probe sends no request

# --- chi-square tail -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, df, p",
    [
        # Upper-tail critical values from the standard chi-square table (4-5 significant digits).
        (3.8415, 1, 0.05),
        (6.6349, 1, 0.01),
        (5.9915, 2, 0.05),
        (7.8147, 3, 0.05),
        (11.345, 3, 0.01),
        (11.070, 5, 0.05),
        (18.307, 10, 0.05),
        (23.209, 10, 0.01),
        (2.5582, 10, 0.99),
        (43.773, 30, 0.05),
    ],
)
def test_chi2_sf_matches_the_table(x, df, p):
    assert chi2_sf(x, df) == pytest.approx(p, rel=2e-3)


@pytest.mark.parametrize("df", [2, 4, 6, 10])
@pytest.mark.parametrize("x", [0.1, 1.0, 3.0, 7.5, 20.0, 60.0])
def test_chi2_sf_equals_the_closed_form_for_even_df(x, df):
    # Even df: P(X > x) = exp(-x/2) * sum_{k < df/2} (x/2)^k / k!  (both branches: series below a+1, fraction above).
    half = x / 2.0
    exact = math.exp(-half) * sum(half**k / math.factorial(k) for k in range(df // 2))
    assert chi2_sf(x, df) == pytest.approx(exact, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("x", [0.01, 0.5, 2.0, 9.0, 30.0])
def test_chi2_sf_with_one_df_is_the_normal_two_sided_tail(x):
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2.0)), rel=1e-9)


def test_chi2_sf_edges():
    assert chi2_sf(0.0, 3) == 1.0
    assert chi2_sf(-1.0, 3) == 1.0
    assert 0.0 <= chi2_sf(1e4, 3) < 1e-300 or chi2_sf(1e4, 3) == 0.0


# --- time blocks -----------------------------------------------------------------------------------------


def test_block_rates_mean_is_the_measurement_rate_and_events_spread_over_their_gap():
    # One request, events of 16 tokens every 0.4 s over 4 s; 10 blocks of 0.4 s.
    arrivals = [(0.4 * i, 0.4 * (i + 1), 16) for i in range(10)]
    rates = block_rates(arrivals, 0.0, 4.0, 10)
    assert rates == pytest.approx([40.0] * 10)
    # Events straddling block edges: each block gets its overlap's share, the mean stays tokens / duration.
    arrivals = [(0.0, 1.5, 30), (1.5, 2.5, 10), (2.5, 4.0, 20)]
    rates = block_rates(arrivals, 0.0, 4.0, 4)
    assert rates == pytest.approx([20.0, 15.0, 10.0 * (0.5 / 1.0) / 1.0 + 20 / 1.5 * 0.5, 20 / 1.5])
    assert sum(rates) / 4 == pytest.approx(60 / 4.0)


def test_block_rates_edges():
    assert block_rates([(0.0, 1.0, 5)], 0.0, 0.0) == []
    assert block_rates([(0.0, 1.0, 5)], 0.0, 1.0, 0) == []
    assert block_rates([(0.0, 2.0, 8)], 0.0, 2.0, 1) == [4.0]
    # An instantaneous event (the first of a request) lands in its block; one exactly at the end in the last.
    assert block_rates([(0.5, 0.5, 3), (2.0, 2.0, 1)], 0.0, 2.0, 2) == pytest.approx([3.0, 1.0])
    # An event reaching outside the window keeps all its tokens on the part inside (the blocks' mean stays
    # tokens / duration); the start offset is honoured.
    assert block_rates([(9.0, 11.0, 4)], 10.0, 1.0, 1) == pytest.approx([4.0])
    # No tokens at all: zero blocks.
    assert block_rates([], 0.0, 1.0, 3) == [0.0, 0.0, 0.0]


def test_blocks_for_needs_enough_events_per_stream():
    assert blocks_for(1000, 4) == 40  # capped
    assert blocks_for(4 * 4 * 8, 4) == 8  # exactly the minimum
    assert blocks_for(4 * 4 * 8 - 1, 4) == 0  # below: no within-measurement evidence


# --- log rate and its variance ---------------------------------------------------------------------------


def _blocks(rng: random.Random, rate: float, sigma: float, k: int) -> list[float]:
    return [rate + rng.gauss(0.0, sigma) for _ in range(k)]


def test_log_rate_recovers_a_known_block_noise():
    rng = random.Random(3)
    rate, sigma, k = 1000.0, 50.0, 4001
    rates = _blocks(rng, rate, sigma, k)
    lr = log_rate(rate, rates)
    assert lr.log_rate == pytest.approx(math.log(rate))
    # var(log rate) = sigma^2 / (K rate^2); the MAD estimate is within a few % with 4,000 differences.
    assert lr.var == pytest.approx(sigma**2 / k / rate**2, rel=0.08)
    assert lr.df == pytest.approx(0.37 * (k - 1))


def test_log_rate_ignores_a_few_large_jumps_and_empty_stalls():
    rng = random.Random(4)
    rate, sigma, k = 1000.0, 20.0, 400
    clean = _blocks(rng, rate, sigma, k)
    jumpy = list(clean)
    for j in (50, 51, 200):  # a prefill stall: two empty blocks, and one drain drop
        jumpy[j] = 0.0
    jumpy[300] = 3 * rate
    a, b = log_rate(rate, clean), log_rate(rate, jumpy)
    assert b.var == pytest.approx(a.var, rel=0.15)
    assert b.df < a.df  # the pair of empty blocks was skipped


def test_log_rate_edges():
    zero = log_rate(0.0, [0.0] * 10)
    assert zero.log_rate == -math.inf and zero.var == math.inf
    assert log_rate(100.0, [100.0, 100.0]).var == math.inf  # fewer than 3 blocks: no evidence
    assert log_rate(math.inf, [1.0] * 10).var == math.inf
    same = log_rate(100.0, [100.0] * 10)  # identical blocks: no measurable noise
    assert same.var == 0.0 and same.log_rate == pytest.approx(math.log(100.0))
    stalled = log_rate(100.0, [0.0, 0.0, 0.0, 400.0])  # only one informative difference pair left
    assert stalled.var == math.inf


def test_paired_round_and_satterthwaite():
    s, b = LogRate(math.log(150.0), 0.0004, 10.0), LogRate(math.log(100.0), 0.0004, 10.0)
    p = paired_round(s, b)
    assert p.log_ratio == pytest.approx(math.log(1.5))
    assert p.var == pytest.approx(0.0008)
    assert p.df == pytest.approx(20.0)  # two equal variances with 10 df each
    assert satterthwaite([(1.0, 5.0)]) == pytest.approx(5.0)
    assert satterthwaite([(math.inf, 5.0), (1.0, 3.0)]) == 3.0  # no finite total: the smallest df
    assert satterthwaite([(1.0, 0.5)]) == 1.0  # never below one


def test_weighted_paired_round_is_the_arithmetic_mix():
    rounds = {"a": PairedRound(math.log(2.0), 0.01, 10.0), "b": PairedRound(math.log(1.0), 0.04, 20.0)}
    mix = weighted_paired_round(rounds, {"a": 3.0, "b": 1.0})
    assert math.exp(mix.log_ratio) == pytest.approx((3 * 2.0 + 1.0) / 4)
    # Delta method: var = sum((w_i r_i / (W mix))^2 var_i).
    m = 7.0 / 4
    assert mix.var == pytest.approx((3 * 2 / (4 * m)) ** 2 * 0.01 + (1 / (4 * m)) ** 2 * 0.04)
    one = weighted_paired_round({"a": rounds["a"]}, {"a": 5.0})
    assert one.log_ratio == pytest.approx(math.log(2.0)) and one.var == pytest.approx(0.01)


# --- the pooled block variance (short measurements) --------------------------------------------------------


def _wave_profile(rng: random.Random, level: float, sigma: float, shape: list[float]) -> list[float]:
    """One measurement's block rates: a closed loop's repeated shape (e.g. a prefill stall, the drain) times level."""
    return [level * c * (1.0 + rng.gauss(0.0, sigma)) for c in shape]


SHAPE = [0.3, 1.4, 1.5, 0.8]  # four blocks (mean 1): the first wave's prefill, two decode blocks, the drain
SPECULATIVE_SHAPE = [0.5, 1.2, 1.3, 1.0]  # another server's shape, also mean 1: the ratio of levels is the speedup


def test_pooled_blocks_for_needs_two_events_per_stream_and_block():
    assert pooled_blocks_for(64 * 8, 32) == 8  # batch-32: 64 requests x 8 events; its own blocks_for is 0
    assert blocks_for(64 * 8, 32) == 0
    assert pooled_blocks_for(3, 1) == 0  # fewer than two blocks
    assert pooled_blocks_for(10**6, 1) == 40  # capped like the own blocks


def test_pooled_block_variance_removes_the_repeated_shape_and_recovers_the_noise():
    rng = random.Random(11)
    sigma, rows = 0.05, 400
    profiles = [_wave_profile(rng, 1000.0, sigma, SHAPE) for _ in range(rows)]
    var, df = pooled_block_variance(profiles)
    assert (rows - 1) * 2 < df <= (rows - 1) * len(SHAPE)  # Satterthwaite over the positions' unequal variances
    # The measurement's log tok/s: mean of K blocks of relative noise sigma * c_j / mean(c), so its variance is
    # sigma^2 * mean(c^2) / mean(c)^2 / K; the estimate is within a few % with 1,197 df.
    c2 = sum(c * c for c in SHAPE) / len(SHAPE) / (sum(SHAPE) / len(SHAPE)) ** 2
    assert var == pytest.approx(sigma**2 * c2 / len(SHAPE), rel=0.1)
    # The same rows one at a time, through the successive-difference MAD: the shape's jumps read as noise.
    own = [log_rate(sum(p) / len(p), p) for p in profiles[:50]]
    assert all(lr.var == math.inf or lr.var > 5 * var for lr in own)


def test_pooled_block_variance_edges():
    assert pooled_block_variance([[1.0, 2.0, 3.0]]) is None  # one measurement: nothing to pool
    assert pooled_block_variance([[1.0, 2.0], [1.0, 2.0, 3.0]]) is None  # block counts differ
    assert pooled_block_variance([[0.0, 0.0], [0.0, 0.0]]) is None  # no tokens at all
    assert pooled_block_variance([[1.0], [2.0]]) is None  # one block each
    assert pooled_block_variance([[1.0, 3.0], [1.0, 3.0]]) == (0.0, 1.0)  # the same blocks twice: no noise
    # Rows at two levels (mean 3): the level change between measurements counts as noise. Per position, relative to
    # the mean: [1/3, 2/3] has variance 1/18, [1, 2] has 1/2; the mean of two blocks has their sum / 2^2.
    var, df = pooled_block_variance([[1.0, 3.0], [2.0, 6.0]])
    assert var == pytest.approx((1 / 18 + 1 / 2) / 4) and df == pytest.approx((10 / 18) ** 2 / ((1 / 18) ** 2 + (1 / 2) ** 2))


def test_a_pooled_estimate_counts_its_df_once():
    # Two rounds share one pooled estimate with 3 df: the sum has 3 df, not the 6 of two independent ones.
    assert pooled_satterthwaite([("w/base", 0.01, 3.0), ("w/base", 0.01, 3.0)]) == pytest.approx(3.0)
    assert pooled_satterthwaite([(None, 0.01, 3.0), (None, 0.01, 3.0)]) == pytest.approx(6.0)
    shared = [paired_round(LogRate(0.1, 0.01, 3.0, pool="w/speculative"), LogRate(0.0, 0.01, 3.0, pool="w/base")) for _ in range(4)]
    assert paired_interval(shared, 0.95).df == pytest.approx(6.0)  # two pools of 3 df, whatever the rounds
    mix = weighted_paired_round({"a": shared[0], "b": PairedRound(0.0, 0.01, 10.0)}, {"a": 1.0, "b": 1.0})
    assert {key for key, _, _ in mix.parts} == {"w/speculative", "w/base", None}


def test_with_pooled_variance_takes_the_pooled_estimate_where_it_has_more_df():
    rng = random.Random(12)
    profiles = [_wave_profile(rng, 1000.0, 0.05, SHAPE * 4) for _ in range(3)]  # 16 coarse blocks, 3 rounds
    var, df = pooled_block_variance(profiles)
    short = LogRate(math.log(1000.0), math.inf, 1.0)  # too few events for its own blocks
    few = LogRate(math.log(1000.0), 1e-6, 2.6)  # its own 8 blocks: 0.37 x 7 df
    many = LogRate(math.log(1000.0), 2e-6, 40.0)  # more df of its own than the pool's (~14 here)
    dead = LogRate(-math.inf, math.inf, 1.0)  # no tokens: stays as it is
    out = with_pooled_variance([short, few, many, dead], profiles, "w/base")
    assert out[0] == LogRate(short.log_rate, var, df, pool="w/base")
    assert out[1] == LogRate(few.log_rate, var, df, pool="w/base") and df > few.df
    assert out[2] is many and out[3] is dead and df < many.df
    assert with_pooled_variance([short], profiles[:1], "w/base") == [short]  # one round: nothing to pool yet


def _pooled_rounds(rng: random.Random, ratio: float, n: int, sigma: float = 0.06) -> list[PairedRound]:
    """n rounds of a short workload (four blocks per measurement, a repeated shape): each server's variance
    pooled over its measurements, as the probe does when a measurement has too few events for its own blocks."""
    profiles: dict[str, list[list[float]]] = {"base": [], "speculative": []}
    for _ in range(n):
        profiles["base"].append(_wave_profile(rng, 1000.0, sigma, SHAPE))
        profiles["speculative"].append(_wave_profile(rng, 1000.0 * ratio, sigma, SPECULATIVE_SHAPE))
    rates = {}
    for variant, rows in profiles.items():
        var, df = pooled_block_variance(rows)
        rates[variant] = [LogRate(math.log(sum(p) / len(p)), var, df, pool=variant) for p in rows]
    return [paired_round(rates["speculative"][i], rates["base"][i]) for i in range(n)]


@pytest.mark.parametrize("n, level", [(2, 0.95), (3, 0.95), (4, 0.9)])
def test_paired_interval_with_pooled_variances_covers_a_known_ratio(n, level):
    rng = random.Random(2000 + n)
    draws, hits = 300, 0
    for _ in range(draws):
        iv = paired_interval(_pooled_rounds(rng, 1.3, n), level)
        assert iv.within
        hits += iv.low <= 1.3 <= iv.high
    assert hits / draws >= level - 0.04


# --- the paired interval ---------------------------------------------------------------------------------


def test_paired_interval_one_round_uses_the_within_round_df():
    p = PairedRound(math.log(1.2), 0.0025, 14.8)
    iv = paired_interval([p], 0.95)
    assert iv.within and not iv.heterogeneous and iv.n == 1
    assert iv.df == pytest.approx(14.8)
    # t(0.975, 14.8) ~ 2.133: the half width on the log scale is 2.133 * 0.05.
    assert math.log(iv.high / iv.estimate) == pytest.approx(2.133 * 0.05, rel=2e-3)
    assert iv.estimate == pytest.approx(1.2)


def test_paired_interval_adds_the_between_round_spread():
    rounds = [PairedRound(math.log(r), 0.0001, 30.0) for r in (1.10, 1.14, 1.12)]
    iv = paired_interval(rounds, 0.95)
    logs = [r.log_ratio for r in rounds]
    mean = sum(logs) / 3
    between = sum((x - mean) ** 2 for x in logs) / 2 / 3
    var = 3 * 0.0001 / 9 + between
    assert iv.estimate == pytest.approx(math.exp(mean))
    assert math.log(iv.high) - mean == pytest.approx(_t975(iv.df) * math.sqrt(var), rel=1e-6)


def test_the_between_round_term_is_at_least_the_servers_own_spread_on_the_promotion_side():
    # Two rounds whose log ratios agree (1.20x twice) while each server's own log tok/s moved by 0.3 between them, far
    # beyond its blocks (sd 0.01): the ratio's spread is 0, the servers' is 2 x 0.3^2 / 2 = 0.09 (stats.round_variance).
    def rnd(spec: float, base: float) -> PairedRound:
        return paired_round(LogRate(spec, 0.0001, 30.0), LogRate(base, 0.0001, 30.0))

    moved = [rnd(7.0 + math.log(1.2), 7.0), rnd(7.3 + math.log(1.2), 7.3)]
    var = 4 * 0.0001 / 4 + 0.09 / 2
    iv = paired_interval(moved, 0.95)
    assert math.log(iv.high) - math.log(1.2) == pytest.approx(_t975(iv.df) * math.sqrt(var), rel=1e-6)
    # Without the floor (or without the servers' levels) only the blocks' variance is left: far narrower.
    bare = paired_interval(moved, 0.95, server_floor=False)
    assert bare.se == pytest.approx(math.sqrt(4 * 0.0001 / 4)) and bare.low > iv.low
    assert paired_interval([PairedRound(p.log_ratio, p.var, p.df, p.parts) for p in moved], 0.95) == bare
    # A floor: servers that did not move leave the ratio's own spread (here the larger) as it was.
    still = [rnd(7.0 + math.log(1.1), 7.0), rnd(7.0 + math.log(1.3), 7.0)]
    assert paired_interval(still, 0.95) == paired_interval(still, 0.95, server_floor=False)
    # In a look, the floor widens both ends: the promotion side's low end and the rollback side's high end.
    levels = look_levels(0.998, 2)
    seq = sequential_interval(moved, levels)
    assert seq.low == paired_interval(moved, levels.low_level).low
    assert seq.high == paired_interval(moved, levels.high_level).high > paired_interval(moved, levels.high_level, server_floor=False).high
    # The weighted mix carries the levels too (traffic-weighted), so its floor is the same servers' spread.
    mix = [weighted_paired_round({"a": p, "b": p}, {"a": 1.0, "b": 3.0}) for p in moved]
    assert [m.levels for m in mix] == pytest.approx([p.levels for p in moved])


def _t975(df: float) -> float:
    return t_quantile(0.975, df)


def test_paired_interval_falls_back_to_round_df_when_rounds_disagree():
    # Rounds 10 % apart, each claiming 0.5 % precision: Cochran's Q rejects the blocks' variance.
    rounds = [PairedRound(math.log(r), 0.005**2, 30.0) for r in (1.0, 1.1, 0.95, 1.08)]
    iv = paired_interval(rounds, 0.95)
    assert iv.heterogeneous and iv.df == 3.0
    # Consistent rounds keep the within-round df.
    calm = [PairedRound(math.log(r), 0.02**2, 30.0) for r in (1.0, 1.01, 0.99, 1.005)]
    iv = paired_interval(calm, 0.95)
    assert not iv.heterogeneous and iv.df > 3.0
    assert HETEROGENEITY_P == 0.01


def test_paired_interval_without_blocks_is_the_round_level_interval():
    rounds = [PairedRound(math.log(r), math.inf, 1.0) for r in (1.2, 1.25, 1.22)]
    iv = paired_interval(rounds, 0.95)
    old = log_ratio_interval([1.2, 1.25, 1.22], 0.95)
    assert not iv.within and iv.df == 2.0
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((old.estimate, old.low, old.high))


def test_paired_interval_edges():
    with pytest.raises(ValueError):
        paired_interval([], 0.95)
    dead = paired_interval([PairedRound(-math.inf, math.inf, 1.0)], 0.95)  # a server that produced no tokens
    assert dead.low == 0.0 and dead.high == math.inf
    exact = paired_interval([PairedRound(math.log(1.3), 0.0, 5.0)] * 3, 0.95)  # noiseless and identical
    assert exact.low == exact.estimate == exact.high == pytest.approx(1.3)
    assert judge_paired(exact, 1.3) is Verdict.UNDECIDED  # touching the threshold is not evidence


def _synthetic_round(rng: random.Random, ratio: float, sigma: float, round_sd: float = 0.0, k: int = 40) -> PairedRound:
    """One round: base and speculative blocks with relative noise ``sigma``, a round effect of sd ``round_sd``."""
    effect = math.exp(rng.gauss(0.0, round_sd)) if round_sd else 1.0
    out = []
    for rate in (1000.0, 1000.0 * ratio * effect):
        blocks = [rate * (1.0 + rng.gauss(0.0, sigma)) for _ in range(k)]
        out.append(log_rate(sum(blocks) / k, blocks))
    base, spec = out
    return paired_round(spec, base)


@pytest.mark.parametrize("n, level", [(1, 0.95), (2, 0.95), (4, 0.95), (3, 0.9)])
def test_paired_interval_covers_a_known_ratio(n, level):
    rng = random.Random(1000 + n)
    draws = 200
    hits = 0
    for _ in range(draws):
        iv = paired_interval([_synthetic_round(rng, 1.25, 0.08) for _ in range(n)], level)
        hits += iv.low <= 1.25 <= iv.high
    # Nominal or above (the between-round term makes it conservative from round 2), never far below: with 200
    # draws the binomial sd is ~1.5 points.
    assert hits / draws >= level - 0.04
    assert hits / draws <= 1.0


def test_paired_interval_covers_with_a_round_effect_the_blocks_cannot_see():
    # Round effect (sd 3 %) larger than the blocks' precision (8 % / sqrt(40) / ~sqrt(2) ~ 1.3 %): the between-round
    # term and the Q fallback must keep coverage near nominal.
    rng = random.Random(77)
    draws, hits = 200, 0
    for _ in range(draws):
        iv = paired_interval([_synthetic_round(rng, 0.95, 0.08, round_sd=0.03) for _ in range(4)], 0.95)
        hits += iv.low <= 0.95 <= iv.high
    assert hits / draws >= 0.90


# --- decision rule: minimum rounds, width bound, futility ------------------------------------------------


def test_judge_paired_minimum_rounds():
    clear_win = [PairedRound(math.log(1.5), 0.0001, 30.0)]
    assert judge_paired(paired_interval(clear_win, 0.99), 1.0) is Verdict.UNDECIDED  # one round never promotes
    assert judge_paired(paired_interval(clear_win * 2, 0.99), 1.0) is Verdict.PASS
    clear_loss = [PairedRound(math.log(0.6), 0.0001, 30.0)]
    assert judge_paired(paired_interval(clear_loss, 0.99), 1.0) is Verdict.FAIL  # a loss may roll back at once
    fallback = [PairedRound(math.log(1.5), math.inf, 1.0)] * 2
    assert judge_paired(paired_interval(fallback, 0.99), 1.0) is Verdict.UNDECIDED  # round-level: from round 3
    assert judge_paired(None, 1.0) is Verdict.UNDECIDED


def test_width_bound_holds_a_decision_back():
    # Above the threshold but wider than [0.5x, 2x] of its estimate: not a decision yet.
    wide = paired_interval([PairedRound(math.log(3.0), 0.33**2, 30.0), PairedRound(math.log(3.2), 0.33**2, 30.0)], 0.998)
    assert wide.low > 1.0 and width(wide) > MAX_WIDTH
    assert judge_paired(wide, 1.0) is Verdict.UNDECIDED
    narrow = paired_interval([PairedRound(math.log(3.0), 0.05**2, 30.0), PairedRound(math.log(3.2), 0.05**2, 30.0)], 0.998)
    assert width(narrow) <= MAX_WIDTH and judge_paired(narrow, 1.0) is Verdict.PASS
    assert width(paired_interval([PairedRound(-math.inf, math.inf, 1.0)], 0.9)) == math.inf


def test_futility_stops_near_the_threshold_but_not_on_a_clear_trend():
    level = 1 - 0.002 / 6
    # Two rounds around 1.00 with 4 % within-round noise: one se above (or below) the estimate, the interval
    # projected to round 6 would still contain 1.0.
    near_one = [PairedRound(math.log(r), 0.04**2, 30.0) for r in (0.995, 1.01)]
    iv = paired_interval(near_one, level)
    assert iv.low < 1.0 < iv.high and futile(iv, 1.0, 6)
    assert not futile(paired_interval(near_one[:1], level), 1.0, 6)  # one round: never (promotion needs two)
    assert not futile(iv, 1.0, 2)  # at the last round the probe ends anyway
    # The same noise around 1.08 or 0.92: undecided now, but the trend would clear 1.0 (either way) by round 6.
    for pair in ((1.07, 1.09), (0.91, 0.93)):
        iv = paired_interval([PairedRound(math.log(r), 0.04**2, 30.0) for r in pair], level)
        assert iv.low < 1.0 < iv.high and not futile(iv, 1.0, 6), pair
    assert not futile(None, 1.0)
    # The round-level fallback (no blocks) needs its three rounds first.
    fallback = [PairedRound(math.log(r), math.inf, 1.0) for r in (0.99, 1.01)]
    assert not futile(paired_interval(fallback, 0.99), 1.0, 6)


# --- the round loop on the simulator (real HTTP, in-process servers) -------------------------------------


def test_equal_servers_stop_early_for_futility_and_never_report_a_wide_interval_at_a_decision():
    # The 100-run benchmark's setup (benchmarks/probe_decisions.py --part errors), five seeds: equal servers
    # with 5 % step jitter. Measured there: 97 of 100 stop Inconclusive after 2.56 rounds on average.
    bench = load_benchmark("probe_decisions")
    profile, small = bench.EQUAL, bench.SMALL

    async def one(seed: int):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(SimulatorServer(profile_from_dict(profile), time_scale=4, seed=seed, load_seconds=0))
            b = await stack.enter_async_context(SimulatorServer(profile_from_dict(profile), time_scale=4, seed=seed + 1000, load_seconds=0))
            return await run_probe(a, b, small, seed=seed)

    async def all_of(seeds):
        return await asyncio.gather(*(one(s) for s in seeds))

    results = asyncio.run(all_of(range(100, 105)))
    # Never promoted, and an early stop is futility's. How many stop early depends on the host's noise (five probes on
    # one event loop beside a busy machine are noisier than the benchmark's), so the share is asserted on recorded
    # rounds below, not here.
    assert [str(r.decision) for r in results] == ["rollback"] * 5, [r.message for r in results]
    early = [r for r in results if str(r.reason) == "Inconclusive" and r.rounds < 6]
    assert all("futility" in r.message for r in early), [r.message for r in early]
    for r in results:
        w = r.workloads[0]
        if r.rounds < 6:  # a decision before max_rounds: every reported interval within [0.5x, 2x]
            assert w.speedup_low and w.speedup_high and max(w.speedup_high / w.speedup, w.speedup / w.speedup_low) <= MAX_WIDTH


@pytest.mark.parametrize("label", ["quiet", "favoured", "loaded"])
def test_equal_servers_replayed_on_recorded_noise_mostly_stop_early_for_futility(label):
    # The equal pair's recorded rounds (an idle machine's, the favoured and the busy ones), 100 probes per workload:
    # none promotes, and one-stream probes stop for futility before the budget (a futile probe costs a few rounds, not
    # six); batch-32's wider rounds stop early less often (76-100 % here), never below half.
    rules = RaceRules(max_rounds=6)
    for trace in recorded_traces(label):
        if "/equal/" not in trace.name:
            continue
        rng = random.Random(f"futility/{trace.name}")
        runs = [replay(trace, 1.0, rules, rng) for _ in range(100)]
        assert all(str(d.decision) == "rollback" for d, _ in runs), trace.name
        early = [d for d, rounds in runs if rounds < rules.max_rounds]
        assert all(str(d.reason) == "Inconclusive" and "futility" in d.message for d in early), trace.name
        assert len(early) >= (100 if trace.name.endswith("/chat") else 50), (trace.name, len(early))


def test_a_short_workload_decides_from_round_two_with_pooled_block_variances():
    # FEW_BLOCKS: 16 requests x 24 tokens at concurrency 4, 8 tokens per event: too few events for MIN_BLOCKS blocks,
    # so no measurement has a variance of its own. Before the pooled variance the probe fell back to the round-level
    # interval (no decision before round 3); now a clear gain promotes after round 2, with a bounded interval, and
    # equal servers still never promote. Decided on recorded one-stream rounds (the quieter machine's and the busy
    # one's, reduced to a short workload's 4 coarse blocks, tests/support/trace_replay.py), so deterministic;
    # the next test measures that a real short workload's measurements are of that kind.
    few = load_benchmark("probe_decisions").FEW_BLOCKS

    def probes(label: str, pair: str, truth: float, blocks: int) -> list:
        traces = {"few-blocks": trace_named(f"{label}/{pair}/chat")}
        script = [ReplayedProbe(f"{label}/{pair}/{truth}/{s}", truth, traces=traces, pooled_blocks=blocks) for s in range(8)]
        return [asyncio.run(run_probe(UNUSED_URL, UNUSED_URL, few, script=s)) for s in script]

    for label, pair in itertools.product(("favoured", "loaded"), ("equal", "eagle3")):
        gains = probes(label, pair, 1.5, 4)
        # Round 2 is the earliest a promotion can happen; the round-level fallback could not decide before round 3. On
        # the noisiest of these traces (loaded/eagle3: beside a busy host the speculative server's own log tok/s spreads
        # 0.10 between rounds, more than the ratio's 0.093) the between-round floor (stats.round_variance: the two
        # servers' own spreads) keeps these 8 probes to round 3 at the earliest; the other three decide at round 2.
        earliest = 3 if (label, pair) == ("loaded", "eagle3") else 2
        assert min(r.rounds for r in gains) == earliest, (label, pair, [(r.rounds, r.message) for r in gains])
        for r in gains:
            # Beside a busy machine a few stop by futility instead (Inconclusive); a 1.5x gain is never judged a loss.
            assert str(r.reason) == "SpeedupConfirmed" or (label == "loaded" and str(r.reason) == "Inconclusive"), r.message
            w = r.workloads[0]
            if str(r.decision) == "promote":
                assert w.speedup_low > 1.0 and max(w.speedup_high / w.speedup, w.speedup / w.speedup_low) <= MAX_WIDTH
        assert sum(str(r.decision) == "promote" for r in gains) >= 6, (label, pair, [r.message for r in gains])
        # The same rounds with one coarse block each (too few for the pool): the round-level fallback, round 3 at best.
        assert min(r.rounds for r in probes(label, pair, 1.5, 1)) >= 3
        equal = probes(label, pair, 1.0, 4)
        assert all(str(r.decision) == "rollback" for r in equal), [r.message for r in equal]


def test_a_short_workloads_measurements_have_no_variance_of_their_own_and_share_the_pooled_one():
    # Measuring, in real time, what the decision above relies on: FEW_BLOCKS's measurements carry no variance of their
    # own but the coarse blocks of the pool, the same number in every round, and from the second round each round's
    # variance is the pooled one. Counts of stream events, not timings: it holds on a busy machine.
    bench = load_benchmark("probe_decisions")
    profile, few = bench.EQUAL, bench.FEW_BLOCKS

    async def one() -> Evidence:
        evidence = Evidence()
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(SimulatorServer(profile_from_dict(profile), time_scale=4, seed=1, load_seconds=0))
            b = await stack.enter_async_context(SimulatorServer(profile_from_dict(bench.faster(profile, 0.5)), time_scale=4, seed=2, load_seconds=0))
            await run_probe(a, b, few, seed=3, max_rounds=2, evidence=evidence)
        return evidence

    evidence = asyncio.run(one())
    rows = evidence.measurements(SPECULATIVE, "few-blocks")
    assert len(rows) == 2
    measured = [m for p in rows for m in (p.speculative, p.base)]
    assert all(m.var == math.inf and len(m.profile) == len(measured[0].profile) >= 2 for m in measured), measured
    assert all(math.isfinite(r.var) and r.var > 0 for r in evidence.paired(SPECULATIVE, "few-blocks"))


@pytest.mark.timing
def test_a_five_percent_loss_never_promotes_with_own_or_pooled_block_variances():
    # The 100-run benchmark's 5 %-slower case (0 of 100 promoted on each workload), five seeds on each: SMALL has
    # blocks of its own, FEW_BLOCKS only the pooled variance.
    bench = load_benchmark("probe_decisions")
    profile = bench.EQUAL

    async def one(seed: int, workloads):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(SimulatorServer(profile_from_dict(profile), time_scale=4, seed=seed, load_seconds=0))
            b = await stack.enter_async_context(
                SimulatorServer(profile_from_dict(bench.slower(profile, 0.05)), time_scale=4, seed=seed + 1000, load_seconds=0)
            )
            return await run_probe(a, b, workloads, seed=seed)

    async def all_of():
        return await asyncio.gather(*(one(s, w) for s in range(400, 405) for w in (bench.SMALL, bench.FEW_BLOCKS)))

    results = asyncio.run(all_of())
    # Rolled back, never promoted. Whether as SpeedupBelowThreshold or as Inconclusive (futility) depends on the noise
    # the host adds: at confidence 0.998 most 5 % losses stop by futility even with a quiet simulator's noise, and beside
    # a busy machine all of them do (CI, 2026-12-06: 0 of 10 below threshold), so only the decision is asserted here;
    # the reasons are asserted on recorded noise below.
    assert all(str(r.decision) == "rollback" for r in results), [r.message for r in results]


@pytest.mark.parametrize("label", ["loaded", "favoured"])
@pytest.mark.parametrize("truth", [0.95, 0.99, 1.0])
def test_a_loss_or_a_tie_replayed_on_recorded_simulator_noise_is_never_promoted(label, truth):
    # Deterministic: the simulator's recorded rounds (quiet-ish and beside a busy make test), drawn with a seed, decided
    # by reconcile/race.py. 100 probes per trace and truth; a false promotion at these truths is at most 0.2 % each.
    rules = RaceRules(max_rounds=6)
    outcomes: Counter[tuple[str, str]] = Counter()
    for trace in recorded_traces(label):
        rng = random.Random(f"{label}/{trace.name}/{truth}")
        for _ in range(100):
            decided, rounds = replay(trace, truth, rules, rng)
            outcomes[(str(decided.decision), str(decided.reason))] += 1
            assert 1 <= rounds <= 6
    assert outcomes[("promote", "SpeedupConfirmed")] == 0, outcomes
    assert sum(outcomes.values()) == 400 and set(outcomes) <= {("rollback", "Inconclusive"), ("rollback", "SpeedupBelowThreshold")}, outcomes


def test_a_clear_loss_or_win_replayed_on_recorded_noise_is_decided_with_its_own_reason():
    # The same replay at 0.7x and 2x: the rollback is SpeedupBelowThreshold and the promotion SpeedupConfirmed on the
    # simulator's chat workload even beside a busy machine. Since the rollback side takes the servers' floor too
    # (stats.sequential_interval), beside a busy host where both simulators move together a few 0.7x probes of the
    # eagle3 pair stop by futility instead (4 of these 50): still a rollback, never a promotion.
    rules = RaceRules(max_rounds=6)
    for trace in recorded_traces("loaded"):
        if not trace.name.endswith("/chat"):
            continue
        rng = random.Random(trace.name)
        for truth, expected in ((0.7, "SpeedupBelowThreshold"), (2.0, "SpeedupConfirmed")):
            runs = [replay(trace, truth, rules, rng)[0] for _ in range(50)]
            reasons = Counter(str(d.reason) for d in runs)
            if truth > 1.0 or "/equal/" in trace.name:
                assert reasons == Counter({expected: 50}), (trace.name, truth, reasons)
            else:
                assert all(str(d.decision) == "rollback" for d in runs) and reasons[expected] >= 45, (trace.name, truth, reasons)


# --- The anytime-valid look levels (probe/sequential.py) ----------------------------------------------------------


@pytest.mark.parametrize("arms", [1, 2, 4])
@pytest.mark.parametrize("confidence", [0.95, 0.998])
def test_every_possible_look_together_spends_at_most_the_error_budget_per_side(confidence, arms):
    alpha = 1.0 - confidence
    for looks in (1, 2, 6, 7, 24, 1000, 100_000):
        promote, rollback = spent(confidence, looks, arms)
        assert promote <= alpha * (1 + 1e-12) and rollback <= alpha * (1 + 1e-12), (looks, promote, rollback)
    # The bound is used, not wasted: the spend approaches the budget as the looks grow.
    assert spent(confidence, 100_000, arms)[0] > 0.999 * alpha
    # An arm's share shrinks with the arms: the best of N is promoted no more often by luck than one candidate.
    assert look_levels(confidence, 2, arms).low_level >= look_levels(confidence, 2, 1).low_level


def test_a_look_has_the_same_level_whatever_the_budget_and_no_look_of_six_is_stricter_than_bonferroni():
    old = per_look_level(0.998, 6)  # the rule this replaced, at the API's default rollout.maxRounds
    for look in range(1, 7):
        levels = look_levels(0.998, look)
        # Wider levels are stricter: each side of each of the first six looks is at most the old level's.
        assert levels.high_level <= old and (look < PROMOTE_FROM_LOOK or levels.low_level <= old), (look, levels)
    assert look_levels(0.998, 1).low_level > 1 - 1e-12  # no promotion at the first look: nothing spent there
    # Later looks keep spending, ever less, so a budget of 24 rounds is valid too.
    late = [look_levels(0.998, k).low_level for k in range(7, 25)]
    assert all(a < b < 1.0 for a, b in itertools.pairwise(late))


def test_futility_projects_to_the_same_horizon_for_every_larger_budget():
    assert futility_horizon(4) == 4 and futility_horizon(6) == futility_horizon(24) == futility_horizon(100) == 6
    # Past round 6 it projects 3 rounds ahead (so a budget of 24 does not keep an undecidable probe to its end), the
    # same for every budget that reaches that far.
    assert futility_horizon(24, 6) == futility_horizon(100, 6) == 9 and futility_horizon(24, 8) == 11 and futility_horizon(10, 8) == 10
    near_one = [PairedRound(math.log(r), 0.04**2, 30.0) for r in (0.995, 1.01)]
    levels = look_levels(0.998, 2)
    iv = sequential_interval(near_one, levels)
    stops = [futile(iv, 1.0, futility_horizon(budget), look_levels(0.998, futility_horizon(budget)).low_level) for budget in (6, 12, 24)]
    assert stops == [True, True, True]


def test_a_sequential_interval_takes_each_bound_at_its_sides_level():
    rounds = [PairedRound(math.log(r), 0.05**2, 30.0) for r in (1.3, 1.4, 1.35)]
    levels = look_levels(0.998, 3)  # both sides spend at look 3, the promotion side more (alpha / 6 > 5 alpha / 36)
    iv = sequential_interval(rounds, levels)
    assert iv.high == pytest.approx(paired_interval(rounds, levels.high_level).high)
    assert iv.low == pytest.approx(paired_interval(rounds, levels.low_level).low)
    # At the first look the promotion side spends nothing: with a prior on the between-round variance both ends are the
    # rollback side's (no promotion is possible); without one, one round bounds nothing (stats.sequential_interval).
    first = look_levels(0.998, 1)
    prior = RoundPrior(0.05**2, 4.0)
    one = sequential_interval(rounds[:1], first, prior)
    assert (one.low, one.high) == pytest.approx(
        (paired_interval(rounds[:1], first.high_level, prior=prior).low, paired_interval(rounds[:1], first.high_level, prior=prior).high)
    )
    assert (sequential_interval(rounds[:1], first).low, sequential_interval(rounds[:1], first).high) == (0.0, math.inf)
    close = [PairedRound(math.log(r), 0.05**2, 30.0) for r in (1.35, 1.37)]
    assert judge_paired(sequential_interval(close, look_levels(0.998, 2)), 1.0) is Verdict.PASS
    # Two rounds that disagree by more than their blocks' noise: the between-round term, with its 1 df, counts in the
    # interval's df, so no promotion on them yet (vLLM's CPU build promoted equal servers 2.6-4 % of the time before).
    assert judge_paired(sequential_interval(rounds[:2], look_levels(0.998, 2)), 1.0) is Verdict.UNDECIDED
    assert sequential_interval(rounds[:2], look_levels(0.998, 2)).df < 5


def test_the_first_look_rolls_back_a_clear_loss_even_with_few_degrees_of_freedom():
    # One round at 0.36x from short measurements (8 df), with a prior on the between-round variance (earlier probes of
    # the same servers; without one the first look bounds nothing: tests/unit/test_stats_rollback.py): the promotion
    # side spends nothing at look 1, so its bound must not make the interval too wide to roll back (the simulation
    # study found no round-1 rollbacks otherwise).
    one = [PairedRound(math.log(0.36), 0.05**2, 8.0)]
    iv = sequential_interval(one, look_levels(0.998, 1), RoundPrior(0.03**2, 20.0))
    assert iv.high < 1.0 and width(iv) <= MAX_WIDTH, iv
    assert judge_paired(iv, 1.0) is Verdict.FAIL
    # ...and still never a promotion at the first look, however clear the win.
    win = [PairedRound(math.log(3.0), 0.05**2, 8.0)]
    assert judge_paired(sequential_interval(win, look_levels(0.998, 1), RoundPrior(0.03**2, 20.0)), 1.0) is Verdict.UNDECIDED
