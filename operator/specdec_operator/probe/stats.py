"""Paired-ratio statistics for the probe: Student-t intervals on log speedups, at each look's own level.

Two methods: the within-round one (``paired_interval``, below: time blocks inside each measurement as evidence,
or, for measurements too short for their own blocks, coarser blocks pooled over all rounds of that server and
workload (``pooled_block_variance``), plus the spread between rounds), which the probe uses, and the round-level
one (``log_ratio_interval``), its fallback when there is no block evidence at all (the first round of a short
workload, or one with fewer than two coarse blocks). Why the round-level one (docs/probe.md has
the longer argument, and the within-round method's):

* The unit of evidence is a *round*: base and candidate measured back to back on the same machine. Requests
  inside one measurement share a batch and are not independent, so they are never treated as samples.
* A probe has a handful of rounds (3 to ~10). A percentile bootstrap over 3-5 values is badly calibrated
  (it cannot produce an interval wider than the sample's range, so its coverage is far below nominal). An
  exact sign test needs at least 6 unanimous pairs for 95 % and throws away magnitudes.
* Throughput ratios are multiplicative and roughly log-normal, so the t-interval is computed on
  ``log(candidate / base)`` per round and exponentiated. With n rounds it has n-1 degrees of freedom: wide
  when n is small, which is the honest answer.
* The probe looks at the interval after every round and stops as soon as it is decisive. Each look spends
  its own part of the error budget, from a sequence that sums to the budget over every possible look
  (probe/sequential.py), so the chance of a wrong decision over the whole probe stays below ``1 - confidence``
  however many rounds the budget allows (:func:`sequential_interval`). :func:`per_look_level` (Bonferroni over a
  fixed number of looks) is the rule it replaced, kept for the benchmarks that compare the two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .sequential import NOTHING_SPENT, LookLevels


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Cumulative distribution function of Student's t with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse of :func:`t_cdf` (bisection; accurate to ~1e-10 for 0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be within (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return hi
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class RatioInterval:
    """A speedup estimate: geometric mean of paired ratios and its confidence interval."""

    estimate: float
    low: float
    high: float
    n: int
    level: float  # the confidence level of this one interval (after the correction for looks)


def per_look_level(confidence: float, looks: int) -> float:
    """Confidence level of each interval so that ``looks`` of them together err with at most ``1 - confidence``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be within (0, 1)")
    return 1.0 - (1.0 - confidence) / max(1, looks)


def log_ratio_interval(ratios: Sequence[float], level: float) -> RatioInterval:
    """Two-sided Student-t interval for the geometric mean of ``ratios`` at ``level`` (needs n >= 2).

    With n == 1 (or a non-positive ratio) the interval is (0, inf): one round proves nothing.
    """
    n = len(ratios)
    if n == 0:
        raise ValueError("no ratios")
    if any(r <= 0 or not math.isfinite(r) for r in ratios):
        return RatioInterval(0.0, 0.0, math.inf, n, level)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / n
    if n < 2:
        return RatioInterval(math.exp(mean), 0.0, math.inf, n, level)
    var = sum((x - mean) ** 2 for x in logs) / (n - 1)
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * math.sqrt(var / n)
    return RatioInterval(_exp(mean), _exp(mean - half), _exp(mean + half), n, level)


def _exp(x: float) -> float:
    """exp that saturates at inf: with one degree of freedom and a strict per-look level the t quantile is in the
    tens of thousands, and noisy rounds made math.exp overflow (OverflowError, a ProbeFailed where the truth is
    Inconclusive; found by benchmarks/scale.py with 500 probes sharing two simulators)."""
    return math.exp(x) if x < 709.0 else math.inf


def weighted_round_ratios(per_workload: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> list[float]:
    """Per round, the weight-averaged speedup over workloads (arithmetic, as a traffic mix adds up).

    Only rounds in which every workload was measured count.
    """
    names = list(per_workload)
    n = min(len(per_workload[name]) for name in names) if names else 0
    total = sum(weights[name] for name in names)
    return [sum(weights[name] * per_workload[name][r] for name in names) / total for r in range(n)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def weighted_percentile(pairs: Sequence[tuple[float, int]], q: float) -> float | None:
    """Percentile of values given as (value, count) pairs, without expanding them."""
    items = sorted((v, c) for v, c in pairs if c > 0)
    total = sum(c for _, c in items)
    if total == 0:
        return None
    rank = q / 100.0 * (total - 1)
    seen = 0
    for value, count in items:
        seen += count
        if seen - 1 >= rank:
            return value
    return items[-1][0]


# --- Within-measurement evidence (batch means) ------------------------------------------------------------------

# Time blocks per measurement: as many as give every concurrent stream EVENTS_PER_BLOCK stream events in a
# block (finer blocks only split one event's smoothed tokens over neighbours: correlated, not new evidence),
# at most MAX_BLOCKS; below MIN_BLOCKS a measurement has no within-measurement evidence.
BLOCKS = 40
MAX_BLOCKS = 40
MIN_BLOCKS = 8
EVENTS_PER_BLOCK = 4


def blocks_for(events: int, streams: int) -> int:
    """Blocks for a measurement of ``events`` stream events over ``streams`` concurrent requests (0: none)."""
    k = min(MAX_BLOCKS, events // max(1, streams * EVENTS_PER_BLOCK))
    return k if k >= MIN_BLOCKS else 0


def block_rates(arrivals: Sequence[tuple[float, float, int]], start: float, duration: float, blocks: int = BLOCKS) -> list[float]:
    """Output tok/s in ``blocks`` equal time blocks of ``[start, start + duration]``.

    Each stream event's tokens are spread evenly over ``[event start, event end]`` (the gap since the same
    request's previous event), so a stream that sends 16 tokens per event does not quantize the blocks.
    The blocks' mean is the measurement's tok/s (tokens / duration) exactly.
    """
    if duration <= 0 or blocks < 1:
        return []
    width = duration / blocks
    tokens = [0.0] * blocks
    for t0, t1, n in arrivals:
        a, b = min(max(t0 - start, 0.0), duration), min(max(t1 - start, 0.0), duration)
        if b - a <= 1e-9 * duration:
            tokens[min(blocks - 1, int(b / width))] += n
            continue
        rate = n / (b - a)
        for j in range(int(a / width), min(blocks - 1, int(b / width)) + 1):
            overlap = min(b, (j + 1) * width) - max(a, j * width)
            if overlap > 0:
                tokens[j] += rate * overlap
    return [x / width for x in tokens]


@dataclass(frozen=True)
class LogRate:
    """A measurement's log tok/s with the variance of that log from its own time blocks, and the variance's df."""

    log_rate: float
    var: float
    df: float
    # Key of a variance estimate that several measurements share (pooled_block_variance: one estimate from all rounds
    # of one server on one workload); None: this measurement's own. A shared estimate's df counts once, not per round.
    pool: str | None = None


def log_rate(rate: float, rates: Sequence[float]) -> LogRate:
    """Delta-method variance of ``log(rate)`` from the block rates: a robust scale of successive differences.

    A closed loop's throughput has structure that repeats in every measurement (the prefill stall of each
    wave, the drain of the last one): a handful of large jumps between blocks that are no noise at all. The
    successive difference ``y[j+1] - y[j]`` removes slow trends, and its median absolute value (MAD; for
    normal blocks ``|d|`` has median ``0.6745 * sqrt(2) * sigma``) ignores the few jumps. Its degrees of
    freedom are about 37 % of the ``K - 1`` differences (the MAD's efficiency at the normal).
    """
    k = len(rates)
    if rate <= 0 or not math.isfinite(rate) or k < 3:
        return LogRate(math.log(rate) if rate > 0 and math.isfinite(rate) else -math.inf, math.inf, 1.0)
    # Two neighbouring blocks without tokens (a prefill stall) say nothing about the noise.
    floor = 1e-6 * rate
    diffs = sorted(abs(rates[j + 1] - rates[j]) for j in range(k - 1) if rates[j] > floor or rates[j + 1] > floor)
    m = len(diffs)
    if m < 3:
        return LogRate(math.log(rate), math.inf, 1.0)
    mad = diffs[m // 2] if m % 2 else (diffs[m // 2 - 1] + diffs[m // 2]) / 2.0
    sigma = mad / (0.6744897501960817 * math.sqrt(2.0))
    return LogRate(math.log(rate), sigma * sigma / k / (rate * rate), max(1.0, 0.37 * m))


# Pooled block variance, for measurements with too few stream events for their own MIN_BLOCKS blocks (short
# workloads: 64 requests x 64 tokens at concurrency 32, or one wave of 128 long streams) and for those whose own blocks
# give fewer degrees of freedom than the pool (with_pooled_variance): coarser blocks, as many as
# give every stream POOLED_EVENTS_PER_BLOCK events (at least MIN_POOLED_BLOCKS), the same number in every measurement
# of one server on one workload, and the noise estimated over all of them (pooled_block_variance).
POOLED_EVENTS_PER_BLOCK = 2
MIN_POOLED_BLOCKS = 2


def pooled_blocks_for(events: int, streams: int) -> int:
    """Blocks per measurement for the pooled estimate (0: too few events even for that)."""
    k = min(MAX_BLOCKS, events // max(1, streams * POOLED_EVENTS_PER_BLOCK))
    return k if k >= MIN_POOLED_BLOCKS else 0


def pooled_block_variance(profiles: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """Variance of one measurement's log tok/s, and its df, from the block rates of repeated measurements.

    ``profiles``: one server's block rates on one workload, one row per measurement (round), the same number K of
    blocks in each. A closed loop repeats its structure (the waves' prefill stalls, the drain) in every measurement
    of the same workload, so instead of ignoring a few large jumps (what the MAD in :func:`log_rate` does) the
    variance is taken per block position, over the measurements: the repeated structure is each position's mean
    and drops out, whatever its shape, and each position keeps its own noise (a prefill block is not as noisy as a
    decode block). With the blocks independent, a measurement's tok/s has variance ``sum_j s_j^2 / K^2``; on the
    log scale divided by the mean rate squared; df by Satterthwaite over the K positions, each with R - 1.
    Structure that does not repeat (waves that drift in phase) and level changes between rounds stay in the
    variance: wider, never narrower. None with fewer than two rows or two blocks.
    """
    rows = [list(p) for p in profiles if len(p) >= MIN_POOLED_BLOCKS]
    if len(rows) < 2 or len(rows) != len(profiles) or len({len(r) for r in rows}) != 1:
        return None
    r, k = len(rows), len(rows[0])
    level = sum(map(sum, rows)) / (r * k)
    if not level > 0 or not math.isfinite(level):
        return None
    column_vars = []
    for j in range(k):
        col = [row[j] / level for row in rows]
        mean = sum(col) / r
        column_vars.append(sum((x - mean) ** 2 for x in col) / (r - 1))
    return sum(column_vars) / (k * k), satterthwaite([(v, float(r - 1)) for v in column_vars])


def with_pooled_variance(rates: Sequence[LogRate], profiles: Sequence[Sequence[float]], key: str) -> list[LogRate]:
    """One server's measurements of one workload, each with the better-founded of its own variance and the pooled one.

    ``profiles``: the same measurements' coarse blocks (:func:`pooled_block_variance`). A measurement takes the
    pooled estimate, marked with ``key`` (its df counts once however many rounds share it), when it has no variance
    of its own (too few events for MIN_BLOCKS blocks) or when the pooled one has more degrees of freedom. The choice
    compares degrees of freedom (set mostly by the block counts and the number of rounds), never which variance is
    smaller: picking the smaller one would understate the noise.
    """
    pooled = pooled_block_variance(profiles)
    if pooled is None:
        return list(rates)
    var, df = pooled
    return [
        lr if not math.isfinite(lr.log_rate) or (math.isfinite(lr.var) and lr.df >= df) else LogRate(lr.log_rate, var, df, pool=key) for lr in rates
    ]


@dataclass(frozen=True)
class PairedRound:
    """One round of one workload (or of the weighted mix): log speedup, its within-round variance and df."""

    log_ratio: float
    var: float
    df: float
    # The variance's components (pool key or None, variance, df); empty: one independent component (var, df).
    parts: tuple[tuple[str | None, float, float], ...] = ()
    # The two servers' own log tok/s this round (speculative, base): paired_interval's floor on the between-round
    # variance (server_spread). None: not known (a round built from a log ratio alone); the floor is then not applied.
    levels: tuple[float, float] | None = None

    def components(self) -> tuple[tuple[str | None, float, float], ...]:
        return self.parts or ((None, self.var, self.df),)


def paired_round(speculative: LogRate, base: LogRate) -> PairedRound:
    """The round's log speedup; variance of a difference of two independent measurements, Satterthwaite df."""
    var = speculative.var + base.var
    parts = ((speculative.pool, speculative.var, speculative.df), (base.pool, base.var, base.df))
    return PairedRound(speculative.log_rate - base.log_rate, var, pooled_satterthwaite(parts), parts, (speculative.log_rate, base.log_rate))


def pooled_satterthwaite(parts: Sequence[tuple[str | None, float, float]]) -> float:
    """Satterthwaite df of a sum of variance components, where components with the same pool key are one estimate
    (scaled copies of it: their variances add, and its df counts once)."""
    merged: dict[str, tuple[float, float]] = {}
    free: list[tuple[float, float]] = []
    for key, var, df in parts:
        if key is None:
            free.append((var, df))
        else:
            v, d = merged.get(key, (0.0, df))
            merged[key] = (v + var, min(d, df))
    return satterthwaite(free + list(merged.values()))


def satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates ``(var, df)``."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if df > 0)
    if not math.isfinite(total) or total <= 0 or denom <= 0:
        return max(1.0, min((df for _, df in parts), default=1.0))
    return max(1.0, total * total / denom)


def weighted_paired_round(rounds: Mapping[str, PairedRound], weights: Mapping[str, float]) -> PairedRound:
    """The round's weight-averaged speedup ``sum(w r) / sum(w)`` (arithmetic, as a traffic mix adds up) as a log,
    with its delta-method variance. Its server levels (for paired_interval's floor) are the workloads' log tok/s
    averaged with the traffic weights, when every workload has them: fixed weights, so that only the servers' moves
    make them spread between rounds (the delta method's ``w_i r_i / sum(w r)`` change with the ratios, and a change of
    0.01 in a weight would move a level of ~7 (log tok/s) by 0.07)."""
    total = sum(weights[name] for name in rounds)
    ratios = {name: math.exp(p.log_ratio) for name, p in rounds.items()}
    mix = sum(weights[name] * ratios[name] for name in rounds) / total
    share = {name: weights[name] * ratios[name] / (total * mix) for name in rounds}
    parts = tuple((key, share[name] ** 2 * var, df) for name, p in rounds.items() for key, var, df in p.components())
    known = [(weights[name] / total, p.levels) for name, p in rounds.items() if p.levels is not None]
    levels = (sum(c * lv[0] for c, lv in known), sum(c * lv[1] for c, lv in known)) if len(known) == len(rounds) else None
    return PairedRound(math.log(mix), sum(v for _, v, _ in parts), pooled_satterthwaite(parts), parts, levels)


def regularized_gamma_q(a: float, x: float) -> float:
    """Q(a, x) = 1 - P(a, x), the upper regularized incomplete gamma function (series / continued fraction)."""
    if x <= 0.0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 3e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 3e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: float) -> float:
    """P(X > x) for X ~ chi-square with ``df`` degrees of freedom."""
    return regularized_gamma_q(df / 2.0, x / 2.0)


# Rounds that disagree more than their own time blocks explain (Cochran's Q, p below this): the within-round
# variance is not trusted and the interval falls back to the rounds alone (n - 1 degrees of freedom).
HETEROGENEITY_P = 0.01


@dataclass(frozen=True)
class PairedInterval(RatioInterval):
    """A :class:`RatioInterval` from within-round evidence, with how it was formed."""

    df: float = 0.0
    se: float = math.inf  # standard error of the mean log ratio (the interval is mean +- t(level, df) * se)
    heterogeneous: bool = False  # rounds disagreed beyond their blocks' noise: round-level df used
    within: bool = True  # False: some measurement had too few stream events for blocks; the round-level t-interval


def _spread(values: Sequence[float]) -> float:
    """Sample variance (n - 1 denominator) of at least two values."""
    mean = sum(values) / len(values)
    return sum((x - mean) ** 2 for x in values) / (len(values) - 1)


def server_spread(rounds: Sequence[PairedRound]) -> float | None:
    """``var(speculative log tok/s) + var(base log tok/s)`` over the rounds: what a round's log ratio would spread by
    if each server's own moves between its measurements were its own (None: fewer than two rounds, or a round without
    finite server levels)."""
    if len(rounds) < 2 or any(r.levels is None or not all(map(math.isfinite, r.levels)) for r in rounds):
        return None
    return _spread([r.levels[0] for r in rounds if r.levels]) + _spread([r.levels[1] for r in rounds if r.levels])


def round_variance(rounds: Sequence[PairedRound], server_floor: bool = True) -> float:
    """The variance of one round's log ratio as the rounds show it (n >= 2): the larger of the log ratios' own spread
    and :func:`server_spread`.

    Noise that the time blocks miss (a server's level moving between its measurements: on vLLM's CPU build each
    server's log tok/s spreads 0.11-0.15 between rounds where its blocks imply 0.04) reaches the ratio through each
    server. The ratio's spread sees it as one contrast per round, at round 2 a single difference that is small by
    chance often enough to let equal servers promote (docs/benchmarks/probe-study.md: 2.7 % of probes). Each server's
    own spread is two more looks at the same noise: ``var(d) = var(s) + var(b) - 2 cov(s, b)``, so their sum is at
    least the ratio's variance whenever the servers' moves are not opposed (a host's load moves both the same way,
    ``cov >= 0``: then it cancels in the ratio and this floor only overstates). As a floor it can only widen the
    interval; its df stay n - 1 (the between-round term's, in :func:`paired_interval`)."""
    ratio = _spread([r.log_ratio for r in rounds])
    servers = server_spread(rounds) if server_floor else None
    return ratio if servers is None else max(ratio, servers)


@dataclass(frozen=True)
class RoundPrior:
    """What earlier probes of the same servers said about the variance of one round's log ratio between rounds: an
    estimate (``var``, as :func:`round_variance` gives it) and its degrees of freedom (``df``: the earlier probe's
    rounds - 1). :func:`paired_interval` pools it with this probe's own between-round spread (a scaled inverse
    chi-square prior: ``(df var + (n - 1) s^2) / (df + n - 1)`` with ``df + n - 1`` degrees of freedom)."""

    var: float
    df: float

    def usable(self) -> bool:
        """A prior counts from PRIOR_MIN_DF degrees of freedom: a one-df estimate (one earlier probe of two rounds) is
        small by chance too often (chi-square with 1 df has most of its mass near 0), and Satterthwaite's df grows as
        the estimate shrinks, so it would let the first look stand on the time blocks alone again."""
        return math.isfinite(self.var) and self.var >= 0 and math.isfinite(self.df) and self.df >= PRIOR_MIN_DF


# The fewest degrees of freedom a prior counts with (RoundPrior.usable).
PRIOR_MIN_DF = 2.0

# The key of the weighted mix's prior in RaceRules.round_priors (policy weighted: the mix's rounds decide).
WEIGHTED_MIX = "*weighted*"

# The most degrees of freedom a prior carries into a probe: earlier probes' spread counts, but never so much that it
# outweighs what the probe's own rounds say when the servers' noise has changed since (the study's prior: 5 df, a
# previous probe of 6 rounds; docs/benchmarks/probe-study.md).
PRIOR_MAX_DF = 5.0


def round_prior(rounds: Sequence[PairedRound], earlier: RoundPrior | None = None, max_df: float = PRIOR_MAX_DF) -> RoundPrior | None:
    """The prior a decided probe leaves for the next probe of the same servers and workload: its rounds' between-round
    variance (:func:`round_variance`, with the servers' floor; n - 1 df) pooled with ``earlier``'s (the prior it had
    itself), the df capped at ``max_df`` (an older estimate's weight shrinks as newer ones come). None: fewer than two
    rounds and no earlier prior."""
    own = (round_variance(rounds), float(len(rounds) - 1)) if len(rounds) >= 2 else None
    if own is not None and not (math.isfinite(own[0]) and own[0] >= 0):
        own = None
    kept = earlier is not None and math.isfinite(earlier.var) and earlier.var >= 0 and math.isfinite(earlier.df) and earlier.df > 0
    parts = [p for p in ((earlier.var, earlier.df) if earlier is not None and kept else None, own) if p is not None]
    if not parts:
        return None
    df = sum(d for _, d in parts)
    return RoundPrior(sum(v * d for v, d in parts) / df, min(df, max_df))


def between_round(rounds: Sequence[PairedRound], server_floor: bool = True, prior: RoundPrior | None = None) -> tuple[float, float] | None:
    """The variance of one round's log ratio between rounds and its df: this probe's (:func:`round_variance`, n - 1 df)
    pooled with ``prior``'s; the prior alone at n = 1; None when there is neither (one round, no prior)."""
    n = len(rounds)
    own = (round_variance(rounds, server_floor), float(n - 1)) if n >= 2 else None
    if prior is None or not prior.usable():
        return own
    if own is None:
        return prior.var, prior.df
    df = prior.df + own[1]
    return (prior.df * prior.var + own[1] * own[0]) / df, df


def paired_interval(rounds: Sequence[PairedRound], level: float, server_floor: bool = True, prior: RoundPrior | None = None) -> PairedInterval:
    """Two-sided interval for the speedup from ``n`` rounds of within-round evidence (``server_floor``: the between-round
    term with :func:`round_variance`'s floor from the servers' own spreads; False: the log ratios' spread alone;
    ``prior``: earlier probes' between-round variance, pooled with this probe's by :func:`between_round`, which also
    gives a one-round interval a between-round term).

    Estimate: ``exp(mean(log ratio))``. Variance of that mean: the within-round one (``sum(var) / n^2``,
    what the time blocks of each measurement say) plus, from two rounds on, the between-round one
    (``round_variance / n``: the log ratios' spread, or each server's own spread summed when that is larger: a host
    hiccup, drift and round effects that the robust block scale does not see; when there are none it roughly doubles
    the variance, the price of not trusting the blocks alone). Quantile:
    Student t with the Satterthwaite df of all those components (the between-round one with n - 1), unless Cochran's Q says the rounds disagree beyond
    their within-round variances (p < HETEROGENEITY_P): then the round-level t with n - 1 df. When a
    measurement had no blocks (too few stream events), the round-level :func:`log_ratio_interval`. With a usable
    ``prior`` (:meth:`RoundPrior.usable`) whose pooled between-round term has more df than that sum: the between-round
    variance alone, with its df (:func:`_prior_interval`).
    """
    n = len(rounds)
    if n == 0:
        raise ValueError("no rounds")
    if any(r.var == math.inf for r in rounds) and all(math.isfinite(r.log_ratio) for r in rounds):
        old = log_ratio_interval([math.exp(r.log_ratio) for r in rounds], level)
        se = math.log(old.high / old.estimate) / t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) if n >= 2 and math.isfinite(old.high) else math.inf
        return PairedInterval(old.estimate, old.low, old.high, n, level, df=float(n - 1), se=se, within=False)
    finite = all(math.isfinite(r.log_ratio) and math.isfinite(r.var) for r in rounds)
    mean = sum(r.log_ratio for r in rounds) / n if all(math.isfinite(r.log_ratio) for r in rounds) else math.nan
    if not finite or not math.isfinite(mean):
        est = _exp(mean) if math.isfinite(mean) else 0.0
        return PairedInterval(est, 0.0, math.inf, n, level, df=0.0)
    var = sum(r.var for r in rounds) / (n * n)
    within = [(key, v / (n * n), d) for r in rounds for key, v, d in r.components()]
    df = pooled_satterthwaite(within)
    heterogeneous = False
    spread = between_round(rounds, server_floor, prior)
    if spread is not None:
        between, between_df = spread[0] / n, spread[1]
        var += between
        # The between-round term is an estimate too, with n - 1 degrees of freedom (plus the prior's): it counts in the
        # Satterthwaite df. Without it a noise the time blocks do not see (vLLM's CPU build: a round's log ratio spread
        # 0.144 where its blocks implied 0.06) made a two-round interval a t with the blocks' many df, and equal servers
        # were promoted 2.6-4 % of the time (docs/benchmarks/probe-study.md); with it, such an interval is as wide as
        # n - 1 df allow.
        df = pooled_satterthwaite(within + [(None, between, between_df)])
        if n >= 2 and all(r.var > 0 for r in rounds):
            weights = [1.0 / r.var for r in rounds]
            pooled = sum(w * r.log_ratio for w, r in zip(weights, rounds)) / sum(weights)
            q = sum(w * (r.log_ratio - pooled) ** 2 for w, r in zip(weights, rounds))
            heterogeneous = chi2_sf(q, n - 1) < HETEROGENEITY_P
        if heterogeneous:
            df = between_df
        if prior is not None and prior.usable() and between_df > df:
            return _prior_interval(mean, n, level, spread)
    if var <= 0:
        return PairedInterval(_exp(mean), _exp(mean), _exp(mean), n, level, df=df, se=0.0, heterogeneous=heterogeneous)
    se = math.sqrt(var)
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se
    return PairedInterval(_exp(mean), _exp(mean - half), _exp(mean + half), n, level, df=df, se=se, heterogeneous=heterogeneous)


def _prior_interval(mean: float, n: int, level: float, spread: tuple[float, float]) -> PairedInterval:
    """The interval of ``n`` rounds from the between-round variance alone, when a prior makes it better founded than the
    sum of the blocks' variance and it (:func:`paired_interval`: its df, the prior's plus the rounds' n - 1, above the
    sum's Satterthwaite df): the t-interval of the mean log ratio with variance ``spread[0] / n`` and ``spread[1]`` df.

    Why the time blocks may drop out: the variance of one round's log ratio between rounds is the whole noise of a round,
    the part the blocks see included, so the sum counts that part twice, and where the blocks give few degrees of
    freedom (a short workload's pooled blocks over two measurements: ~3 df) their term drags the sum's Satterthwaite df
    below the between-round term's own. The t-interval with the pooled between-round variance alone is exact for
    normal rounds whose spread the prior measured (its estimate and the probe's are independent chi-squares of the same
    variance; the servers' floor only widens it). Where the blocks have many df (most workloads with their own blocks,
    vLLM's CPU build), the sum's df are the larger and the sum stays; without a prior it always does (the between-round
    term has 1 df at round 2). The choice compares degrees of freedom, never which interval is narrower (as
    :func:`with_pooled_variance`'s). docs/probe.md, "With a prior, the rounds' spread alone when it has more df", has
    the study (docs/benchmarks/probe-study.md, "What the best test could do")."""
    var, df = spread[0] / n, spread[1]
    if var <= 0:
        return PairedInterval(_exp(mean), _exp(mean), _exp(mean), n, level, df=df, se=0.0)
    se = math.sqrt(var)
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se
    return PairedInterval(_exp(mean), _exp(mean - half), _exp(mean + half), n, level, df=df, se=se)


def sequential_interval(rounds: Sequence[PairedRound], levels: LookLevels, prior: RoundPrior | None = None) -> PairedInterval:
    """:func:`paired_interval` for one look of the sequential probe (probe/sequential.py): the low end at the promotion
    side's level, the high end at the rollback side's, so each bound spends exactly this look's share of its side.
    ``level`` on the result is the promotion side's (futility projects with it). ``prior``: the between-round variance
    that earlier probes of the same servers measured (:class:`RoundPrior`), pooled with this probe's.

    Both sides take the servers' floor on the between-round variance (:func:`round_variance`): at round 2 the ratio's
    spread is a single difference, small by chance often enough to make either bound too tight when the rounds move
    beyond what the time blocks see (vLLM's CPU build). For the same reason no bound comes from one round alone: with
    one round and no prior nothing measures the between-round noise (on the study's longer vLLM trace a round's log
    ratio spreads 0.33 where its blocks imply 0.06, and a 1.05x truth was rolled back after round 1 in 16 % of probes),
    so the first look's interval is ``[0, inf)`` then. With a prior the first look may roll back a clear loss; it never
    promotes (the promotion side spends nothing there: the interval is the rollback side's on both ends, so that its
    low end costs no promotion error and an unbounded one does not make it too wide, decide.MAX_WIDTH)."""
    high = paired_interval(rounds, levels.high_level, prior=prior)
    if len(rounds) < 2 and between_round(rounds, prior=prior) is None:
        return replace(high, low=0.0, high=math.inf)
    if levels.high_level == levels.low_level or levels.low_level >= NOTHING_SPENT:
        return high
    low = paired_interval(rounds, levels.low_level, prior=prior)
    return replace(low, high=high.high)
