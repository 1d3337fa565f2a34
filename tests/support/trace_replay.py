"""Probes replayed from recorded per-round traces (docs/benchmarks/probe-study-traces-*.json, recorded by
benchmarks/probe_study.py), decided by the operator's own decision (reconcile/race.py).

A replay is deterministic: rounds are drawn with a seeded generator from the recorded rounds of each round's server
order (speculative first in odd rounds, as probe/run.py alternates them), with the speculative side's log rates shifted
so that the trace's mean speedup is the truth imposed. The noise is what the simulator really showed on a quiet or a busy
machine, but the decision no longer depends on how busy the machine running the test is.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_operator.probe.evidence import SPECULATIVE, Evidence, Measured, PairedMeasurement
from specdec_operator.reconcile.race import Continue, Decided, RaceRules, decide

TRACES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


@dataclass(frozen=True)
class RecordedTrace:
    name: str
    odd: tuple[dict[str, Any], ...]  # rounds recorded speculative first
    even: tuple[dict[str, Any], ...]  # rounds recorded base first
    mean_log_ratio: float


def recorded_traces(label: str) -> Iterator[RecordedTrace]:
    """The traces of docs/benchmarks/probe-study-traces-<label>.json (loaded, favoured, vllm)."""
    doc = json.loads((TRACES / f"probe-study-traces-{label}.json").read_text(encoding="utf-8"))
    for t in doc["traces"]:
        rows = t["rounds"]
        mean = sum(r["speculative"]["log_rate"] - r["base"]["log_rate"] for r in rows) / len(rows)
        odd = tuple(r for r in rows if r["order"] == "sb")
        even = tuple(r for r in rows if r["order"] != "sb")
        yield RecordedTrace(t["name"], odd, even, mean)


def _measured(row: dict[str, Any], shift: float = 0.0) -> Measured:
    var = math.inf if row["var"] is None else row["var"]
    return Measured(row["tok_s"] * math.exp(shift), row["log_rate"] + shift, var, row["df"], tuple(row["profile"]))


def replay(trace: RecordedTrace, truth: float, rules: RaceRules, rng: random.Random) -> tuple[Decided, int]:
    """One probe of one workload over ``trace`` at ``truth``: the decision and the rounds it took."""
    shift = math.log(truth) - trace.mean_log_ratio
    evidence = Evidence("replay", 1)
    step = decide(evidence, rules, [SPECULATIVE], [trace.name])
    rnd = 0
    while isinstance(step, Continue):
        rnd += 1
        row = rng.choice(trace.odd if rnd % 2 == 1 else trace.even)
        evidence.add(SPECULATIVE, trace.name, PairedMeasurement(rnd, _measured(row["speculative"], shift), _measured(row["base"])))
        step = decide(evidence, rules, [SPECULATIVE], [trace.name])
    return step, rnd
