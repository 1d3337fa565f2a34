"""Priors on the between-round variance, carried from one decided probe of a resource to its next (issue 32, item 2).

A probe's first looks are slow for one reason: the between-round term of its interval (stats.paired_interval) has n - 1
degrees of freedom, 1 at round 2, so the t quantile at the promotion side's alpha / 6 is in the hundreds, and one round
bounds nothing at all (stats.sequential_interval). The rounds of an earlier probe of the same servers measured that
spread already: stats.round_prior turns a decided probe's rounds into a RoundPrior per workload (its df capped at
stats.PRIOR_MAX_DF), and RaceRules.round_priors hands it to the next probe's decision, which pools it with its own
rounds' spread (stats.between_round). Where it lives: in the operator's memory (controller/probescheduler.py), per
resource (namespace, name, uid) and kind of probe; a restarted operator starts without priors, which is today's rule.
docs/probe.md, "A prior on the between-round variance", has the argument and the study.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .evidence import Continue, Decide, Decided, Evidence, RaceRules
from .stats import WEIGHTED_MIX, RoundPrior, round_prior, weighted_paired_round


def priors_after(evidence: Evidence, earlier: Mapping[str, RoundPrior], weights: Mapping[str, float] | None = None) -> dict[str, RoundPrior]:
    """Per workload, the prior a decided probe leaves: :func:`stats.round_prior` over the rounds of the arm measured most
    on it, pooled with the prior the probe had (``earlier``); a workload measured in fewer than two rounds keeps its
    earlier prior. ``weights`` (policy weighted: workload -> traffic weight): also the weighted mix's, under
    stats.WEIGHTED_MIX, over the rounds in which every workload was measured."""
    out = dict(earlier)
    workloads = sorted({w for per in evidence.pairs.values() for w in per})
    for workload in workloads:
        arm = max(evidence.pairs, key=lambda a: (len(evidence.measurements(a, workload)), a))
        prior = round_prior(evidence.paired(arm, workload), earlier.get(workload))
        if prior is not None:
            out[workload] = prior
    if weights and workloads:
        arm = max(evidence.pairs, key=lambda a: (min(len(evidence.measurements(a, w)) for w in workloads), a))
        paired = {w: evidence.paired(arm, w) for w in workloads}
        n = min(len(p) for p in paired.values())
        series = [weighted_paired_round({w: paired[w][i] for w in workloads}, {w: weights.get(w, 1.0) for w in workloads}) for i in range(n)]
        prior = round_prior(series, earlier.get(WEIGHTED_MIX))
        if prior is not None:
            out[WEIGHTED_MIX] = prior
    return out


def with_round_priors(decide: Decide, priors: Mapping[str, RoundPrior]) -> Decide:
    """``decide`` with ``priors`` in its rules (RaceRules.round_priors; the rules' own take precedence)."""
    if not priors:
        return decide

    def decide_with_priors(evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
        return decide(evidence, dataclasses.replace(rules, round_priors={**priors, **rules.round_priors}), arms, workloads)

    return decide_with_priors
