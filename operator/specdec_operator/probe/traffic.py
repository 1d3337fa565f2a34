"""What one workload sends: request bodies from its prompt source, the same prompts to both servers in a round.

A workload's ``prompts`` (api.Prompts) says where its prompts come from and how they are sent:

- Random: exactly ``inputTokens`` random token ids (synthetic traffic: the decision says so): SGLang's ``/generate``
  with ``input_ids``, vLLM's ``/v1/completions`` with the ids as its prompt.
- Default / ConfigMap (datasets.py parses them): text, to ``/v1/chat/completions`` (streaming, the server's chat
  template) or as it is (endpoint Generate: SGLang's ``/generate`` with ``text``, vLLM's ``/v1/completions``).

The engine (engines/) writes each request; vLLM's OpenAI server needs the served model name, which the probe's
preflight reads from ``/v1/models`` (``WorkloadTraffic.model``).

Output length: Fixed is ``outputTokens`` with ``ignore_eos`` (exactly that many tokens, or the request failed);
Dataset is the prompt's own ``max_tokens`` capped by ``maxOutputTokens`` (or that cap when it has none), stopping at
EOS. Every request is greedy (temperature 0).

Pairing: a round's measurement of the base and of the speculative server get the same prompts (the k-th
measurement of each server takes the k-th slice of the dataset, in a seeded order), so the ratio of a round
compares the two servers on one set of prompts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..api import Workload
from ..engines import Engine, HttpRequest, engine_for
from ..errors import InputError
from .datasets import Prompt
from .datasets import default_prompts as _default_prompts


@cache
def default_prompts() -> list[Prompt]:
    """The shipped prompt set, parsed once per process."""
    return _default_prompts()


GENERATE, CHAT = "/generate", "/v1/chat/completions"


def _json_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


_dumps: Callable[[Any], bytes] = _json_dumps
try:
    import orjson

    _dumps = orjson.dumps
except ImportError:  # pragma: no cover - orjson is optional
    pass


@dataclass(frozen=True)
class RequestPlan:
    """One request: its endpoint path, its pre-serialized body, and the tokens it must (exact) or may return."""

    path: str
    body: bytes
    max_tokens: int
    exact: bool


def _plan(request: HttpRequest, max_tokens: int, exact: bool) -> RequestPlan:
    return RequestPlan(request.path, _dumps(request.body), max_tokens, exact)


def random_ids_plans(workload: Workload, rng: random.Random, *, engine: Engine | None = None, model: str = "default") -> list[RequestPlan]:
    """Random token-id prompts of exactly ``input_tokens``, ``output_tokens`` with ignore_eos (the engine's request)."""
    engine = engine or engine_for(None)
    plans = []
    for _ in range(workload.requests):
        ids = [rng.randrange(1000, 30000) for _ in range(workload.input_tokens)]
        plans.append(_plan(engine.random_ids_request(ids, workload.output_tokens, model=model), workload.output_tokens, True))
    return plans


def prompt_plan(workload: Workload, prompt: Prompt, *, model: str = "default", engine: Engine | None = None) -> RequestPlan:
    """The request for one dataset prompt under the workload's endpoint and output length."""
    source = workload.prompts
    fixed = source.output_length == "Fixed"
    if fixed:
        max_tokens = workload.output_tokens
    else:
        max_tokens = min(prompt.max_tokens or source.max_output_tokens, source.max_output_tokens)
    chat = (source.endpoint or "Chat") == "Chat"
    request = (engine or engine_for(None)).text_request(
        prompt.text if not chat else "", prompt.chat_messages() if chat else [], chat=chat, max_tokens=max_tokens, fixed=fixed, model=model
    )
    return _plan(request, max_tokens, fixed)


@dataclass
class WorkloadTraffic:
    """The requests of one workload; ``next_plans(server)`` is the next measurement's, paired across servers."""

    workload: Workload
    prompts: list[Prompt] | None  # None: random token ids
    description: str
    rng: random.Random
    engine: Engine | None = None  # None: SGLang
    model: str = "default"  # the served model name (set by the probe's preflight before the first measurement)
    _order: list[int] = field(default_factory=list)
    _taken: dict[str, int] = field(default_factory=dict)
    _slices: list[list[RequestPlan]] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        return self.prompts is None

    def next_plans(self, server: str) -> list[RequestPlan]:
        k = self._taken.get(server, 0)
        self._taken[server] = k + 1
        while len(self._slices) <= k:
            self._slices.append(self._make_slice())
        return self._slices[k]

    def _make_slice(self) -> list[RequestPlan]:
        if self.prompts is None:
            return random_ids_plans(self.workload, self.rng, engine=self.engine, model=self.model)
        plans = []
        for _ in range(self.workload.requests):
            if not self._order:
                self._order = list(range(len(self.prompts)))
                self.rng.shuffle(self._order)
            plans.append(prompt_plan(self.workload, self.prompts[self._order.pop()], model=self.model, engine=self.engine))
        return plans


def describe_source(workload: Workload) -> str:
    """A workload's prompt source in words (status.probe.traffic, error messages)."""
    source = workload.prompts
    if source.source == "Random":
        return f"random token ids ({workload.input_tokens} tokens)"
    if source.source == "ConfigMap" and source.config_map is not None:
        return f"configmap/{source.config_map.name} key {source.config_map.key}"
    if source.source == "File" and source.file is not None:
        where = f"claim {source.file.claim_name}" if source.file.claim_name else "the model volume"
        return f"file {source.file.path} on {where}"
    return "the default prompt set"


def build_traffic(
    workloads: Sequence[Workload], datasets: Mapping[str, list[Prompt]] | None = None, seed: int | None = None, engine: Engine | None = None
) -> dict[str, WorkloadTraffic]:
    """Each workload's traffic: its dataset (``datasets[name]``: what the operator read from a ConfigMap, or the
    CLI's ``--dataset``), the default prompt set, or random ids. InputError when a dataset source was not read."""
    given = datasets or {}
    rng = random.Random(seed)
    out: dict[str, WorkloadTraffic] = {}
    for w in workloads:
        source = w.prompts.source
        prompts: list[Prompt] | None
        if w.name in given:
            prompts = list(given[w.name])
            description = describe_source(w) if source in ("ConfigMap", "File") else "the dataset given (--dataset)"
        elif source == "Random":
            prompts, description = None, describe_source(w)
        elif source == "Default":
            prompts, description = default_prompts(), DEFAULT_DESCRIPTION
        else:
            raise InputError(f"workloads[{w.name}].prompts: source {source} needs its dataset read first (none was given for this workload)")
        if prompts is not None:
            description += f", {len(prompts)} prompts, {(w.prompts.endpoint or 'Chat')} endpoint, output {w.prompts.output_length}"
        out[w.name] = WorkloadTraffic(w, prompts, description, random.Random(rng.random()), engine)
    return out


DEFAULT_DESCRIPTION = "the default prompt set"
