"""The speedup curve over load: where does speculation stop paying? (pure)

Each workload is measured at one concurrency, so the workloads together give the speedup as a function of
concurrency, each point with its interval. The break-even concurrency is where that curve crosses 1.0: found
between the two measured points around the first crossing, interpolating log speedup linearly in log concurrency
(both span orders of magnitude, and a throughput ratio is multiplicative). Its interval comes from the same
interpolation of the interval ends: the pessimistic curve (each point's low end) crosses 1.0 on one side of the
estimate, the optimistic curve (high ends) on the other. An end whose curve does not cross in the measured
range is open: the break-even may lie below the smallest or above the largest concurrency measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CurvePoint:
    concurrency: int
    speedup: float
    low: float | None = None  # interval ends; None = unbounded on that side
    high: float | None = None


@dataclass(frozen=True)
class BreakEven:
    concurrency: float | None  # where the estimate crosses 1.0; None when it does not in the measured range
    low: float | None  # the interval on it; None = open (beyond the measured range on that side)
    high: float | None
    summary: str  # one line for humans and `kubectl get -o wide`


def _crossing(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The first x where the piecewise log-log line through (xs, ys) crosses y = 1, or None."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if (y0 >= 1.0) == (y1 >= 1.0):
            continue
        l0, l1 = math.log(y0), math.log(y1)
        fraction = l0 / (l0 - l1)
        return math.exp(math.log(x0) + fraction * (math.log(x1) - math.log(x0)))
    return None


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def break_even(points: Sequence[CurvePoint]) -> BreakEven | None:
    """The break-even concurrency of measured points (None with fewer than two distinct concurrencies)."""
    usable = sorted((p for p in points if p.speedup > 0 and math.isfinite(p.speedup)), key=lambda p: p.concurrency)
    by_concurrency: dict[int, CurvePoint] = {}
    for point in usable:  # one point per concurrency: the first measured
        by_concurrency.setdefault(point.concurrency, point)
    curve = list(by_concurrency.values())
    if len(curve) < 2:
        return None
    xs = [float(p.concurrency) for p in curve]
    span = f"{curve[0].concurrency}-{curve[-1].concurrency}"
    estimate = _crossing(xs, [p.speedup for p in curve])
    if estimate is None:
        side = "faster" if curve[0].speedup >= 1.0 else "slower"
        return BreakEven(None, None, None, f"none in {span} ({side} at every measured concurrency)")
    falling = curve[0].speedup >= 1.0
    # A missing low end is 0 (the pessimistic curve is below 1 there); a missing high end is unbounded.
    pessimistic = _crossing(xs, [p.low if p.low is not None and p.low > 0 else 1e-9 for p in curve])
    optimistic = _crossing(xs, [p.high if p.high is not None and math.isfinite(p.high) else 1e9 for p in curve])
    # Falling curve: the pessimistic curve crosses first (the lower bound), the optimistic one last; rising: mirrored.
    low, high = (pessimistic, optimistic) if falling else (optimistic, pessimistic)
    # A noisy bound curve may first cross the other way; the interval still holds the estimate.
    low = min(low, estimate) if low is not None else None
    high = max(high, estimate) if high is not None else None
    low_text = _fmt(low) if low is not None else f"<{curve[0].concurrency}"
    high_text = _fmt(high) if high is not None else f">{curve[-1].concurrency}"
    return BreakEven(estimate, low, high, f"{_fmt(estimate)} [{low_text}, {high_text}]")
