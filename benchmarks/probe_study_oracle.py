"""What the best possible test could do on the study's recorded traces (issue 32 item 3's round goals).

benchmarks/probe_study.py replays the probe's rule over recorded rounds; where it misses a round goal (a clear truth,
1.5x or more or 0.7x or less, decided right within 2 rounds on quiet traces and 4 on the others, in 90 % of probes), the
question is whether any test could meet it there at the same error level. Three references, all over the study's own
resampling (each round drawn with replacement from the trace's rounds of run.py's order for that round, the truth
imposed by shifting the log ratios):

* ``z-oracle``: knows the true variance of one round's log ratio (the trace's, per server order: in the resampled world
  it is exact) and tests the mean of the rounds so far with a normal quantile. ``spending``: the looks and levels the
  probe has (probe/sequential.py: rollback from look 1 at 5 alpha / 36, promotion from look 2 at alpha / 6); ``fixed``:
  one test after exactly the goal's rounds at the whole one-sided ``alpha`` (the most any test of that many rounds could
  do). Computed exactly: every sequence of rounds is enumerated (30^4 = 810,000 at 4 rounds of a 60-round trace).
* ``t-oracle``: a test that must estimate that variance, as any real one must: the rounds' own spread (n - 1 df) pooled
  with a prior from an earlier probe of ``df + 1`` rounds of the same trace (``df`` degrees of freedom; 0: no prior), a
  Student t quantile at the probe's spending levels, no time blocks and no floor. Monte Carlo (``--probes``).
* What would reach the goal where the z-oracle misses: the rounds it needs at the trace's noise, and the variance of a
  round that 2 (quiet) or 4 rounds would need (so how much longer a round must be, if a round's variance falls as
  1 / its length).

``rollback`` (the no-prior false rollback at 1.05x on the long vLLM trace): the rule's round-2 look evaluated on every
pair of recorded rounds (exact, no Monte Carlo), the pairs that roll back, and the same rule on normal rounds of the
trace's variances (Monte Carlo), which shows how much of the rate is the trace's shape rather than the rule.

Usage (docs/benchmarks/probe-study.md, "What the best test could do", has the commands and the results):
  .venv/bin/python benchmarks/probe_study_oracle.py --traces docs/benchmarks/probe-study-traces-*.json \
      --summary docs/benchmarks/probe-study-summary.json --json docs/benchmarks/probe-study-oracle.json --md OUT.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from statistics import NormalDist
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_study as ps

ALPHA = 1.0 - ps.CONFIDENCE
PROMOTE_SPEND = ALPHA / 6.0  # probe/sequential.py: looks 2-6 of the promotion side
ROLLBACK_SPEND = 5.0 * ALPHA / 36.0  # looks 1-6 of the rollback side
GOAL_SHARE = 0.9
# The rule's rows shown beside the references (probe_study.py's method names in the summary): without a prior (a7706dc),
# with the prior of an earlier 6-round probe before and after the between-round term alone (prior6+between).
RULES = ("rollback-floor", "prior6", "prior6+between")
PRIOR_DFS = (0, 2, 5, 10, 20, 50)
Z = NormalDist()


def _orders(trace: ps.Trace) -> tuple[np.ndarray, np.ndarray]:
    """The trace's log ratios, speculative-first rounds and base-first rounds."""
    odd = np.array([s.log_rate - b.log_rate for s, b, _, _ in trace.odd])
    even = np.array([s.log_rate - b.log_rate for s, b, _, _ in trace.even])
    return odd, even


def _series(trace: ps.Trace, truth: float, looks: int) -> tuple[list[np.ndarray], list[float]]:
    """Per look k, the shifted log ratios it may draw and their true variance (the trace's, of that order)."""
    odd, even = _orders(trace)
    shift = math.log(truth) - trace.mean_log_ratio
    arrays = [(odd if k % 2 == 1 else even) + shift for k in range(1, looks + 1)]
    return arrays, [float(a.var()) for a in arrays]


def z_oracle(trace: ps.Trace, truth: float, looks: int, fixed: bool) -> dict[str, float]:
    """The known-variance test, every sequence of ``looks`` rounds enumerated: the share promoted, rolled back, and right
    (promoted when truth > 1, rolled back when below) by the last look. ``fixed``: one look, the last, at ``ALPHA``."""
    arrays, variances = _series(trace, truth, looks)
    shape = [len(a) for a in arrays]
    total = np.zeros(shape)
    decided = np.zeros(shape, dtype=np.int8)
    var = 0.0
    for k in range(1, looks + 1):
        index: list[Any] = [None] * looks
        index[k - 1] = slice(None)
        total = total + arrays[k - 1][tuple(index)]
        var += variances[k - 1]
        if fixed and k < looks:
            continue
        mean, se = total / k, math.sqrt(var) / k
        zp = Z.inv_cdf(1.0 - (ALPHA if fixed else PROMOTE_SPEND))
        zr = Z.inv_cdf(1.0 - (ALPHA if fixed else ROLLBACK_SPEND))
        if k >= ps_promote_from():
            decided[(decided == 0) & (mean - zp * se > 0)] = 1
        decided[(decided == 0) & (mean + zr * se < 0)] = -1
    promote, rollback = float((decided == 1).mean()), float((decided == -1).mean())
    return {"promote": promote, "rollback": rollback, "right": promote if truth > 1.0 else rollback}


def ps_promote_from() -> int:
    """The first look that may promote: probe/sequential.py's PROMOTE_FROM_LOOK (both server orders measured)."""
    from specdec_operator.probe.sequential import PROMOTE_FROM_LOOK

    return PROMOTE_FROM_LOOK


def t_oracle(trace: ps.Trace, truth: float, looks: int, prior_df: int, probes: int, seed: int) -> dict[str, float]:
    """A t-test on the rounds' spread pooled with a prior of ``prior_df`` df (an earlier probe of prior_df + 1 rounds of
    the same trace, 0: none), at the probe's spending levels, first decisive look within ``looks``; Monte Carlo."""
    from specdec_operator.probe.stats import t_quantile

    rng = np.random.default_rng(seed)
    odd, even = _orders(trace)
    shift = math.log(truth) - trace.mean_log_ratio
    draw = [(odd if k % 2 == 1 else even) for k in range(1, max(looks, prior_df + 1) + 1)]
    rounds = np.stack([draw[k][rng.integers(len(draw[k]), size=probes)] + shift for k in range(looks)], axis=1)
    if prior_df:
        earlier = np.stack([draw[k][rng.integers(len(draw[k]), size=probes)] for k in range(prior_df + 1)], axis=1)
        prior_var = earlier.var(axis=1, ddof=1)
    decided = np.zeros(probes, dtype=np.int8)
    promote_from = ps_promote_from()
    for k in range(1, looks + 1):
        own_df = k - 1
        df = own_df + prior_df
        if df < 1:
            continue
        own = rounds[:, :k].var(axis=1, ddof=1) if k >= 2 else np.zeros(probes)
        var = ((prior_var * prior_df) if prior_df else 0.0) + own * own_df
        se = np.sqrt(var / df / k)
        mean = rounds[:, :k].mean(axis=1)
        if k >= promote_from:
            decided[(decided == 0) & (mean - t_quantile(1.0 - PROMOTE_SPEND, df) * se > 0)] = 1
        decided[(decided == 0) & (mean + t_quantile(1.0 - ROLLBACK_SPEND, df) * se < 0)] = -1
    promote, rollback = float((decided == 1).mean()), float((decided == -1).mean())
    return {"promote": promote, "rollback": rollback, "right": promote if truth > 1.0 else rollback}


def what_reaches(trace: ps.Trace, truth: float, bound: int, prior_df: int = 5) -> dict[str, float]:
    """What would meet the goal at this truth: the rounds the known-variance test needs at the trace's noise, and the sd
    of one round's log ratio that ``bound`` rounds need, for it and for a t-test with a prior of ``prior_df`` df (the
    probe's PRIOR_MAX_DF), so the factor by which a round must be longer if its variance falls as 1 / its length. From the
    normal approximation of the last look at the spending level (90 %: the quantile at alpha / 6, or 5 alpha / 36 for a
    loss, plus z(0.9), standard errors)."""
    from specdec_operator.probe.stats import t_quantile

    odd, even = _orders(trace)
    sigma2 = float((odd.var() + even.var()) / 2.0)
    effect = abs(math.log(truth))
    spend = PROMOTE_SPEND if truth > 1.0 else ROLLBACK_SPEND
    z_need = Z.inv_cdf(1.0 - spend) + Z.inv_cdf(GOAL_SHARE)
    t_need = t_quantile(1.0 - spend, prior_df + bound - 1) + Z.inv_cdf(GOAL_SHARE)
    z_sd, t_sd = effect * math.sqrt(bound) / z_need, effect * math.sqrt(bound) / t_need
    return {
        "round_sd": round(math.sqrt(sigma2), 4),
        "rounds_needed": math.ceil(z_need**2 * sigma2 / effect**2),
        "round_sd_for_bound": round(z_sd, 4),
        "round_longer_by": round(sigma2 / z_sd**2, 2),
        "prior_df": prior_df,
        "round_sd_for_bound_t": round(t_sd, 4),
        "round_longer_by_t": round(sigma2 / t_sd**2, 2),
    }


def method_rows(summary: Sequence[dict[str, Any]], trace: str) -> dict[str, Any]:
    """The rule's own share right within the bound per clear truth, from probe_study.py render's summary (maxRounds 6)."""
    out = {}
    for row in summary:
        if row["trace"] == trace and row["max_rounds"] == 6:
            out[row["method"]] = row["correct_within_bound"]
    return out


def rollback_check(trace: ps.Trace, truth: float, normal_draws: int, seed: int) -> dict[str, Any]:
    """The rule without a prior (this checkout's, method ``current``) at ``truth`` on ``trace``: its round-2 look on every
    pair of recorded rounds (the pairs that roll back, and the exact share), and the same look on ``normal_draws`` pairs
    of normal rounds with the trace's variances (each server's log tok/s, their covariance, the blocks' median variance)."""
    mods = ps._worker_state["mods"]
    stats, decide, seq = mods["stats"], mods["decide"], mods["sequential"]
    rule = ps.Rule("current", ps.CONFIDENCE, 6, mods)
    shift = math.log(truth) - trace.mean_log_ratio
    hits = []
    for i in range(len(trace.odd)):
        for j in range(len(trace.even)):
            if ps.look(trace, shift, rule, [i, j]) == "rollback":
                s1, b1, _, _ = trace.odd[i]
                s2, b2, _, _ = trace.even[j]
                hits.append(
                    {
                        "odd": i,
                        "even": j,
                        "log_ratios": [round(s1.log_rate - b1.log_rate + shift, 4), round(s2.log_rate - b2.log_rate + shift, 4)],
                        "speculative": [s1.log_rate, s2.log_rate],
                        "base": [b1.log_rate, b2.log_rate],
                    }
                )
    rows = trace.odd + trace.even
    spec = np.array([s.log_rate for s, _, _, _ in rows])
    base = np.array([b.log_rate for _, b, _, _ in rows])
    within = float(np.median([s.var + b.var for s, b, _, _ in rows if math.isfinite(s.var) and math.isfinite(b.var)]))
    within_df = float(np.median([min(s.df, b.df) for s, b, _, _ in rows]))
    cov = np.cov(np.stack([spec, base]))
    rng = np.random.default_rng(seed)
    levels = seq.look_levels(ps.CONFIDENCE, 2)
    normal_hits = 0
    for _ in range(normal_draws):
        pair = rng.multivariate_normal([math.log(truth), 0.0], cov, size=2)
        paired = [stats.PairedRound(float(s - b), within, within_df, (), (float(s), float(b))) for s, b in pair]
        normal_hits += decide.judge_paired(stats.sequential_interval(paired, levels), ps.MIN_SPEEDUP) is decide.Verdict.FAIL
    return {
        "trace": trace.name,
        "truth": truth,
        "pairs": len(trace.odd) * len(trace.even),
        "round2_rollbacks": hits,
        "round2_rate": len(hits) / (len(trace.odd) * len(trace.even)),
        "one_pair_share": 1.0 / (len(trace.odd) * len(trace.even)),
        "round_sd": round(float(np.sqrt((_orders(trace)[0].var() + _orders(trace)[1].var()) / 2)), 4),
        "blocks_sd": round(math.sqrt(within), 4),
        "normal_draws": normal_draws,
        "normal_round2_rate": normal_hits / normal_draws,
    }


def study(args: argparse.Namespace) -> dict[str, Any]:
    ps._init_worker(args.traces, None, False)
    traces = list(ps._worker_state["traces"].values())
    summary = json.load(open(args.summary)) if args.summary else []
    out: list[dict[str, Any]] = []
    for n, trace in enumerate(traces):
        bound = ps.round_bound(trace.name)
        for truth in ps.CLEAR:
            row: dict[str, Any] = {"trace": trace.name, "truth": truth, "bound": bound}
            row["z_spending"] = z_oracle(trace, truth, bound, fixed=False)["right"]
            row["z_fixed"] = z_oracle(trace, truth, bound, fixed=True)["right"]
            seed = ps.cell_seed(trace.name, truth, bound)
            row["t_prior"] = {str(df): t_oracle(trace, truth, bound, df, args.probes, seed + df)["right"] for df in PRIOR_DFS}
            row["method"] = {m: v.get(str(truth)) for m, v in method_rows(summary, trace.name).items()}
            row["reach"] = what_reaches(trace, truth, bound)
            out.append(row)
        print(f"[{n + 1}/{len(traces)}] {trace.name}", file=sys.stderr, flush=True)
    # The references' own errors at the threshold: the z-oracle exactly within the goal's rounds, the t-oracle over six
    # looks (maxRounds 6) with each prior; on traces whose rounds are far from normal they exceed the nominal level.
    nulls = [{"trace": t.name, "truth": truth, **z_oracle(t, truth, ps.round_bound(t.name), fixed=False)} for t in traces for truth in (1.0, 1.05)]
    t_nulls = [
        {"trace": t.name, "truth": 1.0, "prior_df": df, "looks": 6, **t_oracle(t, 1.0, 6, df, args.probes, ps.cell_seed(t.name, 1.0, 6) + df)}
        for t in traces
        for df in PRIOR_DFS
    ]
    doc = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/probe_study_oracle.py", *sys.argv[1:]]),
        "confidence": ps.CONFIDENCE,
        "goal_share": GOAL_SHARE,
        "t_oracle_probes": args.probes,
        "rows": out,
        "z_oracle_at_the_threshold": nulls,
        "t_oracle_at_the_threshold": t_nulls,
        "rollback": [rollback_check(t, 1.05, args.normal_draws, 7) for t in traces if t.name.startswith("vllm-long/")],
    }
    return doc


def _p(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(doc: dict[str, Any]) -> str:
    """The table: per trace and clear truth, the share right within the goal's rounds, the rule's and each reference's."""
    head = (
        "| trace | truth | bound | rule: "
        + " / ".join(RULES)
        + " | z-oracle: spending / fixed | t-oracle, prior df "
        + " / ".join(map(str, PRIOR_DFS))
        + " | needed where the rule or the z-oracle is short |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        m = r["method"]
        rule = " / ".join(_p(m.get(name)) for name in RULES)
        need = r["reach"]
        short = (m.get(RULES[-1]) or 1.0) < GOAL_SHARE or r["z_spending"] < GOAL_SHARE  # today's rule, or the best test
        need_s = (
            f"z: {need['rounds_needed']} rounds, or sd {need['round_sd']} -> {need['round_sd_for_bound']} ({need['round_longer_by']}x longer); "
            f"t, prior {need['prior_df']} df: sd -> {need['round_sd_for_bound_t']} ({need['round_longer_by_t']}x longer)"
            if short
            else ""
        )
        t_s = " / ".join(_p(r["t_prior"][str(df)]) for df in PRIOR_DFS)
        lines.append(f"| {r['trace']} | {r['truth']:g} | {r['bound']} | {rule} | {_p(r['z_spending'])} / {_p(r['z_fixed'])} | {t_s} | {need_s} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", nargs="+", required=True)
    p.add_argument("--summary", help="probe_study.py render's summary JSON: the rule's own shares beside the references")
    p.add_argument("--probes", type=int, default=20000, help="Monte Carlo probes per t-oracle cell")
    p.add_argument("--normal-draws", type=int, default=20000, help="normal pairs for the rollback check")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    doc = study(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    text = markdown(doc)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    for r in doc["rollback"]:
        print(
            f"{r['trace']} x{r['truth']}: round-2 rollbacks {len(r['round2_rollbacks'])} of {r['pairs']} pairs ({100 * r['round2_rate']:.2f} %), normal rounds {100 * r['normal_round2_rate']:.3f} %"
        )


if __name__ == "__main__":
    main()
