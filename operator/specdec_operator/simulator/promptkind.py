"""What kind of prompt a request is, for a profile's per-kind acceptance (``accept_length_by_kind``).

A drafter accepts more on some traffic than on other: EAGLE-3 tables report higher acceptance on code and math
(HumanEval, GSM8K) than on open chat (MT-Bench), and a drafter trained on English accepts less on other languages.
Random token ids are their own kind: no drafter predicts them well. The simulator cannot know what a real drafter
would do; it applies the table a profile gives, keyed by this classifier of the prompt text. The rule is simple
and documented (docs/probe.md), so a test knows which kind each of its prompts is:

1. ``input_ids`` (no text) -> ``random``.
2. More than 30 % of the letters outside ASCII, or two different words of a short list of German, French, Spanish,
   Portuguese and Italian function words (``und``, ``der``, ``est``, ``les``, ``una``, ``não``, ...) -> ``multilingual``.
3. A code marker (a fence, ``def ``, ``function``, ``class ``, ``#include``, ``SELECT ``, ``=>``, ``{``, or the words
   "Python", "Go ", "Rust", "TypeScript", "SQL", "C code") -> ``code``.
4. A math marker (``solve``, ``equation``, ``probability``, ``compute``, ``x^2``, or at least three numbers and an
   operator or a "how much"/"how long") -> ``math``.
5. ``summar`` or ``tl;dr`` -> ``summary``.
6. Anything else -> ``chat``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

KINDS = ("random", "multilingual", "code", "math", "summary", "chat")

_CODE = re.compile(r"```|\bdef |\bfunction\b|\bclass |#include|\bSELECT |=>|\{|\bPython\b|\bGo\b|\bRust\b|\bTypeScript\b|\bSQL\b|\bC code\b")
_MATH_WORDS = re.compile(r"\bsolve\b|\bequation|\bprobabilit|\bcompute\b|x\^2|\bhow (much|long|many)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_OPERATOR = re.compile(r"[-+*/=%^]")
_FOREIGN_WORDS = frozenset(
    [
        "und",
        "der",
        "die",
        "das",
        "ist",
        "nicht",
        "ich",
        "wie",
        "eine",
        "einen",
        "mit",
        "auf",
        "les",
        "est",
        "une",
        "pour",
        "dans",
        "avec",
        "qui",
        "sont",
        "pas",
        "el",
        "los",
        "las",
        "una",
        "por",
        "para",
        "como",
        "qué",
        "cómo",
        "del",
        "não",
        "uma",
        "você",
        "são",
        "il",
        "della",
        "che",
        "sono",
        "per",
        "gli",
    ]
)
_WORD = re.compile(r"\w+")
_SUMMARY = re.compile(r"summar|tl;dr", re.IGNORECASE)


def classify(text: str | None) -> str:
    """The kind of a prompt: random (no text), multilingual, code, math, summary or chat (rules in the module doc)."""
    if text is None:
        return "random"
    letters = [c for c in text if c.isalpha()]
    if letters and sum(1 for c in letters if not c.isascii()) > 0.3 * len(letters):
        return "multilingual"
    if len(_FOREIGN_WORDS.intersection(w.lower() for w in _WORD.findall(text))) >= 2:
        return "multilingual"
    if _CODE.search(text):
        return "code"
    if _MATH_WORDS.search(text) or (len(_NUMBER.findall(text)) >= 3 and _OPERATOR.search(text)):
        return "math"
    if _SUMMARY.search(text):
        return "summary"
    return "chat"


# How long a span must be to count as repeated (n-gram speculation matches a few tokens of context and drafts what
# followed them; SGLang's and vLLM's defaults match 1-5 and up to 18 tokens).
REPEAT_SPAN = 4


def repetition_share(tokens: Sequence[object]) -> float:
    """The share of a prompt's tokens that lie in a span of REPEAT_SPAN tokens occurring at least twice in it.

    What n-gram and suffix speculation feed on: context whose spans come back (code under edit, a document quoted in a
    RAG prompt, an agent's transcript with repeated tool output). The simulator has no model of what a real target
    would answer, so it takes the prompt's own repetition as the share of the answer that repeats the context
    (docs/candidates.md). Random token ids and free chat prompts come out near 0; text is split into words, token ids are
    taken as they are.
    """
    n = len(tokens)
    if n < 2 * REPEAT_SPAN:
        return 0.0
    seen: dict[tuple[object, ...], int] = {}
    for i in range(n - REPEAT_SPAN + 1):
        span = tuple(tokens[i : i + REPEAT_SPAN])
        seen[span] = seen.get(span, 0) + 1
    covered = [False] * n
    for i in range(n - REPEAT_SPAN + 1):
        if seen[tuple(tokens[i : i + REPEAT_SPAN])] > 1:
            covered[i : i + REPEAT_SPAN] = [True] * REPEAT_SPAN
    return round(sum(covered) / n, 4)


def text_repetition_share(text: str | None) -> float:
    """repetition_share of a text prompt, by words."""
    return repetition_share(text.split()) if text else 0.0
