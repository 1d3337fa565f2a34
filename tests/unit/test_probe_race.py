"""The decision core of a probe of one or more arms (reconcile/race.py) on scripted evidence (probe/evidence.py).

Deterministic: every round is written by the test (a log speedup with a within-round variance), so the decisions do
not depend on how busy the machine is, and a Monte Carlo over seeded synthetic rounds checks the race's error rate.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from specdec_operator.api import Decision, Reason
from specdec_operator.probe.evidence import SCHEMA, STATUS_BYTE_BUDGET, Evidence, Measured, PairedMeasurement, from_compact
from specdec_operator.reconcile.race import ArmOutcome, Continue, Decided, RaceRules, decide

NOISE = 0.04  # within-round standard deviation of a log speedup: a quiet simulator's


def pair(rnd: int, speedup: float, sd: float = NOISE, df: float = 30.0) -> PairedMeasurement:
    """A paired measurement whose log speedup has within-round variance sd^2 (half from each server's measurement)."""
    half = sd * sd / 2.0
    base = Measured(100.0, math.log(100.0), half, df)
    return PairedMeasurement(rnd, Measured(100.0 * speedup, math.log(100.0 * speedup), half, df), base)


def run(script: dict[str, list[float]], rules: RaceRules, workloads: tuple[str, ...] = ("chat",)) -> tuple[Decided, int, Evidence]:
    """Feed the scripted rounds (arm -> speedup of each round, on every workload) until the core decides; return the
    decision, the rounds it took, and the evidence. Only what ``decide`` asks for is measured."""
    evidence = Evidence("rev-1", 1)
    step = decide(evidence, rules, list(script), list(workloads))
    rounds = 0
    while isinstance(step, Continue):
        rounds += 1
        for arm, names in step.workloads.items():
            for name in names:
                ratio = script[arm][len(evidence.measurements(arm, name))]
                evidence.add(arm, name, pair(rounds, ratio))
        step = decide(evidence, rules, list(script), list(workloads))
    return step, rounds, evidence


def test_a_clear_win_is_promoted_at_the_second_round_and_not_before():
    rules = RaceRules(max_rounds=6)
    evidence = Evidence("rev-1", 1)
    evidence.add("eagle3", "chat", pair(1, 2.0))
    assert isinstance(decide(evidence, rules, ["eagle3"], ["chat"]), Continue)  # both server orders first
    decided, rounds, _ = run({"eagle3": [2.0, 2.05, 1.98] * 4}, rules)
    assert (decided.decision, decided.reason, decided.winner, rounds) == (Decision.PROMOTE, Reason.SPEEDUP_CONFIRMED, "eagle3", 2)


def test_a_clear_loss_is_rolled_back_at_the_first_look_with_a_between_round_spread():
    # Without a prior on the between-round variance one round bounds nothing (stats.sequential_interval): round 2.
    decided, rounds, _ = run({"public": [0.36] * 6}, RaceRules())
    assert (decided.decision, decided.reason, rounds) == (Decision.ROLLBACK, Reason.SPEEDUP_BELOW_THRESHOLD, 2)
    assert decided.arms["public"].outcome is ArmOutcome.FAILED


@pytest.mark.parametrize("truth", [0.7, 0.93, 1.0, 1.08, 1.3, 2.0])
def test_a_larger_budget_never_decides_later(truth):
    rng = random.Random(7)
    script = {"arm": [truth * math.exp(rng.gauss(0.0, 0.05)) for _ in range(40)]}
    small = run(script, RaceRules(max_rounds=6))
    large = run(script, RaceRules(max_rounds=24))
    # The same evidence decides at the same round under both budgets, unless the small budget ran out first.
    if small[0].reason is not Reason.INCONCLUSIVE or small[1] < 6:
        assert (large[0].decision, large[0].reason, large[1]) == (small[0].decision, small[0].reason, small[1])
    else:
        assert large[1] >= small[1]


def test_a_race_eliminates_the_slow_arms_and_promotes_the_fastest():
    script = {"ngram": [0.9, 0.91, 0.89] * 8, "eagle3": [1.5, 1.52, 1.49] * 8, "dflash": [2.2, 2.25, 2.18] * 8}
    decided, rounds, evidence = run(script, RaceRules(max_rounds=12))
    assert (decided.decision, decided.winner) == (Decision.PROMOTE, "dflash")
    assert decided.arms["ngram"].outcome in (ArmOutcome.FAILED, ArmOutcome.FUTILE, ArmOutcome.CANNOT_WIN)
    assert decided.arms["eagle3"].outcome in (ArmOutcome.PASSED, ArmOutcome.CANNOT_WIN)
    assert "arm dflash wins" in decided.message and rounds <= 4
    # The loser stopped early: fewer of its rounds were measured than the winner's.
    assert len(evidence.paired("ngram", "chat")) <= len(evidence.paired("dflash", "chat"))


def test_a_drafter_that_accepts_nothing_is_out_of_the_race_at_once():
    evidence = Evidence("rev-1", 1)
    evidence.accept_length["broken"] = 1.0
    step = decide(evidence, RaceRules(), ["broken", "public"], ["chat"])
    assert isinstance(step, Continue) and list(step.workloads) == ["public"]
    only = decide(evidence, RaceRules(), ["broken"], ["chat"])
    assert isinstance(only, Decided) and only.reason is Reason.DRAFTER_NOT_ACCEPTING


def test_under_policy_all_a_confirmed_workload_is_not_measured_again():
    rules = RaceRules(max_rounds=6)
    evidence = Evidence("rev-1", 1)
    for rnd, (chat, batch) in enumerate([(2.0, 1.02), (2.02, 0.99)], start=1):
        evidence.add("a", "chat", pair(rnd, chat))
        evidence.add("a", "batch", pair(rnd, batch, sd=0.3, df=5.0))
    step = decide(evidence, rules, ["a"], ["chat", "batch"])
    assert isinstance(step, Continue) and step.workloads == {"a": ("batch",)}


def test_picking_the_best_of_four_equal_arms_promotes_no_more_often_than_the_budget():
    # Four arms exactly at the threshold, round noise 5 %: each race that promotes any arm is a false promotion.
    confidence, races, rng = 0.9, 400, random.Random(11)
    promoted = 0
    for _ in range(races):
        script = {f"arm{i}": [math.exp(rng.gauss(0.0, NOISE)) for _ in range(8)] for i in range(4)}
        decided, _, _ = run(script, RaceRules(confidence=confidence, max_rounds=8))
        promoted += decided.decision is Decision.PROMOTE
    assert promoted / races <= 1.0 - confidence, promoted


def test_evidence_round_trips_compactly_and_is_never_resumed_from_another_revision_or_generation():
    _, _, evidence = run({"a": [1.4, 1.5, 1.45, 1.47] * 2, "b": [0.8, 0.82, 0.79] * 3}, RaceRules(), ("chat", "batch"))
    evidence.seconds = 12.5  # the time measured before a restart: a resumed probe's GPU-seconds count it
    doc = json.loads(json.dumps(evidence.to_compact()))
    back = from_compact(doc, "rev-1", 1)
    assert back is not None and back.seconds == 12.5
    assert back is not None and back.pairs.keys() == evidence.pairs.keys()
    for arm in evidence.pairs:
        for w in ("chat", "batch"):
            assert [round(p.log_ratio, 5) for p in back.paired(arm, w)] == [round(p.log_ratio, 5) for p in evidence.paired(arm, w)]
    assert back.rounds("a") == evidence.rounds("a")
    # Deciding on the resumed evidence gives the same answer as on the original.
    resumed, original = (decide(e, RaceRules(), ["a", "b"], ["chat", "batch"]) for e in (back, evidence))
    assert isinstance(resumed, Decided) and isinstance(original, Decided)
    assert (resumed.decision, resumed.reason, resumed.winner) == (original.decision, original.reason, original.winner)
    assert {a: s.outcome for a, s in resumed.arms.items()} == {a: s.outcome for a, s in original.arms.items()}
    assert from_compact(doc, "rev-2", 1) is None  # the spec changed: start afresh
    assert from_compact(doc, "rev-1", 2) is None
    assert from_compact({**doc, "v": SCHEMA + 1}, "rev-1", 1) is None
    assert from_compact({**doc, "arms": {"a": {"chat": [["x"]]}}}, "rev-1", 1) is None


def test_the_compact_evidence_of_a_probe_is_small_and_profiles_are_what_makes_it_grow():
    # Six rounds of one arm on two workloads without block profiles fit status's budget; with the coarse profiles a
    # measurement keeps for the pooled variance (up to 40 blocks) it goes to a child object.
    evidence = Evidence("0123456789abcdef", 12)
    for w in ("chat", "batch-64"):
        for rnd in range(1, 7):
            evidence.add("speculative", w, pair(rnd, 1.2345678))
    assert evidence.compact_bytes() < STATUS_BYTE_BUDGET, evidence.compact_bytes()
    profiled = Evidence("0123456789abcdef", 12)
    blocks = tuple(1234.56789 + i for i in range(40))
    for w in ("chat", "batch-64"):
        for rnd in range(1, 7):
            m = Measured(1234.56789, 7.118, 0.000612345, 31.5, blocks)
            profiled.add("speculative", w, PairedMeasurement(rnd, m, m))
    assert STATUS_BYTE_BUDGET < profiled.compact_bytes() < 64 * 1024, profiled.compact_bytes()


def test_at_the_last_round_a_verdict_stands_with_a_wide_side_interval():
    # Weighted: the mix passes, one workload's own interval is wider than the bound. Before the last round that
    # workload is measured again; at the last round the verdict stands (the old probe's rule, docs/probe.md).
    rules = RaceRules(policy="weighted", weights={"chat": 3.0, "batch": 1.0}, max_rounds=3)
    evidence = Evidence("rev-1", 1)
    for rnd, (chat, batch) in enumerate([(2.0, 2.5), (2.05, 1.4), (1.98, 3.1)], start=1):
        evidence.add("a", "chat", pair(rnd, chat))
        evidence.add("a", "batch", pair(rnd, batch, sd=0.5, df=3.0))
        step = decide(evidence, rules, ["a"], ["chat", "batch"])
        if rnd < 3:
            assert isinstance(step, Continue), step
    assert isinstance(step, Decided) and step.decision is Decision.PROMOTE, step.message
    assert step.arms["a"].wide == ("batch",)


def test_a_failed_workload_beside_a_wide_one_stops_at_the_budget():
    # Policy all: x fails at once (0.5x, tight), y's rounds swing so widely that its interval never fits the width
    # bound. Only y is measured again; the probe must still stop at maxRounds (it ran until its time budget before).
    rules = RaceRules(max_rounds=4)
    evidence = Evidence("rev-1", 1)

    def measured(rate: float, var: float) -> Measured:
        return Measured(rate, math.log(rate), var, 30.0)

    step = decide(evidence, rules, ["arm"], ["x", "y"])
    rounds = 0
    while isinstance(step, Continue) and rounds < 40:
        rounds += 1
        for name in step.workloads["arm"]:
            if name == "x":
                evidence.add("arm", "x", PairedMeasurement(rounds, measured(500.0, 1e-4), measured(1000.0, 1e-4)))
            else:
                evidence.add("arm", "y", PairedMeasurement(rounds, measured(1000.0 * (3.0 if rounds % 2 else 0.4), 0.5), measured(1000.0, 0.5)))
        step = decide(evidence, rules, ["arm"], ["x", "y"])
    assert isinstance(step, Decided) and rounds == 4, (rounds, {w: len(r) for w, r in evidence.pairs["arm"].items()})
    assert (step.decision, step.reason) == (Decision.ROLLBACK, Reason.SPEEDUP_BELOW_THRESHOLD), step.message
