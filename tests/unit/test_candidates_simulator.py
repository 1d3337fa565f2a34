"""Issue 35 (4): the simulator speaks each candidate method. NGRAM's acceptance depends on how much the answer repeats
the context (the prompt's repetition share, read from the request's own tokens); STANDALONE and DFLASH draft like the
EAGLE family with their own step costs; each exports its metrics as the engines do (SGLang's gauges count every verify,
vLLM's spec_decode counters only the steps that drafted). Draws are seeded: the assertions hold on any machine."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_operator.engines import SpecMetrics, counter_window
from specdec_operator.engines.vllm import VLLM
from specdec_operator.errors import InputError
from specdec_operator.probe.metrics import parse_engine_metrics
from specdec_operator.simulator import Engine, SimulatorServer, load_profile, profile_from_dict, shipped_profiles
from specdec_operator.simulator.inputs import parse_chat_completions, parse_completions, parse_generate
from specdec_operator.simulator.promptkind import repetition_share, text_repetition_share

CODE = "def area(width, height):\n    return width * height\n"
# A code edit: the function is quoted, and the answer repeats most of it (what n-gram speculation feeds on).
REPETITIVE = f"Rename height to depth in this code and keep the rest as is:\n{CODE * 3}Here it is again, unchanged:\n{CODE * 2}"
FREE = "Write a short poem about autumn leaves falling slowly in a quiet park near the river at dusk."


def test_the_repetition_share_is_read_from_the_prompt_tokens() -> None:
    assert text_repetition_share(FREE) == 0.0
    assert text_repetition_share(REPETITIVE) > 0.6
    assert repetition_share(list(range(1000))) == 0.0  # random-like ids repeat nothing
    ids = [5, 6, 7, 8, 9] * 10
    assert repetition_share(ids) == 1.0 and repetition_share([1, 2, 3]) == 0.0
    # Every endpoint hands it to the engine: /generate text or ids, completions, chat (the whole context).
    assert parse_generate({"text": REPETITIVE}).repetition == text_repetition_share(REPETITIVE)
    assert parse_generate({"input_ids": ids}).repetition == 1.0
    assert parse_completions({"prompt": FREE}, "m").repetition == 0.0
    chat = parse_chat_completions({"messages": [{"role": "system", "content": CODE * 3}, {"role": "user", "content": "rename height"}]}, "m")
    assert chat.repetition > 0.5


def speculative_profile(**speculative):
    return profile_from_dict(
        {
            "name": "t",
            "load_seconds": 0,
            "max_running_requests": 64,
            "prefill_tokens_per_s": 1e5,
            "step_ms": [[1, 10.0]],
            "jitter": 0.0,
            "speculative": speculative,
        }
    )


def test_ngram_drafts_only_where_the_context_repeats_and_vllm_counts_only_those_drafts() -> None:
    async def steps(repetition: float) -> tuple[float, int, int]:
        engine = Engine(load_profile("llama31-8b-ngram"), seed=7)
        req = engine.submit(100, 10, repetition=repetition)
        draws = [engine._decode_tokens(req) for _ in range(20000)]
        for k, proposed in draws:
            engine.spec_decode.count(proposed, k - 1)
        return sum(k for k, _ in draws) / len(draws), engine.spec_decode.drafts, len(draws)

    free, drafts, n = asyncio.run(steps(0.0))
    assert free == 1.0 and drafts == 0  # nothing to match: plain decode steps, no vLLM draft counted
    full, drafts, n = asyncio.run(steps(1.0))
    assert full == pytest.approx(4.0, rel=0.03) and drafts == n
    half, drafts, n = asyncio.run(steps(0.5))
    assert half == pytest.approx(1 + 0.5 * 3.0, rel=0.03) and drafts == pytest.approx(n / 2, rel=0.03)
    # A method with a drafter drafts whatever the context.
    engine_free = asyncio.run(_eagle_mean())
    assert engine_free == pytest.approx(2.8, rel=0.03)


async def _eagle_mean() -> float:
    engine = Engine(load_profile("llama31-8b-eagle3"), seed=7)
    req = engine.submit(100, 10, repetition=0.0)
    return sum(engine._decode_tokens(req)[0] for _ in range(20000)) / 20000


def test_the_shipped_profiles_rank_the_methods_by_traffic() -> None:
    assert {"llama31-8b-ngram", "llama31-8b-standalone", "llama31-8b-dflash"} <= set(shipped_profiles())
    base = load_profile("llama31-8b-base")
    eagle3, ngram = load_profile("llama31-8b-eagle3"), load_profile("llama31-8b-ngram")

    def speedup(p, concurrency: int, repetition: float) -> float:
        return p.analytic_throughput(concurrency, 1024, 256, repetition) / base.analytic_throughput(concurrency, 1024, 256)

    # Repetitive traffic: n-gram speculation beats the EAGLE-3 drafter; free chat: it loses to the base, EAGLE-3 wins.
    assert speedup(ngram, 1, 0.8) > speedup(eagle3, 1, 0.8) > 1.5
    assert speedup(ngram, 1, 0.0) < 1.0 < speedup(eagle3, 1, 0.0)
    dflash, standalone = load_profile("llama31-8b-dflash"), load_profile("llama31-8b-standalone")
    assert speedup(dflash, 1, 0) > speedup(eagle3, 1, 0) > speedup(standalone, 1, 0) > 1.0
    assert speedup(standalone, 128, 0) < 1.0  # a draft model's forwards cost too much at a large batch


def test_a_profile_names_a_method_the_engines_have() -> None:
    with pytest.raises(InputError, match="algorithm 'MEDUSA' is not one of EAGLE3, EAGLE, NEXTN, STANDALONE, DFLASH, NGRAM, SUFFIX"):
        speculative_profile(algorithm="MEDUSA", num_steps=3, eagle_topk=1, num_draft_tokens=4, accept_length_mean=2.0)


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _serve(name: str, prompts: list[str], max_tokens: int = 64) -> tuple[dict, str, list[dict]]:
    loaded = dataclasses.replace(load_profile(name), load_seconds=0)  # serving at once
    async with SimulatorServer(loaded, time_scale=50, seed=3) as url, aiohttp.ClientSession() as s:
        metas = []
        for text in prompts:
            body = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True}}
            async with s.post(url + "/generate", json=body) as r:
                metas.append((await r.json())["meta_info"])
        async with s.get(url + "/server_info") as r:
            info = await r.json()
        async with s.get(url + "/metrics") as r:
            metrics = await r.text()
    return info, metrics, metas


def test_an_ngram_server_reports_its_method_and_accepts_by_how_much_the_prompt_repeats() -> None:
    info, metrics, metas = asyncio.run(_serve("llama31-8b-ngram", [REPETITIVE] * 6 + [FREE] * 6))
    assert info["speculative_algorithm"] == "NGRAM" and info["speculative_draft_model_path"] is None
    repetitive = sum(m["completion_tokens"] for m in metas[:6]) / sum(m["spec_verify_ct"] for m in metas[:6])
    free = sum(m["completion_tokens"] for m in metas[6:]) / sum(m["spec_verify_ct"] for m in metas[6:])
    assert free < 1.1 < 2.0 < repetitive  # per request, as SGLang's meta_info says it
    values = samples(metrics)
    assert values["sglang:spec_verify_calls_total"] > values["vllm:spec_decode_num_drafts_total"] > 0
    # vLLM's acceptance (per draft) is higher than SGLang's (per verify, undrafted steps included).
    vllm = VLLM.read_metrics(parse_engine_metrics(metrics, VLLM))
    window = counter_window(SpecMetrics(verify_calls=0, accepted_tokens=0, accepted_per_position=()), vllm)
    assert window is not None and window.accept_length > 3.0
    assert window.position_rates is not None and len(window.position_rates) == 7


@pytest.mark.parametrize(
    ("name", "algorithm", "steps", "tokens"), [("llama31-8b-standalone", "STANDALONE", 3, 4), ("llama31-8b-dflash", "DFLASH", 1, 16)]
)
def test_standalone_and_dflash_servers_report_as_their_engines_do(name: str, algorithm: str, steps: int, tokens: int) -> None:
    info, metrics, metas = asyncio.run(_serve(name, [FREE] * 8, max_tokens=96))
    assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (algorithm, steps, tokens)
    assert info["speculative_draft_model_path"].endswith("-draft")
    values = samples(metrics)
    # Every verify drafts: vLLM's drafts equal SGLang's verify calls, with num_draft_tokens - 1 positions.
    assert values["vllm:spec_decode_num_drafts_total"] == values["sglang:spec_verify_calls_total"] > 0
    assert values["vllm:spec_decode_num_draft_tokens_total"] == values["vllm:spec_decode_num_drafts_total"] * (tokens - 1)
    accept = load_profile(name).speculative.accept_length_mean
    measured = sum(m["completion_tokens"] - 1 for m in metas) / sum(m["spec_verify_ct"] for m in metas)
    assert measured == pytest.approx(accept, rel=0.15)
