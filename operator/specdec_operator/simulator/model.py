"""A continuous-batching performance model of an SGLang server.

The model is what makes the simulator useful for judging the probe: throughput comes out of the same
mechanics that produce it on a GPU, not out of a sleep per request.

* The scheduler admits queued requests up to ``max_running_requests``; the rest wait (this is how the
  speculative server's silent cap of 48 cuts throughput at concurrency 128).
* An iteration is either a prefill batch (new requests; it produces their first token and stalls decode,
  as SGLang does without mixed chunked prefill) or a decode step that serves every running request.
* A decode step takes ``step_ms(batch)`` from the profile (linear interpolation), times a jitter factor.
* In speculative mode each request gains ``k`` tokens per step, ``1 <= k <= num_draft_tokens``. ``k`` is
  one plus the length of the accepted prefix of a draft chain in which each draft token is accepted with
  probability ``p``, ``p`` solved so that the mean of ``k`` is ``accept_length_mean``. That is the shape
  EAGLE acceptance has (a rejected draft ends the chain) and it makes ``accept_length_mean = 1`` mean
  "nothing is ever accepted", as in SGLang's own log line.
* Methods that draft from the context (NGRAM, SUFFIX) propose a draft only where the context has a match: in a
  decode step a request's draft is found with probability equal to its prompt's repetition share
  (promptkind.repetition_share, how much of the answer repeats the context), and is then accepted as a chain like any
  other with ``accept_length_mean`` (the mean tokens of a step that drafted). Without a match the step yields one
  token. SGLang counts every such step as a verify (its sglang:spec_accept_length is tokens per verify, the lower
  number); vLLM counts only the steps that drafted (vllm:spec_decode_num_drafts), so acceptance from its counters is
  the per-draft one. STANDALONE and DFLASH draft like the EAGLE family (DFLASH's chain is its block of
  ``num_draft_tokens``, with SGLang's steps and topk 1); their profiles differ in the step time a draft costs.
* With SGLang's adaptive speculation (``--speculative-adaptive``, a profile's ``adaptive``; adaptive.py) each decode
  batch runs at the steps its batch-size bucket's slot has chosen: the chain then has steps + 1 tokens with the same
  ``p``, steps 0 is a one-token step at ``target_step_ms``, and the step time is linear in the steps in between
  (:meth:`Profile.verify_step_seconds`).

The clock is simulated time; ``time_scale`` S maps it onto wall time (S simulated seconds per wall
second). Everything the server reports (latencies, throughput gauges) is in wall-clock units, as a real
server S times faster would report it. Steps are scheduled against absolute deadlines, so a step that the host runs late is caught up
by the next ones instead of slowing the simulated GPU down.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from ..choices import ALGORITHMS, DRAFTER_FREE_ALGORITHMS
from ..errors import InputError
from .adaptive import (
    AdaptiveConfig,
    AdaptiveSteps,
    adaptive_config_from_dict,
    adaptive_unsupported_reason,
    default_adaptive_config,
    speculative_cuda_graph_batch_sizes,
)
from .faults import ErrorConfig, error_config_from_dict
from .promptkind import KINDS


@dataclass(frozen=True)
class SpeculativeConfig:
    """The speculative half of a profile: SGLang's flags plus the drafter's mean acceptance length."""

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    accept_length_mean: float
    # Per prompt kind (promptkind.py: random, multilingual, code, math, summary, chat): the mean acceptance length
    # of requests of that kind; a kind not listed gets accept_length_mean.
    accept_length_by_kind: tuple[tuple[str, float], ...] = ()

    def accept_length_for(self, kind: str) -> float:
        return dict(self.accept_length_by_kind).get(kind, self.accept_length_mean)

    @property
    def drafts_from_context(self) -> bool:
        """NGRAM and SUFFIX: a draft exists only where the context has a match (the module's docstring)."""
        return self.algorithm in DRAFTER_FREE_ALGORITHMS

    @property
    def chain_accept_probability(self) -> float:
        """Per-draft-token acceptance probability ``p`` with E[k] = accept_length_mean.

        E[k] = 1 + p + p^2 + ... + p^(D-1) for D = num_draft_tokens; solved by bisection (monotone in p).
        """
        target, depth = self.accept_length_mean, self.num_draft_tokens
        if target <= 1.0:
            return 0.0
        if target >= depth:
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            mean = sum(mid**i for i in range(depth))
            lo, hi = (mid, hi) if mean < target else (lo, mid)
        return (lo + hi) / 2


@dataclass(frozen=True)
class Profile:
    """A simulated server: the keys of the profile JSON (see docs/probe.md)."""

    name: str
    load_seconds: float
    max_running_requests: int
    prefill_tokens_per_s: float
    step_ms: tuple[tuple[int, float], ...]
    speculative: SpeculativeConfig | None = None
    jitter: float = 0.0
    errors: ErrorConfig = field(default_factory=ErrorConfig)
    # Optional keys: what /server_info and /metrics report, how SGLang streams.
    model_path: str = "simulated/model"
    served_model_name: str | None = None
    tp_size: int = 1
    stream_interval: int = 1
    context_length: int = 131072
    description: str = ""
    # Adaptive speculation (SGLang's --speculative-adaptive; simulator/adaptive.py). ``target_step_ms`` is the step
    # time without drafting (steps 0), in step_ms's format; None: the same as step_ms.
    target_step_ms: tuple[tuple[int, float], ...] | None = None
    adaptive: AdaptiveConfig | None = None

    def step_seconds(self, batch: int) -> float:
        """Decode step time for a running batch, linearly interpolated (and extrapolated past the ends)."""
        return _interpolate_ms(self.step_ms, batch) / 1000.0

    def target_step_seconds(self, batch: int) -> float:
        """A decode step without drafting (adaptive steps 0): ``target_step_ms``, else ``step_ms``."""
        return _interpolate_ms(self.target_step_ms or self.step_ms, batch) / 1000.0

    def verify_step_seconds(self, batch: int, num_steps: int) -> float:
        """A speculative decode step at ``num_steps`` draft steps (adaptive mode).

        Linear in the number of draft tokens: ``target + (step - target) * num_steps / speculative.num_steps``,
        so steps 0 costs ``target_step_ms``, the configured steps cost ``step_ms``, and more steps than configured
        extrapolate the same line (topk 1: each step is one more drafter forward and one more verified token).
        """
        spec = self.speculative
        assert spec is not None, "verify_step_seconds: a base server does not verify"
        target, full = self.target_step_seconds(batch), self.step_seconds(batch)
        return max(target + (full - target) * num_steps / spec.num_steps, 1e-6)

    @property
    def adaptive_unsupported_reason(self) -> str | None:
        """Why SGLang would switch this profile's adaptive mode off (it serves statically then), or None."""
        if self.adaptive is None:
            return None
        spec = self.speculative
        return adaptive_unsupported_reason(spec.algorithm if spec else None, spec.eagle_topk if spec else None)

    @property
    def adaptive_active(self) -> bool:
        return self.adaptive is not None and self.adaptive_unsupported_reason is None

    @property
    def resolved_num_draft_tokens(self) -> int | None:
        """SGLang's resolved speculative_num_draft_tokens: num_steps + 1 under adaptive (speculative_hook.py)."""
        if self.speculative is None:
            return None
        return self.speculative.num_steps + 1 if self.adaptive_active else self.speculative.num_draft_tokens

    def with_adaptive(self, config: AdaptiveConfig) -> Profile:
        """This profile served with ``--speculative-adaptive`` and ``config`` (InputError as SGLang's startup check)."""
        profile = dataclasses.replace(self, adaptive=config)
        _check_adaptive_steps(profile)
        return profile

    @property
    def mean_tokens_per_step(self) -> float:
        """Tokens a request gains per decode step (NGRAM and SUFFIX: per step that drafts)."""
        return self.speculative.accept_length_mean if self.speculative else 1.0

    def tokens_per_step(self, repetition: float = 1.0) -> float:
        """Tokens a request gains per decode step; for NGRAM and SUFFIX at a prompt repetition share of ``repetition``
        (a step drafts with that probability), for the other methods whatever it is."""
        spec = self.speculative
        if spec is None:
            return 1.0
        if spec.drafts_from_context:
            return 1.0 + repetition * (spec.accept_length_mean - 1.0)
        return spec.accept_length_mean

    def analytic_throughput(self, concurrency: int, input_tokens: int, output_tokens: int, repetition: float = 1.0) -> float:
        """Steady-state output tok/s of closed-loop clients (no jitter, no host overhead).

        Requests of equal length run in waves of ``b = min(concurrency, max_running_requests)``: one prefill
        of ``b * input_tokens`` produces the first token of each, then decode steps at batch ``b`` produce
        the other ``output_tokens - 1`` at ``tokens_per_step(repetition)`` tokens a step.
        """
        batch = min(concurrency, self.max_running_requests)
        prefill_s = batch * input_tokens / self.prefill_tokens_per_s
        decode_steps = max(output_tokens - 1, 0) / self.tokens_per_step(repetition)
        wave_s = prefill_s + decode_steps * self.step_seconds(batch)
        return batch * output_tokens / wave_s


def _interpolate_ms(points: tuple[tuple[int, float], ...], batch: int) -> float:
    batches = [b for b, _ in points]
    if len(points) == 1:
        return points[0][1]
    if batch <= batches[0]:
        return points[0][1]
    i = bisect.bisect_left(batches, batch)
    if i >= len(points):
        i = len(points) - 1
    (b0, m0), (b1, m1) = points[i - 1], points[i]
    ms = m0 + (m1 - m0) * (batch - b0) / (b1 - b0)
    return max(ms, 1e-3)


def _check_adaptive_steps(profile: Profile) -> None:
    """SGLang's startup check (speculative_hook._init_adaptive_speculative_params), when the mode is on."""
    config, spec = profile.adaptive, profile.speculative
    if config is None or spec is None or not profile.adaptive_active:
        return
    if spec.num_steps not in config.candidate_steps:
        raise InputError(
            f"{config.source}: --speculative-num-steps={spec.num_steps} is not in the adaptive config "
            f"candidate_steps {config.candidate_steps}. Pass one of those values."
        )


def _adaptive_config(data: dict, source: str) -> AdaptiveConfig | None:
    """The profile's optional ``adaptive`` key: null/absent (off), true (SGLang's default config), or a config."""
    raw = data.get("adaptive")
    if raw is None or raw is False:
        return None
    if raw is True:
        return default_adaptive_config()
    return adaptive_config_from_dict(raw, f"{source}: adaptive")


def _field(data: dict, key: str, source: str, kind: type | tuple, *, minimum: float | None = None) -> Any:
    if key not in data:
        raise InputError(f"{source}: missing key {key!r}; see docs/probe.md for the profile format")
    value: Any = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InputError(f"{source}: {key!r} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    if minimum is not None and cast(float, value) < minimum:  # a number: checked just above
        raise InputError(f"{source}: {key!r} must be >= {minimum}, got {value!r}")
    return value


def profile_from_dict(data: Any, source: str = "profile") -> Profile:
    """Validate a profile mapping and build a :class:`Profile` (InputError names the bad key)."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: a profile must be a JSON object")
    num = (int, float)
    name = _field(data, "name", source, str)
    load_seconds = float(_field(data, "load_seconds", source, num, minimum=0))
    max_running = _field(data, "max_running_requests", source, int, minimum=1)
    prefill = float(_field(data, "prefill_tokens_per_s", source, num))
    if prefill <= 0:
        raise InputError(f"{source}: 'prefill_tokens_per_s' must be > 0")
    steps = _step_points(data, source)
    spec = _speculative_config(data, source)
    target_steps = _step_points(data, source, "target_step_ms") if data.get("target_step_ms") is not None else None
    if target_steps is not None and spec is None:
        raise InputError(f"{source}: 'target_step_ms' is the step time without drafting; a base server has only step_ms")
    adaptive = _adaptive_config(data, source)
    jitter = float(_field(data, "jitter", source, num, minimum=0))
    errors = error_config_from_dict(data.get("errors", {}) or {}, source)
    optional: dict[str, Any] = {}
    for key, kind in (
        ("model_path", str),
        ("served_model_name", str),
        ("tp_size", int),
        ("stream_interval", int),
        ("context_length", int),
        ("description", str),
    ):
        if key in data and data[key] is not None:
            optional[key] = _field(data, key, source, kind)
    if optional.get("stream_interval", 1) < 1:
        raise InputError(f"{source}: 'stream_interval' must be >= 1")
    profile = Profile(
        name=name,
        load_seconds=load_seconds,
        max_running_requests=max_running,
        prefill_tokens_per_s=prefill,
        step_ms=steps,
        speculative=spec,
        jitter=jitter,
        errors=errors,
        target_step_ms=target_steps,
        adaptive=adaptive,
        **optional,
    )
    _check_adaptive_steps(profile)
    return profile


def _step_points(data: dict, source: str, key: str = "step_ms") -> tuple[tuple[int, float], ...]:
    """The profile's ``step_ms`` (or ``target_step_ms``): [batch, ms] points, sorted by batch, one per batch size."""
    steps: list[tuple[int, float]] = []
    for point in _field(data, key, source, list):
        ok = (
            isinstance(point, list)
            and len(point) == 2
            and isinstance(point[0], int)
            and not isinstance(point[0], bool)
            and isinstance(point[1], (int, float))
            and point[0] >= 1
            and point[1] > 0
        )
        if not ok:
            raise InputError(f"{source}: '{key}' entries must be [batch >= 1, ms > 0], got {point!r}")
        steps.append((point[0], float(point[1])))
    if not steps:
        raise InputError(f"{source}: '{key}' needs at least one [batch, ms] point")
    steps.sort()
    if len({b for b, _ in steps}) != len(steps):
        raise InputError(f"{source}: '{key}' has two points for the same batch size")
    return tuple(steps)


def _speculative_config(data: dict, source: str) -> SpeculativeConfig | None:
    """The profile's ``speculative`` block: null for a base server."""
    if "speculative" not in data:
        raise InputError(f"{source}: missing key 'speculative' (null for a base server)")
    raw = data["speculative"]
    if raw is None:
        return None
    where = f"{source}: speculative"
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be null or an object")
    spec = SpeculativeConfig(
        algorithm=str(_field(raw, "algorithm", where, str)).upper(),
        num_steps=_field(raw, "num_steps", where, int, minimum=1),
        eagle_topk=_field(raw, "eagle_topk", where, int, minimum=1),
        num_draft_tokens=_field(raw, "num_draft_tokens", where, int, minimum=2),
        accept_length_mean=float(_field(raw, "accept_length_mean", where, (int, float), minimum=1.0)),
    )
    if spec.algorithm not in ALGORITHMS:
        raise InputError(f"{where}: algorithm {spec.algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if spec.accept_length_mean > spec.num_draft_tokens:
        raise InputError(f"{where}: accept_length_mean cannot exceed num_draft_tokens")
    by_kind = raw.get("accept_length_by_kind")
    if by_kind is not None:
        if not isinstance(by_kind, dict):
            raise InputError(f"{where}: accept_length_by_kind must be an object {{kind: mean acceptance length}}")
        pairs = []
        for kind, value in sorted(by_kind.items()):
            if kind not in KINDS:
                raise InputError(f"{where}: accept_length_by_kind: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= spec.num_draft_tokens:
                raise InputError(f"{where}: accept_length_by_kind.{kind} must be a number within 1..num_draft_tokens, got {value!r}")
            pairs.append((kind, float(value)))
        spec = dataclasses.replace(spec, accept_length_by_kind=tuple(pairs))
    return spec


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with the package (``specdec simulate --profile NAME``)."""
    folder = resources.files("specdec_operator.simulator") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(ref: str | Path) -> Profile:
    """Load a profile from a JSON file path or a shipped profile name."""
    path = Path(ref)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise InputError(f"{path}: profile file not found; pass a JSON file or one of {shipped_profiles()}")
        text = path.read_text()
        source = str(path)
    else:
        names = shipped_profiles()
        if str(ref) not in names:
            raise InputError(f"--profile {ref!r}: no such file or shipped profile; shipped: {', '.join(names)}")
        text = (resources.files("specdec_operator.simulator") / "profiles" / f"{ref}.json").read_text()
        source = f"profile {ref}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return profile_from_dict(data, source)


# Bucket bounds as in SGLang's metrics collector (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics) in constant memory."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts):
            running += n
            out.append((bound, running))
        return out


@dataclass
class Emission:
    """What a request has produced so far, handed to the HTTP layer when SGLang would stream it."""

    completion_tokens: int
    finished: bool
    verify_ct: int
    correct_drafts: int


@dataclass(eq=False)
class SimRequest:
    """One generation request inside the engine."""

    prompt_tokens: int
    max_new_tokens: int
    stream_interval: int
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = 0.0  # simulated seconds
    first_token_at: float | None = None
    finished_at: float | None = None
    completion_tokens: int = 0
    sent_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    accept_p: float | None = None  # this request's per-draft-token acceptance (its prompt kind); None: the engine's
    repetition: float = 0.0  # its prompt's repetition share: how often NGRAM/SUFFIX find a draft for it
    cancelled: bool = False
    # When set, emissions are handed to this callback synchronously instead of the queue: the HTTP layer
    # writes them straight to the socket, one task switch fewer per streamed event.
    sink: Callable[[Emission], None] | None = None


@dataclass
class SpecDecodeCounters:
    """vLLM 0.32's spec_decode counters (vllm/v1/spec_decode/metrics.py), which the simulator exports beside SGLang's
    gauges: a draft is one request's verify step; a chain accepts its first ``accepted`` positions."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @classmethod
    def for_positions(cls, positions: int) -> SpecDecodeCounters:
        return cls(accepted_per_position=[0] * positions)  # vLLM creates every position's series at start-up, at 0

    def count(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        if len(self.accepted_per_position) < proposed:
            self.accepted_per_position += [0] * (proposed - len(self.accepted_per_position))
        for i in range(accepted):
            self.accepted_per_position[i] += 1


def chain_tokens(rng: random.Random, depth: int, accept: float) -> int:
    """Tokens one request gains in a decode step: 1 + the accepted prefix of a chain of ``depth - 1`` draft tokens,
    each accepted with probability ``accept`` until the first rejection."""
    k = 1
    while k < depth and rng.random() < accept:
        k += 1
    return k


class Engine:
    """The scheduler loop of one simulated server, running on the current asyncio event loop."""

    def __init__(self, profile: Profile, *, time_scale: float = 1.0, seed: int | None = None) -> None:
        if time_scale <= 0:
            raise InputError("--time-scale must be > 0")
        self.profile = profile
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self.sim_now = 0.0
        # Simulated seconds spent in prefills and decode steps (not idle): throughput that no host delay reaches.
        self.busy_seconds = 0.0
        self._p = profile.speculative.chain_accept_probability if profile.speculative else 0.0
        self._p_by_kind: dict[str, float] = {}
        if profile.speculative is not None:
            for kind, mean in profile.speculative.accept_length_by_kind:
                self._p_by_kind[kind] = dataclasses.replace(profile.speculative, accept_length_mean=mean).chain_accept_probability
        # Adaptive speculation: the per-bucket step slots, and the steps the last decode batch ran at (SGLang's
        # sglang:spec_num_steps gauge reports the worker's active steps, which is that batch's).
        self.adaptive: AdaptiveSteps | None = None
        self.active_num_steps = profile.speculative.num_steps if profile.speculative else 0
        if profile.adaptive is not None and profile.adaptive_active:
            self.adaptive = AdaptiveSteps(
                profile.adaptive,
                initial_steps=self.active_num_steps,
                cuda_graph_batch_sizes=speculative_cuda_graph_batch_sizes(profile.max_running_requests),
            )
        # (batch size, steps) of recent decode batches under adaptive: what tests and demos read the rule from.
        self.recent_adaptive_steps: deque[tuple[int, int]] = deque(maxlen=10000)
        # Counters and gauges for /metrics and /server_info.
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.verify_calls_total = 0
        self.spec_decode = SpecDecodeCounters.for_positions(profile.speculative.num_draft_tokens - 1 if profile.speculative else 0)
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0
        self.last_accept_rate = 0.0
        self.lifetime_tokens = 0
        self.lifetime_verify = 0
        self.ttft_seconds = Histogram(TTFT_BUCKETS)
        self.itl_seconds = Histogram(ITL_BUCKETS)
        self.e2e_seconds = Histogram(E2E_BUCKETS)
        self._window_tokens = 0
        self._window_verify = 0
        self._window_start = 0.0

    def set_accept_length_mean(self, value: float) -> None:
        """Change the drafter's mean acceptance length from now on (drift scenarios: 2.3 -> 1.0 mid-run)."""
        spec = self.profile.speculative
        if spec is None:
            raise ValueError("set_accept_length_mean: this profile is not speculative")
        if not 1.0 <= value <= spec.num_draft_tokens:
            raise ValueError(f"set_accept_length_mean: {value} is outside 1..{spec.num_draft_tokens}")
        self._p = dataclasses.replace(spec, accept_length_mean=value).chain_accept_probability
        self._p_by_kind = {}  # drift replaces what the drafter accepts on every kind

    # --- clock -------------------------------------------------------------------------------
    def wall_to_sim(self, wall: float) -> float:
        return (wall - self._t0) * self.time_scale

    def sim_to_wall(self, sim: float) -> float:
        return self._t0 + sim / self.time_scale

    def now(self) -> float:
        """Current simulated time (seconds since the engine started)."""
        return self.wall_to_sim(self._loop.time())

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.profile.name}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(
        self, prompt_tokens: int, max_new_tokens: int, stream_interval: int | None = None, kind: str | None = None, repetition: float = 0.0
    ) -> SimRequest:
        req = SimRequest(
            prompt_tokens=prompt_tokens,
            max_new_tokens=max(1, max_new_tokens),
            stream_interval=stream_interval or self.profile.stream_interval,
            arrival=self.now(),
            accept_p=self._p_by_kind.get(kind) if kind is not None else None,
            repetition=repetition,
        )
        self.waiting.append(req)
        self.requests_total += 1
        self.prompt_tokens_total += prompt_tokens
        self._wake.set()
        return req

    # --- the scheduler --------------------------------------------------------------------------
    def _jitter(self) -> float:
        return 1.0 if self.profile.jitter <= 0 else max(0.05, self.rng.gauss(1.0, self.profile.jitter))

    def _draw_tokens(self, num_draft_tokens: int | None = None, p: float | None = None) -> int:
        """chain_tokens with the profile's chain (``num_draft_tokens``, adaptive: the batch's steps + 1) and
        acceptance (``p``: the one the profile's accept_length_mean implies at its own configuration)."""
        spec = self.profile.speculative
        if spec is None:
            return 1
        return chain_tokens(self.rng, spec.num_draft_tokens if num_draft_tokens is None else num_draft_tokens, self._p if p is None else p)

    def _decode_tokens(self, req: SimRequest) -> tuple[int, int]:
        """(tokens a request gains in a decode step, draft tokens proposed for it): NGRAM and SUFFIX propose nothing in
        a step whose context has no match (probability 1 - its repetition share), and vLLM counts no draft then."""
        spec = self.profile.speculative
        if spec is None or (spec.drafts_from_context and self.rng.random() >= req.repetition):
            return 1, 0
        return self._draw_tokens(p=req.accept_p), spec.num_draft_tokens - 1

    async def _run(self) -> None:
        while True:
            self.waiting = [r for r in self.waiting if not r.cancelled]
            self.running = [r for r in self.running if not r.cancelled]
            if not self.waiting and not self.running:
                self._wake.clear()
                self.last_gen_throughput = 0.0
                await self._wake.wait()
                self.sim_now = max(self.sim_now, self.now())
                continue
            room = self.profile.max_running_requests - len(self.running)
            admitted = self.waiting[:room] if room > 0 else []
            if admitted:
                del self.waiting[: len(admitted)]
                tokens = sum(r.prompt_tokens for r in admitted)
                self._busy(tokens / self.profile.prefill_tokens_per_s * self._jitter())
                await self._sleep_until(self.sim_now)
                for req in admitted:
                    req.first_token_at = self.sim_now
                    # The prefill's token is not a verify step: SGLang counts spec_verify_ct in decode only.
                    self._advance(req, 1, verify=False)
                    self.running.append(req)
            elif self.adaptive is not None:
                await self._adaptive_decode_step(self.adaptive)
            else:
                batch = list(self.running)
                self._busy(self.profile.step_seconds(len(batch)) * self._jitter())
                step_tokens = step_verify = 0
                await self._sleep_until(self.sim_now)
                for req in batch:
                    if req.cancelled:
                        continue
                    k, proposed = self._decode_tokens(req)
                    self.spec_decode.count(proposed, k - 1)
                    step_tokens += self._advance(req, k, verify=self.profile.speculative is not None)
                    step_verify += 1
                self._account(step_tokens, step_verify)
            self.running = [r for r in self.running if r.finished_at is None]

    async def _adaptive_decode_step(self, adaptive: AdaptiveSteps) -> None:
        """One decode batch under SGLang's adaptive rule (eagle_worker_v2.py forward_batch_generation).

        The batch's slot picks the steps; steps 0 is a one-token verify (no drafting, the target's step time),
        which SGLang still counts as a verify with 0 accepted drafts. Afterwards the slot gets every request's
        accepted draft count, as batch_result_processor.py feeds on_verify_complete.
        """
        batch = list(self.running)
        num_steps = adaptive.steps_for_batch(len(batch))
        self.active_num_steps = num_steps
        self.recent_adaptive_steps.append((len(batch), num_steps))
        self._busy(self.profile.verify_step_seconds(len(batch), num_steps) * self._jitter())
        await self._sleep_until(self.sim_now)
        step_tokens = 0
        correct_drafts: list[int] = []
        for req in batch:
            if req.cancelled:
                continue
            k = self._draw_tokens(num_steps + 1, p=req.accept_p)
            # The slot sees what the verify accepted, before max_new_tokens trims the output.
            correct_drafts.append(k - 1)
            self.spec_decode.count(num_steps, k - 1)
            step_tokens += self._advance(req, k, verify=True)
        if adaptive.on_verify_complete(correct_drafts, len(batch)):
            self.active_num_steps = adaptive.steps_for_batch(len(batch))  # SGLang switches the state right away
        self._account(step_tokens, len(correct_drafts))

    def _busy(self, seconds: float) -> None:
        """Advance the simulated clock by a prefill or a decode step."""
        self.sim_now += seconds
        self.busy_seconds += seconds

    async def _sleep_until(self, sim_time: float) -> None:
        delay = self.sim_to_wall(sim_time) - self._loop.time()
        # A late step is not waited for: the following steps catch the schedule up.
        await asyncio.sleep(delay if delay > 0 else 0)

    def _advance(self, req: SimRequest, k: int, *, verify: bool) -> int:
        """Add up to k tokens to a request (never past max_new_tokens); emit when SGLang would."""
        k = min(k, req.max_new_tokens - req.completion_tokens)
        req.completion_tokens += k
        if verify:
            req.verify_ct += 1
            req.correct_drafts += k - 1
        self.generation_tokens_total += k
        finished = req.completion_tokens >= req.max_new_tokens
        unsent = req.completion_tokens - req.sent_tokens
        if finished:
            req.finished_at = self.sim_now
            self.e2e_seconds.observe((self.sim_now - req.arrival) / self.time_scale)
            if req.first_token_at is not None:
                self.ttft_seconds.observe((req.first_token_at - req.arrival) / self.time_scale)
                if req.completion_tokens > 1:
                    decode_s = (self.sim_now - req.first_token_at) / self.time_scale
                    self.itl_seconds.observe(decode_s / (req.completion_tokens - 1))
        if finished or req.stream_interval == 1 or unsent >= req.stream_interval or req.sent_tokens == 0:
            req.sent_tokens = req.completion_tokens
            emission = Emission(req.completion_tokens, finished, req.verify_ct, req.correct_drafts)
            if req.sink is not None:
                req.sink(emission)
            else:
                req.out.put_nowait(emission)
        return k

    def _account(self, tokens: int, verifies: int) -> None:
        """Update the gauges SGLang's scheduler logs every decode-log interval."""
        self._window_tokens += tokens
        self._window_verify += verifies
        self.lifetime_tokens += tokens
        self.lifetime_verify += verifies
        if self.profile.speculative is not None:
            self.verify_calls_total += verifies
        elapsed = self.sim_now - self._window_start
        if elapsed >= 0.5 or self._window_verify >= 4000:
            # Reported in wall-clock tok/s: a server S times faster reports S times the throughput.
            self.last_gen_throughput = self._window_tokens / elapsed * self.time_scale if elapsed > 0 else 0.0
            if self.profile.speculative is not None and self._window_verify:
                self.last_accept_length = self._window_tokens / self._window_verify
                # SGLang divides by the configured draft tokens, whatever steps adaptive ran at.
                drafts = self._window_verify * ((self.profile.resolved_num_draft_tokens or 1) - 1)
                self.last_accept_rate = (self._window_tokens - self._window_verify) / drafts
            self._window_tokens = self._window_verify = 0
            self._window_start = self.sim_now

    @property
    def avg_spec_accept_length(self) -> float:
        return self.lifetime_tokens / self.lifetime_verify if self.lifetime_verify else 0.0
