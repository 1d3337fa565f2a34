"""The two workloads of the real-engine race (issue 35, item 5) and the measure that tells them apart.

- ``copy``: chat prompts that quote a passage of coined words and ask for it back ("Repeat this text: ..."): the
  traffic prompt-lookup (n-gram) speculation is for, where the answer repeats long spans of the prompt;
- ``free``: the probe's shipped prompt set (free-text questions), where nothing in the answer is in the prompt.

The copy-trained target (tests/support/copy_models.py) learns both from these generators: the passage back on a
copy prompt (every passage begins one of four fixed sequences of coined words: see copy_models on why), a fixed cycle of
64 other coined words (never a word of the prompt) on anything else.

``copy_share`` is the share of an answer's tokens inside a SPAN-token run that also occurs in the prompt: 1.0 where
the answer quotes the prompt throughout, 0.0 where no SPAN consecutive answer tokens appear there. The race measures it
on words of the servers' text (every coined word is one token of the copy target's tokenizer, so words are tokens).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SPAN = 4
COPY_INSTRUCTIONS = ["Repeat this text:", "Quote the passage exactly:", "Copy this passage word for word:", "Say this back to me:"]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
# Free-text prompts in training: English-like questions (the shipped prompts are English questions and tasks).
ENGLISH = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "for",
    "on",
    "with",
    "as",
    "how",
    "what",
    "why",
    "when",
    "write",
    "explain",
    "describe",
    "give",
    "list",
    "make",
    "find",
    "solve",
    "python",
    "function",
    "code",
    "text",
    "words",
    "step",
    "by",
    "small",
    "large",
    "company",
    "job",
    "interview",
    "train",
    "time",
    "data",
    "file",
    "number",
    "sort",
    "short",
    "story",
    "about",
    "history",
    "science",
    "plan",
    "trip",
    "recipe",
    "letter",
    "email",
    "summary",
    "reason",
    "example",
    "table",
    "question",
    "answer",
    "difference",
    "between",
    "simple",
    "best",
    "way",
    "learn",
    "use",
    "build",
    "test",
    "fix",
    "error",
    "program",
    "string",
    "list",
    "dict",
    "class",
    "return",
    "value",
]


def coined_words(n: int, seed: int, avoid: Sequence[str] = ()) -> list[str]:
    """`n` distinct lowercase words of 4-6 letters built from consonant-vowel syllables (no English word: the
    shipped prompts do not contain them), none in `avoid`."""
    rnd = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        word = "".join(rnd.choice("bdfgklmnprstvz") + rnd.choice("aeiou") for _ in range(rnd.choice([2, 3])))
        word = word[: rnd.choice([4, 5, 6])]
        if word not in out and word not in avoid and word not in ENGLISH:
            out.append(word)
    return out


# A passage is the beginning of one of four sequences of 64 coined words (the target finds which in the prompt and
# continues it: copy_models says why); a free answer walks the answer cycle from any word.
PASSAGE_WORDS = coined_words(256, seed=10)
PASSAGES = [PASSAGE_WORDS[i : i + 64] for i in range(0, 256, 64)]
ANSWER_CYCLE = coined_words(64, seed=11, avoid=PASSAGE_WORDS)


def copy_example(rnd: random.Random, min_words: int, max_words: int) -> tuple[list[dict[str, str]], str]:
    """A copy prompt (its passage the first `min_words`-`max_words` words, at most 64, of one of PASSAGES) and the
    answer: the passage."""
    passage = " ".join(rnd.choice(PASSAGES)[: rnd.randint(min_words, max_words)])
    messages = [{"role": "user", "content": f"{rnd.choice(COPY_INSTRUCTIONS)} {passage}"}]
    return ([SYSTEM] if rnd.random() < 0.5 else []) + messages, " " + passage


def free_answer(start: int, words: int) -> str:
    return "".join(" " + ANSWER_CYCLE[(start + i) % len(ANSWER_CYCLE)] for i in range(words))


def free_example(rnd: random.Random, words: int) -> tuple[list[dict[str, str]], str]:
    """A free prompt (English-like words, some punctuation and digits) and its answer: `words` steps of the cycle."""
    parts = [rnd.choice(ENGLISH) for _ in range(rnd.randint(4, 24))]
    for _ in range(rnd.randint(0, 3)):
        parts.insert(rnd.randrange(len(parts) + 1), rnd.choice(["?", ".", ",", ":", "(x)", "9:15", "240", "k", "'s"]))
    text = " ".join(parts)
    messages = [{"role": "user", "content": text[0].upper() + text[1:]}]
    return ([SYSTEM] if rnd.random() < 0.5 else []) + messages, free_answer(rnd.randrange(len(ANSWER_CYCLE)), words)


def training_examples(n: int, seed: int, copy_fraction: float = 0.5) -> list[tuple[list[dict[str, str]], str]]:
    """`n` (messages, answer) pairs, `copy_fraction` of them copy prompts of 8-64 words, the rest free (32-word answers:
    the cycle is learnt from any stretch of it)."""
    rnd = random.Random(seed)
    return [copy_example(rnd, 8, 64) if rnd.random() < copy_fraction else free_example(rnd, 32) for _ in range(n)]


def copy_workload(n: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """The race's copy prompts: passages of 56-64 words, longer than the probe's 48 output tokens."""
    rnd = random.Random(1000 + seed)
    return [{"messages": copy_example(rnd, 56, 64)[0]} for _ in range(n)]


def free_workload() -> list[dict[str, Any]]:
    """The race's free prompts: the probe's shipped prompt set."""
    path = REPO / "operator" / "specdec_operator" / "probe" / "data" / "default-prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


WORKLOADS: dict[str, Callable[[], list[dict[str, Any]]]] = {"copy": copy_workload, "free": free_workload}


def write_jsonl(path: Path, prompts: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def covered_share(output: Sequence[Any], seen: Callable[[int], bool], span: int = SPAN) -> float:
    """The share of `output` inside a `span`-long run starting at i for which seen(i) is true."""
    covered = [False] * len(output)
    for i in range(len(output) - span + 1):
        if seen(i):
            covered[i : i + span] = [True] * span
    return sum(covered) / len(output) if output else 0.0


def copy_share(prompt: Sequence[Any], output: Sequence[Any], span: int = SPAN) -> float:
    """The share of `output` (tokens or words) inside a `span`-long run that also occurs in `prompt`."""
    runs = {tuple(prompt[i : i + span]) for i in range(len(prompt) - span + 1)}
    return covered_share(output, lambda i: tuple(output[i : i + span]) in runs, span)


def context_share(prompt: Sequence[Any], output: Sequence[Any], span: int = SPAN) -> float:
    """As copy_share, but a run may also occur earlier in the output: what n-gram lookup can find."""
    runs = {tuple(prompt[i : i + span]) for i in range(len(prompt) - span + 1)}

    def seen(i: int) -> bool:
        run, earlier = tuple(output[i : i + span]), output[: i + span - 1]
        return run in runs or any(tuple(earlier[j : j + span]) == run for j in range(len(earlier) - span + 1))

    return covered_share(output, seen, span)
