"""What a probe measured and decided: per workload, per speculative arm, and the whole (``ProbeResult.to_status()`` is
the CR's ``status.probe``; ``to_dict()`` the ``specdec probe --json`` document)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..api import BreakEvenStatus, Decision, ProbeStatus, Reason, WorkloadResult
from ..textutil import rfc3339
from .curve import BreakEven, CurvePoint, break_even
from .decide import Verdict

# Family-wise over every look a probe could take, however many rounds its budget allows (probe/sequential.py: each
# look spends its own share of 1 - confidence). Equal servers must practically never be promoted: docs/probe.md has
# the measured rates (benchmarks/probe_decisions.py, benchmarks/probe_study.py).
DEFAULT_CONFIDENCE = 0.998


def _rfc3339(ts: datetime | None) -> str | None:
    return None if ts is None else rfc3339(ts)


def _num(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


@dataclass
class WorkloadOutcome:
    """Per-workload outcome: mean tok/s of each server over the rounds, the speedup and its interval."""

    name: str
    concurrency: int
    weight: float = 1.0
    base_tok_s: float | None = None
    speculative_tok_s: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    rounds: int = 0
    verdict: str = Verdict.UNDECIDED.value
    ratios: list[float] = field(default_factory=list)
    base_latency: dict[str, float | None] = field(default_factory=dict)
    speculative_latency: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "weight": self.weight,
            "base_tok_s": _num(self.base_tok_s, 2),
            # The `specdec probe --json` document keeps the names it was published with (docs/probe.md):
            # "candidate" there is the speculative server.
            "candidate_tok_s": _num(self.speculative_tok_s, 2),
            "speedup": _num(self.speedup),
            "speedup_low": _num(self.speedup_low),
            "speedup_high": _num(self.speedup_high),
            "rounds": self.rounds,
            "verdict": self.verdict,
            "ratios": [_num(r) for r in self.ratios],
            "base_latency": self.base_latency,
            "candidate_latency": self.speculative_latency,
        }

    def to_status(self) -> WorkloadResult:
        return WorkloadResult(
            name=self.name,
            concurrency=self.concurrency,
            base_tokens_per_second=_num(self.base_tok_s, 2),
            speculative_tokens_per_second=_num(self.speculative_tok_s, 2),
            speedup=_num(self.speedup),
            speedup_low=_num(self.speedup_low),
            speedup_high=_num(self.speedup_high),
        )


@dataclass
class ArmResult:
    """One speculative arm of a probe (a server, or a configuration in a race) against the shared base: its acceptance,
    its intervals and where the decision left it (reconcile/race.py's ArmOutcome: Passed, Failed, Futile, ...)."""

    name: str
    url: str = ""
    outcome: str = "Undecided"
    rounds: int = 0
    accept_length: float | None = None  # client side: completion_tokens / spec_verify_ct over its measurements
    server_accept_length: float | None = None  # the server's own, from /metrics after its last round
    accept_rate_by_position: list[float] | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    max_running_requests: int | None = None
    workloads: list[WorkloadOutcome] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "outcome": self.outcome,
            "rounds": self.rounds,
            "accept_length": _num(self.accept_length),
            "server_accept_length": _num(self.server_accept_length),
            "speedup": _num(self.speedup),
            "speedup_low": _num(self.speedup_low),
            "speedup_high": _num(self.speedup_high),
            "max_running_requests": self.max_running_requests,
            "workloads": [w.to_dict() for w in self.workloads],
        }


@dataclass
class ProbeResult:
    """What the probe decided and why (``to_status()`` is the CR's ``status.probe``).

    The top-level measurements (acceptance, speedup, workloads, the speculative server's cap) are the *lead* arm's: the
    winner, else the only arm, else the arm with the highest estimate (:meth:`show_arm`); ``arms`` has every arm's."""

    decision: Decision | None = None  # None until the decision (reconcile/race.py) is in: a partial result (on_round)
    reason: Reason | None = None
    message: str = ""
    rounds: int = 0
    policy: str = "all"
    min_speedup: float = 1.0
    confidence: float = DEFAULT_CONFIDENCE
    accept_length: float | None = None  # client side: completion_tokens / spec_verify_ct over the speculative server's rounds
    server_accept_length: float | None = None  # the server's own, from /metrics after the last round (ServerAcceptance)
    accept_rate_by_position: list[float] | None = None  # vLLM: accepted tokens per draft at each draft position
    speedup: float | None = None  # smallest workload speedup (all) or the weighted one (weighted)
    speedup_low: float | None = None
    speedup_high: float | None = None
    workloads: list[WorkloadOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    base_reachable: bool = True
    base_max_running_requests: int | None = None
    speculative_max_running_requests: int | None = None
    traffic: dict[str, str] = field(default_factory=dict)  # workload -> what it sent (traffic.py)
    synthetic: list[str] = field(default_factory=list)  # workloads that sent random token ids
    output_match_rate: float | None = None  # outputs.py: the greedy completions' match with the base's
    outputs_compared: int | None = None
    # ProbeFailed on a failure that a later attempt can clear (a connection reset, a 5xx, a timeout, a server that
    # went away): the probe scheduler tries again, with backoff, before it reports ProbeFailed.
    transient: bool = False
    winner: str | None = None  # the arm the decision promotes (None: rollback)
    arms: dict[str, ArmResult] = field(default_factory=dict)  # every speculative arm, by name

    def show_arm(self, arm: ArmResult) -> None:
        """Make ``arm`` the lead: its measurements become the top-level ones (single-arm status is exactly these)."""
        self.accept_length, self.server_accept_length = arm.accept_length, arm.server_accept_length
        self.accept_rate_by_position = arm.accept_rate_by_position
        self.speedup, self.speedup_low, self.speedup_high = arm.speedup, arm.speedup_low, arm.speedup_high
        self.workloads = arm.workloads
        self.speculative_max_running_requests = arm.max_running_requests

    @property
    def wall_seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        """The ``specdec probe --json`` document (snake_case)."""
        return {
            "decision": self.decision,
            "reason": self.reason,
            "message": self.message,
            "rounds": self.rounds,
            "policy": self.policy,
            "min_speedup": self.min_speedup,
            "confidence": self.confidence,
            "accept_length": _num(self.accept_length),
            "server_accept_length": _num(self.server_accept_length),
            "accept_rate_by_position": self.accept_rate_by_position,
            "speedup": _num(self.speedup),
            "speedup_low": _num(self.speedup_low),
            "speedup_high": _num(self.speedup_high),
            "workloads": [w.to_dict() for w in self.workloads],
            "warnings": list(self.warnings),
            "base_max_running_requests": self.base_max_running_requests,
            "candidate_max_running_requests": self.speculative_max_running_requests,
            "started_at": _rfc3339(self.started_at),
            "finished_at": _rfc3339(self.finished_at),
            "wall_seconds": _num(self.wall_seconds, 3),
            "break_even": dataclasses.asdict(found) if (found := self.break_even()) is not None else None,
            "traffic": dict(self.traffic),
            "synthetic_traffic": bool(self.synthetic),
            "output_match_rate": _num(self.output_match_rate),
            "outputs_compared": self.outputs_compared,
            "winner": self.winner,
            # A race's arms; a probe of one speculative server has the top-level fields only (they are its arm's).
            **({"arms": {name: arm.to_dict() for name, arm in self.arms.items()}} if len(self.arms) > 1 else {}),
        }

    def traffic_summary(self) -> str | None:
        return "; ".join(f"{name}: {what}" for name, what in self.traffic.items()) or None

    def to_status(self, revision: str | None = None, gpu_seconds: float | None = None) -> ProbeStatus:
        """The CR's ``status.probe`` for the speculative ``revision`` that was measured; ``gpu_seconds``: what it cost
        (the scheduler's, from the spec: probecost.py)."""
        if self.decision is None or self.reason is None:
            raise ValueError("a probe without a decision has no status.probe")
        return ProbeStatus(
            decision=self.decision,
            reason=self.reason,
            rounds=self.rounds,
            started_at=_rfc3339(self.started_at),
            finished_at=_rfc3339(self.finished_at),
            gpu_seconds=gpu_seconds,
            # Chat streams carry no spec_verify_ct: then the server's own sglang:spec_accept_length.
            accept_length=_num(self.accept_length if self.accept_length is not None else self.server_accept_length),
            accept_rate_by_position=self.accept_rate_by_position,
            speedup=_num(self.speedup),
            message=self.message,
            revision=revision,
            output_match_rate=_num(self.output_match_rate),
            outputs_compared=self.outputs_compared,
            traffic=self.traffic_summary(),
            synthetic_traffic=True if self.synthetic else None,
            workloads=[w.to_status() for w in self.workloads],
            break_even=self.break_even_status(),
        )

    def break_even(self) -> BreakEven | None:
        """Where the speedup curve over the workloads' concurrencies crosses 1.0 (probe/curve.py)."""
        points = [CurvePoint(w.concurrency, w.speedup, w.speedup_low, w.speedup_high) for w in self.workloads if w.speedup is not None]
        return break_even(points)

    def break_even_status(self) -> BreakEvenStatus | None:
        found = self.break_even()
        if found is None:
            return None
        return BreakEvenStatus(concurrency=_num(found.concurrency, 2), low=_num(found.low, 2), high=_num(found.high, 2), summary=found.summary)
