"""`specdec-train gather` (a retraining Job's first stage, issue 36 item 2): the capture's JSON lines become prompt
conversations for regeneration and a held-out slice that training never sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drafter_training.cli import build_parser
from drafter_training.gather import RECENT_SHARE, gather, sample_window
from drafter_training.regenerate import read_conversations
from specdec_operator.api_retraining_job import TrainingBudget
from specdec_operator.errors import InputError


def _capture(directory: Path, name: str, records: list) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def chat(i: int) -> dict:
    return {
        "time": "2026-12-07T01:00:00Z",
        "endpoint": "/v1/chat/completions",
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": f"question {i}"}],
    }


def test_gather_keeps_chat_requests_once_and_splits_a_stable_heldout_slice(tmp_path):
    cap = tmp_path / "cap"
    _capture(cap, "capture-20261207T000000Z-a.jsonl", [chat(i) for i in range(150)] + [{"endpoint": "/v1/completions", "prompt": "raw text"}])
    _capture(cap, "capture-20261207T010000Z-b.jsonl", [chat(3), chat(7), '{"messages": [{"role": "user", "content": "cut sho', chat(200)])
    (cap / "notes.txt").write_text("not a capture file")
    stats = gather(cap, tmp_path / "out", heldout_share=0.2)
    assert stats == {
        "files": 2,
        "unreadable": 1,
        "not_chat": 1,
        "repeated": 2,
        "conversations": 151,
        "older": 0,
        "train": stats["train"],
        "heldout": stats["heldout"],
    }
    assert stats["train"] + stats["heldout"] == 151 and 15 <= stats["heldout"] <= 45  # about a fifth of them
    train, heldout = read_conversations(tmp_path / "out" / "prompts.jsonl"), read_conversations(tmp_path / "out" / "heldout.jsonl")
    texts = lambda convs: {c["messages"][0]["content"] for c in convs}  # noqa: E731
    assert not texts(train) & texts(heldout) and texts(train) | texts(heldout) == {f"question {i}" for i in [*range(150), 200]}
    assert json.loads((tmp_path / "out" / "gather.json").read_text()) == stats
    # The same conversation lands on the same side whatever else was captured with it.
    again = gather(cap, tmp_path / "again", heldout_share=0.2, max_samples=40)
    assert again["conversations"] == 40 and texts(read_conversations(tmp_path / "again" / "heldout.jsonl")) <= texts(heldout)
    assert "question 200" in texts(read_conversations(tmp_path / "again" / "prompts.jsonl")) | texts(
        read_conversations(tmp_path / "again" / "heldout.jsonl")
    )  # the newest are kept


def test_the_window_keeps_the_newest_share_and_spreads_the_rest_over_the_older_traffic():
    items = list(range(100))
    assert sample_window(items, None) == ([], items) and sample_window(items, 100) == ([], items)  # everything fits
    older, newest = sample_window(items, 20, 0.5)
    assert newest == list(range(90, 100)) and older == list(range(0, 90, 9))  # evenly over 0..89, oldest first
    assert sample_window(items, 20, 1.0) == ([], list(range(80, 100)))  # the newest only
    older, newest = sample_window(items, 3, 0.1)
    assert newest == [99] and older == [0, 49]  # at least one of the newest
    assert sample_window(items, 20, 0.5) == sample_window(list(items), 20, 0.5)  # no randomness


def test_after_a_shift_the_older_traffic_is_trained_on_and_only_the_newest_is_held_out(tmp_path):
    """60 conversations of the old kind, then 60 of the new; 40 kept: the newest 20 (new kind), and 20 spread over the 100
    before them (12 of the old kind: every fifth)."""
    cap = tmp_path / "cap"
    old = [{**chat(i), "messages": [{"role": "user", "content": f"old {i}"}]} for i in range(60)]
    new = [{**chat(i), "messages": [{"role": "user", "content": f"new {i}"}]} for i in range(60)]
    _capture(cap, "capture-20261207T000000Z-a.jsonl", old)
    _capture(cap, "capture-20261207T020000Z-a.jsonl", new)
    stats = gather(cap, tmp_path / "out", heldout_share=0.3, max_samples=40, recent_share=0.5)
    assert stats["conversations"] == 40 and stats["older"] == 20 and stats["train"] + stats["heldout"] == 40
    train = [c["messages"][0]["content"] for c in read_conversations(tmp_path / "out" / "prompts.jsonl")]
    heldout = [c["messages"][0]["content"] for c in read_conversations(tmp_path / "out" / "heldout.jsonl")]
    assert sum(t.startswith("old") for t in train) == 12 and heldout and all(t in {f"new {i}" for i in range(40, 60)} for t in heldout)
    newest_only = gather(cap, tmp_path / "newest", heldout_share=0.3, max_samples=40, recent_share=1.0)
    assert newest_only["older"] == 0
    assert not any(c["messages"][0]["content"].startswith("old") for c in read_conversations(tmp_path / "newest" / "prompts.jsonl"))


def test_gather_refuses_what_it_cannot_use_in_one_line(tmp_path):
    with pytest.raises(InputError, match=r"no capture-\*\.jsonl; pass the captured traffic's directory"):
        gather(tmp_path, tmp_path / "out")
    _capture(tmp_path / "cap", "capture-x.jsonl", [{"prompt": "only completions"}])
    with pytest.raises(InputError, match="no chat conversation to train on"):
        gather(tmp_path / "cap", tmp_path / "out")
    with pytest.raises(InputError, match="--heldout-share 1.0"):
        gather(tmp_path / "cap", tmp_path / "out", heldout_share=1.0)
    with pytest.raises(InputError, match="--recent-share 0: must be above 0"):
        gather(tmp_path / "cap", tmp_path / "out", recent_share=0)


def test_the_stage_and_the_api_default_to_the_same_window():
    args = build_parser().parse_args(["gather", "--capture", "c", "--out", "o"])
    assert args.recent_share == RECENT_SHARE == TrainingBudget().recent_share
