"""The operator's log line of every probe round (controller/probescheduler._round_line): what an Inconclusive race
was made of stays readable afterwards, where status keeps only the last figures."""

from __future__ import annotations

from types import SimpleNamespace

from specdec_operator.controller.probescheduler import _round_line


def workload(name: str, ratios: list[float], speedup: float | None, low: float | None, high: float | None) -> SimpleNamespace:
    return SimpleNamespace(name=name, ratios=ratios, speedup=speedup, speedup_low=low, speedup_high=high)


def test_a_round_line_names_the_candidate_the_interval_and_every_rounds_ratio():
    partial = SimpleNamespace(
        rounds=3,
        workloads=[
            workload("single-stream", [2.411, 1.891, 2.828], 2.345, 0.017, 528.675),
            workload("held-out-traffic", [1.972, 1.969, 2.016], 1.985, 1.434, 2.772),
        ],
    )
    line = _round_line(partial, "train-1")
    assert line == (
        "candidate train-1 round 3: single-stream 2.345x [0.017, 528.675], rounds 2.411 1.891 2.828; "
        "held-out-traffic 1.985x [1.434, 2.772], rounds 1.972 1.969 2.016"
    )


def test_an_unbounded_end_and_a_first_round_read_as_such_and_a_plain_probe_is_a_probe():
    first = SimpleNamespace(rounds=1, workloads=[workload("chat", [2.4], 2.4, None, None), workload("idle", [], None, None, None)])
    assert _round_line(first, None) == "probe round 1: chat 2.400x [-, inf], rounds 2.400"
    wide = SimpleNamespace(rounds=2, workloads=[workload("chat", [2.4, 1.9], 2.1, 0.0, 3.3e170)])
    assert _round_line(wide, None) == "probe round 2: chat 2.100x [0.000, inf], rounds 2.400 1.900"
    assert _round_line(SimpleNamespace(rounds=0, workloads=[]), "x") == "candidate x round 0: nothing measured yet"
