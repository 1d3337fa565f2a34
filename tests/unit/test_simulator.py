"""The SGLang simulator: profiles, the continuous-batching model, and SGLang 0.5.23's response shapes."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_operator.cli import main as specdec_main
from specdec_operator.errors import InputError
from specdec_operator.simulator import (
    Engine,
    SimulatorProcess,
    SimulatorServer,
    load_profile,
    profile_from_dict,
    shipped_profiles,
)
from tests.support.benchmarks import load_benchmark

SEED_PROFILES = ["sglang-base-kimi-k25", "kimi-k2-public-eagle3", "kimi-k25-custom-eagle3"]


def profile(**overrides):
    data = {
        "name": "test",
        "load_seconds": 0,
        "max_running_requests": 64,
        "prefill_tokens_per_s": 100000,
        "step_ms": [[1, 10.0], [64, 20.0]],
        "speculative": None,
        "jitter": 0.0,
        "errors": {"http_500_rate": 0.0, "timeout_rate": 0.0},
    }
    data.update(overrides)
    return profile_from_dict(data)


SPEC = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": 2.5}


async def read_sse(resp: aiohttp.ClientResponse) -> list[bytes]:
    raw = await resp.read()
    return [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


# --- profiles --------------------------------------------------------------------------------------


def test_shipped_profiles_include_the_seed_and_the_demo_pair():
    names = shipped_profiles()
    for name in SEED_PROFILES + ["llama31-8b-base", "llama31-8b-eagle3"]:
        assert name in names
        p = load_profile(name)
        assert p.name == name


def test_seed_profiles_reproduce_the_seed_table_within_two_percent():
    # Decode-only rates (tiny prompts) against the seed's measured single-stream and concurrency-128 numbers.
    expected = {
        "sglang-base-kimi-k25": (63.6, 2370.0),
        "kimi-k2-public-eagle3": (62.9, 849.0),
        "kimi-k25-custom-eagle3": (40.8, 597.0),
    }
    for name, (single, c128) in expected.items():
        p = load_profile(name)
        assert p.analytic_throughput(1, 1, 100_000) == pytest.approx(single, rel=0.02)
        assert p.analytic_throughput(128, 1, 100_000) == pytest.approx(c128, rel=0.02)
    assert load_profile("kimi-k2-public-eagle3").max_running_requests == 48
    assert load_profile("kimi-k25-custom-eagle3").speculative.accept_length_mean == 1.0


def test_profile_errors_name_the_key():
    with pytest.raises(InputError, match="max_running_requests"):
        profile(max_running_requests=0)
    with pytest.raises(InputError, match="step_ms"):
        profile(step_ms=[[0, 5]])
    with pytest.raises(InputError, match="accept_length_mean"):
        profile(speculative={**SPEC, "accept_length_mean": 9})
    with pytest.raises(InputError, match="unknown errors key"):
        profile(errors={"http_501_rate": 0.1})
    with pytest.raises(InputError, match="speculative"):
        profile_from_dict({k: v for k, v in json.loads(json.dumps(profile_dict())).items() if k != "speculative"})


def profile_dict():
    return {
        "name": "x",
        "load_seconds": 0,
        "max_running_requests": 1,
        "prefill_tokens_per_s": 1,
        "step_ms": [[1, 1]],
        "speculative": None,
        "jitter": 0,
        "errors": {},
    }


def test_cli_rejects_unknown_profile_in_one_line(capsys, tmp_path):
    assert specdec_main(["simulate", "--profile", "no-such-profile"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no-such-profile" in err and "sglang-base-kimi-k25" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert specdec_main(["simulate", "--profile", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_step_time_interpolates_and_analytic_throughput_respects_the_cap():
    p = profile(step_ms=[[1, 10.0], [11, 20.0]], max_running_requests=4)
    assert p.step_seconds(1) == pytest.approx(0.010)
    assert p.step_seconds(6) == pytest.approx(0.015)
    # Concurrency above the cap runs at the cap's batch.
    assert p.analytic_throughput(100, 1, 1000) == pytest.approx(p.analytic_throughput(4, 1, 1000))


def test_speculative_draws_have_the_profile_mean_and_bounds():
    async def draw():
        engine = Engine(profile(speculative=SPEC), seed=5)
        return [engine._draw_tokens() for _ in range(40000)]

    ks = asyncio.run(draw())
    assert min(ks) == 1 and max(ks) == 4
    assert sum(ks) / len(ks) == pytest.approx(2.5, rel=0.02)

    async def draw_broken():
        engine = Engine(profile(speculative={**SPEC, "accept_length_mean": 1.0}), seed=5)
        return {engine._draw_tokens() for _ in range(1000)}

    assert asyncio.run(draw_broken()) == {1}

    async def drift():
        engine = Engine(profile(speculative=SPEC), seed=5)
        engine.set_accept_length_mean(1.0)  # the drafter stops accepting mid-run
        broken = {engine._draw_tokens() for _ in range(1000)}
        engine.set_accept_length_mean(3.5)
        return broken, sum(engine._draw_tokens() for _ in range(20000)) / 20000

    broken, recovered = asyncio.run(drift())
    assert broken == {1} and recovered == pytest.approx(3.5, rel=0.02)


# --- HTTP shapes --------------------------------------------------------------------------------------


def test_generate_streaming_has_sglang_shapes_and_speculative_meta():
    async def scenario():
        async with SimulatorServer(profile(speculative=SPEC), time_scale=10, seed=1) as url, aiohttp.ClientSession() as s:
            body = {"input_ids": list(range(40)), "stream": True, "sampling_params": {"max_new_tokens": 33, "ignore_eos": True}}
            async with s.post(url + "/generate", json=body) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/event-stream")
                return await read_sse(r)

    events = asyncio.run(scenario())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 33
    # Cumulative output (SGLang's default): text and ids grow with the count.
    for c in chunks:
        assert len(c["output_ids"]) == c["meta_info"]["completion_tokens"]
        assert set(c) == {"text", "output_ids", "meta_info"}
        assert c["meta_info"]["prompt_tokens"] == 40
    # A speculative step delivers several tokens in one event.
    assert max(b - a for a, b in itertools.pairwise(counts)) > 1
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 33}
    assert final["spec_accept_length"] == pytest.approx(33 / final["spec_verify_ct"])
    assert final["spec_num_proposed_drafts"] == final["spec_verify_ct"] * 3
    assert final["spec_accept_rate"] == pytest.approx(final["spec_num_correct_drafts"] / final["spec_num_proposed_drafts"])
    assert final["e2e_latency"] > 0
    # The first token comes from prefill, not from a verify step.
    assert final["spec_num_correct_drafts"] == 33 - 1 - final["spec_verify_ct"]


def test_stream_interval_batches_tokens_per_event_and_base_has_no_spec_meta():
    async def scenario():
        async with SimulatorServer(profile(), time_scale=20, seed=1) as url, aiohttp.ClientSession() as s:
            body = {"text": "hello world " * 10, "stream": True, "sampling_params": {"max_new_tokens": 20, "stream_interval": 8}}
            async with s.post(url + "/generate", json=body) as r:
                events = await read_sse(r)
            async with s.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 5}}) as r:
                plain = await r.json()
            return events, plain

    events, plain = asyncio.run(scenario())
    counts = [json.loads(e)["meta_info"]["completion_tokens"] for e in events[:-1]]
    assert counts == [1, 9, 17, 20]  # first token at once, then every 8, then the finish
    assert "spec_verify_ct" not in json.loads(events[-2])["meta_info"]
    assert plain["meta_info"]["completion_tokens"] == 5 and len(plain["output_ids"]) == 5
    assert plain["meta_info"]["finish_reason"]["type"] == "length"


def test_max_new_tokens_zero_generates_one_token_even_as_a_fresh_servers_first_request():
    """The engine generates at least one token, so the output tape must hold one before any request has run."""

    async def scenario():
        async with SimulatorServer(profile(), time_scale=20) as url, aiohttp.ClientSession() as s:
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}
            async with s.post(url + "/generate", json=body) as r:
                return r.status, await r.json()

    status, body = asyncio.run(scenario())
    assert status == 200 and body["meta_info"]["completion_tokens"] == 1 and body["output_ids"] == [1000]


def test_openai_endpoints_stream_with_usage():
    async def scenario():
        async with SimulatorServer(profile(), time_scale=20) as url, aiohttp.ClientSession() as s:
            chat = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 6,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with s.post(url + "/v1/chat/completions", json=chat) as r:
                chat_events = await read_sse(r)
            async with s.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4}) as r:
                completion = await r.json()
            async with s.get(url + "/v1/models") as r:
                models = await r.json()
            return chat_events, completion, models

    chat_events, completion, models = asyncio.run(scenario())
    assert chat_events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in chat_events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    assert text.strip()
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 4
    assert completion["choices"][0]["finish_reason"] == "length"
    assert models["data"][0]["object"] == "model"


def test_bad_requests_get_sglang_error_bodies():
    async def scenario():
        async with SimulatorServer(profile()) as url, aiohttp.ClientSession() as s:
            async with s.post(url + "/generate", data=b"{oops") as r:
                a = (r.status, await r.json())
            async with s.post(url + "/generate", json={"sampling_params": {}}) as r:
                b = (r.status, await r.json())
            async with s.post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": -1}}) as r:
                c = (r.status, await r.json())
            return a, b, c

    for status, body in asyncio.run(scenario()):
        assert status == 400 and body["error"]["message"]


def test_health_and_ready_are_503_while_loading_then_200():
    async def scenario():
        async with SimulatorServer(profile(load_seconds=5), time_scale=10) as url:  # 0.5 s of wall time
            async with aiohttp.ClientSession() as s:
                early = []
                for path in ("/health", "/health_generate", "/ready", "/server_info"):
                    async with s.get(url + path) as r:
                        early.append(r.status)
                async with s.post(url + "/generate", json={"text": "x"}) as r:
                    early.append(r.status)
                await asyncio.sleep(0.7)
                late = []
                for path in ("/health", "/health_generate", "/ready"):
                    async with s.get(url + path) as r:
                        late.append(r.status)
                return early, late

    early, late = asyncio.run(scenario())
    assert early == [503, 503, 503, 503, 503]
    assert late == [200, 200, 200]


def test_server_info_and_metrics_report_the_effective_configuration():
    async def scenario():
        p = profile(speculative=SPEC, max_running_requests=2, tp_size=2)
        async with SimulatorServer(p, time_scale=1, seed=3) as url, aiohttp.ClientSession() as s:
            body = {"input_ids": [1] * 8, "sampling_params": {"max_new_tokens": 200}}
            tasks = [asyncio.create_task(s.post(url + "/generate", json=body)) for _ in range(5)]
            await asyncio.sleep(0.3)
            async with s.get(url + "/metrics") as r:
                during = await r.text()
            for t in tasks:
                (await t).release()
            async with s.get(url + "/server_info") as r:
                info = await r.json()
            async with s.get(url + "/metrics") as r:
                after = await r.text()
            return info, during, after

    info, during, after = asyncio.run(scenario())
    assert info["max_running_requests"] == 2
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 4
    assert info["version"] == "0.5.23" and info["internal_states"][0]["avg_spec_accept_length"] > 1.5

    def samples(text):
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    d = samples(during)
    running = d["sglang:num_running_reqs"]
    assert {labels["tp_rank"] for labels, _ in running} == {"0", "1"}
    assert all(v == 2 for _, v in running)  # capped at max_running_requests
    assert all(v == 3 for _, v in d["sglang:num_queue_reqs"])  # the rest queue
    a = samples(after)
    assert a["sglang:generation_tokens_total"][0][1] == 5 * 200
    assert a["sglang:num_requests_total"][0][1] == 5
    assert a["sglang:spec_verify_calls_total"][0][1] > 0
    assert 1.5 < a["sglang:spec_accept_length"][0][1] <= 4
    assert a["sglang:time_to_first_token_seconds_count"][0][1] == 5


@pytest.mark.timing  # tok/s in real time: beside 3 busy control planes a 32-stream run measured 12 % under the model
def test_continuous_batching_throughput_follows_the_model():
    """Closed-loop throughput from the HTTP server matches the analytic model (batch and cap included)."""

    async def tok_s(p, concurrency, requests, out_tokens, scale):
        async with SimulatorServer(p, time_scale=scale, seed=1) as url, aiohttp.ClientSession() as s:
            body = {"input_ids": [7] * 64, "sampling_params": {"max_new_tokens": out_tokens}}
            queue = list(range(requests))

            async def client():
                while queue:
                    queue.pop()
                    async with s.post(url + "/generate", json=body) as r:
                        assert r.status == 200
                        await r.read()

            t = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(concurrency)))
            return requests * out_tokens / (time.perf_counter() - t)

    p = profile(max_running_requests=8, step_ms=[[1, 10.0], [8, 24.0], [64, 80.0]], prefill_tokens_per_s=50000)
    for concurrency in (1, 8):
        measured = asyncio.run(tok_s(p, concurrency, 2 * concurrency, 100, 4))
        assert measured == pytest.approx(4 * p.analytic_throughput(concurrency, 64, 100), rel=0.06)
    # 32 clients against a cap of 8 get the cap's throughput (analytic_throughput applies the cap), not 32 streams'.
    # At half the clock speed of the runs above: 32 streams share this process's event loop with the server, and
    # at 4x a loaded CI host measured 23 % under the model.
    capped = asyncio.run(tok_s(p, 32, 32, 100, 2))
    assert capped == pytest.approx(2 * p.analytic_throughput(8, 64, 100), rel=0.08)


def test_subprocess_serves_prints_its_url_and_stops_on_sigterm(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specdec_operator.cli",
            "simulate",
            "--profile",
            "llama31-8b-eagle3",
            "--port",
            "0",
            "--time-scale",
            "10",
            "--load-seconds",
            "0",
            "--seed",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "serving SGLang API at http://127.0.0.1:" in line
        url = line.split(" at ")[1].split()[0]

        async def query():
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    health = r.status
                async with s.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 3}}) as r:
                    gen = await r.json()
                return health, gen

        health, gen = asyncio.run(query())
        assert health == 200 and gen["meta_info"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_subprocess_dies_after_the_configured_requests(tmp_path):
    data = json.loads((Path(__file__).parents[2] / "operator/specdec_operator/simulator/profiles/llama31-8b-base.json").read_text())
    data["errors"] = {"die_after_requests": 2}
    data["load_seconds"] = 0
    path = tmp_path / "dying.json"
    path.write_text(json.dumps(data))
    sim = SimulatorProcess(str(path), "--time-scale", "10", stderr=subprocess.PIPE)
    with sim as url:

        async def hammer():
            statuses = []
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    try:
                        async with s.post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}) as r:
                            statuses.append(r.status)
                    except aiohttp.ClientError:
                        statuses.append("reset")
            return statuses

        assert asyncio.run(hammer()) == [200, 200, "reset"]
        assert sim.proc.wait(timeout=10) == 1


@pytest.mark.slow
def test_sglang_benchmark_client_reads_the_simulator(tmp_path):
    """SGLang's own `python -m sglang.benchmark.serving --backend sglang` runs against the simulator."""
    pytest.importorskip("datasets", reason="sglang.benchmark.serving imports datasets (the dev extra has it)")
    bench = load_benchmark("probe_fidelity")
    tokenizer = bench.build_tokenizer(str(tmp_path))
    with SimulatorProcess("llama31-8b-eagle3", "--time-scale", "4", "--load-seconds", "0", "--seed", "1") as url:
        result = bench.run_sglang_bench(url, tokenizer, 4, 32, 48, 8, str(tmp_path / "out.jsonl"))
    assert result["completed"] == 8
    assert result["total_output_tokens"] == 8 * 48
    assert result["output_throughput"] > 0 and result["median_ttft_ms"] > 0
    # Read from /server_info's internal_states, as SGLang's client does.
    assert 2.0 < result["accept_length"] < 3.6
