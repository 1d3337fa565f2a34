"""benchmarks/probe_study_oracle.py's references on a tiny synthetic trace whose answers can be worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from specdec_operator.probe.stats import LogRate
from tests.support.benchmarks import load_benchmark


def _trace(ratios_odd: list[float], ratios_even: list[float]) -> tuple[Any, Any]:
    """The benchmark module and a Trace of these log ratios per server order."""
    oracle = load_benchmark("probe_study_oracle")
    row = lambda d: (LogRate(7.0 + d, 1e-4, 10.0), LogRate(7.0, 1e-4, 10.0), (), ())  # noqa: E731
    rows = [*ratios_odd, *ratios_even]
    return oracle, oracle.ps.Trace("t/pair/w", tuple(map(row, ratios_odd)), tuple(map(row, ratios_even)), sum(rows) / len(rows), 1.0, 1.0)


def test_the_known_variance_test_enumerates_every_pair_of_rounds():
    # Rounds of log ratio +-0.1 in each order (mean 0, variance 0.01 per round): after two rounds the mean is
    # log(truth) + {0.1, 0, 0, -0.1} and its standard error 0.1 / sqrt(2). One test at the whole one-sided alpha (0.002,
    # z = 2.878) promotes when the mean exceeds 0.2035: every pair at 1.5x (log 0.405), one pair of four at 1.2x (0.182).
    oracle, trace = _trace([0.1, -0.1], [0.1, -0.1])
    assert oracle.z_oracle(trace, 1.5, 2, fixed=True)["right"] == 1.0
    assert oracle.z_oracle(trace, 1.2, 2, fixed=True) == {"promote": 0.25, "rollback": 0.0, "right": 0.25}
    # The probe's spending levels are stricter (alpha / 6 at look 2: z = 3.41, threshold 0.241): still one pair at 1.2x.
    assert oracle.z_oracle(trace, 1.2, 2, fixed=False)["promote"] == 0.25
    # A loss: the rollback side may decide at look 1 (5 alpha / 36: z = 3.45, se 0.1): log 0.5 + 0.1 + 0.345 < 0.
    assert oracle.z_oracle(trace, 0.5, 1, fixed=False) == {"promote": 0.0, "rollback": 1.0, "right": 1.0}


def test_what_would_reach_a_goal_scales_with_the_rounds_noise():
    oracle, trace = _trace([0.3, -0.3], [0.3, -0.3])
    need = oracle.what_reaches(trace, 1.5, 4)
    # sd 0.3 per round: (z(alpha / 6) + z(0.9))^2 x 0.09 / log(1.5)^2 = 12.01, so 13 rounds; four need sd 0.173.
    assert need["round_sd"] == pytest.approx(0.3)
    assert need["rounds_needed"] == 13
    assert need["round_sd_for_bound"] == pytest.approx(2 * math.log(1.5) / 4.68448, abs=1e-4)
    assert need["round_longer_by"] == pytest.approx((0.3 / need["round_sd_for_bound"]) ** 2, rel=1e-2)
    # A test that must estimate the variance (a 5-df prior) needs quieter rounds than one that knows it.
    assert need["round_sd_for_bound_t"] < need["round_sd_for_bound"]
