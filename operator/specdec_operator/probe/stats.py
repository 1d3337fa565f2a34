"""Paired-ratio statistics for the probe: Student-t intervals on log speedups, corrected for repeated looks.

Why this method (docs/probe.md has the longer argument):

* The unit of evidence is a *round*: base and candidate measured back to back on the same machine. Requests
  inside one measurement share a batch and are not independent, so they are never treated as samples.
* A probe has a handful of rounds (3 to ~10). A percentile bootstrap over 3-5 values is badly calibrated
  (it cannot produce an interval wider than the sample's range, so its coverage is far below nominal). An
  exact sign test needs at least 6 unanimous pairs for 95 % and throws away magnitudes.
* Throughput ratios are multiplicative and roughly log-normal, so the t-interval is computed on
  ``log(candidate / base)`` per round and exponentiated. With n rounds it has n-1 degrees of freedom: wide
  when n is small, which is the honest answer.
* The probe looks at the interval after every round and stops as soon as it is decisive. Each look spends
  part of the error budget (Bonferroni over the possible looks), so the chance of a wrong decision over the
  whole probe stays below ``1 - confidence`` instead of growing with every extra round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
