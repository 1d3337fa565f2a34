"""Drafter revisions that learned one kind of traffic (simulator/revisions.py): what `make demo`'s retraining loop
serves before and after the traffic shifts (issue 36, item 5)."""

import asyncio

import aiohttp
import pytest

from specdec_operator.errors import InputError
from specdec_operator.simulator import SimulatorServer, load_profile
from specdec_operator.simulator import revisions as rv
from specdec_operator.simulator.cli import build_parser, resolve_profile

CHAT = "Tell me about your favourite holiday and what made it memorable."
CODE = "Write a Python function that parses a CSV file and returns a dict of columns."


def test_a_drafter_trained_on_chat_accepts_chat_and_not_code():
    eagle = load_profile("llama31-8b-eagle3")
    chat = rv.trained_on(eagle, ["chat"])
    spec = chat.speculative
    assert spec.accept_length_for("chat") == eagle.speculative.accept_length_mean == 2.8
    assert spec.accept_length_for("code") == rv.UNTRAINED_ACCEPT_LENGTH
    code = rv.trained_on(eagle, ["code"]).speculative
    assert code.accept_length_for("code") == 2.8 and code.accept_length_for("chat") == rv.UNTRAINED_ACCEPT_LENGTH


def test_kind_figures_follow_the_acceptance_on_that_kind():
    eagle, base = load_profile("llama31-8b-eagle3"), load_profile("llama31-8b-base")
    chat = rv.trained_on(eagle, ["chat"])
    on_chat, on_code = rv.kind_figures(chat, base, "chat"), rv.kind_figures(chat, base, "code")
    assert on_chat[1] == 2.8 and on_code[1] == 1.2
    assert on_chat[0] > 1.5 and on_code[0] < 1.0  # 1.2 tokens a step do not pay for the verify step
    assert rv.kind_figures(rv.trained_on(eagle, ["code"]), base, "code") == on_chat


def test_learned_kinds_are_the_traffic_s_main_kinds():
    assert rv.learned_kinds([CODE] * 8 + [CHAT] * 2) == ("code",)
    assert rv.learned_kinds([CODE] * 5 + [CHAT] * 5) in (("code", "chat"), ("chat", "code"))
    assert rv.learned_kinds([]) == ()


def test_a_revision_directory_round_trips_and_a_bad_one_is_one_line(tmp_path):
    rv.write_revision(tmp_path, "llama31-8b-eagle3", ["code"])
    profile = rv.read_revision(tmp_path)
    assert profile.speculative.accept_length_for("code") == 2.8 and profile.speculative.accept_length_for("chat") == 1.2
    (tmp_path / rv.REVISION_FILE).write_text('{"profile": "llama31-8b-eagle3", "trainedOn": ["poetry"]}')
    with pytest.raises(InputError, match="poetry"):
        rv.read_revision(tmp_path)
    with pytest.raises(InputError, match="not a simulated drafter revision"):
        rv.read_revision(tmp_path / "missing")


def test_trained_on_refuses_a_base_and_ngram():
    with pytest.raises(InputError, match="no trained drafter"):
        rv.trained_on(load_profile("llama31-8b-base"), ["chat"])
    with pytest.raises(InputError, match="no trained drafter"):
        rv.trained_on(load_profile("llama31-8b-ngram"), ["chat"])
    with pytest.raises(InputError, match="kinds are"):
        rv.parse_kinds("chat,poetry")


def test_the_simulator_serves_a_drafter_trained_on_chat_with_low_acceptance_on_code():
    """--trained-on through the CLI's profile: the served acceptance (SGLang's spec_accept_length) falls on code."""
    args = build_parser().parse_args(["--profile", "llama31-8b-eagle3", "--trained-on", "chat"])
    profile = resolve_profile(args)

    async def accept_on(prompt: str) -> float:
        server = SimulatorServer(profile, port=0, time_scale=50.0, seed=1, load_seconds=0)
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                body = {"text": prompt, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
                async with session.post(url + "/generate", json=body) as answer:
                    return (await answer.json())["meta_info"]["spec_accept_length"]
        finally:
            await server.stop()

    chat, code = asyncio.run(accept_on(CHAT)), asyncio.run(accept_on(CODE))
    assert chat > 2.2 and code < 1.6
