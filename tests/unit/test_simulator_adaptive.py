"""The simulator's adaptive speculation (simulator/adaptive.py): SGLang 0.5.23's rule, its config, its effect.

The rule is checked against SGLang's own AdaptiveStepSlot and AdaptiveSpeculativeParams where sglang is importable
(it is in the project's venv, installed without its dependencies; the import takes torch's time once), and against
the documented behaviour everywhere. Throughput is measured on the engine's simulated clock with in-process
clients and a time scale the host cannot keep up with: the engine then never sleeps, and tokens per simulated
second are the model's, whatever else the host is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from types import SimpleNamespace
from typing import cast

import aiohttp
import pytest

from specdec_operator.cli import main as specdec_main
from specdec_operator.errors import InputError
from specdec_operator.simulator import Engine, Simulator, SimulatorServer, profile_from_dict
from specdec_operator.simulator.adaptive import (
    DEFAULT_ADAPTIVE_CONFIG,
    AdaptiveSteps,
    StepSlot,
    adaptive_config_from_dict,
    speculative_cuda_graph_batch_sizes,
)
from specdec_operator.simulator.cli import build_parser, resolve_profile
from specdec_operator.simulator.info import server_args


def spec_block(accept: float, *, topk: int = 1, steps: int = 3, draft_tokens: int = 4) -> dict:
    return {"algorithm": "EAGLE3", "num_steps": steps, "eagle_topk": topk, "num_draft_tokens": draft_tokens, "accept_length_mean": accept}


def prof(name, step_ms, accept=None, **extra):
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 256,
            "prefill_tokens_per_s": 200000,
            "step_ms": step_ms,
            "speculative": None if accept is None else spec_block(accept),
            "jitter": 0.0,
            "errors": {},
            **extra,
        }
    )


# As tests/unit/test_probe.py's MIXED: speculation wins at one stream (2.08x) and loses at 128 (0.5x). Without drafting
# a step costs what the base server's does.
BASE_STEPS = [[1, 10.0], [128, 80.0]]
BASE = prof("base", BASE_STEPS)
MIXED = prof("mixed", [[1, 12.0], [128, 400.0]], 2.5)
# Steps 0 from batch 32 up: the operator's rendering of a break-even at 32 (issue 15, item 2).
OFF_FROM_32 = {"1": {"candidate_steps": [1, 3]}, "32": {"candidate_steps": [0]}}
ADAPTIVE = prof("mixed-adaptive", [[1, 12.0], [128, 400.0]], 2.5, target_step_ms=BASE_STEPS, adaptive=OFF_FROM_32)


# --- the rule against SGLang's own ---------------------------------------------------------------------


def random_slot_config(rng: random.Random) -> dict:
    cfg: dict = {"candidate_steps": rng.sample(range(8), rng.randint(1, 5))}
    for key, choices in (
        ("ema_alpha", [0.1, 0.2, 0.5, 0.9]),
        ("update_interval", [1, 2, 5]),
        ("warmup_batches", [0, 3, 10]),
        ("down_hysteresis", [-0.25, 0.0, 0.3]),
        ("up_hysteresis", [0.0, 0.25, -0.2]),
        ("ceiling_coeff", [0, 0, 1.0, 1.5]),
    ):
        if rng.random() < 0.6:
            cfg[key] = rng.choice(choices)
    return cfg


def correct_drafts(rng: random.Random, steps: int, batch: int, p: float) -> list[int]:
    """Accepted drafts per request as a chain with acceptance p gives them: at most ``steps``, 0 at steps 0."""
    out = []
    for _ in range(batch):
        n = 0
        while n < steps and rng.random() < p:
            n += 1
        out.append(n)
    return out


def test_slot_makes_sglangs_decisions_on_random_sequences():
    sglang_params = pytest.importorskip("sglang.srt.speculative.adaptive_spec_params")
    rng = random.Random(15)
    decisions = changes = 0
    for _ in range(300):
        cfg = random_slot_config(rng)
        initial = rng.randrange(8)
        theirs = sglang_params.AdaptiveStepSlot(initial, dict(cfg))
        ours = StepSlot(adaptive_config_from_dict({"1": cfg}, "test").buckets[0][1], initial)
        assert (ours.steps, ours.ema) == (theirs.current_steps, theirs.ema_accept_len)
        p = rng.random()
        for _ in range(200):
            if rng.random() < 0.05:
                p = rng.random()  # the drafter drifts
            drafts = correct_drafts(rng, ours.steps, rng.choice([0, 1, 3, 16]), p)
            changed = ours.observe(drafts)
            assert changed == theirs.update(drafts)
            assert ours.steps == theirs.current_steps and ours.ema == theirs.ema_accept_len
            decisions += 1
            changes += changed
    assert decisions == 60000 and changes > 1000  # the sequences exercise the rule, not just the warm-up


def test_routing_makes_sglangs_decisions_with_cuda_graph_padding(tmp_path):
    sglang_params = pytest.importorskip("sglang.srt.speculative.adaptive_spec_params")
    rng = random.Random(7)
    for trial in range(40):
        config = {str(b): random_slot_config(rng) for b in rng.sample([1, 2, 4, 8, 16, 24, 32, 48, 64, 128], rng.randint(1, 5))}
        config.update({k: v for k, v in (("warmup_batches", rng.choice([0, 2, 10])), ("update_interval", rng.choice([1, 5]))) if rng.random() < 0.5})
        path = tmp_path / f"adaptive-{trial}.json"
        path.write_text(json.dumps(config))
        initial = rng.randrange(8)
        union = sorted({s for k, v in config.items() if k.isdigit() for s in v["candidate_steps"]})
        theirs = sglang_params.AdaptiveSpeculativeParams(initial, cfg_path=str(path))
        graphs = speculative_cuda_graph_batch_sizes(rng.choice([48, 128, 256]))
        theirs.set_cuda_graph_bs(graphs)
        ours = AdaptiveSteps(adaptive_config_from_dict(config, str(path)), initial, graphs)
        assert theirs.candidate_steps == union
        p = rng.random()
        for _ in range(300):
            batch = rng.randint(1, 300)
            steps = ours.steps_for_batch(batch)
            assert steps == theirs.get_steps_for_batch(batch), (config, batch)
            drafts = correct_drafts(rng, steps, batch, p)
            assert ours.on_verify_complete(drafts, batch) == (theirs.on_verify_complete(drafts, batch) is not None)


def test_default_config_and_validation_messages_are_sglangs(tmp_path):
    sglang_params = pytest.importorskip("sglang.srt.speculative.adaptive_spec_params")
    assert DEFAULT_ADAPTIVE_CONFIG == sglang_params.DEFAULT_ADAPTIVE_CONFIG
    for bad in ({"1": {"candidate_steps": []}}, {"8": {"candidate_steps": [1, -1]}}, {"1": {}}, {"ema_alpha": 0.3}, {"x1": {"candidate_steps": [1]}}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError) as sglang_error:
            sglang_params.AdaptiveSpeculativeParams(3, cfg_path=str(path))
        with pytest.raises(InputError) as our_error:
            adaptive_config_from_dict(bad, str(path))
        assert str(our_error.value) == f"{path}: {sglang_error.value}"


def test_warmup_then_every_update_interval_as_documented():
    # Nothing accepted: the EMA falls from 2.0 (steps 3 - 1) towards 0 at once, but the first decision is taken
    # after warmup_batches + update_interval = 15 batches, not after the 10 warm-up batches.
    slot = StepSlot(adaptive_config_from_dict({"1": {"candidate_steps": [1, 3]}}, "t").buckets[0][1], 3)
    history = []
    for _ in range(20):
        history.append(slot.steps)
        slot.observe([0])
    assert history == [3] * 15 + [1] * 5
    # Steps 0 is not sticky while a positive candidate exists: every interval probes the next step up.
    slot = StepSlot(adaptive_config_from_dict({"1": {"candidate_steps": [0, 1]}}, "t").buckets[0][1], 1)
    history = []
    for _ in range(40):
        history.append(slot.steps)
        slot.observe([0, 0])
    assert history == [1] * 15 + [0] * 5 + [1] * 5 + [0] * 5 + [1] * 5 + [0] * 5
    # A slot whose initial steps are not a candidate starts at the middle one; [0] alone never drafts.
    only_zero = StepSlot(adaptive_config_from_dict({"1": {"candidate_steps": [0]}}, "t").buckets[0][1], 3)
    for _ in range(50):
        only_zero.observe([0])
    assert (only_zero.steps, only_zero.ema) == (0, -1.0)


def test_batches_route_to_the_bucket_at_or_below_their_cuda_graph_size():
    steps = AdaptiveSteps(adaptive_config_from_dict(OFF_FROM_32, "t"), 3, speculative_cuda_graph_batch_sizes(256))
    # 31 pads to the captured 32 and so runs without drafting; 29 pads to 30, bucket 1.
    assert [steps.bucket_for(b) for b in (1, 8, 29, 30, 31, 32, 33, 300)] == [1, 1, 1, 1, 32, 32, 32, 32]
    unpadded = AdaptiveSteps(adaptive_config_from_dict({"4": {"candidate_steps": [1]}, "32": {"candidate_steps": [0]}}, "t"), 1)
    assert [unpadded.bucket_for(b) for b in (1, 31, 32)] == [4, 4, 32]  # below the smallest bucket: the smallest


# --- the engine ------------------------------------------------------------------------------------------


async def closed_loop_tok_s(profile, concurrency: int, requests: int, out_tokens: int = 64, seed: int = 1) -> tuple[float, Engine]:
    """Output tokens per busy simulated second of ``concurrency`` closed-loop clients on the engine itself."""
    engine = Engine(profile, time_scale=1e6, seed=seed)  # far faster than the host: steps never wait on the clock
    engine.start()
    queue = list(range(requests))

    async def client():
        while queue:
            queue.pop()
            req = engine.submit(32, out_tokens)
            while not (await req.out.get()).finished:
                pass

    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = engine.busy_seconds  # idle gaps between a finish and the client's next request are the host's
    await engine.stop()
    return requests * out_tokens / elapsed, engine


def tok_s(profile, concurrency, requests):
    return asyncio.run(closed_loop_tok_s(profile, concurrency, requests))


def test_adaptive_keeps_the_win_at_one_stream_and_the_base_rate_at_128():
    base_1, base_128 = tok_s(BASE, 1, 6)[0], tok_s(BASE, 128, 384)[0]
    spec_1, spec_128 = tok_s(MIXED, 1, 6)[0], tok_s(MIXED, 128, 384)[0]
    (adaptive_1, engine_1), (adaptive_128, engine_128) = tok_s(ADAPTIVE, 1, 6), tok_s(ADAPTIVE, 128, 384)
    print(f"tok/s at c=1: base {base_1:.0f}, speculative {spec_1:.0f}, adaptive {adaptive_1:.0f}")
    print(f"tok/s at c=128: base {base_128:.0f}, speculative {spec_128:.0f}, adaptive {adaptive_128:.0f}")
    assert spec_1 / base_1 == pytest.approx(2.08, rel=0.1) and spec_128 / base_128 == pytest.approx(0.5, rel=0.1)
    # One stream: bucket 1 stays at 3 steps (EMA ~1.5 accepted drafts: no threshold is crossed), the win is kept.
    assert adaptive_1 / spec_1 == pytest.approx(1.0, rel=0.05)
    assert {s for _, s in engine_1.recent_adaptive_steps} == {3}
    # 128 streams: bucket 32's only candidate is 0, so every decode batch is a target step, as fast as the base's.
    assert adaptive_128 / base_128 == pytest.approx(1.0, rel=0.05)
    assert {s for b, s in engine_128.recent_adaptive_steps if b >= 31} == {0}
    # The drafter's memory stays taken: the speculative server's cap, not the base's.
    assert engine_128.profile.max_running_requests == MIXED.max_running_requests


def test_engine_shows_the_warmup_and_the_update_interval():
    async def run(profile, tokens):
        engine = Engine(profile, time_scale=1e6, seed=3)
        engine.start()
        req = engine.submit(8, tokens)
        while not (await req.out.get()).finished:
            pass
        await engine.stop()
        return engine

    never_accepts = prof("broken", [[1, 12.0]], 1.0, target_step_ms=[[1, 10.0]], adaptive={"1": {"candidate_steps": [1, 3]}})
    engine = asyncio.run(run(never_accepts, 31))  # the prefill's token, then 30 decode steps at one token each
    assert [s for _, s in engine.recent_adaptive_steps] == [3] * 15 + [1] * 15
    faster = prof(
        "broken", [[1, 12.0]], 1.0, adaptive={"warmup_batches": 2, "update_interval": 3, "ema_alpha": 0.9, "1": {"candidate_steps": [1, 3]}}
    )
    engine = asyncio.run(run(faster, 11))
    assert [s for _, s in engine.recent_adaptive_steps] == [3] * 5 + [1] * 5


def test_verify_step_time_is_linear_in_the_draft_steps():
    p = prof("t", [[1, 16.0]], 2.0, target_step_ms=[[1, 10.0]])
    assert [round(p.verify_step_seconds(1, s) * 1000, 6) for s in (0, 1, 3, 5)] == [10.0, 12.0, 16.0, 20.0]
    # No target_step_ms: a step without drafting costs what a verify step does (no saving unless measured).
    assert prof("t", [[1, 16.0]], 2.0).verify_step_seconds(1, 0) == pytest.approx(0.016)


# --- what the server reports ---------------------------------------------------------------------------


def test_steps_zero_counts_as_a_verify_with_nothing_accepted_and_reports_sglangs_args():
    # SGLang runs steps 0 through verify (a one-token tree) and counts it in spec_verify_ct with 0 accepted
    # drafts (batch_result_processor.py), so spec_accept_length = completion_tokens / spec_verify_ct.
    # SGLang requires --speculative-num-steps (3) among the candidates of some bucket: here bucket 64's.
    off_at_one = {"1": {"candidate_steps": [0]}, "64": {"candidate_steps": [3]}}
    profile = prof("off", [[1, 12.0]], 2.5, target_step_ms=[[1, 10.0]], adaptive=off_at_one, stream_interval=8)

    async def scenario():
        async with SimulatorServer(profile, time_scale=20, seed=1) as url, aiohttp.ClientSession() as s:
            body = {"input_ids": [1] * 8, "sampling_params": {"max_new_tokens": 33}}
            async with s.post(url + "/generate", json=body) as r:
                meta = (await r.json())["meta_info"]
            async with s.get(url + "/server_info") as r:
                info = await r.json()
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
            return meta, info, metrics

    meta, info, metrics = asyncio.run(scenario())
    assert meta["spec_verify_ct"] == 32 and meta["spec_num_correct_drafts"] == 0
    assert meta["spec_accept_length"] == pytest.approx(33 / 32)
    assert meta["spec_num_proposed_drafts"] == 32 * 3  # SGLang multiplies by the configured draft tokens - 1
    assert info["speculative_adaptive"] is True and info["speculative_adaptive_config"] is None
    assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
    assert "--speculative-adaptive" in info["launch_command"]
    assert info["simulator"]["adaptive"]["steps_by_batch_size"] == {"1": 0, "64": 3}
    assert 'sglang:spec_num_steps{engine_type="unified",model_name="simulated/model",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0' in metrics
    assert "sglang:spec_accept_length{" in metrics


def simulator_of(profile) -> Simulator:
    """What info.server_args reads of a Simulator, without an event loop."""
    return cast(Simulator, SimpleNamespace(profile=profile, served_model_name="m", host="127.0.0.1", port=30000))


def test_a_profile_without_adaptive_reports_it_off():
    args = server_args(simulator_of(MIXED))
    assert args["speculative_adaptive"] is False and args["speculative_adaptive_config"] is None
    assert "--speculative-adaptive" not in args["launch_command"]


# --- the command line ----------------------------------------------------------------------------------


def profile_file(tmp_path, **spec_overrides):
    data = {
        "name": "cli",
        "load_seconds": 0,
        "max_running_requests": 48,
        "prefill_tokens_per_s": 1000,
        "step_ms": [[1, 10.0]],
        "speculative": {**spec_block(2.0), **spec_overrides},
        "jitter": 0.0,
        "errors": {},
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_cli_flags_pick_the_file_else_the_profile_else_sglangs_default(tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"ema_alpha": 0.5, "1": {"candidate_steps": [1, 3]}}))
    profile = resolve_profile(parse("--profile", profile_file(tmp_path), "--speculative-adaptive", "--speculative-adaptive-config", str(config)))
    assert profile.adaptive_active and profile.adaptive is not None and profile.adaptive.path == str(config)
    assert profile.adaptive.buckets[0][1].ema_alpha == 0.5
    default = resolve_profile(parse("--profile", profile_file(tmp_path), "--speculative-adaptive"))
    assert default.adaptive is not None and [b for b, _ in default.adaptive.buckets] == [1, 8, 32, 64]
    assert resolve_profile(parse("--profile", profile_file(tmp_path))).adaptive is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"1": {"candidate_steps": [1, -2]}}', "BS 1: candidate_steps must be a list of non-negative ints, got [1, -2]"),
        ('{"ema_alpha": 0.2}', "must contain at least one integer-string BS key"),
        ('{"1": {"candidate_steps": [1, 5]}}', "--speculative-num-steps=3 is not in the adaptive config candidate_steps [1, 5]"),
        ('{"1": {"candidate_steps": [3], "update_interval": 0}}', "BS 1: update_interval must be an integer >= 1, got 0"),
        ('{"1": [3]}', "BS 1: must be an object with candidate_steps"),
        ("{not json", "not valid JSON"),
        (None, "cannot read it"),
    ],
)
def test_cli_rejects_a_bad_config_in_one_line_naming_file_and_key(tmp_path, capsys, config, message):
    path = tmp_path / "adaptive.json"
    if config is not None:
        path.write_text(config)
    argv = ["simulate", "--profile", profile_file(tmp_path), "--speculative-adaptive", "--speculative-adaptive-config", str(path)]
    assert specdec_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and str(path) in err and message in err, err


def test_profile_adaptive_block_is_validated_like_the_file():
    with pytest.raises(InputError, match=r"profile: adaptive: BS 8: candidate_steps must be a list"):
        prof("x", [[1, 10.0]], 2.0, adaptive={"8": {"candidate_steps": "3"}})
    with pytest.raises(InputError, match="target_step_ms"):
        prof("x", [[1, 10.0]], None, target_step_ms=[[1, 5.0]])


def test_topk_4_falls_back_to_static_speculation_with_sglangs_reason(tmp_path, capsys):
    # SGLang does not refuse to start: it warns and serves with static params (speculative_hook.py).
    path = profile_file(tmp_path, eagle_topk=4, num_draft_tokens=8)
    profile = resolve_profile(parse("--profile", path, "--speculative-adaptive", "--speculative-adaptive-config", str(tmp_path / "never-read.json")))
    assert capsys.readouterr().err.strip() == (
        "specdec simulate: warning: speculative_adaptive disabled: speculative_eagle_topk=4 (only topk=1 is supported). "
        "Falling back to static speculative params."
    )
    assert not profile.adaptive_active and profile.adaptive_unsupported_reason == "speculative_eagle_topk=4 (only topk=1 is supported)"

    async def engine_of(p):
        return Engine(p)

    assert asyncio.run(engine_of(profile)).adaptive is None
    args = server_args(simulator_of(profile))
    assert args["speculative_adaptive"] is False and args["speculative_num_draft_tokens"] == 8
    base = resolve_profile(parse("--profile", "llama31-8b-base", "--speculative-adaptive"))
    assert base.adaptive_unsupported_reason == "speculative_algorithm=None (only EAGLE/EAGLE3 are supported)"
    capsys.readouterr()
