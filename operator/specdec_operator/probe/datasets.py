"""Prompt datasets for the probe: the formats users have, parsed into one normalised form.

Three formats, one prompt per line (ShareGPT also as one JSON array, as it is published):

- ``Chat``: JSONL of OpenAI chat requests, ``{"messages": [{"role": "user", "content": "..."}], "max_tokens": 256}``
  (``max_tokens`` or ``max_completion_tokens`` optional; other request keys are ignored).
- ``ShareGPT``: ``{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}``; the
  conversation up to its last human turn is the prompt (a trailing gpt answer is the reference, not sent).
- ``Prompt``: JSONL of ``{"prompt": "..."}`` (optional ``max_tokens``).

``Auto`` tells them apart per line by their key. Every error is one line naming the source, the line (or item) and
the fix: ``configmap/prompts key chat.jsonl line 17: not JSON (Expecting ',' delimiter); fix the line or remove it``.
The package ships a default set (``data/default-prompts.jsonl``, written for this project: see docs/probe.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InputError

FORMATS = ("Auto", "Chat", "ShareGPT", "Prompt")
MAX_PROMPTS = 20_000
MAX_BYTES = 64 * 1024 * 1024
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "system": "system",
}
_KEY_FORMAT = {"messages": "Chat", "conversations": "ShareGPT", "prompt": "Prompt"}


@dataclass(frozen=True)
class Prompt:
    """One normalised prompt: chat messages (a ``Prompt`` line is one user message) and its own output cap."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int | None = None
    raw_text: str | None = None  # a Prompt line's text, sent to /generate as it is

    @property
    def text(self) -> str:
        """What /generate's ``text`` gets: the prompt line itself, or the messages' contents joined (no chat template)."""
        if self.raw_text is not None:
            return self.raw_text
        return "\n\n".join(content for _, content in self.messages)

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_dict(self) -> dict[str, Any]:
        """The normalised JSONL line (format Chat, or Prompt for a raw text)."""
        out: dict[str, Any] = {"prompt": self.raw_text} if self.raw_text is not None else {"messages": self.chat_messages()}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


def _fail(source: str, where: str, problem: str, fix: str = "fix the line or remove it") -> InputError:
    return InputError(f"{source} {where}: {problem}; {fix}")


def _max_tokens(obj: dict[str, Any], source: str, where: str) -> int | None:
    for key in ("max_tokens", "max_completion_tokens"):
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail(source, where, f"{key} must be a positive integer, got {value!r}")
        return value
    return None


def _text(value: Any, source: str, where: str, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts: the text parts only
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        if texts and len(texts) == len(parts):
            return "\n".join(texts)
    raise _fail(source, where, f"{what} must be a string (or a list of text parts), got {type(value).__name__}")


def _chat(obj: dict[str, Any], source: str, where: str) -> Prompt:
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail(source, where, "'messages' must be a non-empty list of {role, content}")
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or "content" not in msg:
            raise _fail(source, where, f"messages[{i}] must be an object with 'role' and 'content'")
        out.append((msg["role"], _text(msg["content"], source, where, f"messages[{i}].content")))
    if not any(role == "user" for role, _ in out):
        raise _fail(source, where, "no message has role 'user'")
    return Prompt(tuple(out), _max_tokens(obj, source, where))


def _sharegpt(obj: dict[str, Any], source: str, where: str) -> Prompt:
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise _fail(source, where, "'conversations' must be a non-empty list of {from, value}")
    out: list[tuple[str, str]] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) or not isinstance(turn.get("value"), str):
            raise _fail(source, where, f"conversations[{i}] must be an object with string 'from' and 'value'")
        role = _ROLES.get(turn["from"].lower())
        if role is None:
            raise _fail(source, where, f"conversations[{i}].from {turn['from']!r} is not one of human, gpt, system")
        out.append((role, turn["value"]))
    while out and out[-1][0] == "assistant":  # the reference answer is not part of the prompt
        out.pop()
    if not any(role == "user" for role, _ in out):
        raise _fail(source, where, "no human turn")
    return Prompt(tuple(out), _max_tokens(obj, source, where))


def _prompt(obj: dict[str, Any], source: str, where: str) -> Prompt:
    text = obj.get("prompt")
    if not isinstance(text, str) or not text:
        raise _fail(source, where, "'prompt' must be a non-empty string")
    return Prompt((("user", text),), _max_tokens(obj, source, where), raw_text=text)


_PARSERS = {"Chat": _chat, "ShareGPT": _sharegpt, "Prompt": _prompt}


def _one(obj: Any, fmt: str, source: str, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise _fail(source, where, f"expected a JSON object, got {type(obj).__name__}")
    if fmt == "Auto":
        found = [f for key, f in _KEY_FORMAT.items() if key in obj]
        if not found:
            raise _fail(source, where, "no 'messages', 'conversations' or 'prompt' key (formats Chat, ShareGPT, Prompt)")
        fmt = found[0]
    else:
        key = next(k for k, f in _KEY_FORMAT.items() if f == fmt)
        if key not in obj:
            raise _fail(source, where, f"no {key!r} key (format {fmt})", "fix the line, or set the format to the one the file has (or Auto)")
    return _PARSERS[fmt](obj, source, where)


def parse_dataset(text: str, *, source: str, fmt: str = "Auto") -> list[Prompt]:
    """Parse a dataset's text; InputError (one line naming ``source`` and the line) on the first bad line."""
    if fmt not in FORMATS:
        raise InputError(f"{source}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if len(text.encode()) > MAX_BYTES:
        raise InputError(f"{source}: larger than {MAX_BYTES // (1024 * 1024)} MiB; use a sample of it")
    prompts: list[Prompt] = []
    stripped = text.lstrip()
    if stripped.startswith("["):  # one JSON array (ShareGPT as published, or a list of any of the formats)
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _fail(
                source, f"line {exc.lineno}", f"not JSON ({exc.msg})", "fix the file (a JSON array, or JSONL with one object a line)"
            ) from None
        for i, obj in enumerate(items):
            prompts.append(_one(obj, fmt, source, f"item {i}"))
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(source, f"line {number}", f"not JSON ({exc.msg})") from None
            prompts.append(_one(obj, fmt, source, f"line {number}"))
            if len(prompts) > MAX_PROMPTS:
                break
    if not prompts:
        raise InputError(f"{source}: no prompts in it; give one JSON object a line (formats Chat, ShareGPT, Prompt)")
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{source}: more than {MAX_PROMPTS} prompts; use a sample of it")
    return prompts


def load_dataset_file(path: str | Path, fmt: str = "Auto", *, source: str | None = None) -> list[Prompt]:
    """Read and parse a dataset file (``specdec probe --dataset FILE``, and the reader pod of a File source, whose
    ``source`` names the claim and the path on it rather than where the pod mounts it)."""
    source = source or f"dataset {path}"
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{source}: no such file; check the path (it is relative to the volume's root)") from None
    except IsADirectoryError:
        raise InputError(f"{source}: is a directory; give the path of a JSONL or JSON file") from None
    except OSError as exc:
        raise InputError(f"{source}: cannot be read ({exc.strerror}); give the path of a JSONL or JSON file") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    return parse_dataset(text, source=source, fmt=fmt)


DEFAULT_SOURCE = "the default prompt set (specdec_operator/probe/data/default-prompts.jsonl)"


def default_prompts() -> list[Prompt]:
    """The project's own prompt set, shipped as package data: used when a workload names no source."""
    text = (resources.files("specdec_operator.probe") / "data" / "default-prompts.jsonl").read_text(encoding="utf-8")
    return parse_dataset(text, source=DEFAULT_SOURCE, fmt="Chat")


def to_jsonl(prompts: list[Prompt]) -> str:
    """The normalised prompts as JSONL (what the file reader hands the operator)."""
    return "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in prompts)
