"""Fault injection: the profile's ``errors`` block, the fault each generation request draws, and its effects.

Each rate is a per-request probability, drawn from the simulator's seeded RNG; at most one fault a request. What a
fault does on the wire (a streamed fault strikes half-way; generation.py writes it where each format streams):

- ``http_500``: answered 500 with SGLang's error body, before the request reaches the engine.
- ``timeout``: accepted and never answered (until the client gives up or the server stops).
- ``truncated_stream``: the connection closes: a stream without a finish or [DONE], or half a body.
- ``malformed_json``: stream events that are not JSON, or half a body that ends cleanly.
- ``stall``: the stream, or the body, waits ``stall_seconds`` of wall time, then finishes.
- ``die_after_requests``: the server dies (connections reset, health 503) on the request after that many.
- ``corrupt_token_share``: not a per-request fault but a wrong answer: that share of output positions (chosen per
  prompt, the same on every request with that prompt) carry another token, as a miswired drafter whose bad drafts
  the verify step lets through would produce. The stream is well-formed; only the text and ids differ.
"""

from __future__ import annotations

import asyncio
import enum
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import InputError

if TYPE_CHECKING:
    from .model import Emission

ERROR_KEYS = {
    "http_500_rate",
    "timeout_rate",
    "truncated_stream_rate",
    "malformed_json_rate",
    "stall_rate",
    "stall_seconds",
    "die_after_requests",
    "corrupt_token_share",
}


@dataclass(frozen=True)
class ErrorConfig:
    """Fault injection, each rate a per-request probability (drawn from the simulator's seeded RNG)."""

    http_500_rate: float = 0.0
    timeout_rate: float = 0.0  # accept the request and never answer
    truncated_stream_rate: float = 0.0  # close the stream half-way, without a finish or [DONE]
    malformed_json_rate: float = 0.0  # stream events from half-way are not JSON
    stall_rate: float = 0.0  # stop streaming half-way for stall_seconds (wall), then finish: too late
    stall_seconds: float = 30.0
    die_after_requests: int | None = None  # the server dies (connections reset) after this many /generate
    corrupt_token_share: float = 0.0  # share of output positions with a wrong token (tokens.CorruptedTokens)


def error_config_from_dict(raw: Any, source: str) -> ErrorConfig:
    """Validate a profile's ``errors`` block (InputError names the bad key)."""
    if not isinstance(raw, dict):
        raise InputError(f"{source}: 'errors' must be an object")
    unknown = set(raw) - ERROR_KEYS
    if unknown:
        raise InputError(f"{source}: unknown errors key(s) {sorted(unknown)}; known: {sorted(ERROR_KEYS)}")
    for key, value in raw.items():
        if key == "die_after_requests":
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise InputError(f"{source}: errors.die_after_requests must be null or an integer >= 0")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (key.endswith(("_rate", "_share")) and value > 1):
            raise InputError(f"{source}: errors.{key} must be a number (rates within 0..1), got {value!r}")
    return ErrorConfig(**raw)


class Fault(enum.Enum):
    NONE = "none"
    HTTP_500 = "http_500"
    TIMEOUT = "timeout"
    TRUNCATED = "truncated_stream"
    MALFORMED = "malformed_json"
    STALL = "stall"


class FaultInjector:
    """Draws each generation request's fault and says when the server dies."""

    def __init__(self, errors: ErrorConfig, seed: int | None) -> None:
        self.errors = errors
        # Its own stream: the engine's jitter and acceptance draws do not shift with the faults drawn.
        self.rng = random.Random(None if seed is None else seed + 7919)

    def draw(self) -> Fault:
        e = self.errors
        u = self.rng.random()
        for fault, rate in (
            (Fault.HTTP_500, e.http_500_rate),
            (Fault.TIMEOUT, e.timeout_rate),
            (Fault.TRUNCATED, e.truncated_stream_rate),
            (Fault.MALFORMED, e.malformed_json_rate),
            (Fault.STALL, e.stall_rate),
        ):
            if u < rate:
                return fault
            u -= rate
        return Fault.NONE

    def kills_at(self, generation_requests: int) -> bool:
        """Whether the server is dead once it has received this many generation requests."""
        limit = self.errors.die_after_requests
        return limit is not None and generation_requests > limit


def past_halfway(em: Emission, max_new_tokens: int) -> bool:
    """Whether a streamed fault strikes at this emission: half the tokens are out, and it is not the last."""
    return em.completion_tokens >= max_new_tokens // 2 and not em.finished


def close_connection(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.close()


async def whole_response(request: web.Request, body: bytes, fault: Fault, stall_seconds: float) -> web.StreamResponse:
    """A response that is not streamed, as the request's fault leaves it."""
    if fault is Fault.TRUNCATED:
        return await _truncated_response(request, body[: len(body) // 2], "application/json")
    if fault is Fault.MALFORMED:
        return web.Response(body=body[: len(body) // 2], content_type="application/json")
    if fault is Fault.STALL:
        await asyncio.sleep(stall_seconds)
    return web.Response(body=body, content_type="application/json")


async def _truncated_response(request: web.Request, partial: bytes, content_type: str) -> web.StreamResponse:
    """Promise twice the bytes, send ``partial`` and close: the client sees the body end early."""
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    resp.content_length = len(partial) * 2
    await resp.prepare(request)
    await resp.write(partial)
    close_connection(request)
    return resp
