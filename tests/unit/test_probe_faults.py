"""Reliability: 100 seeded probes against simulators injecting faults never promote, and all end with a reason.

The campaign lives in benchmarks/probe_faults.py (which prints the counts recorded in docs/probe.md).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.benchmarks import load_benchmark

REASONS = {"SpeedupConfirmed", "SpeedupBelowThreshold", "DrafterNotAccepting", "Inconclusive", "ProbeFailed"}


def load_campaign():
    return load_benchmark("probe_faults")


@pytest.mark.slow
def test_hundred_faulty_probes_never_promote_and_all_end_with_a_reason():
    campaign = load_campaign()
    outcomes = asyncio.run(campaign.campaign(runs=100, parallel=10))
    assert len(outcomes) == 100
    assert [o.decision for o in outcomes if o.decision == "promote"] == []
    assert all(o.reason in REASONS and o.message for o in outcomes)
    # Every fault kind ran, on both sides, and was caught as a failure rather than measured around.
    assert {o.fault for o in outcomes} == set(campaign.FAULTS)
    assert {o.faulty for o in outcomes} == {"base", "candidate"}
    assert {o.reason for o in outcomes} == {"ProbeFailed"}
    assert max(o.seconds for o in outcomes) < 10


def _control_profiles(campaign):
    """The campaign's base and candidate without faults (benchmarks/probe_faults.py)."""
    from specdec_operator.simulator import profile_from_dict

    base = campaign._profile("base", [[1, 10.0], [64, 20.0]], None, {})
    cand = campaign._profile("candidate", [[1, 12.0], [64, 24.0]], 2.5, {})
    return profile_from_dict(base), profile_from_dict(cand)


def test_the_same_servers_without_faults_would_promote():
    """The control: the campaign's candidate is truly faster, so a zero-promotion result means something. The model's
    speedup on the campaign's workload, decided with the campaign's lenient settings on the simulators' recorded rounds
    (quieter machine and busy one, tests/support/trace_replay.py): promoted every time."""
    from specdec_operator.cli.probe import run_probe
    from tests.support.trace_replay import ReplayedProbe, analytic_speedup, traces_by_shape

    campaign = load_campaign()
    base, cand = _control_profiles(campaign)
    truth = analytic_speedup(base, cand, campaign.WORKLOAD)
    assert truth > 1.5
    settings = {k: v for k, v in campaign.PROBE_SETTINGS.items() if k in ("max_rounds", "confidence")}
    for label, pair in itertools.product(("favoured", "loaded"), ("equal", "eagle3")):
        traces = traces_by_shape(label, pair, [campaign.WORKLOAD])
        script = ReplayedProbe(f"{label}/{pair}/control", truth, traces=traces)
        result = asyncio.run(run_probe("http://127.0.0.1:9", "http://127.0.0.1:9", [campaign.WORKLOAD], script=script, **settings))
        assert (result.decision, result.reason) == ("promote", "SpeedupConfirmed"), (label, pair, result.message)


@pytest.mark.timing
def test_the_same_servers_without_faults_answer_every_request_within_the_campaigns_timeouts():
    """The control's measuring half, in real time: without faults every request of the campaign's probe succeeds within
    its tight timeouts (so the campaign's ProbeFailed outcomes are the faults'), and the candidate's drafter is
    accepted. It stays in the quiet phase: a read timeout of 0.5 s is a timing."""
    campaign = load_campaign()
    base, cand = _control_profiles(campaign)

    async def control():
        from contextlib import AsyncExitStack

        from specdec_operator.cli.probe import run_probe
        from specdec_operator.simulator import SimulatorServer

        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(base, time_scale=4, seed=1))
            c = await stack.enter_async_context(SimulatorServer(cand, time_scale=4, seed=2))
            return await run_probe(b, c, [campaign.WORKLOAD], seed=1, **{**campaign.PROBE_SETTINGS, "max_rounds": 2})

    result = asyncio.run(control())
    assert result.reason != "ProbeFailed" and result.rounds >= 1, result.message
    assert result.accept_length == pytest.approx(2.5, rel=0.1) and result.workloads[0].speedup, result.message
