"""`specdec probe`'s cost of a race (issue 35): every arm's server is held for the whole probe, so the speculative
side's cores are each arm's times the arms (benchmarks/vllm_race.py compares a race's core-seconds with separate
probes'; before this, a race of two arms reported one arm's cores)."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest

from specdec_operator.cli import main as specdec_main
from specdec_operator.simulator import SimulatorServer
from tests.unit.test_probe_cost import _profile


def _race_json(capsys, *flags: str) -> dict:
    async def serve() -> dict:
        async with AsyncExitStack() as stack:

            def server(name: str, accept: float | None, seed: int):
                return stack.enter_async_context(
                    SimulatorServer(_profile(name, [[1, 10.0], [128, 80.0]], accept), time_scale=4.0, seed=seed, load_seconds=0)
                )

            base, fast, slow = [await server(n, a, s) for n, a, s in (("base", None, 0), ("fast", 2.5, 1), ("slow", 1.6, 2))]
            argv = ["probe", "--base", base, "--arm", f"fast={fast}", "--arm", f"slow={slow}", "--workload", "w:1:16:16:2"]
            argv += ["--max-rounds", "1", "--quiet", "--output-check-prompts", "0", "--json", *flags]
            assert await asyncio.to_thread(specdec_main, argv) == 0
            return json.loads(capsys.readouterr().out)

    return asyncio.run(serve())


def test_a_race_of_two_arms_costs_the_base_and_both_arms_servers(capsys) -> None:
    out = _race_json(capsys, "--base-cores", "1", "--speculative-cores", "1", "--base-gpus", "0", "--speculative-gpus", "0")
    assert set(out["arms"]) == {"fast", "slow"}
    assert out["base_cores"] == 1 and out["candidate_cores"] == 2
    # wall_seconds is rounded to 3 decimals in the JSON, the cost computed before that: N units differ by N x 0.0005.
    assert out["core_seconds"] == pytest.approx(3 * out["wall_seconds"], abs=0.01)
    assert out["gpu_seconds"] == 0.0
    gpus = _race_json(capsys, "--base-gpus", "8", "--speculative-gpus", "8")
    assert gpus["candidate_gpus"] == 16 and gpus["gpu_seconds"] == pytest.approx(24 * gpus["wall_seconds"], abs=0.02)
