"""Why the probe uses a t-interval on log ratios with a correction for repeated looks (docs/probe.md).

Monte Carlo over synthetic paired rounds (log-normal round-to-round noise, which is what throughput
ratios look like): pure statistics, no servers.

1. Coverage of a nominal 95 % interval with n rounds: percentile bootstrap vs Student-t on log ratios.
2. Error rates of the whole sequential rule (look after every round from round 3, stop when decisive):
   how often equal servers get promoted, and how many rounds a real 1.3x / 1.1x speedup needs - with the
   Bonferroni-corrected level the probe uses, and without the correction.

Usage: .venv/bin/python benchmarks/probe_calibration.py [--trials 4000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys

from specdec_operator.probe.decide import MIN_ROUNDS, Verdict, judge
from specdec_operator.probe.stats import log_ratio_interval, per_look_level


def bootstrap_interval(ratios: list[float], level: float, rng: random.Random, resamples: int = 400) -> tuple:
    n = len(ratios)
    logs = [math.log(r) for r in ratios]
    means = sorted(sum(rng.choice(logs) for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return math.exp(lo), math.exp(hi)


def coverage(trials: int, sigma: float, rng: random.Random) -> list[dict]:
    rows = []
    truth = 1.25
    for n in (3, 4, 5, 6, 8):
        t_hits = b_hits = 0
        for _ in range(trials):
            ratios = [truth * math.exp(rng.gauss(0, sigma)) for _ in range(n)]
            iv = log_ratio_interval(ratios, 0.95)
            t_hits += iv.low <= truth <= iv.high
            lo, hi = bootstrap_interval(ratios, 0.95, rng)
            b_hits += lo <= truth <= hi
        rows.append({"rounds": n, "t_interval_coverage": round(t_hits / trials, 3), "percentile_bootstrap_coverage": round(b_hits / trials, 3)})
    return rows


def sequential(trials: int, sigma: float, truth: float, max_rounds: int, corrected: bool, rng: random.Random, confidence: float = 0.95) -> dict:
    looks = max(1, max_rounds - MIN_ROUNDS + 1) if corrected else 1
    level = per_look_level(confidence, looks)
    promote = reject = 0
    rounds_used = 0
    for _ in range(trials):
        ratios: list[float] = []
        for _ in range(max_rounds):
            ratios.append(truth * math.exp(rng.gauss(0, sigma)))
            verdict = judge(log_ratio_interval(ratios, level), 1.0)
            if verdict is not Verdict.UNDECIDED:
                promote += verdict is Verdict.PASS
                reject += verdict is Verdict.FAIL
                break
        rounds_used += len(ratios)
    return {
        "confidence": confidence,
        "truth": truth,
        "sigma": sigma,
        "max_rounds": max_rounds,
        "bonferroni": corrected,
        "per_look_level": round(level, 4),
        "promote_rate": round(promote / trials, 4),
        "reject_rate": round(reject / trials, 4),
        "mean_rounds": round(rounds_used / trials, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=4000)
    args = parser.parse_args()
    rng = random.Random(2026)
    for row in coverage(args.trials // 4, 0.05, rng):
        print(json.dumps({"part": "coverage", "sigma": 0.05, **row}))
    for truth in (1.0, 1.1, 1.3):
        for sigma in (0.03, 0.08):
            for corrected in (True, False):
                print(json.dumps({"part": "sequential", **sequential(args.trials, sigma, truth, 6, corrected, rng)}))
    # The probe's default: family-wise 0.998 (the null needs many trials to see its small rate).
    for truth, sigma in ((1.0, 0.03), (1.0, 0.08), (1.15, 0.02), (1.3, 0.02), (1.3, 0.08), (2.0, 0.03), (2.0, 0.1), (0.7, 0.03), (0.4, 0.03)):
        for confidence in (0.99, 0.998):
            trials = args.trials * 5 if truth == 1.0 else args.trials // 2
            print(json.dumps({"part": "sequential", **sequential(trials, sigma, truth, 6, True, rng, confidence)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
