"""What a probe has measured so far, kept compactly and keyed so that it is never resumed from stale evidence, and the
steps a decision over it can return.

The unit is a paired measurement of one arm (a speculative configuration) against the base on one workload in one
round: each server's tok/s, the log of it with its within-measurement variance and degrees of freedom, and its coarse
block profile (stats.with_pooled_variance pools those over the rounds of one server and workload, so the paired rounds
are derived from all of them, never stored). An arm's acceptance length comes with it. A race of several arms shares
one base; each arm has its own paired measurements.

``to_compact()`` is a JSON document (short keys, rounded floats, a schema version, the resource's revision and
generation) meant for a child object; ``from_compact()`` returns None for a document of another schema, revision or
generation (or one it cannot read), so a restarted operator resumes only the probe of the spec it is still looking at.

Besides the rounds, the evidence carries what this run of the probe observed that is not a round (:class:`RunFacts`:
a server that could not be measured, the time budget spent, the greedy output comparison, where an arm's acceptance
was read). They are facts, never a Reason: the decision turns them into one (reconcile/race.py with
reconcile/probe_outcome.py). They belong to one run and are not kept in the compact document: a resumed probe starts
with none.

The decision itself is reconcile/race.py's: a pure function of an :class:`Evidence` and :class:`RaceRules` that returns
:class:`Continue` (what to measure next) or :class:`Decided`. They are defined here so that the probe's loop (this
layer) can run any decision function it is given (``Decide``) without importing the layer above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..api import Decision, Reason
from .stats import LogRate, PairedRound, RatioInterval, RoundPrior, paired_round, with_pooled_variance

SCHEMA = 1
BASE, SPECULATIVE = "base", "speculative"
# A compact document of at most this many bytes may go into status; a larger one belongs in a child object. Six rounds
# of two workloads with coarse profiles are about 3-6 KiB per arm (tests/unit/test_probe_race.py measures it).
STATUS_BYTE_BUDGET = 2048


@dataclass(frozen=True)
class Measured:
    """One server's measurement of one workload: tok/s, log tok/s with its variance and df, the coarse block rates."""

    tok_s: float
    log_rate: float
    var: float
    df: float
    profile: tuple[float, ...] = ()

    def rate(self) -> LogRate:
        return LogRate(self.log_rate, self.var, self.df)


@dataclass(frozen=True)
class PairedMeasurement:
    round: int
    speculative: Measured
    base: Measured


class FailureKind(StrEnum):
    """Why a probe could not measure (each becomes ProbeFailed in reconcile/probe_outcome.py)."""

    UNREACHABLE = "Unreachable"  # a server's info endpoint did not answer before the first round
    MODEL_MISMATCH = "ModelMismatch"  # the servers serve different model names: the same prompts cannot go to all
    REQUEST = "Request"  # a request of a round or of the output check failed (client.ProbeRequestError)
    ERROR = "Error"  # anything unforeseen (a bug, an answer no code path expected)


@dataclass(frozen=True)
class ProbeFailure:
    """A fact: the probe could not measure. ``detail``: the error as the client saw it; ``transient``: a later attempt
    may clear it (a reset connection, a 5xx, a timeout); ``server``: the unreachable one ("base" or an arm's name);
    ``models``: server -> served model name (ModelMismatch)."""

    kind: FailureKind
    detail: str = ""
    transient: bool = False
    server: str | None = None
    models: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class TimeBudgetSpent:
    """A fact: the probe's time budget (``seconds``) ran out after ``complete_rounds`` complete rounds."""

    seconds: float
    complete_rounds: int


@dataclass(frozen=True)
class OutputFacts:
    """A fact: the greedy completions of ``arm`` compared with the base's (probe/outputs.py) on ``compared`` prompts:
    their mean match share, how many were identical, where the others first differed; ``min_match_rate`` is the rule's
    threshold (rollout.outputCheck.minMatchRate), carried with the measurement it applies to."""

    arm: str
    match_rate: float | None
    compared: int
    identical: int
    first_differences: tuple[int, ...]
    min_match_rate: float


@dataclass
class RunFacts:
    """What one run of a probe observed besides its rounds (not kept: a resumed probe starts with none)."""

    failure: ProbeFailure | None = None
    time_budget: TimeBudgetSpent | None = None
    outputs: OutputFacts | None = None
    accept_read: dict[str, str] = field(default_factory=dict)  # arm -> where the acceptance that stopped it was read


@dataclass
class Evidence:
    """Every arm's paired measurements per workload and its acceptance, keyed by the resource's revision and generation."""

    revision: str = ""
    generation: int = 0
    pairs: dict[str, dict[str, list[PairedMeasurement]]] = field(default_factory=dict)  # arm -> workload -> rounds
    accept_length: dict[str, float] = field(default_factory=dict)  # arm -> acceptance length measured so far
    seconds: float = 0.0  # time spent measuring these rounds, over every run of the probe (its GPU-seconds' time)
    facts: RunFacts = field(default_factory=RunFacts, compare=False)  # this run's non-round facts (not in to_compact)

    def add(self, arm: str, workload: str, pair: PairedMeasurement) -> None:
        self.pairs.setdefault(arm, {}).setdefault(workload, []).append(pair)

    def measurements(self, arm: str, workload: str) -> list[PairedMeasurement]:
        return self.pairs.get(arm, {}).get(workload, [])

    def rounds(self, arm: str) -> int:
        """The last round in which anything of this arm was measured."""
        return max((p.round for rows in self.pairs.get(arm, {}).values() for p in rows), default=0)

    def paired(self, arm: str, workload: str) -> list[PairedRound]:
        """The arm's paired rounds on a workload, each measurement with the better-founded of its own variance and the
        one pooled over all of that server's measurements of the workload (stats.with_pooled_variance)."""
        rows = self.measurements(arm, workload)
        rates = {}
        for variant in (SPECULATIVE, BASE):
            ms = [getattr(p, variant) for p in rows]
            rates[variant] = with_pooled_variance([m.rate() for m in ms], [list(m.profile) for m in ms], f"{workload}/{variant}")
        return [paired_round(s, b) for s, b in zip(rates[SPECULATIVE], rates[BASE], strict=True)]

    def to_compact(self) -> dict[str, Any]:
        def one(m: Measured) -> list[Any]:
            return [_f(m.tok_s), _f(m.log_rate), _f(m.var), _f(m.df), [_f(x) for x in m.profile]]

        return {
            "v": SCHEMA,
            "rev": self.revision,
            "gen": self.generation,
            "arms": {
                arm: {w: [[p.round, one(p.speculative), one(p.base)] for p in rows] for w, rows in per.items()} for arm, per in self.pairs.items()
            },
            "acc": {arm: _f(a) for arm, a in self.accept_length.items()},
            "s": _f(self.seconds),
        }

    def compact_bytes(self) -> int:
        return len(json.dumps(self.to_compact(), separators=(",", ":")).encode())


def from_compact(doc: Mapping[str, Any] | None, revision: str, generation: int) -> Evidence | None:
    """The evidence in ``doc`` when it is of this schema, revision and generation; otherwise None (start afresh)."""
    if not isinstance(doc, Mapping) or doc.get("v") != SCHEMA or doc.get("rev") != revision or doc.get("gen") != generation:
        return None
    evidence = Evidence(revision, generation)

    def one(row: Sequence[Any]) -> Measured:
        tok_s, log_rate, var, df, profile = row
        return Measured(float(tok_s), float(log_rate), float(var), float(df), tuple(float(x) for x in profile))

    try:
        for arm, per in (doc.get("arms") or {}).items():
            for workload, rows in per.items():
                for rnd, spec, base in rows:
                    evidence.add(str(arm), str(workload), PairedMeasurement(int(rnd), one(spec), one(base)))
        evidence.accept_length = {str(arm): float(a) for arm, a in (doc.get("acc") or {}).items() if a is not None}
        evidence.seconds = float(doc.get("s") or 0.0)
    except (TypeError, ValueError, AttributeError):
        return None  # a document this code cannot read counts as stale: the probe starts afresh
    return evidence


def _f(x: float) -> float | str:
    """Six significant digits; infinities and NaN as strings (JSON has none; float() reads them back)."""
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return float(f"{x:.6g}")


# --- What a decision over the evidence returns ------------------------------------------------------------------------


class ArmOutcome(StrEnum):
    UNDECIDED = "Undecided"
    PASSED = "Passed"
    FAILED = "Failed"
    FUTILE = "Futile"
    NOT_ACCEPTING = "NotAccepting"
    CANNOT_WIN = "CannotWin"
    INCONCLUSIVE = "Inconclusive"  # undecided when the budget ran out


@dataclass(frozen=True)
class RaceRules:
    """What ``spec.rollout`` says about deciding (``policy``: "all" or "weighted")."""

    min_speedup: float = 1.0
    confidence: float = 0.998
    max_rounds: int = 6
    policy: str = "all"
    weights: Mapping[str, float] = field(default_factory=dict)  # workload -> weight (weighted policy; default 1)
    accept_length_floor: float | None = 1.1
    labels: Mapping[str, str] = field(default_factory=dict)  # workload -> how messages name it ("chat (c=1)")
    # A race of candidates measured one after another (reconcile/candidate_race.py): the arms the error budget is shared
    # with over the whole race (this probe's arms and the others'), and the best low end a candidate measured before
    # has passed with (an arm whose high end is below it cannot win: CannotWin).
    family: int = 1
    bar: float | None = None
    # workload -> the between-round variance earlier probes of the same servers measured (stats.RoundPrior, pooled with
    # this probe's own spread; policy all). None of them: each probe stands on its own rounds (one round bounds nothing).
    round_priors: Mapping[str, RoundPrior] = field(default_factory=dict)


@dataclass(frozen=True)
class ArmState:
    arm: str
    outcome: ArmOutcome
    rounds: int
    interval: RatioInterval | None  # the policy's: the worst workload's (all) or the weighted mix's
    workloads: Mapping[str, RatioInterval] = field(default_factory=dict)
    wide: tuple[str, ...] = ()  # workloads whose intervals are wider than the bound: measured again before a decision
    next_workloads: tuple[str, ...] = ()  # what another round of this arm measures (while it is undecided)


@dataclass(frozen=True)
class Continue:
    """Measure another round of these arms, each on these workloads."""

    workloads: Mapping[str, tuple[str, ...]]  # arm -> workloads
    arms: Mapping[str, ArmState]


@dataclass(frozen=True)
class Decided:
    decision: Decision
    reason: Reason
    message: str
    winner: str | None
    arms: Mapping[str, ArmState]
    # ProbeFailed on a failure that a later attempt can clear (ProbeFailure.transient): the probe scheduler tries again.
    transient: bool = False


Decide = Callable[[Evidence, RaceRules, Sequence[str], Sequence[str]], "Continue | Decided"]
