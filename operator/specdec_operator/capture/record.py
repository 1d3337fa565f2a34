"""What one captured request becomes: the record's fields, the sampling draw, the opt-out, the redaction patterns.

Pure functions of a request's bytes and headers (and of the answer's), so the proxy's forwarding path only hands
them what it already has. Nothing here logs: a record's text must never reach a log line.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api_retraining import OPT_OUT_HEADER, OPT_OUT_VALUES

# The OpenAI-compatible endpoints whose requests are captured; everything else is forwarded only.
CAPTURED_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
# A request body larger than this is forwarded and not captured (a prompt of a training sample is far smaller).
MAX_CAPTURED_BODY = 1 << 20
# The sampling parameters kept with a record (what regenerating its answer needs); the rest is dropped.
KEPT_PARAMETERS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop", "n", "stream", "seed")


def opted_out(headers: Mapping[str, str]) -> bool:
    """Whether the client asked that this request not be captured (header X-Specdec-Capture: off)."""
    return (headers.get(OPT_OUT_HEADER) or "").strip().lower() in OPT_OUT_VALUES


@dataclass
class Sampler:
    """Each request is captured with probability ``share``, independently (a seeded generator for tests)."""

    share: float
    seed: int | None = None
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def draw(self) -> bool:
        return self._random.random() < self.share


def request_fields(endpoint: str, body: bytes) -> dict[str, Any] | None:
    """The record's request part (model, messages or prompt, the kept parameters), or None when the body is not a
    JSON object of that endpoint (then nothing is captured)."""
    if len(body) > MAX_CAPTURED_BODY:
        return None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(document, dict):
        return None
    text_key = "messages" if endpoint == "chat" else "prompt"
    if text_key not in document:
        return None
    out: dict[str, Any] = {"endpoint": endpoint, "model": document.get("model"), text_key: document[text_key]}
    out["parameters"] = {k: document[k] for k in KEPT_PARAMETERS if k in document}
    return out


def answer_text(endpoint: str, body: bytes, streamed: bool) -> list[str] | None:
    """The text of each choice of an answer (a JSON body, or server-sent events assembled from their deltas), or
    None when it cannot be read (then the record is kept without it)."""
    try:
        if not streamed:
            document = json.loads(body)
            return [_choice_text(endpoint, c, delta=False) for c in document.get("choices") or []]
        texts: dict[int, list[str]] = {}
        for line in body.decode("utf-8").splitlines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]" or not payload:
                continue
            for choice in json.loads(payload).get("choices") or []:
                texts.setdefault(int(choice.get("index", 0)), []).append(_choice_text(endpoint, choice, delta=True))
        return ["".join(texts[i]) for i in sorted(texts)]
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return None


def _choice_text(endpoint: str, choice: dict[str, Any], delta: bool) -> str:
    if endpoint == "completions":
        return str(choice.get("text") or "")
    message = choice.get("delta" if delta else "message") or {}
    return str(message.get("content") or "")


@dataclass(frozen=True)
class Redactor:
    """The spec's patterns, compiled once, replaced in every string of a record."""

    patterns: tuple[re.Pattern[str], ...]
    replacement: str = "[REDACTED]"

    @classmethod
    def of(cls, patterns: Iterable[str], replacement: str = "[REDACTED]") -> Redactor:
        return cls(tuple(re.compile(p) for p in patterns), replacement)

    def apply(self, value: Any) -> Any:
        """``value`` with every pattern replaced in every string inside it (keys are left as they are)."""
        if not self.patterns:
            return value
        if isinstance(value, str):
            for pattern in self.patterns:
                value = pattern.sub(self.replacement, value)
            return value
        if isinstance(value, list):
            return [self.apply(v) for v in value]
        if isinstance(value, dict):
            return {k: self.apply(v) for k, v in value.items()}
        return value
