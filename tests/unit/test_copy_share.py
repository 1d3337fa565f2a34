"""The real-engine race's measure of how much an answer quotes its prompt (tests/support/copy_workloads.py)."""

from __future__ import annotations

import pytest

from tests.support.copy_workloads import ANSWER_CYCLE, PASSAGE_WORDS, PASSAGES, context_share, copy_share, copy_workload, free_answer


def test_a_quoted_passage_is_all_copy() -> None:
    prompt = ["Repeat", "this", "text:", "a", "b", "c", "d", "e", "f", "g", "h"]
    assert copy_share(prompt, ["a", "b", "c", "d", "e", "f", "g", "h"]) == 1.0
    assert copy_share(prompt, ["c", "d", "e", "f"]) == 1.0


def test_runs_shorter_than_the_span_do_not_count() -> None:
    prompt = ["Repeat", "this", "text:", "a", "b", "c", "d", "e", "f", "g", "h"]
    assert copy_share(prompt, ["a", "b", "c", "x", "d", "e", "f", "y"]) == 0.0  # three in a row at most
    # 4 of 8 words in the run "e f g h"; "a b x" breaks the other half
    assert copy_share(prompt, ["a", "b", "x", "y", "e", "f", "g", "h"]) == pytest.approx(0.5)
    assert copy_share(prompt, []) == 0.0


def test_context_share_also_counts_the_answers_own_repeats() -> None:
    prompt = ["what", "is", "a", "loop"]
    looping = ["t", "d", "d", "t", "d", "d", "t", "d", "d", "t"]
    assert copy_share(prompt, looping) == 0.0
    assert context_share(prompt, looping) > 0.6
    assert context_share(prompt, ["a", "b", "c", "d", "e", "f", "g", "h"]) == 0.0


def test_a_free_answer_walks_the_cycle_without_repeating_a_run() -> None:
    answer = free_answer(start=60, words=48).split()
    assert answer[:5] == ANSWER_CYCLE[60:64] + ANSWER_CYCLE[:1]
    assert context_share([], answer) == 0.0
    assert not set(answer) & set(PASSAGE_WORDS)


def test_the_copy_workload_quotes_passages_longer_than_the_answer() -> None:
    prompts = copy_workload(16, seed=0)
    assert prompts == copy_workload(16, seed=0)
    for p in prompts:
        passage = p["messages"][-1]["content"].split(":", 1)[1].split()
        assert len(passage) >= 56 and set(passage) <= set(PASSAGE_WORDS)
        assert any(passage == words[: len(passage)] for words in PASSAGES)
