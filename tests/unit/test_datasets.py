"""Prompt datasets, the simulator's per-kind acceptance and corrupted tokens, and the greedy output check."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest

from specdec_operator.api import OutputCheck, Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.controller.probescheduler import config_map_dataset
from specdec_operator.errors import InputError
from specdec_operator.probe.datasets import default_prompts, parse_dataset
from specdec_operator.probe.outputs import prefix_match
from specdec_operator.simulator import SimulatorServer, profile_from_dict
from specdec_operator.simulator.promptkind import classify
from tests.support.trace_replay import ReplayedProbe, analytic_speedup, traces_by_shape


def test_the_three_formats_parse_and_auto_tells_them_apart():
    text = "\n".join(
        [
            json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}),
            json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}),
            json.dumps({"prompt": "plain"}),
            "",
        ]
    )
    chat, share, plain = parse_dataset(text, source="t")
    assert chat.messages == (("user", "hi"),) and chat.max_tokens == 32
    assert share.messages == (("user", "q"),)  # the trailing gpt answer is the reference, not the prompt
    assert plain.text == "plain" and plain.max_tokens is None
    array = json.dumps([{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "x"}]}])
    assert parse_dataset(array, source="t", fmt="ShareGPT")[0].messages == (("system", "s"), ("user", "x"))


@pytest.mark.parametrize(
    "text,fmt,expected",
    [
        ('{"prompt": "a"}\n{"prompt": "b",}\n', "Auto", "dataset configmap/p key k.jsonl line 2: not JSON ("),
        ('{"prompt": "a"}\n{"other": 1}\n', "Auto", "line 2: no 'messages', 'conversations' or 'prompt' key"),
        ('{"prompt": "a"}\n', "Chat", "line 1: no 'messages' key (format Chat)"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}\n', "Auto", "line 1: max_tokens must be a positive integer"),
        ("\n\n", "Auto", "no prompts in it"),
    ],
)
def test_errors_are_one_line_naming_the_source_and_line(text, fmt, expected):
    with pytest.raises(InputError) as err:
        parse_dataset(text, source="dataset configmap/p key k.jsonl", fmt=fmt)
    message = str(err.value)
    assert "\n" not in message and expected in message, message


def test_config_map_sources_name_the_missing_object_or_key():
    with pytest.raises(InputError, match=r"configmap/p key k.jsonl: ConfigMap ns/p not found"):
        config_map_dataset("ns", None, "p", "k.jsonl", "Auto")
    with pytest.raises(InputError, match=r"has no key 'k.jsonl' \(keys: other.jsonl\)"):
        config_map_dataset("ns", {"data": {"other.jsonl": ""}}, "p", "k.jsonl", "Auto")
    good = config_map_dataset("ns", {"data": {"k.jsonl": '{"prompt": "x"}\n'}}, "p", "k.jsonl", "Auto")
    assert [p.text for p in good] == ["x"]


def test_the_default_set_is_a_few_hundred_prompts_of_mixed_kinds():
    prompts = default_prompts()
    assert 300 <= len(prompts) <= 1000
    kinds = {classify("\n".join(c for r, c in p.messages if r == "user")) for p in prompts}
    assert kinds >= {"code", "math", "chat", "summary", "multilingual"}
    assert classify(None) == "random"


def _profile(name, accept=None, by_kind=None, **errors):
    spec = None
    if accept is not None:
        spec = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
        if by_kind:
            spec["accept_length_by_kind"] = by_kind
    step = [[1, 10.0], [16, 20.0]] if accept is None else [[1, 14.0], [16, 28.0]]
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 64,
            "prefill_tokens_per_s": 200000,
            "step_ms": step,
            "speculative": spec,
            "jitter": 0.01,
            "errors": errors,
            "stream_interval": 8,
        }
    )


BASE = _profile("base")
CODE_DATASET = {"w": parse_dataset("".join(json.dumps({"prompt": f"Write a Python function number {i}"}) + "\n" for i in range(16)), source="t")}


async def _probe(spec_profile, workload, datasets=None, check=None, max_rounds=6):
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(SimulatorServer(BASE, time_scale=2, seed=1, load_seconds=0))
        s = await stack.enter_async_context(SimulatorServer(spec_profile, time_scale=2, seed=2, load_seconds=0))
        return await run_probe(b, s, [workload], seed=3, max_rounds=max_rounds, datasets=datasets, output_check=check)


def _workload(**prompts):
    return Workload.model_validate({"name": "w", "concurrency": 2, "requests": 4, "inputTokens": 32, "outputTokens": 64, "prompts": prompts})


def _decided_at_measured_acceptance(accept_length, workload, datasets=None):
    """The decision at the speedup the measured acceptance gives these simulators (their model, _profile's step times),
    on the simulators' recorded rounds (tests/support/trace_replay.py): the same on every machine."""
    truth = analytic_speedup(BASE, _profile("measured", accept_length), workload)
    traces = traces_by_shape("favoured", "eagle3", [workload])
    script = ReplayedProbe(f"datasets/{workload.prompts.source}/{accept_length:.2f}", truth, traces=traces)
    return asyncio.run(run_probe("http://127.0.0.1:9", "http://127.0.0.1:9", [workload], max_rounds=6, datasets=datasets, script=script))


def test_random_ids_promote_a_drafter_that_the_users_code_rolls_back_and_the_reverse():
    # Measured for real, one round each: which prompts reach the server (random ids, or the user's code through the
    # generate and the chat endpoints) shows in the drafter's acceptance, counted from the streamed tokens (not timed:
    # it holds on a busy machine). The decision at the speed that acceptance gives is made on recorded rounds.
    random_lover = _profile("random-lover", 2.0, {"random": 3.5, "code": 1.2})
    code_lover = _profile("code-lover", 2.0, {"random": 1.2, "code": 3.5})
    cases = [
        (random_lover, _workload(source="Random"), None, 3.5, "promote"),
        (random_lover, _workload(endpoint="Generate"), CODE_DATASET, 1.2, "rollback"),
        (code_lover, _workload(source="Random"), None, 1.2, "rollback"),
        (code_lover, _workload(), CODE_DATASET, 3.5, "promote"),  # the chat endpoint
    ]
    for profile, workload, datasets, accept, decision in cases:
        measured = asyncio.run(_probe(profile, workload, datasets, max_rounds=1))
        assert measured.reason != "ProbeFailed" and measured.accept_length == pytest.approx(accept, rel=0.15), measured.message
        synthetic = workload.prompts.source == "Random"
        assert ("SyntheticTraffic" in measured.message) is synthetic and bool(measured.synthetic) is synthetic, measured.message
        decided = _decided_at_measured_acceptance(measured.accept_length, workload, datasets)
        assert decided.decision == decision, (profile.name, workload.prompts, decided.message)


def test_prefix_match():
    assert prefix_match([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, None)
    assert prefix_match([1, 2, 3, 4], [1, 2, 9, 4]) == (0.5, 2)


def test_equal_servers_match_exactly_and_a_corrupted_server_is_rolled_back():
    check = OutputCheck(prompts=8, max_tokens=64)
    equal = asyncio.run(_probe(_profile("good", 3.0), _workload(source="Random"), check=check))
    assert equal.output_match_rate == 1.0 and equal.reason != "OutputMismatch"
    bad = asyncio.run(_probe(_profile("bad", 3.0, corrupt_token_share=0.05), _workload(), check=check))
    assert bad.decision == "rollback" and bad.reason == "OutputMismatch" and bad.output_match_rate < 0.9, bad.message


def test_a_synthetic_decision_posts_a_synthetic_traffic_warning_once():
    from specdec_operator.api import ProbeStatus, SpeculativeServerStatus
    from specdec_operator.reconcile.events import transition_events

    probe = ProbeStatus(
        decision="promote", reason="SpeedupConfirmed", revision="r1", synthetic_traffic=True, traffic="w: random token ids (32 tokens)"
    )
    new = SpeculativeServerStatus(probe=probe)
    events = transition_events(SpeculativeServerStatus(), new, name="x", workloads=["w"])
    assert [(e.type, e.reason) for e in events if e.reason == "SyntheticTraffic"] == [("Warning", "SyntheticTraffic")]
    assert not [e for e in transition_events(new, new, name="x", workloads=["w"]) if e.reason == "SyntheticTraffic"]
