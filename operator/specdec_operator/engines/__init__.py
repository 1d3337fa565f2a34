"""The serving engines (spec.engine): one module per engine behind one interface, `Engine`.

Everything the operator does differently for SGLang and for vLLM goes through an `Engine` taken from
`engine_for(spec)` (or `engine_named(name)`): the server command line (`render_argv`), the container's name,
environment and health endpoints, the speculation metrics the drift monitor and the probe read
(`metric_names`, `read_metrics`), the probe's HTTP protocol (`info_path`, `server_info`, `random_ids_request`,
`text_request`, `output_request`, `output_ids`) and load-aware speculation (`adaptive_document`,
`adaptive_unsupported_reason`). No other module asks which engine a spec names.

- engines/sglang.py: SGLang (its command lines: ../sglang.py, per release).
- engines/vllm.py: vLLM 0.32 (OpenAI API, counters for acceptance, num_speculative_tokens_per_batch_size).
- engines/paths.py: where every engine's server listens and finds its models.
- ../enginefacts.py (standard library only, shared with the API, the validator and drafter_training): each engine's
  names, release, layer-id convention, drafter formats and metric names, and DEFAULT, the engine where none is named.

Like sglang.py this package never imports an engine: the operator renders for images it does not contain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import enginefacts
from ..api import SpeculativeServerSpec, Variant
from ..errors import InputError


@dataclass(frozen=True)
class HealthPaths:
    """The server container's HTTP probes: startup and liveness ask whether the process is up, readiness whether it
    serves."""

    startup: str
    readiness: str
    liveness: str


@dataclass(frozen=True)
class SpecMetrics:
    """What one scrape of a server's /metrics says about speculation, in one vocabulary for every engine.

    An engine fills what it exports: SGLang a gauge (``accept_length``, computed by the server over its own
    window) and counters of verify steps and generated tokens; vLLM counters only (``verify_calls`` is its
    drafts, one per verify step of a request), from which the monitor and the probe compute acceptance over
    their own window from the deltas of two scrapes (monitor.window_acceptance)."""

    accept_length: float | None = None
    throughput: float | None = None
    verify_calls: float | None = None
    generated_tokens: float | None = None
    accepted_tokens: float | None = None  # counter: draft tokens accepted
    draft_tokens: float | None = None  # counter: draft tokens proposed
    accepted_per_position: tuple[float, ...] | None = None  # counter per draft position (0 = the first draft token)

    @property
    def counts_acceptance(self) -> bool:
        """Whether acceptance comes from counters (deltas between scrapes) rather than a gauge."""
        return self.accept_length is None and self.accepted_tokens is not None and self.verify_calls is not None


class Counters(Protocol):
    """What counter_window reads: SpecMetrics, and the monitor's Sample."""

    @property
    def counts_acceptance(self) -> bool: ...
    @property
    def verify_calls(self) -> float | None: ...
    @property
    def accepted_tokens(self) -> float | None: ...
    @property
    def accepted_per_position(self) -> tuple[float, ...] | None: ...


@dataclass(frozen=True)
class Window:
    """Acceptance between two scrapes of one server's counters (vLLM)."""

    accept_length: float  # 1 + accepted draft tokens per draft
    drafts: float  # drafts (verify steps of a request) in the window
    position_rates: tuple[float, ...] | None  # accepted tokens per draft at each draft position


def counter_window(previous: Counters, current: Counters) -> Window | None:
    """Acceptance from the counters' deltas between two scrapes: 1 + delta(accepted) / delta(drafts), and per draft
    position delta(accepted at i) / delta(drafts). None when there is no window: counters missing, no draft in
    between (idle, or a load-aware server not drafting at its batch sizes), or a counter that went back (restarted)."""
    if not previous.counts_acceptance or not current.counts_acceptance:
        return None
    assert previous.verify_calls is not None and previous.accepted_tokens is not None
    assert current.verify_calls is not None and current.accepted_tokens is not None
    drafts = current.verify_calls - previous.verify_calls
    accepted = current.accepted_tokens - previous.accepted_tokens
    if drafts <= 0 or accepted < 0:
        return None
    rates = None
    now, then = current.accepted_per_position, previous.accepted_per_position
    if now is not None and then is not None and len(then) <= len(now):
        then = then + (0.0,) * (len(now) - len(then))  # a position first counted in between started at 0
        if all(a >= b for a, b in zip(now, then)):
            rates = tuple(round((a - b) / drafts, 4) for a, b in zip(now, then))
    return Window(1.0 + accepted / drafts, drafts, rates)


@dataclass(frozen=True)
class ServerInfo:
    """What the probe's preflight learns from a server."""

    max_running_requests: int | None = None
    speculating: bool | None = None  # None: the engine's info endpoint does not say
    model: str | None = None  # the served model name (OpenAI requests must name it)


@dataclass(frozen=True)
class HttpRequest:
    """One request the probe sends: the path under the server's root and its JSON body."""

    path: str
    body: dict[str, Any]


class Engine(Protocol):
    """One serving engine, as the operator sees it. Implementations: engines.sglang.SGLANG, engines.vllm.VLLM."""

    facts: enginefacts.EngineFacts  # what code that renders nothing for the engine knows of it (enginefacts.py)
    name: str  # spec.engine: SGLang or vLLM
    cli_name: str  # how `specdec validate --engine` and `specdec-train export --engine` name it
    container_name: str  # the server container of every pod
    validator_args: tuple[str, ...]  # what the speculative pod's `specdec validate` is told of the engine
    health: HealthPaths
    info_path: str  # what the probe's preflight GETs
    metric_prefix: str  # every sample name of the engine's own starts with it (sglang:, vllm:)
    metric_names: frozenset[str]  # the /metrics sample names read_metrics reads
    metric_labels: tuple[str, ...]  # labels kept apart when a scrape is parsed (vLLM's position), as name{label=value}
    acceptance_from_counters: bool  # acceptance is computed from counter deltas between scrapes (counter_window), not read
    metric_reduce: str  # how label sets other than those are combined: "mean" (SGLang's TP ranks) or "sum" (vLLM's engines)
    # The load-aware table is read from a mounted file (SGLang's --speculative-adaptive-config: a ConfigMap the
    # operator makes and mounts) rather than taken inline on the command line (vLLM's --speculative-config).
    adaptive_config_file: bool
    # Seconds a server keeps a CPU core busy after its last request (vLLM: its shm broadcast reader busy-loops 1 s
    # after its last read, vllm/distributed/device_communicators/shm_broadcast.py SpinCondition). The probe lets it
    # end before it measures the other server (probe/run.py), or that server's measurement shares the core with it.
    idle_spin_s: float

    def render_argv(
        self,
        spec: SpeculativeServerSpec,
        variant: Variant | str,
        *,
        adaptive_config_path: str | None = None,
        adaptive_config: str | None = None,
        worker: bool = False,
    ) -> list[str]:
        """The full container command of one server. ``adaptive_config_path`` / ``adaptive_config``: serve
        load-aware with the table of adaptive_document (a file mounted from the ConfigMap at that path, and the same
        document as JSON; each engine reads it the way it can)."""
        ...

    def container_env(self, spec: SpeculativeServerSpec, variant: Variant | str) -> list[dict[str, Any]]:
        """The engine's own environment variables of the server container, before the user's (which win)."""
        ...

    def user_env(self, spec: SpeculativeServerSpec) -> list[dict[str, Any]]:
        """The user's environment variables of the server container (the engine's section of the spec)."""
        ...

    def read_metrics(self, metrics: Mapping[str, float]) -> SpecMetrics:
        """A parsed scrape (sample name -> value, see metric_labels) in the monitor's vocabulary."""
        ...

    def request_model_name(self, spec: SpeculativeServerSpec) -> str:
        """The model name a client puts in its OpenAI requests to this engine's server of ``spec``."""
        ...

    def server_info(self, data: Mapping[str, Any]) -> ServerInfo:
        """The preflight's answer (the JSON document at info_path)."""
        ...

    def random_ids_request(self, ids: Sequence[int], max_tokens: int, *, model: str) -> HttpRequest:
        """A streaming, greedy request of exactly max_tokens (ignore_eos) for a prompt of token ids."""
        ...

    def text_request(self, text: str, messages: list[dict[str, Any]], *, chat: bool, max_tokens: int, fixed: bool, model: str) -> HttpRequest:
        """A streaming, greedy request for a text prompt: through the chat template (chat) or as it is."""
        ...

    def output_request(self, *, text: str | None, ids: Sequence[int] | None, max_tokens: int, model: str) -> HttpRequest:
        """The output check's request (greedy, ignore_eos, not streamed) whose answer output_ids reads."""
        ...

    def output_ids(self, data: Mapping[str, Any]) -> list[int]:
        """The completion's token ids from the output check's answer; KeyError/TypeError when it has none."""
        ...

    def adaptive_document(self, no_draft_from: int, num_steps: int, spec: SpeculativeServerSpec | None = None) -> Any:
        """Load-aware speculation's table: num_steps below batch size no_draft_from, no drafting from there up (for
        ``spec``'s server; without one, for the defaults)."""
        ...

    def adaptive_unsupported_reason(self, spec: SpeculativeServerSpec) -> str | None:
        """Why the engine would not serve load-aware for this spec (it would fall back silently), or None."""
        ...


def _engines() -> dict[str, Engine]:
    from .sglang import SGLANG
    from .vllm import VLLM

    return {SGLANG.name: SGLANG, VLLM.name: VLLM}


def engine_named(name: str) -> Engine:
    """The engine spec.engine names (SGLang or vLLM; also the CLI's sglang / vllm)."""
    engines = _engines()
    for engine in engines.values():
        if name in (engine.name, engine.cli_name):
            return engine
    raise InputError(f"spec.engine: {name!r} is not one of {', '.join(engines)}")


def default_engine() -> Engine:
    """The engine where none is named (enginefacts.DEFAULT): the CLIs', the probe's and the monitor's without a spec."""
    return engine_named(enginefacts.DEFAULT.name)


def engine_for(spec: SpeculativeServerSpec | None) -> Engine:
    """The engine of a spec; without one, default_engine()."""
    return engine_named(spec.engine) if spec is not None else default_engine()


def engine_names() -> list[str]:
    return list(_engines())
