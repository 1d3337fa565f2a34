"""Reliability: 100 seeded probes against simulators injecting faults never promote, and all end with a reason.

The campaign lives in benchmarks/probe_faults.py (which prints the counts recorded in docs/probe.md).
"""

from __future__ import annotations

import asyncio

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


@pytest.mark.timing
def test_the_same_servers_without_faults_would_promote():
    """The control: the campaign's candidate is truly faster, so a zero-promotion result means something."""
    campaign = load_campaign()

    async def control():
        from contextlib import AsyncExitStack

        from specdec_operator.cli.probe import run_probe
        from specdec_operator.simulator import SimulatorServer, profile_from_dict

        base = campaign._profile("base", [[1, 10.0], [64, 20.0]], None, {})
        cand = campaign._profile("candidate", [[1, 12.0], [64, 24.0]], 2.5, {})
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(profile_from_dict(base), time_scale=4, seed=1))
            c = await stack.enter_async_context(SimulatorServer(profile_from_dict(cand), time_scale=4, seed=2))
            return await run_probe(b, c, [campaign.WORKLOAD], seed=1, **campaign.PROBE_SETTINGS)

    result = asyncio.run(control())
    assert (result.decision, result.reason) == ("promote", "SpeedupConfirmed"), result.message
