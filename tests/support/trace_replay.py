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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_operator.api import Workload
from specdec_operator.probe.evidence import SPECULATIVE, Evidence, Measured, PairedMeasurement
from specdec_operator.probe.scripted import ScriptedProbe
from specdec_operator.reconcile.race import Continue, Decided, RaceRules, decide
from specdec_operator.simulator.model import Profile

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


def trace_named(name: str) -> RecordedTrace:
    """One recorded trace by its name, e.g. ``loaded/eagle3/chat`` (the label is the name's first part)."""
    found = [t for t in recorded_traces(name.split("/", 1)[0]) if t.name == name]
    if not found:
        raise KeyError(f"no recorded trace {name!r} in docs/benchmarks/probe-study-traces-*.json")
    return found[0]


def analytic_speedup(base: Profile, speculative: Profile, workload: Workload) -> float:
    """The simulators' own truth on a workload (Profile.analytic_throughput: no jitter, no host overhead)."""
    shape = (workload.concurrency, workload.input_tokens, workload.output_tokens)
    return speculative.analytic_throughput(*shape) / base.analytic_throughput(*shape)


def _coarse(row: dict[str, Any], blocks: int) -> Measured:
    """A recorded measurement as a short workload's: no variance of its own, ``blocks`` coarse block rates (adjacent
    recorded blocks averaged: equal-duration blocks, so a coarser block's rate is their mean) for the pooled variance."""
    rates = row["profile"]
    size = len(rates) // blocks
    coarse = tuple(sum(rates[i * size : (i + 1) * size]) / size for i in range(blocks))
    return Measured(row["tok_s"], row["log_rate"], math.inf, 1.0, coarse)


def traces_by_shape(label: str, pair: str, workloads: Sequence[Workload]) -> dict[str, RecordedTrace]:
    """Each workload's recorded noise of the nearer shape: the ``chat`` trace (one stream) of ``<label>/<pair>`` for a
    workload of up to 4 streams, its ``batch-32`` trace (32 concurrent streams, far noisier) for a wider one."""
    return {w.name: trace_named(f"{label}/{pair}/{'chat' if w.concurrency <= 4 else 'batch-32'}") for w in workloads}


@dataclass(frozen=True)
class ReplayedProbe(ScriptedProbe):
    """A probe script (probe/scripted.py, what ``run_probe(script=...)`` and ``--probe-script`` feed the decision) whose
    rounds are the simulator's recorded ones: a workload's round ``rnd`` is a recorded round of that server order from
    ``traces[workload]``, drawn with a generator seeded by the key, the workload and the round, its speculative side
    shifted so the trace's mean speedup is the workload's ``speedup``. ``pooled_blocks``: the measurements are a short
    workload's (no variance of their own, that many coarse blocks), so only the pooled block variance
    (stats.with_pooled_variance) gives a round a within-round variance."""

    traces: Mapping[str, RecordedTrace] = field(default_factory=dict)
    pooled_blocks: int = 0
    seconds_per_round: float = 0.0

    def pair(self, workload: str, rnd: int) -> tuple[Measured, Measured]:
        trace = self.traces[workload]
        row = random.Random(f"{self.key}/{workload}/{rnd}").choice(trace.odd if rnd % 2 == 1 else trace.even)
        shift = math.log(self.speedup_of(workload)) - trace.mean_log_ratio
        if self.pooled_blocks:
            spec, base = _coarse(row["speculative"], self.pooled_blocks), _coarse(row["base"], self.pooled_blocks)
            return Measured(spec.tok_s * math.exp(shift), spec.log_rate + shift, spec.var, spec.df, spec.profile), base
        return _measured(row["speculative"], shift), _measured(row["base"])
