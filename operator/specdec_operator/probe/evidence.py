"""What a probe has measured so far, kept compactly and keyed so that it is never resumed from stale evidence.

The unit is a paired round of one arm (a speculative configuration) against the base on one workload: the round's log
speedup with its within-round variance and degrees of freedom (stats.PairedRound), and both servers' tok/s. An arm's
acceptance counters come with it. A race of several arms shares one base, so each arm has its own paired rounds.

``to_compact()`` is a JSON document (short keys, rounded floats, a schema version, the resource's revision and
generation) meant for a child object or status; ``from_compact()`` returns None for a document of another schema,
revision or generation, so a restarted operator resumes only the probe of the spec it is still looking at.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .stats import PairedRound

SCHEMA = 1
# The compact document of a probe is kept under this many bytes (6 rounds x 2 workloads x 4 arms is about 3 KiB): a
# larger one belongs in a child object, not in status (tests/unit/test_probe_race.py checks the typical size).
BYTE_BUDGET = 8192


@dataclass(frozen=True)
class ArmRound:
    """One paired round of one arm on one workload."""

    round: int
    paired: PairedRound
    speculative_tok_s: float
    base_tok_s: float


@dataclass
class Evidence:
    """Every arm's paired rounds per workload, its acceptance, keyed by the resource's revision and generation."""

    revision: str
    generation: int
    rounds: dict[str, dict[str, list[ArmRound]]] = field(default_factory=dict)  # arm -> workload -> rounds
    accept_length: dict[str, float] = field(default_factory=dict)  # arm -> acceptance length measured so far

    def add(self, arm: str, workload: str, entry: ArmRound) -> None:
        self.rounds.setdefault(arm, {}).setdefault(workload, []).append(entry)

    def paired(self, arm: str, workload: str) -> list[PairedRound]:
        return [r.paired for r in self.rounds.get(arm, {}).get(workload, [])]

    def complete_rounds(self, arm: str, workloads: list[str]) -> int:
        """Rounds in which every workload of the arm was measured."""
        per = self.rounds.get(arm, {})
        return min((len(per.get(w, [])) for w in workloads), default=0)

    def to_compact(self) -> dict[str, Any]:
        def one(r: ArmRound) -> list[Any]:
            p = r.paired
            parts = [[key, _f(var), _f(df)] for key, var, df in p.parts]
            return [r.round, _f(p.log_ratio), _f(p.var), _f(p.df), _f(r.speculative_tok_s), _f(r.base_tok_s), parts]

        return {
            "v": SCHEMA,
            "rev": self.revision,
            "gen": self.generation,
            "arms": {arm: {w: [one(r) for r in rs] for w, rs in per.items()} for arm, per in self.rounds.items()},
            "acc": {arm: _f(a) for arm, a in self.accept_length.items()},
        }

    def compact_bytes(self) -> int:
        return len(json.dumps(self.to_compact(), separators=(",", ":")).encode())


def from_compact(doc: Mapping[str, Any] | None, revision: str, generation: int) -> Evidence | None:
    """The evidence in ``doc`` when it is of this schema, revision and generation; otherwise None (start afresh)."""
    if not isinstance(doc, Mapping) or doc.get("v") != SCHEMA or doc.get("rev") != revision or doc.get("gen") != generation:
        return None
    evidence = Evidence(revision, generation)
    try:
        for arm, per in (doc.get("arms") or {}).items():
            for workload, rows in per.items():
                for rnd, log_ratio, var, df, spec, base, parts in rows:
                    paired = PairedRound(_inf(log_ratio), _inf(var), float(df), tuple((key, _inf(v), float(d)) for key, v, d in parts))
                    evidence.add(arm, workload, ArmRound(int(rnd), paired, float(spec), float(base)))
        evidence.accept_length = {arm: float(a) for arm, a in (doc.get("acc") or {}).items() if a is not None}
    except (TypeError, ValueError):
        return None  # a document this code cannot read is stale too: the probe starts afresh
    return evidence


def _f(x: float) -> float | str:
    """Six significant digits; infinities as strings (JSON has none)."""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if math.isnan(x):
        return "nan"
    return float(f"{x:.6g}")


def _inf(x: float | str) -> float:
    return float(x)
