"""The speedup curve over concurrency and its break-even point: the pure rule, and a probe against simulators
whose crossover is known analytically."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest

from specdec_operator import crd
from specdec_operator.cli.probe import run_probe
from specdec_operator.probe import parse_workload
from specdec_operator.probe.curve import CurvePoint, break_even
from specdec_operator.resource import dump
from specdec_operator.simulator import SimulatorServer
from specdec_operator.simulator.model import profile_from_dict


def test_a_falling_curve_crosses_where_log_speedup_reaches_zero_between_its_points() -> None:
    # log-log interpolation: between (16, 2.0) and (64, 0.5) the log speedup falls linearly in log concurrency
    # and is 0 halfway, at sqrt(16 * 64) = 32.
    found = break_even([CurvePoint(1, 2.5, 2.2, 2.8), CurvePoint(16, 2.0, 1.5, 2.6), CurvePoint(64, 0.5, 0.4, 0.6)])
    assert found is not None and found.concurrency == pytest.approx(32.0)
    # The pessimistic curve (low ends) crosses first, the optimistic one (high ends) last.
    assert found.low is not None and found.high is not None and found.low < 32.0 < found.high
    assert found.low == pytest.approx(math.exp(math.log(16) + math.log(1.5) / (math.log(1.5) - math.log(0.4)) * math.log(4)))
    assert found.summary.startswith("32 [")


def test_open_ends_and_no_crossing_are_said_in_words() -> None:
    # The low end is below 1 everywhere and the high end above 1 everywhere: both ends open.
    wide = break_even([CurvePoint(1, 1.2, 0.5, 3.0), CurvePoint(128, 0.8, 0.3, 2.0)])
    assert wide is not None and wide.concurrency is not None and (wide.low, wide.high) == (None, None)
    assert wide.summary.endswith("[<1, >128]")
    faster = break_even([CurvePoint(1, 2.0), CurvePoint(64, 1.4), CurvePoint(128, 1.1)])
    assert faster is not None and faster.concurrency is None and faster.summary == "none in 1-128 (faster at every measured concurrency)"
    slower = break_even([CurvePoint(4, 0.9), CurvePoint(8, 0.7)])
    assert slower is not None and slower.summary == "none in 4-8 (slower at every measured concurrency)"
    rising = break_even([CurvePoint(1, 0.5, 0.4, 0.6), CurvePoint(64, 2.0, 1.8, 2.2)])
    assert rising is not None and rising.concurrency == pytest.approx(8.0) and rising.low < 8.0 < rising.high
    assert break_even([CurvePoint(8, 1.5)]) is None  # one concurrency is not a curve
    assert break_even([CurvePoint(8, 1.5), CurvePoint(8, 0.5)]) is None


def test_kubectl_get_wide_shows_the_break_even_from_the_probe_status() -> None:
    column = next(c for c in crd.PRINTER_COLUMNS if c["name"] == "Break-even")
    assert column["jsonPath"] == ".status.probe.breakEven.summary" and column["priority"] == 1
    status = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "summary" in status["properties"]["probe"]["properties"]["breakEven"]["properties"]


def profile(name: str, step_ms: list[list[float]]):
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 512,
            "prefill_tokens_per_s": 400000,
            "step_ms": step_ms,
            "speculative": None,
            "jitter": 0.01,
            "errors": {},
            "stream_interval": 16,
        }
    )


BASE_FLAT = profile("flat", [[1, 40.0], [128, 40.0]])
STEEP = profile("steep", [[1, 20.0], [128, 80.0]])
CURVE_WORKLOADS = [parse_workload(f"c{c}:{c}:16:32:{max(2, c)}") for c in (1, 16, 32, 64, 128)]
CROSSOVER = 1 + 127 / 3  # 43.3


def test_a_probe_finds_the_analytic_crossover_of_a_server_that_wins_light_and_loses_heavy() -> None:
    """Base: a 40 ms decode step at every batch size. The measured server: 20 ms at batch 1, growing linearly to
    80 ms at 128, one token per step (no drafting, so no acceptance noise: the curve is the step-time ratio).
    Throughput ratio = 40 / step(c), which is 1 where step(c) = 40 ms: c = 1 + 127 / 3 = 43.3. Prefill costs both
    servers the same time, so it moves no crossing.

    The decision and the curve it reports, on the simulators' recorded rounds (tests/support/trace_replay.py) at the
    model's speedup of each concurrency: the same on every machine. The next test measures the curve in real time."""
    from tests.support.trace_replay import ReplayedProbe, analytic_speedup, traces_by_shape

    truths = {w.name: analytic_speedup(BASE_FLAT, STEEP, w) for w in CURVE_WORKLOADS}
    assert truths["c1"] > 1.5 and truths["c128"] < 0.6
    for label, pair in ((label, pair) for label in ("favoured", "loaded") for pair in ("equal", "eagle3")):
        script = ReplayedProbe(f"{label}/{pair}/curve", truths, traces=traces_by_shape(label, pair, CURVE_WORKLOADS))
        result = asyncio.run(run_probe("http://127.0.0.1:9", "http://127.0.0.1:9", CURVE_WORKLOADS, max_rounds=4, script=script))
        # Never promoted. The loss at 128 clears the threshold, or the concurrent workloads' rounds (the recorded
        # batch-32 noise: single rounds from 0.4x to 3x of their mean) leave an interval too wide at round 4.
        assert result.decision == "rollback" and result.reason in ("SpeedupBelowThreshold", "Inconclusive"), (label, pair, result.message)
        found = result.break_even()
        assert found is not None and found.concurrency is not None, found
        # The guarantee is the interval: it holds the analytic crossover. The estimate rests on as few rounds as the
        # decision needs (a clear loss at 128 can end the probe after its first round), so it is only asked to be near.
        assert (found.low or 0) <= CROSSOVER <= (found.high or math.inf), (label, pair, found)
        assert found.concurrency == pytest.approx(CROSSOVER, rel=0.5), (label, pair, found)
        status = dump(result.to_status("rev"))
        assert status["breakEven"]["summary"] == found.summary and status["breakEven"]["concurrency"] == round(found.concurrency, 2)
        assert result.to_dict()["break_even"]["concurrency"] == found.concurrency


@pytest.mark.timing
def test_a_probe_measures_the_falling_curve_of_a_server_that_wins_light_and_loses_heavy() -> None:
    """The same servers measured in real time, one round, whatever it decides. Busy cores pull every measured ratio
    towards 1 and add noise (near the crossing, c32's 1.15x and c64's 0.80x may swap sides: beside a load of 14 the
    crossing once came out past 65 for 43.3), so what is asserted is what holds on any machine: a win at one stream,
    a loss at 128, and the curve crossing 1 between the concurrencies where the model's does (16 and 128)."""

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            # Time scale 2 and a stream interval of 16: the client and both servers share one event loop on a
            # loaded 2-core host, which must not set the pace.
            b = await stack.enter_async_context(SimulatorServer(BASE_FLAT, time_scale=2, seed=1, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(STEEP, time_scale=2, seed=2, load_seconds=0))
            return await run_probe(b, s, CURVE_WORKLOADS, seed=3, max_rounds=1)

    result = asyncio.run(scenario())
    assert result.rounds == 1 and all(w.speedup for w in result.workloads), result.message
    by_name = {w.name: w.speedup for w in result.workloads}
    # The model: 2.0x and 0.5x. 128 streams in one process are what a busy host pulls towards 1 most (0.58x to 0.66x
    # measured beside a load of 10), so only the side of 1 is asked there.
    assert by_name["c1"] > 1.5 and by_name["c128"] < 1.0, by_name
    found = result.break_even()
    assert found is not None and found.concurrency is not None and 16 < found.concurrency < 128, (found, by_name)
