"""Same answers: the speculative server's greedy completions must equal the base's.

Speculative decoding is lossless by construction: with temperature 0 the verify step keeps exactly the tokens the
target would have produced. A server whose answers change anyway has a bug (a drafter wired to the wrong target
layer or vocabulary mapping, a broken verify kernel, a structured-output interaction), and the speedup it shows
is not worth having. After the rounds, the probe sends a sample of its own prompts to each server, one at a time
(text, or the random ids of a synthetic workload; temperature 0, ``ignore_eos``, ``rollout.outputCheck.maxTokens``
tokens) and compares the completions' token ids token by token: SGLang's ``/generate`` and its ``output_ids``, vLLM's
``/v1/completions`` with ``return_token_ids`` and its ``choices[0].token_ids`` (engines/).

A prompt's match is the share of the base's tokens before the first difference (1.0: identical; a completion that
differs at its first token: 0.0). Greedy decoding follows its own earlier tokens, so everything after the first
difference is a different continuation, not more evidence. The match rate is the mean over the sample; it goes to
the decision as a fact (:func:`output_facts`), which rolls back with reason OutputMismatch when it is below
``rollout.outputCheck.minMatchRate`` (0.9 by default; reconcile/probe_outcome.py). Why a threshold and not equality: batched kernels are not bit-deterministic, and the verify step runs a
different kernel shape than a decode step, so on real GPUs two correct servers can part on a near-tie, usually
late in a completion (docs/probe.md has the rule and the evidence). One prompt at a time keeps the batch at 1.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from ..api import OutputCheck
from ..engines import Engine, engine_for
from .client import ProbeRequestError, _loads, transient_status
from .evidence import OutputFacts
from .traffic import WorkloadTraffic, _dumps


@dataclass
class OutputComparison:
    """The compared prompts: per prompt, the match share and where the first difference is (None: identical)."""

    matches: list[float] = field(default_factory=list)
    first_difference: list[int | None] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return len(self.matches)

    @property
    def match_rate(self) -> float | None:
        return sum(self.matches) / len(self.matches) if self.matches else None

    @property
    def identical(self) -> int:
        return sum(1 for d in self.first_difference if d is None)


def prefix_match(base: list[int], speculative: list[int]) -> tuple[float, int | None]:
    """(share of base's tokens before the first difference, index of the first difference or None if equal)."""
    if base == speculative:
        return 1.0, None
    n = 0
    for a, b in zip(base, speculative):
        if a != b:
            break
        n += 1
    return (n / len(base) if base else 0.0), n


def sample_bodies(
    traffic: Mapping[str, WorkloadTraffic], check: OutputCheck, seed: int | None, *, engine: Engine | None = None, model: str = "default"
) -> list[tuple[str, bytes]]:
    """``check.prompts`` (path, body) requests of the engine, taken in turn from the workloads (their prompts, or random ids)."""
    engine = engine or engine_for(None)
    rng = random.Random(seed)
    sources = list(traffic.values())
    orders = {id(t): rng.sample(range(len(t.prompts)), len(t.prompts)) if t.prompts else [] for t in sources}
    requests: list[tuple[str, bytes]] = []
    i = 0
    while len(requests) < check.prompts and sources:
        t = sources[i % len(sources)]
        order = orders[id(t)]
        if t.prompts is None:
            ids = [rng.randrange(1000, 30000) for _ in range(t.workload.input_tokens)]
            request = engine.output_request(text=None, ids=ids, max_tokens=check.max_tokens, model=model)
        else:
            if not order:
                order.extend(rng.sample(range(len(t.prompts)), len(t.prompts)))
            request = engine.output_request(text=t.prompts[order.pop()].text, ids=None, max_tokens=check.max_tokens, model=model)
        requests.append((request.path, _dumps(request.body)))
        i += 1
    return requests


async def _output_ids(session: aiohttp.ClientSession, url: str, body: bytes, timeout: float, engine: Engine) -> list[int]:
    try:
        async with session.post(url, data=body, timeout=aiohttp.ClientTimeout(total=timeout), headers={"Content-Type": "application/json"}) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise ProbeRequestError(f"{url}: HTTP {resp.status}: {raw[:200].decode(errors='replace')}", transient=transient_status(resp.status))
    except TimeoutError:
        raise ProbeRequestError(f"{url}: timed out after {timeout:g}s (output check)", transient=True) from None
    except aiohttp.ClientError as exc:
        raise ProbeRequestError(f"{url}: {type(exc).__name__}: {exc}", transient=True) from None
    try:
        return engine.output_ids(_loads(raw))
    except Exception:
        raise ProbeRequestError(f"{url}: the output check's answer has no list of token ids: {raw[:120]!r}") from None


async def compare_outputs(
    session: aiohttp.ClientSession,
    base_url: str,
    speculative_url: str,
    traffic: Mapping[str, WorkloadTraffic],
    check: OutputCheck,
    *,
    request_timeout: float,
    seed: int | None = None,
    engine: Engine | None = None,
    model: str = "default",
) -> OutputComparison:
    """Send the sample to each server, one prompt at a time, and compare the completions; ProbeRequestError on failure."""
    engine = engine or engine_for(None)
    out = OutputComparison()
    for path, body in sample_bodies(traffic, check, seed, engine=engine, model=model):
        base = await _output_ids(session, base_url + path, body, request_timeout, engine)
        speculative = await _output_ids(session, speculative_url + path, body, request_timeout, engine)
        share, first = prefix_match(base, speculative)
        out.matches.append(share)
        out.first_difference.append(first)
    return out


def output_facts(comparison: OutputComparison, arm: str, min_match_rate: float) -> OutputFacts:
    """The comparison as the fact the decision reads (reconcile/probe_outcome.py: OutputMismatch below the threshold)."""
    return OutputFacts(
        arm,
        comparison.match_rate,
        comparison.compared,
        comparison.identical,
        tuple(d for d in comparison.first_difference if d is not None),
        float(min_match_rate),
    )
