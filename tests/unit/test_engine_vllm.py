"""spec.engine vLLM through the seam: the drift monitor on vLLM's counters (acceptance over a window of two scrapes,
per draft position, from real Prometheus exposition), and the probe over vLLM's OpenAI protocol against simulators
over real HTTP (/v1/models, streamed /v1/completions and /v1/chat/completions with usage, return_token_ids, the
vllm:spec_decode_* counters the simulator exports beside SGLang's gauges)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from contextlib import AsyncExitStack

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from specdec_operator.api import MonitorStatus, OutputCheck, Prompts
from specdec_operator.cli.probe import run_probe
from specdec_operator.engines.sglang import SGLANG
from specdec_operator.engines.vllm import VLLM
from specdec_operator.monitor import observe, observe_fleet, remember, sample_from_metrics
from specdec_operator.probe import parse_workload, scrape_metrics
from specdec_operator.probe.datasets import Prompt
from specdec_operator.probe.metrics import parse_engine_metrics
from specdec_operator.probe.traffic import prompt_plan, random_ids_plans
from specdec_operator.simulator import SimulatorServer, profile_from_dict


class VLLMCounters:
    """vLLM 0.32's spec-decode counters (vllm/v1/spec_decode/metrics.py) in a registry of their own, per engine core."""

    def __init__(self, positions: int = 3, engines: tuple[str, ...] = ("0",)) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=self.registry)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=self.registry)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=self.registry)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per position", [*labels, "position"], registry=self.registry)
        self.positions, self.engines = positions, engines
        for engine in engines:  # vLLM creates every series at start-up, at 0
            for c in (self.drafts, self.draft_tokens, self.accepted):
                c.labels("llama", engine)
            for p in range(positions):
                self.per_pos.labels("llama", engine, str(p))

    def serve(self, drafts: int, per_position: list[int], engine: str = "0") -> None:
        self.drafts.labels("llama", engine).inc(drafts)
        self.draft_tokens.labels("llama", engine).inc(drafts * self.positions)
        self.accepted.labels("llama", engine).inc(sum(per_position))
        for p, n in enumerate(per_position):
            self.per_pos.labels("llama", engine, str(p)).inc(n)

    def sample(self, time: str):
        return sample_from_metrics(parse_engine_metrics(generate_latest(self.registry).decode(), VLLM), time, VLLM)


def test_vllm_exposition_is_read_per_position_and_summed_over_engine_cores():
    server = VLLMCounters(engines=("0", "1"))
    server.serve(100, [80, 50, 20], engine="0")
    server.serve(50, [10, 5, 0], engine="1")
    sample = server.sample("t1")
    assert (sample.verify_calls, sample.accepted_tokens, sample.accepted_per_position) == (150, 165, (90, 55, 20))
    assert sample.accept_length is None and sample.counts_acceptance
    # SGLang's reading of the same text finds nothing of its own.
    assert SGLANG.read_metrics(parse_engine_metrics(generate_latest(server.registry).decode(), SGLANG)).accept_length is None


def test_the_monitor_judges_vllm_on_the_window_between_scrapes_not_the_lifetime():
    server, floor, window = VLLMCounters(), 1.5, 2
    server.serve(10_000, [9_000, 8_000, 7_000])  # hours of good service before the first scrape: lifetime 3.4
    first = server.sample("t1")
    verdict = observe(None, first, floor=floor, window=window, previous=None)
    assert not verdict.evidence and verdict.status.below_floor_count == 0  # a baseline, not a lifetime ratio

    server.serve(100, [80, 50, 20])
    second = server.sample("t2")
    verdict = observe(verdict.status, second, floor=floor, window=window, previous=first)
    assert verdict.evidence and verdict.status.accept_length == pytest.approx(2.5)
    assert verdict.status.accept_rate_by_position == [0.8, 0.5, 0.2]

    server.serve(100, [10, 0, 0])  # the drafter stopped paying; the lifetime ratio is still 3.3
    third = server.sample("t3")
    verdict = observe(verdict.status, third, floor=floor, window=window, previous=second)
    assert verdict.status.accept_length == pytest.approx(1.1) and verdict.status.below_floor_count == 1 and not verdict.drifted

    idle = server.sample("t4")  # no draft since: says nothing, the count stays
    verdict = observe(verdict.status, idle, floor=floor, window=window, previous=third)
    assert not verdict.evidence and verdict.status.below_floor_count == 1

    server.serve(100, [5, 0, 0])
    verdict = observe(verdict.status, server.sample("t5"), floor=floor, window=window, previous=idle)
    assert verdict.drifted and verdict.status.below_floor_count == 2


def test_a_restarted_vllm_container_is_a_new_baseline():
    before, after = VLLMCounters(), VLLMCounters()
    before.serve(500, [400, 300, 200])
    after.serve(10, [2, 1, 0])  # the container restarted: its counters began again at 0
    verdict = observe(MonitorStatus(below_floor_count=1), after.sample("t2"), floor=1.5, window=3, previous=before.sample("t1"))
    assert not verdict.evidence and verdict.status.below_floor_count == 1


def test_a_vllm_fleet_weighs_each_pod_by_its_drafts_per_position_too():
    a, b = VLLMCounters(), VLLMCounters()
    previous = {"a": a.sample("t1"), "b": b.sample("t1")}
    a.serve(300, [270, 240, 210])  # 3.4
    b.serve(100, [30, 10, 0])  # 1.4
    verdict = observe_fleet(None, {"a": a.sample("t2"), "b": b.sample("t2")}, previous, floor=1.5, window=3)
    assert verdict.status.accept_length == pytest.approx((3.4 * 300 + 1.4 * 100) / 400)
    assert verdict.status.verify_calls == 400
    assert verdict.status.accept_rate_by_position == [0.75, 0.625, 0.525]
    first_only = observe_fleet(None, {"a": a.sample("t1")}, None, floor=1.5, window=3)
    assert not first_only.evidence  # a pod's first scrape is its baseline
    assert remember(None, {"a": a.sample("t2")})["a"].accepted_tokens == 720


def test_vllm_requests_name_the_served_model_and_use_the_openai_api():
    ids = parse_workload("ids:1:4:16:1").model_copy(update={"prompts": Prompts(source="Random")})
    [plan] = random_ids_plans(ids, random.Random(0), engine=VLLM, model="llama")
    assert plan.path == "/v1/completions" and plan.exact
    assert b'"model":"llama"' in plan.body and b'"ignore_eos":true' in plan.body and b'"include_usage":true' in plan.body
    text = parse_workload("text:1:4:16:1").model_copy(update={"prompts": Prompts(endpoint="Generate")})
    plan = prompt_plan(text, Prompt(messages=(("user", "hi"),), raw_text="hi"), model="llama", engine=VLLM)
    assert plan.path == "/v1/completions" and b'"prompt":"hi"' in plan.body and b'"max_tokens":16' in plan.body
    chat = prompt_plan(parse_workload("chat:1:4:16:1"), Prompt(messages=(("user", "hi"),)), model="llama", engine=VLLM)
    assert chat.path == "/v1/chat/completions" and b'"max_completion_tokens":16' in chat.body


def prof(name: str, step_ms: list[list[float]], accept: float | None = None) -> object:
    spec = None if accept is None else {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 256,
            "prefill_tokens_per_s": 200000,
            "step_ms": step_ms,
            "speculative": spec,
            "jitter": 0.01,
            "errors": {},
            "stream_interval": 8,
        }
    )


def test_a_probe_in_vllms_protocol_decides_and_reads_acceptance_from_the_counters():
    base, win = prof("base", [[1, 10.0], [128, 80.0]]), prof("win", [[1, 12.0], [128, 120.0]], 2.5)
    chat = parse_workload("chat:1:32:64:2")
    ids = parse_workload("ids:16:32:64:32").model_copy(update={"prompts": Prompts(source="Random")})

    async def probe():
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(base, time_scale=2.0, seed=0, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(win, time_scale=2.0, seed=1000, load_seconds=0))
            result = await run_probe(b, s, [chat, ids], seed=0, engine=VLLM, output_check=OutputCheck(prompts=4, max_tokens=16))
            return result, await scrape_metrics(None, s, engine=VLLM)

    result, metrics = asyncio.run(probe())
    assert (result.decision, result.reason) == ("promote", "SpeedupConfirmed"), result.message
    # No spec_verify_ct in OpenAI streams: the acceptance is the server's counters since the preflight.
    assert result.accept_length == result.server_accept_length == pytest.approx(2.5, rel=0.1)
    rates = result.accept_rate_by_position
    assert rates is not None and len(rates) == 3 and rates[0] > rates[1] > rates[2] > 0
    assert result.to_status("rev").accept_rate_by_position == rates  # status.probe.acceptRateByPosition
    assert result.outputs_compared == 4 and result.output_match_rate == 1.0
    assert metrics["vllm:spec_decode_num_drafts_total"] > 0 and not result.warnings


def test_the_operators_drift_scrape_reads_a_vllm_pod_through_the_engine() -> None:
    from specdec_operator.controller.config import Endpoints, OperatorConfig
    from specdec_operator.controller.probescheduler import ProbeScheduler

    async def go():
        async with SimulatorServer(prof("win", [[1, 12.0], [128, 120.0]], 2.5), time_scale=2.0, seed=3, load_seconds=0) as url:
            scheduler = ProbeScheduler(OperatorConfig(endpoints=Endpoints({"ns/pod/llama-spec-0": url})))
            try:
                first = await scheduler.scrape(("ns", "llama"), {"llama-spec-0": None}, VLLM)
                session = await scheduler.session()
                body = {"model": "x", "prompt": "def add(a, b):", "max_tokens": 64, "temperature": 0.0, "ignore_eos": True}
                for _ in range(8):
                    async with session.post(url + "/v1/completions", json=body) as resp:
                        assert resp.status == 200
                second = await scheduler.scrape(("ns", "llama"), {"llama-spec-0": None}, VLLM)
            finally:
                await scheduler.close()
            return first, second

    first, second = asyncio.run(go())
    baseline = observe_fleet(None, first, None, floor=1.5, window=3)
    assert not baseline.evidence  # the pod's first scrape: a baseline
    verdict = observe_fleet(baseline.status, second, remember(None, first), floor=1.5, window=3)
    assert verdict.evidence and 1.8 < (verdict.status.accept_length or 0) < 3.2 and verdict.status.below_floor_count == 0
    rates = verdict.status.accept_rate_by_position or []
    assert len(rates) == 3 and rates[0] >= rates[1] >= rates[2]


def test_a_vllm_server_that_is_not_speculating_is_named_in_a_warning():
    base = prof("base", [[1, 10.0], [128, 80.0]])

    async def probe():
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(base, time_scale=4.0, seed=0, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(base, time_scale=4.0, seed=1, load_seconds=0))
            return await run_probe(b, s, [parse_workload("chat:1:32:16:2")], seed=0, engine=VLLM, max_rounds=1)

    result = asyncio.run(probe())
    assert "speculative /metrics has no vllm:spec_decode counters: is it speculating?" in result.warnings
    assert result.accept_length is None and result.accept_rate_by_position is None


def test_the_probe_waits_out_vllms_idle_spin_before_it_measures_the_other_server(monkeypatch: pytest.MonkeyPatch):
    """vLLM's shm reader busy-loops a core for 1 s after its last request (engines.vllm idle_spin_s): on a shared
    host the server measured next would share that core, and did (on the real-engine tier the odd rounds' ratios came
    out 0.16 above the even rounds' on the log scale, benchmarks/probe_settle.py). The probe pauses that long before a measurement of the other server, never
    before one of the same server; --settle 0 turns it off."""
    import specdec_operator.probe.run as probe_run

    same = prof("base", [[1, 10.0], [128, 80.0]])
    real_measure = probe_run._measure_one
    spans: list[tuple[str, float, float]] = []

    async def recording(session, url, *args, **kwargs):
        started = time.monotonic()
        try:
            return await real_measure(session, url, *args, **kwargs)
        finally:
            spans.append((url, started, time.monotonic()))

    monkeypatch.setattr(probe_run, "_measure_one", recording)

    async def probe(settle_s: float | None):
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(same, time_scale=4.0, seed=0, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(same, time_scale=4.0, seed=1, load_seconds=0))
            return await run_probe(b, s, [parse_workload("chat:1:32:8:2")], seed=0, engine=VLLM, max_rounds=3, settle_s=settle_s)

    def gaps() -> tuple[list[float], list[float]]:
        switched = [n[1] - p[2] for p, n in itertools.pairwise(spans) if p[0] != n[0]]
        stayed = [n[1] - p[2] for p, n in itertools.pairwise(spans) if p[0] == n[0]]
        return switched, stayed

    asyncio.run(probe(None))
    switched, stayed = gaps()
    assert len(spans) >= 4 and switched and stayed, spans  # rounds of (spec, base) then (base, spec): both kinds
    assert min(switched) >= VLLM.idle_spin_s - 0.02, switched
    assert max(stayed) < 0.5, stayed
    spans.clear()
    asyncio.run(probe(0.0))
    switched, _ = gaps()
    assert switched and max(switched) < 0.5, switched
