"""Load-aware speculation: SGLang's adaptive mode configured from the measured speedup curve (pure).

SGLang 0.5.23 can choose the number of draft steps per batch size (``--speculative-adaptive`` with
``--speculative-adaptive-config``: candidate steps per batch-size bucket, 0 = no drafting). Neither SGLang nor vLLM
ships a table for it, because the right one depends on the hardware, the drafter and the traffic. Here it is
derived from a probe's own measurements:

* ``adaptive_config(break_even, num_steps)``: the spec's numSteps below the first batch size where speculation may
  stop paying, 0 from there up. Each bucket has a single candidate, so SGLang's EMA never moves it: a bucket that
  also listed 1 would go back to drafting for one update interval out of two, probing, even when nothing is
  accepted (simulator/adaptive.py reproduces SGLang's rule; tests/unit/test_simulator_adaptive.py checks it against
  SGLang's own). The start of the no-draft range is the low end of the break-even interval when it is bounded:
  speculation is switched off wherever the measurements cannot rule out a loss.
* ``adaptive_unsupported_reason(spec)``: why SGLang would not run adaptive for this spec, in SGLang's words. SGLang
  does not refuse such a server: it logs a warning and serves with static steps, which is exactly the silent
  fallback the operator must see before it spends a probe.
* ``never_slower(probe, min_speedup)``: the decision on the adaptive server's probe. It is promoted only when no
  workload is measurably slower than the base (every interval's high end at least 1) and at least one is
  measurably faster (its low end above ``min_speedup``); otherwise it rolls back with NoLoadWithSpeedup.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from .api import BreakEvenStatus, Decision, LoadAwareStatus, ProbeMeasurement, Reason, SpeculativeServerSpec
from .probe.curve import BreakEven

# Flags of sglang.extraArgs under which SGLang 0.5.23's adaptive_unsupported_reason says no
# (sglang/srt/speculative/adaptive_spec_params.py in the installed wheel).
_UNSUPPORTED_FLAGS = {
    "--enable-dp-attention": "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)",
    "--enable-multi-layer-eagle": "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)",
    "--enable-two-batch-overlap": "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)",
    "--enable-pdmux": "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)",
}


def adaptive_unsupported_reason(spec: SpeculativeServerSpec) -> str | None:
    """SGLang's reason for not running adaptive speculation with this spec's server, or None when it can."""
    drafter = spec.drafter
    if drafter.algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={drafter.algorithm} (only EAGLE/EAGLE3 are supported)"
    if drafter.eagle_topk != 1:
        return f"speculative_eagle_topk={drafter.eagle_topk} (only topk=1 is supported)"
    for arg in spec.sglang.extra_args:
        reason = _UNSUPPORTED_FLAGS.get(arg.split("=", 1)[0])
        if reason is not None:
            return reason
    return None


@dataclass(frozen=True)
class AdaptivePlan:
    no_draft_from: int  # the smallest batch size served without drafting
    config: dict[str, Any]  # SGLang's --speculative-adaptive-config document


def adaptive_config(break_even: BreakEven, num_steps: int) -> AdaptivePlan | None:
    """The adaptive table for a curve that wins at low load and loses at high; None when there is no such range.

    The table needs a drafting bucket at batch size 1 (SGLang refuses to start unless numSteps is a candidate of
    some bucket), so a break-even below 2 leaves nothing to speculate on.
    """
    start = break_even.low if break_even.low is not None else break_even.concurrency
    if start is None or num_steps < 1:
        return None
    no_draft_from = math.ceil(start)
    if no_draft_from < 2:
        return None
    config = {"1": {"candidate_steps": [num_steps]}, str(no_draft_from): {"candidate_steps": [0]}}
    return AdaptivePlan(no_draft_from, config)


def never_slower(probe: ProbeMeasurement, min_speedup: float) -> tuple[Decision, Reason, str]:
    """The decision on an adaptive server's probe (see the module docstring)."""
    workloads = probe.workloads or []
    slower = [w for w in workloads if w.speedup_high is not None and w.speedup_high < 1.0]
    faster = [w for w in workloads if w.speedup_low is not None and w.speedup_low > min_speedup]
    if not workloads:
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, "no workload was measured"
    if slower:
        names = ", ".join(f"{w.name} (c={w.concurrency}) {w.speedup}x [.., {w.speedup_high}]" for w in slower)
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, f"slower than the base at {names}"
    if not faster:
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, f"not slower at any workload, but faster than {min_speedup:g}x at none"
    names = ", ".join(f"{w.name} (c={w.concurrency}) {w.speedup}x [{w.speedup_low}, ..]" for w in faster)
    return Decision.PROMOTE, Reason.LOAD_AWARE_SPEEDUP, f"never slower than the base, faster at {names}"


# --------------------------------------------------------------------------------------------------
# The load-aware probe: when the operator runs one, and what it runs


# Plain decisions that may hide a win at low load: the measured speedup did not clear the bar everywhere. A drafter
# that accepts nothing (DrafterNotAccepting) or a server that could not be measured (ProbeFailed) has no curve.
_LOAD_AWARE_PROBE_REASONS = (Reason.SPEEDUP_BELOW_THRESHOLD, Reason.INCONCLUSIVE)


@dataclass(frozen=True)
class LoadAwareProbe:
    """A load-aware probe: the adaptive table derived from the plain probe, which the speculative server runs while
    it is measured against the base again (status wording: "load-aware trial", Reason LoadAwareTrial)."""

    plan: AdaptivePlan
    plain: ProbeMeasurement  # the plain probe's decision and curve

    @property
    def config_json(self) -> str:
        return json.dumps(self.plan.config, sort_keys=True, separators=(",", ":"))

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.config_json.encode()).hexdigest()[:12]

    @property
    def summary(self) -> str:
        return f"drafts below batch {self.plan.no_draft_from}"

    def status(self, reason: Reason = Reason.LOAD_AWARE_TRIAL, message: str | None = None) -> LoadAwareStatus:
        break_even = self.plain.break_even.summary if self.plain.break_even else "unknown"
        return LoadAwareStatus(
            summary=self.summary,
            reason=reason,
            message=message
            or f"plain speculation stops paying at concurrency {break_even}: the speculative server runs SGLang's adaptive speculation "
            f"with {self.plan.config['1']['candidate_steps'][0]} draft steps below batch size {self.plan.no_draft_from} and none from there up",
            no_draft_from=self.plan.no_draft_from,
            config=self.config_json,
            plain_probe=ProbeMeasurement.model_validate(self.plain.model_dump(include=set(ProbeMeasurement.model_fields))),
        )


def _break_even(found: BreakEvenStatus | None) -> BreakEven | None:
    if found is None or found.concurrency is None:
        return None
    return BreakEven(found.concurrency, found.low, found.high, found.summary)


def load_aware_probe_for(spec: SpeculativeServerSpec, plain: ProbeMeasurement) -> LoadAwareProbe | str | None:
    """What load-aware speculation makes of a plain probe's decision.

    A LoadAwareProbe when plain speculation was rolled back for its speed, wins measurably at the lowest concurrency and stops
    paying at a break-even that leaves batch sizes to draft on; SGLang's reason (a string) when such a curve was
    measured but SGLang cannot run adaptive speculation for this spec; None when there is nothing to try.
    """
    if plain.decision != Decision.ROLLBACK or plain.reason not in _LOAD_AWARE_PROBE_REASONS:
        return None
    curve = sorted((w for w in plain.workloads or [] if w.speedup is not None), key=lambda w: w.concurrency)
    found = _break_even(plain.break_even)
    # A measured win at the lowest concurrency (its interval's low end above minSpeedup), not a point estimate:
    # the seed's public drafter (1.005x at one stream, 0.43x at 128) has nothing to win back.
    if not curve or found is None or (curve[0].speedup_low or 0.0) <= spec.rollout.min_speedup:
        return None  # no curve that falls through 1.0 from a win at low load
    plan = adaptive_config(found, spec.drafter.num_steps)
    if plan is None:
        return None
    unsupported = adaptive_unsupported_reason(spec)
    return unsupported if unsupported is not None else LoadAwareProbe(plan, plain)


def unsupported_note(reason: str) -> LoadAwareStatus:
    return LoadAwareStatus(
        summary=f"unsupported: {reason}",
        reason=Reason.LOAD_AWARE_UNSUPPORTED,
        message=f"plain speculation wins at low load and loses at high, but SGLang's adaptive speculation does not run with this spec: {reason}; "
        "the plain decision stands",
    )
