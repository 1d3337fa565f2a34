"""A prior on the between-round variance from an earlier probe of the same servers (stats.RoundPrior, RaceRules.round_priors,
issue 32): pooled with the probe's own spread, it lets a quiet pair decide at the first looks without loosening the bound
on false promotions. Scripted rounds and the recorded traces of docs/benchmarks/ only (no timing)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from specdec_operator.api import Decision, Reason
from specdec_operator.probe.evidence import SPECULATIVE, Evidence, Measured, PairedMeasurement
from specdec_operator.probe.stats import PRIOR_MAX_DF, RoundPrior, round_prior, round_variance
from specdec_operator.reconcile.race import Continue, Decided, RaceRules, decide
from tests.support.trace_replay import RecordedTrace, replay, trace_named


def _pair(rnd: int, ratio: float, base: float = 7.0, sd: float = 0.02) -> PairedMeasurement:
    def m(log_rate: float) -> Measured:
        return Measured(math.exp(log_rate), log_rate, sd * sd, 14.0)

    return PairedMeasurement(rnd, m(base + math.log(ratio)), m(base))


def _evidence(ratios: list[float]) -> Evidence:
    evidence = Evidence("rev", 1)
    for rnd, r in enumerate(ratios, start=1):
        evidence.add(SPECULATIVE, "chat", _pair(rnd, r, 7.0 + 0.01 * (rnd % 2)))
    return evidence


def test_a_decided_probe_leaves_its_between_round_variance_as_the_next_ones_prior():
    rounds = _evidence([1.5, 1.6, 1.55]).paired(SPECULATIVE, "chat")
    prior = round_prior(rounds)
    assert prior == RoundPrior(pytest.approx(round_variance(rounds)), 2.0)
    # Pooled with the prior it had itself, its df capped: an older estimate weighs at most PRIOR_MAX_DF.
    earlier = RoundPrior(0.04, 5.0)
    pooled = round_prior(rounds, earlier)
    assert pooled is not None and pooled.df == PRIOR_MAX_DF
    assert pooled.var == pytest.approx((5.0 * 0.04 + 2.0 * round_variance(rounds)) / 7.0)
    assert round_prior(rounds[:1]) is None and round_prior(rounds[:1], earlier) == RoundPrior(0.04, PRIOR_MAX_DF)


def test_with_a_prior_a_clear_loss_rolls_back_after_one_round():
    evidence = _evidence([0.5])
    assert isinstance(decide(evidence, RaceRules(), [SPECULATIVE], ["chat"]), Continue)  # one round, no prior: nothing
    rules = RaceRules(round_priors={"chat": RoundPrior(0.03**2, 5.0)})
    got = decide(evidence, rules, [SPECULATIVE], ["chat"])
    assert isinstance(got, Decided) and (got.decision, got.reason) == (Decision.ROLLBACK, Reason.SPEEDUP_BELOW_THRESHOLD)
    # ...but never a promotion after one round, however clear the win; and a prior of noisy rounds (0.3) holds it.
    assert isinstance(decide(_evidence([3.0]), rules, [SPECULATIVE], ["chat"]), Continue)
    noisy = RaceRules(round_priors={"chat": RoundPrior(0.3**2, 5.0)})
    assert isinstance(decide(evidence, noisy, [SPECULATIVE], ["chat"]), Continue)
    # A prior of one df (one earlier probe of two rounds) does not count: too often small by chance (stats.PRIOR_MIN_DF).
    assert isinstance(decide(evidence, RaceRules(round_priors={"chat": RoundPrior(0.03**2, 1.0)}), [SPECULATIVE], ["chat"]), Continue)


def _previous_probe(trace: RecordedTrace, rng: random.Random, rounds: int = 6) -> RoundPrior:
    """The prior a previous probe of ``rounds`` rounds on the same recorded servers leaves (its rounds drawn as a probe's)."""
    evidence = Evidence("previous", 1)
    for rnd in range(1, rounds + 1):
        row = rng.choice(trace.odd if rnd % 2 == 1 else trace.even)
        s, b = row["speculative"], row["base"]
        evidence.add(
            SPECULATIVE,
            trace.name,
            PairedMeasurement(
                rnd,
                Measured(s["tok_s"], s["log_rate"], math.inf if s["var"] is None else s["var"], s["df"], tuple(s["profile"])),
                Measured(b["tok_s"], b["log_rate"], math.inf if b["var"] is None else b["var"], b["df"], tuple(b["profile"])),
            ),
        )
    prior = round_prior(evidence.paired(SPECULATIVE, trace.name))
    assert prior is not None
    return prior


def test_a_prior_decides_the_quiet_eagle3_chat_pair_within_two_rounds():
    # The idle machine's eagle3 chat pair (docs/benchmarks/probe-study.md): without a prior 61 % of 1.5x probes promote
    # within 2 rounds (round 2 is the first look that can promote, and its between-round term has 1 df there); with the
    # prior an earlier 6-round probe of the same servers left (5 df), at least 90 % of 100 replayed probes do.
    trace = trace_named("quiet/eagle3/chat")
    rng = random.Random("prior/quiet/eagle3/chat")
    quick = {"prior": 0, "none": 0}
    for _ in range(100):
        prior = _previous_probe(trace, rng)
        seed = rng.random()
        for label, rules in (("prior", RaceRules(round_priors={trace.name: prior})), ("none", RaceRules())):
            decided, rounds = replay(trace, 1.5, rules, random.Random(seed))
            quick[label] += decided.reason is Reason.SPEEDUP_CONFIRMED and rounds <= 2
    assert quick["prior"] >= 90 and quick["prior"] > quick["none"], quick


@pytest.mark.parametrize("name", ["quiet/eagle3/chat", "loaded/equal/batch-32", "vllm/equal/single-stream"])
def test_with_a_prior_equal_servers_are_not_promoted(name):
    # Truth 1.0 on three kinds of noise (an idle host's speculative pair, a busy host's 32-stream workload, vLLM's CPU
    # build), each probe with the prior of its own earlier probe: none of 150 promoted (the study's rate: at most 0.2 %).
    trace = trace_named(name)
    rng = random.Random(f"prior-null/{name}")
    runs = [replay(trace, 1.0, RaceRules(round_priors={trace.name: _previous_probe(trace, rng)}), rng) for _ in range(150)]
    assert not any(d.decision is Decision.PROMOTE for d, _ in runs), [d.message for d, _ in runs if d.decision is Decision.PROMOTE]


def test_the_probe_scheduler_hands_a_resources_next_probe_the_prior_its_last_probe_left(tmp_path):
    # Probes of one resource (revisions r1..r4) on scripted rounds at 0.5x (probe/scripted.py: seeded noise 0.03; the
    # spec's policy is weighted: the mix's prior decides): the first has no prior and rolls back at round 2; each leaves
    # its rounds' between-round variance pooled with the prior it had (ProbeScheduler.round_priors: 1 df per two-round
    # probe); a prior counts from 2 df (stats.PRIOR_MIN_DF), so the third and fourth roll back after one round. Another
    # resource starts without.
    from specdec_operator.controller.config import Endpoints, OperatorConfig
    from specdec_operator.controller.probescheduler import ProbeScheduler
    from specdec_operator.resource import parse_spec
    from tests.support.world import llama_spec

    script = tmp_path / "script.yaml"
    script.write_text("ns/llama: {speedup: 0.5, secondsPerRound: 0}\nns/other: {speedup: 0.5, secondsPerRound: 0}\n")
    spec = parse_spec(llama_spec(**{"rollout.maxRounds": 6, "rollout.loadAware": "Off"}))

    async def go() -> list[int]:
        scheduler = ProbeScheduler(OperatorConfig(endpoints=Endpoints({}), probe_script=str(script)))
        rounds = []
        try:
            for key, revision in [(("ns", "llama"), f"r{i}") for i in range(1, 5)] + [(("ns", "other"), "r1")]:
                done = asyncio.Event()
                scheduler.start(key, spec, revision, done.set, owner_uid="uid-" + key[1])
                while scheduler.finished(key) is None:
                    await asyncio.wait_for(done.wait(), 60)
                    done.clear()
                status = scheduler.finished(key)
                assert status is not None and status.reason == "SpeedupBelowThreshold", status
                rounds.append(status.rounds)
                scheduler.settle(key)
            # A deleted resource takes what its probes taught with it; the other keeps its own.
            scheduler.forget(("ns", "llama"))
            assert [k[:2] for k in scheduler.round_priors] == [("ns", "other")]
        finally:
            await scheduler.close()
        return rounds

    assert asyncio.run(go()) == [2, 2, 1, 1, 2]
