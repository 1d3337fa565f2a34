"""Load generation against SGLang: closed-loop streaming clients, strict response checks.

One measurement runs ``workload.requests`` requests through ``workload.concurrency`` closed-loop clients
(each sends its next request the moment the previous one finishes). What a request is comes from traffic.py:
a dataset prompt to ``/v1/chat/completions`` or ``/generate`` with ``text``, or a prompt of exactly
``input_tokens`` random token ids (``input_ids``) to ``/generate``; with a fixed output length ``ignore_eos``
makes every request generate exactly ``output_tokens``. Output tok/s = tokens received / wall time from the
first send to the last completion, the same definition as ``sglang.benchmark.serving``'s
``output_throughput``.

Anything short of a complete, well-formed answer (a non-200 status, a connection error, a timeout, a chunk
that is not JSON, an ``error`` object, a stream that ends without its finish reason and ``[DONE]``, fewer
tokens than asked for) raises :class:`ProbeRequestError`: the probe never decides on partial data.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from ..api import Workload
from ..errors import InputError
from .stats import percentile, weighted_percentile
from .traffic import WorkloadTraffic, random_ids_plans

# orjson where it is installed: the stream parser's JSON decoding is most of the probe client's CPU (docs/probe.md).
_loads: Callable[[bytes], Any] = json.loads
try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is optional
    pass


class ProbeRequestError(Exception):
    """A request did not produce a complete, well-formed answer.

    ``transient``: the kind of failure that a later attempt can clear by itself (a connection reset or refused, a
    5xx or 429, a timeout, a request the server aborted: a restarting or preempted pod, an overloaded proxy), as
    opposed to an answer that is wrong in itself (malformed, the wrong token count). The probe scheduler retries a
    probe that failed transiently, with backoff, a bounded number of times, before ProbeFailed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def transient_status(status: int) -> bool:
    """HTTP statuses that mean "not now" rather than "never": server errors and rate limiting."""
    return status >= 500 or status == 429


def parse_workload(text: str) -> Workload:
    """The CLI form ``NAME:CONCURRENCY:INPUT_TOKENS:OUTPUT_TOKENS:REQUESTS[:WEIGHT]`` as the API's Workload."""
    parts = text.split(":")
    if len(parts) not in (5, 6):
        raise InputError(f"--workload {text!r}: expected NAME:CONCURRENCY:INPUT_TOKENS:OUTPUT_TOKENS:REQUESTS[:WEIGHT], e.g. chat:16:1024:256:64")
    name, *nums = parts
    try:
        ints = [int(x) for x in nums[:4]]
        weight = float(nums[4]) if len(nums) == 5 else 1.0
    except ValueError:
        raise InputError(f"--workload {text!r}: CONCURRENCY, INPUT_TOKENS, OUTPUT_TOKENS and REQUESTS must be integers (WEIGHT a number)") from None
    try:
        return Workload(name=name, concurrency=ints[0], input_tokens=ints[1], output_tokens=ints[2], requests=ints[3], weight=weight)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"--workload {text!r}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


@dataclass
class Measurement:
    """One workload run once against one server."""

    workload: str
    url: str
    output_tokens: int = 0
    duration_s: float = 0.0
    requests: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_pairs: list[tuple[float, int]] = field(default_factory=list)  # (per-token gap, tokens in the chunk)
    spec_tokens: int = 0  # completion tokens of requests that reported spec_verify_ct
    spec_verify_ct: int = 0
    aborted_early: bool = False
    # Token arrivals for the probe's within-measurement statistics (probe/stats.py): (start, end, tokens) per
    # stream event, perf_counter seconds; an event's tokens were produced between the previous event of the same
    # request and this one (a request's first event: at its arrival, after the prefill).
    started_at: float = 0.0
    arrivals: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def accept_length(self) -> float | None:
        """completion_tokens / spec_verify_ct over the measurement, as SGLang defines it; None if not speculating."""
        return self.spec_tokens / self.spec_verify_ct if self.spec_verify_ct else None

    def latency_summary(self) -> dict[str, float | None]:
        def ms(v: float | None) -> float | None:
            return None if v is None else round(v * 1000.0, 3)

        return {
            "ttft_p50_ms": ms(percentile(self.ttft_s, 50)),
            "ttft_p90_ms": ms(percentile(self.ttft_s, 90)),
            "ttft_p99_ms": ms(percentile(self.ttft_s, 99)),
            "itl_p50_ms": ms(weighted_percentile(self.itl_pairs, 50)),
            "itl_p90_ms": ms(weighted_percentile(self.itl_pairs, 90)),
            "itl_p99_ms": ms(weighted_percentile(self.itl_pairs, 99)),
        }


def make_prompts(workload: Workload, rng: random.Random) -> list[bytes]:
    """Request bodies (pre-serialized) with random token-id prompts of exactly ``input_tokens``."""
    return [plan.body for plan in random_ids_plans(workload, rng)]


def _chat_tokens(data: dict) -> tuple[int | None, object]:
    """(completion tokens so far or None, finish reason) of one OpenAI chat chunk (continuous usage stats)."""
    usage = data.get("usage") or {}
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise KeyError("usage.completion_tokens")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise KeyError("choices")
    finish = choices[0].get("finish_reason") if choices else None
    return tokens, finish


async def _one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    expected_tokens: int,
    timeout: aiohttp.ClientTimeout,
    m: Measurement,
    exact: bool = True,
) -> None:
    # OpenAI streams (chat and completions, SGLang's and vLLM's): choices and usage; SGLang's /generate: meta_info.
    chat = url.endswith(("/v1/chat/completions", "/v1/completions"))
    start = time.perf_counter()
    last_t = start
    last_tokens = 0
    first = True
    done = False
    final_meta: dict | None = None
    finish_seen: object = None
    buf = b""
    try:
        async with session.post(url, data=body, timeout=timeout, headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200].replace("\n", " ")
                raise ProbeRequestError(f"{url}: HTTP {resp.status}: {text}", transient=transient_status(resp.status))
            async for chunk in resp.content.iter_any():
                buf += chunk
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    event, buf = buf[:cut], buf[cut + 2 :]
                    if not event.startswith(b"data: "):
                        if event.strip():
                            raise ProbeRequestError(f"{url}: unexpected stream line {event[:60]!r}")
                        continue
                    payload = event[6:]
                    if payload == b"[DONE]":
                        done = True
                        continue
                    try:
                        data = _loads(payload)
                        if chat:
                            if "error" in data:
                                raise KeyError("error")
                            # SGLang: a role chunk, content chunks (each with its usage under
                            # continuous_usage_stats), a finish chunk, a usage chunk, [DONE].
                            usage_tokens, finish = _chat_tokens(data)
                            tokens = last_tokens if usage_tokens is None else usage_tokens
                            meta = {"finish_reason": finish} if finish is not None else {}
                        else:
                            meta = data["meta_info"]
                            tokens = meta["completion_tokens"]
                    except Exception:
                        if b'"error"' in payload:
                            raise ProbeRequestError(f"{url}: error in stream: {payload[:200]!r}") from None
                        raise ProbeRequestError(f"{url}: malformed stream chunk {payload[:80]!r}") from None
                    now = time.perf_counter()
                    if tokens > last_tokens:  # the first event's tokens come at once after the prefill
                        m.arrivals.append((now if first else last_t, now, tokens - last_tokens))
                    if first:
                        m.ttft_s.append(now - start)
                        first = False
                    elif tokens > last_tokens:
                        m.itl_pairs.append(((now - last_t) / (tokens - last_tokens), tokens - last_tokens))
                    if tokens > last_tokens or not chat:
                        last_t, last_tokens = now, tokens
                    if meta.get("finish_reason") is not None:
                        final_meta = meta
                        finish_seen = meta["finish_reason"]
    except TimeoutError:
        raise ProbeRequestError(f"{url}: timed out after {time.perf_counter() - start:.1f}s", transient=True) from None
    except aiohttp.ClientError as exc:
        raise ProbeRequestError(f"{url}: {type(exc).__name__}: {exc}", transient=True) from None
    if buf.strip():
        raise ProbeRequestError(f"{url}: stream ended inside an event ({buf[:60]!r})")
    if final_meta is None or not done:
        raise ProbeRequestError(f"{url}: stream ended without a finish reason and [DONE] (truncated)")
    finish = finish_seen or {}
    if (isinstance(finish, dict) and finish.get("type") == "abort") or finish == "abort":
        message = finish.get("message") if isinstance(finish, dict) else "abort"
        raise ProbeRequestError(f"{url}: request aborted by the server: {message}", transient=True)
    if exact and last_tokens != expected_tokens:
        raise ProbeRequestError(f"{url}: returned {last_tokens} of {expected_tokens} tokens (ignore_eos ignored?)")
    if not exact and not 1 <= last_tokens <= expected_tokens:
        raise ProbeRequestError(f"{url}: returned {last_tokens} tokens for max {expected_tokens}")
    m.output_tokens += last_tokens
    m.requests += 1
    verify = final_meta.get("spec_verify_ct")
    if isinstance(verify, int) and verify > 0:
        m.spec_tokens += last_tokens
        m.spec_verify_ct += verify


async def measure(
    session: aiohttp.ClientSession,
    base_url: str,
    workload: Workload,
    *,
    rng: random.Random,
    request_timeout: float = 600.0,
    read_timeout: float = 120.0,
    stop_early: Callable[[Measurement], bool] | None = None,
    traffic: WorkloadTraffic | None = None,
) -> Measurement:
    """Run one workload against one server; raises ProbeRequestError on the first bad response.

    ``traffic`` gives the requests (traffic.py: the workload's prompt source, paired across servers); without it
    every request is a random token-id prompt of ``input_tokens``.
    ``stop_early(measurement)`` is asked after each completed request; when it returns True the remaining
    requests are cancelled and the measurement is marked ``aborted_early`` (its tok/s is then not used).
    """
    root = base_url.rstrip("/")
    plans = traffic.next_plans(root) if traffic is not None else random_ids_plans(workload, rng)
    m = Measurement(workload=workload.name, url=base_url)
    timeout = aiohttp.ClientTimeout(total=request_timeout, sock_read=read_timeout)
    next_index = 0
    stop = asyncio.Event()

    async def client() -> None:
        nonlocal next_index
        while not stop.is_set() and next_index < len(plans):
            plan = plans[next_index]
            next_index += 1
            await _one_request(session, root + plan.path, plan.body, plan.max_tokens, timeout, m, plan.exact)
            if stop_early is not None and not stop.is_set() and stop_early(m):
                m.aborted_early = True
                stop.set()

    start = m.started_at = time.perf_counter()
    tasks = [asyncio.create_task(client()) for _ in range(min(workload.concurrency, len(plans)))]
    try:
        stopper = asyncio.create_task(stop.wait())
        pending: set[asyncio.Task[Any]] = set(tasks)
        while pending:
            finished, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
            for task in finished:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if stopper in finished:
                break
        m.duration_s = time.perf_counter() - start
    finally:
        for task in tasks:
            task.cancel()
        stopper.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
    return m


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float = 10.0) -> dict:
    """GET a JSON document; ProbeRequestError on any failure."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise ProbeRequestError(f"{url}: HTTP {resp.status}", transient=transient_status(resp.status))
            raw = await resp.read()
    except TimeoutError:
        raise ProbeRequestError(f"{url}: timed out after {timeout:g}s", transient=True) from None
    except aiohttp.ClientError as exc:
        raise ProbeRequestError(f"{url}: {type(exc).__name__}: {exc}", transient=True) from None
    try:
        data = _loads(raw)
    except Exception:
        raise ProbeRequestError(f"{url}: response is not JSON") from None
    if not isinstance(data, dict):
        raise ProbeRequestError(f"{url}: response is not a JSON object")
    return data
