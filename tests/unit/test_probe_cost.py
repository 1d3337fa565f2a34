"""What a decision cost (issue 32, item 5): status.probe.gpuSeconds from the GPUs the probed servers' pods request
times the probe's time, a load-aware decision's two probes together, the counter on /metrics, `kubectl specdec
status`, and `specdec probe`'s GPU- and core-seconds from the flags that declare them."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest
from prometheus_client import generate_latest

from specdec_operator import manifests as m
from specdec_operator.api import ProbeStatus, SpeculativeServerStatus, Workload
from specdec_operator.cli import main as specdec_main
from specdec_operator.cli.kubectl_specdec import describe
from specdec_operator.controller.config import Endpoints, OperatorConfig
from specdec_operator.controller.probescheduler import ProbeScheduler
from specdec_operator.errors import InputError
from specdec_operator.probecost import cli_cost, decision_seconds, probed_gpus, server_gpus, unit_seconds
from specdec_operator.resource import parse_spec
from specdec_operator.simulator import SimulatorServer, profile_from_dict
from specdec_operator.textutil import parse_time
from tests.support import runtime
from tests.support.world import COMPATIBLE, World, llama_spec
from tests.unit.test_reconcile_loadaware import adaptive_result, plain_rollback, ready_adaptive


def requested_gpus(server: dict) -> int:
    """nvidia.com/gpu that one server (one replica of the rendered object) requests, summed over its pods."""

    def pod(template: dict) -> int:
        return sum(int(c["resources"]["limits"].get(m.GPU_RESOURCE, 0)) for c in template["spec"]["containers"])

    if server["kind"] == "Deployment":
        return pod(server["spec"]["template"])
    lws = server["spec"]["leaderWorkerTemplate"]
    return pod(lws["leaderTemplate"]) + (lws["size"] - 1) * pod(lws["workerTemplate"])


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (8, 1), (16, 1), (4, 2), (8, 4)])
def test_the_probed_gpus_are_what_one_base_and_one_speculative_server_request(gpus: int, nodes: int) -> None:
    spec = parse_spec(llama_spec(**{"resources.gpus": gpus, "resources.nodes": nodes}))
    servers = []
    for variant in ("base", "speculative"):
        if nodes == 1:
            servers.append(m.deployment("llama", "ns", spec, variant, command=["serve"], replicas=1, revision="r1"))
        else:
            servers.append(
                m.leader_worker_set("llama", "ns", spec, variant, leader_command=["serve"], worker_command=["serve"], replicas=1, revision="r1")
            )
    assert server_gpus(spec.resources) == requested_gpus(servers[0]) == gpus * nodes
    assert probed_gpus(spec) == sum(requested_gpus(s) for s in servers) == 2 * gpus * nodes


def test_unknown_is_never_zero_and_a_decision_of_two_probes_sums_them() -> None:
    assert unit_seconds(16, 61.25) == 980.0 and unit_seconds(0, 61.25) == 0.0
    assert unit_seconds(None, 61.25) is None and unit_seconds(16, None) is None
    assert unit_seconds(16, -0.5) == 0.0  # a clock that stepped back costs nothing, not a negative
    assert decision_seconds(960.0, 480.5) == 1440.5
    assert decision_seconds(None, 480.5) is None and decision_seconds() is None


def test_specdec_probes_flags_declare_gpus_and_cores_in_pairs() -> None:
    cost = cli_cost(10.0, base_gpus=1, speculative_gpus=1, base_cores=1, speculative_cores=2)
    assert cost["gpu_seconds"] == 20.0 and cost["core_seconds"] == 30.0
    assert cost["base_gpus"] == 1 and cost["candidate_gpus"] == 1 and cost["candidate_cores"] == 2
    none = cli_cost(10.0)
    assert none["gpu_seconds"] is None and none["core_seconds"] is None
    assert cli_cost(10.0, base_gpus=0, speculative_gpus=0)["gpu_seconds"] == 0.0  # CPU servers: 0 GPUs is known
    with pytest.raises(InputError, match="--base-gpus and --speculative-gpus: give both"):
        cli_cost(10.0, base_gpus=8)
    with pytest.raises(InputError, match="--speculative-cores -1"):
        cli_cost(10.0, base_cores=1, speculative_cores=-1)


# --- the operator: the scheduler fills it, reconcile keeps it, a load-aware decision adds both probes ---------------


def _profile(name: str, step_ms: list[list[float]], accept: float | None = None) -> object:
    speculative = (
        None if accept is None else {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
    )
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 256,
            "prefill_tokens_per_s": 200000,
            "step_ms": step_ms,
            "speculative": speculative,
            "jitter": 0.01,
            "errors": {},
            "stream_interval": 8,
        }
    )


def test_the_probe_scheduler_fills_gpu_seconds_from_the_spec_and_the_probes_time() -> None:
    spec = parse_spec(llama_spec(**{"resources.gpus": 4, "rollout.maxRounds": 2, "rollout.loadAware": "Off"}))
    spec = spec.model_copy(
        update={
            "rollout": spec.rollout.model_copy(
                update={"workloads": [Workload(name="w", concurrency=1, input_tokens=16, output_tokens=16, requests=2)]}
            )
        }
    )

    async def go() -> ProbeStatus:
        async with AsyncExitStack() as stack:
            base = await stack.enter_async_context(
                SimulatorServer(_profile("base", [[1, 10.0], [128, 80.0]]), time_scale=4.0, seed=0, load_seconds=0)
            )
            spec_url = await stack.enter_async_context(
                SimulatorServer(_profile("win", [[1, 12.0], [128, 120.0]], 2.5), time_scale=4.0, seed=1, load_seconds=0)
            )
            scheduler = ProbeScheduler(OperatorConfig(endpoints=Endpoints({"ns/llama-base": base, "ns/llama-spec": spec_url})))
            done = asyncio.Event()
            try:
                scheduler.start(("ns", "llama"), spec, "r1", done.set)
                while scheduler.finished(("ns", "llama")) is None:
                    await asyncio.wait_for(done.wait(), 120)
                    done.clear()
                result = scheduler.finished(("ns", "llama"))
                assert result is not None
                return result
            finally:
                await scheduler.close()

    status = asyncio.run(go())
    assert status.rounds and status.started_at and status.finished_at and status.gpu_seconds is not None
    # 8 GPUs (2 servers x 4) for the probe's time; status' times are whole seconds, so within one second of them.
    started, finished = parse_time(status.started_at), parse_time(status.finished_at)
    assert started is not None and finished is not None
    seconds = (finished - started).total_seconds()
    assert 8 * (seconds - 1) <= status.gpu_seconds <= 8 * (seconds + 1) and status.gpu_seconds > 0


def probed_once(world: World, gpu_seconds: float):
    """Deploy, validate, and hand reconcile the plain probe's result as the scheduler does (gpuSeconds filled)."""
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    return world.step(probe_result={**plain_rollback(plan.revision), "gpuSeconds": gpu_seconds})


def test_a_plain_decisions_gpu_seconds_reach_status_probe() -> None:
    plan = probed_once(World(llama_spec(**{"rollout.loadAware": "Off"})), 960.0)
    assert plan.status["probe"]["gpuSeconds"] == 960.0 and plan.status["phase"] == "RolledBack"


def test_a_load_aware_decision_costs_both_probes() -> None:
    world = World(llama_spec())
    probed_once(world, 960.0)
    assert world.status["probe"]["loadAware"]["plainProbe"]["gpuSeconds"] == 960.0
    ready_adaptive(world)
    plan = world.step()
    adaptive = {**adaptive_result(plan.revision, 0.97, 1.03, world.status), "gpuSeconds": 1600.0}
    status = world.step(probe_result=adaptive).status
    assert status["phase"] == "Promoted" and status["reason"] == "LoadAwareSpeedup"
    assert status["probe"]["gpuSeconds"] == 2560.0 and status["probe"]["loadAware"]["plainProbe"]["gpuSeconds"] == 960.0
    text = describe("llama", SpeculativeServerStatus.model_validate(status), {})
    assert "  cost: 2,560 GPU-seconds (0.71 GPU-hours), both probes: the plain one 960" in text


def test_the_counter_adds_each_probes_gpu_seconds_once_and_goes_with_the_resource() -> None:
    cluster = runtime.Cluster(runtime.llama_spec())
    cluster.step()
    cluster.ready_pods("base", "speculative")
    plan = cluster.step()
    cluster.probes.result = runtime.decision(plan.revision, "promote", "SpeedupConfirmed").model_copy(update={"gpu_seconds": 960.0})
    cluster.step()
    cluster.step()  # recorded once: a later step adds nothing
    text = generate_latest(cluster.metrics.registry).decode()
    assert "# TYPE specdec_probe_gpu_seconds_total counter" in text
    assert 'specdec_probe_gpu_seconds_total{name="llama",namespace="ns"} 960.0' in text
    cluster.metrics.forget("ns", "llama")
    assert 'specdec_probe_gpu_seconds_total{name="llama"' not in generate_latest(cluster.metrics.registry).decode()


def test_kubectl_specdec_status_says_what_the_decision_cost() -> None:
    status = SpeculativeServerStatus.model_validate(
        {
            "phase": "Promoted",
            "activeVariant": "speculative",
            "probe": {
                "decision": "promote",
                "reason": "SpeedupConfirmed",
                "speedup": 1.9,
                "revision": "r1",
                "startedAt": "2026-12-02T09:59:00Z",
                "finishedAt": "2026-12-02T10:00:00Z",
                "gpuSeconds": 960.0,
            },
        }
    )
    lines = describe("llama", status, {}).splitlines()
    assert lines[1:3] == [
        "  decision: promote (SpeedupConfirmed), speedup 1.90x, revision r1",
        "  cost: 960 GPU-seconds (0.27 GPU-hours); probe ran 60 s",
    ]
    assert status.probe is not None
    unknown = status.model_copy(update={"probe": status.probe.model_copy(update={"gpu_seconds": None})})
    assert "cost:" not in describe("llama", unknown, {})  # an operator that did not count says nothing, not 0


# --- specdec probe ------------------------------------------------------------------------------------------------


def _probe_cli(capsys, *flags: str) -> str:
    async def serve() -> str:
        async with AsyncExitStack() as stack:
            base = await stack.enter_async_context(
                SimulatorServer(_profile("base", [[1, 10.0], [128, 80.0]]), time_scale=4.0, seed=0, load_seconds=0)
            )
            spec_url = await stack.enter_async_context(
                SimulatorServer(_profile("win", [[1, 12.0], [128, 120.0]], 2.5), time_scale=4.0, seed=1, load_seconds=0)
            )
            argv = ["probe", "--base", base, "--candidate", spec_url, "--workload", "w:1:16:16:2", "--max-rounds", "1", "--quiet"]
            argv += ["--output-check-prompts", "0", *flags]
            code = await asyncio.to_thread(specdec_main, argv)
            assert code == 0
            return capsys.readouterr().out

    return asyncio.run(serve())


def test_specdec_probe_prints_gpu_and_core_seconds_from_the_declared_servers(capsys) -> None:
    out = json.loads(_probe_cli(capsys, "--json", "--base-gpus", "0", "--speculative-gpus", "0", "--base-cores", "1", "--speculative-cores", "1"))
    assert out["wall_seconds"] > 0 and out["gpu_seconds"] == 0.0
    assert out["core_seconds"] == pytest.approx(2 * out["wall_seconds"], abs=0.01)
    unknown = json.loads(_probe_cli(capsys, "--json"))
    assert unknown["gpu_seconds"] is None and unknown["core_seconds"] is None and unknown["base_gpus"] is None
    text = _probe_cli(capsys, "--base-gpus", "8", "--speculative-gpus", "8")
    cost = [line for line in text.splitlines() if line.startswith("cost: ")]
    assert len(cost) == 1 and " GPU-seconds (8 + 8 GPUs) over " in cost[0] and "core-seconds" not in cost[0]
    text = _probe_cli(capsys)
    assert "cost: GPU-seconds unknown (--base-gpus, --speculative-gpus) over " in text


def test_specdec_probe_refuses_half_a_pair_before_any_request(capsys) -> None:
    assert specdec_main(["probe", "--base", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1", "--base-cores", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--base-cores and --speculative-cores: give both" in err
