"""benchmarks/probe_study.py's Monte Carlo on a tiny synthetic trace: the truth it imposes is the one the decisions
see, and the error accounting counts what it says (issue 32 item 3)."""

from __future__ import annotations

import json
import math
import random

import pytest

from tests.support.benchmarks import load_benchmark


def synthetic_trace(path, rounds: int = 12, noise: float = 0.03, ratio: float = 1.3) -> str:
    """A trace file of ``rounds`` rounds: base ~100 tok/s, speculative ``ratio`` times that, each measurement with 8
    coarse blocks and its own variance from them (as run.py's _log_rate would give), server order alternating."""
    rng = random.Random(7)

    def measurement(level: float) -> dict:
        blocks = [level * math.exp(rng.gauss(0.0, noise * math.sqrt(8))) for _ in range(8)]
        rate = sum(blocks) / len(blocks)
        return {"tok_s": rate, "log_rate": math.log(rate), "var": noise**2, "df": 2.6, "profile": blocks}

    rows = []
    for rnd in range(1, rounds + 1):
        host = math.exp(rng.gauss(0.0, 0.02))  # a round effect both servers share
        rows.append(
            {
                "round": rnd,
                "order": "sb" if rnd % 2 else "bs",
                "duration_s": 0.5,
                "speculative": measurement(100.0 * ratio * host),
                "base": measurement(100.0 * host),
            }
        )
    file = path / "trace.json"
    file.write_text(json.dumps({"label": "synthetic", "traces": [{"name": "synthetic/x/y", "time_scale": 5.0, "rounds": rows}]}))
    return str(file)


@pytest.fixture(scope="module")
def study():
    return load_benchmark("probe_study")


def test_imposed_truth_decides_and_errors_are_counted(tmp_path, study):
    mods = study.load_modules(None)
    (trace,) = study.load_traces([synthetic_trace(tmp_path)], mods["stats"])
    assert trace.round_s == 0.5 and len(trace.odd) == len(trace.even) == 6
    with study.fast_t_quantile(mods):
        rows = {
            (method, truth): study.run_cell(trace, truth, study.Rule(method, 0.998, 6, mods), 60, seed=3, gpus=16)
            for method in ("old", "new")
            for truth in (0.36, 1.0, 3.0)
        }
    assert mods["stats"].t_quantile.__name__ == "t_quantile"  # restored: other tests see the exact one
    for method in ("old", "new"):
        win, loss, null = rows[method, 3.0], rows[method, 0.36], rows[method, 1.0]
        # A 3x win is promoted, a 0.36x loss never is (and is rolled back for speed), whatever the trace's own ratio.
        assert win["promote"] == 60 and win["false_rollback_rate"] == 0.0 and win["false_promotion_rate"] is None
        assert loss["promote"] == 0 and loss["rollback"] == 60 and loss["false_promotion_rate"] == 0.0
        assert loss["false_rollback_rate"] is None  # a rollback of a loss is no error
        # Equal servers: a promotion there is counted as a false one; the shares add up.
        assert null["false_promotion_rate"] == null["promote"] / 60
        assert null["promote"] + null["rollback"] + null["inconclusive"] == 60
        assert null["inconclusive_share"] == null["inconclusive"] / 60
        for row in (win, loss, null):
            assert 1 <= row["rounds_median"] <= row["rounds_p90"] <= 6
            assert row["gpu_s_mean"] == pytest.approx(row["rounds_mean"] * 0.5 * 5.0 * 16, abs=0.1)
        assert win["rounds_median"] >= 2  # promotion needs both server orders (decide.PROMOTE_MIN_ROUNDS)


def test_old_method_is_the_bonferroni_rule_and_new_does_not_depend_on_the_budget(tmp_path, study):
    """The same draws: the old rule's decisions slow down with a larger budget on a clear win, the new rule's don't."""
    mods = study.load_modules(None)
    (trace,) = study.load_traces([synthetic_trace(tmp_path, noise=0.06)], mods["stats"])
    with study.fast_t_quantile(mods):
        medians = {
            (method, budget): study.run_cell(trace, 1.5, study.Rule(method, 0.998, budget, mods), 40, seed=5, gpus=1)["rounds_mean"]
            for method in ("old", "new")
            for budget in (6, 24)
        }
    assert medians["new", 24] == medians["new", 6]
    assert medians["old", 24] > medians["old", 6]


def test_fast_t_quantile_matches_the_exact_one_and_is_restored(study):
    mods = study.load_modules(None)
    exact = mods["stats"].t_quantile
    rng = random.Random(11)
    points = [(rng.choice([0.9999, 1 - 0.002 / 12, 1 - 0.002 / 36, 0.995]), math.exp(rng.uniform(0.0, math.log(3000.0)))) for _ in range(25)]
    with study.fast_t_quantile(mods):
        assert mods["stats"].t_quantile is not exact and mods["decide"].t_quantile is not exact
        fast = [mods["stats"].t_quantile(p, df) for p, df in points]
    assert mods["stats"].t_quantile is exact and mods["decide"].t_quantile is exact
    for (p, df), value in zip(points, fast):
        assert value == pytest.approx(exact(p, df), rel=1e-5), (p, df)
