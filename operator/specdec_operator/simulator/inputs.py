"""What a generation request asks for: the bodies of /generate, /v1/completions and /v1/chat/completions, parsed.

There is no tokenizer: a text prompt counts one token per 4 UTF-8 bytes, a chat message 4 tokens more for its
role and template; ``input_ids`` and token-id prompts count exactly. A body SGLang would refuse raises
:class:`RequestError` with the message SGLang's 400 carries (formats.error_response renders it).
"""

from __future__ import annotations

import math
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from .promptkind import classify, repetition_share, text_repetition_share


class RequestError(Exception):
    """A request SGLang would refuse with 400 (its error body shape)."""


@dataclass(frozen=True, kw_only=True)
class GenerationInput:
    """What every generation endpoint asks of the engine."""

    prompt_tokens: int
    max_new_tokens: int
    stream: bool
    stream_interval: int | None = None  # None: the server's --stream-interval
    kind: str = "random"  # promptkind.classify of the prompt text (a profile's accept_length_by_kind)
    prompt_key: int = 0  # a stable hash of the prompt: which output tokens a corrupt_token_share fault changes
    # promptkind.repetition_share of the prompt: how much of the answer repeats the context (n-gram, suffix speculation)
    repetition: float = 0.0


@dataclass(frozen=True, kw_only=True)
class GenerateInput(GenerationInput):
    """A /generate request (SGLang's native API)."""

    rid: str  # the client's request id, or a fresh one


@dataclass(frozen=True, kw_only=True)
class OpenAIInput(GenerationInput):
    """A /v1/completions or /v1/chat/completions request."""

    chat: bool
    model: str
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: the usage in every content chunk
    return_token_ids: bool = False  # vLLM's return_token_ids: the completion's token ids in choices[0].token_ids


def _key(prompt: Any) -> int:
    return zlib.crc32(repr(prompt).encode())


def parse_generate(body: dict[str, Any]) -> GenerateInput:
    prompt_tokens = _generate_prompt_tokens(body)
    text = body.get("text") if body.get("input_ids") is None else None
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise RequestError("sampling_params must be an object")
    max_new = _int_param(params, "max_new_tokens", 128)
    interval = _optional_int_param(params, "stream_interval")
    return GenerateInput(
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new,
        stream=bool(body.get("stream", False)),
        rid=str(body.get("rid") or uuid.uuid4().hex),
        stream_interval=interval,
        kind=classify(text),
        prompt_key=_key(text if text is not None else body.get("input_ids")),
        repetition=text_repetition_share(text) if text is not None else repetition_share(body.get("input_ids") or []),
    )


def parse_completions(body: dict[str, Any], served_model_name: str) -> OpenAIInput:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt_tokens = len(prompt)
    elif isinstance(prompt, str):
        prompt_tokens = text_tokens(prompt)
    else:
        raise RequestError("prompt must be a string or a list of token ids")
    max_new = _int_param(body, "max_tokens", 16)
    kind = classify(prompt if isinstance(prompt, str) else None)
    repetition = text_repetition_share(prompt) if isinstance(prompt, str) else repetition_share(prompt)
    return _openai_input(
        body, served_model_name, chat=False, prompt_tokens=prompt_tokens, max_new_tokens=max_new, kind=kind, key=_key(prompt), repetition=repetition
    )


def parse_chat_completions(body: dict[str, Any], served_model_name: str) -> OpenAIInput:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt_tokens = text_tokens(text) + 4 * len(messages)  # role/template tokens
    max_new = _optional_int_param(body, "max_completion_tokens") or _int_param(body, "max_tokens", 128)
    # The kind is the user's words (a system prompt is the same on every request).
    user = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role") == "user")
    return _openai_input(
        body,
        served_model_name,
        chat=True,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new,
        kind=classify(user or text),
        key=_key(messages),
        repetition=text_repetition_share(text),  # the whole context: a system prompt's document is quoted too
    )


def text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode()) / 4))


def _openai_input(
    body: dict[str, Any], served_model_name: str, *, chat: bool, prompt_tokens: int, max_new_tokens: int, kind: str, key: int, repetition: float
) -> OpenAIInput:
    opts = body.get("stream_options") or {}
    return OpenAIInput(
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        stream=bool(body.get("stream", False)),
        chat=chat,
        model=str(body.get("model") or served_model_name),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        continuous_usage=bool(isinstance(opts, dict) and opts.get("continuous_usage_stats")),
        return_token_ids=bool(body.get("return_token_ids")),
        kind=kind,
        prompt_key=key,
        repetition=repetition,
    )


def _generate_prompt_tokens(body: dict[str, Any]) -> int:
    ids = body.get("input_ids")
    text = body.get("text")
    if ids is not None:
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            raise RequestError("batched input_ids are not supported by the simulator; send one prompt a request")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise RequestError("input_ids must be a non-empty list of integers")
        return len(ids)
    if text is not None:
        if isinstance(text, list):
            raise RequestError("batched text is not supported by the simulator; send one prompt a request")
        if not isinstance(text, str):
            raise RequestError("text must be a string")
        return text_tokens(text)
    raise RequestError("Either text, input_ids or input_embeds should be provided.")


def _int_param(params: dict[str, Any], key: str, default: int) -> int:
    value = _optional_int_param(params, key)
    return default if value is None else value


def _optional_int_param(params: dict[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RequestError(f"{key} must be a non-negative integer, got {value!r}")
    return value
