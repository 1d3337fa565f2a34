"""Load-aware speculation: the engine's per-batch-size drafting configured from the measured speedup curve (pure).

SGLang 0.5.23 can choose the number of draft steps per batch size (``--speculative-adaptive`` with
``--speculative-adaptive-config``: candidate steps per batch-size bucket, 0 = no drafting); vLLM 0.32 the number of
speculative tokens (``num_speculative_tokens_per_batch_size`` in ``--speculative-config``: inclusive batch-size
ranges, 0 = no drafting). Neither ships a table for it, because the right one depends on the hardware, the
drafter and the traffic. Here it is derived from a probe's own measurements, and the engine (engines/) writes it
in its own format (``Engine.adaptive_document``):

* ``adaptive_config(break_even, num_steps)``: the spec's numSteps below the first batch size where speculation may
  stop paying, 0 from there up. Each bucket has a single candidate, so SGLang's EMA never moves it: a bucket that
  also listed 1 would go back to drafting for one update interval out of two, probing, even when nothing is
  accepted (simulator/adaptive.py reproduces SGLang's rule; tests/unit/test_simulator_adaptive.py checks it against
  SGLang's own). The start of the no-draft range is the low end of the break-even interval when it is bounded:
  speculation is switched off wherever the measurements cannot rule out a loss.
* ``adaptive_unsupported_reason(spec)``: why the engine would not run adaptive for this spec, in its words. Neither
  refuses such a server: each logs a warning and serves with static steps, which is exactly the silent fallback
  the operator must see before it spends a probe.
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
from .engines import engine_for
from .probe.curve import BreakEven


def adaptive_unsupported_reason(spec: SpeculativeServerSpec) -> str | None:
    """The engine's reason for not running adaptive speculation with this spec's server, or None when it can."""
    return engine_for(spec).adaptive_unsupported_reason(spec)


@dataclass(frozen=True)
class AdaptivePlan:
    no_draft_from: int  # the smallest batch size served without drafting
    config: Any  # the engine's document: SGLang's --speculative-adaptive-config, vLLM's num_speculative_tokens_per_batch_size
    num_steps: int = 0  # the drafting steps below no_draft_from (spec.drafter.numSteps)


def adaptive_config(break_even: BreakEven, num_steps: int, spec: SpeculativeServerSpec | None = None) -> AdaptivePlan | None:
    """The adaptive table for a curve that wins at low load and loses at high; None when there is no such range.

    The table needs a drafting bucket at batch size 1 (SGLang refuses to start unless numSteps is a candidate of
    some bucket; vLLM's ranges must start at 1), so a break-even below 2 leaves nothing to speculate on. The
    document is the engine's of ``spec`` (SGLang's without one).
    """
    start = break_even.low if break_even.low is not None else break_even.concurrency
    if start is None or num_steps < 1:
        return None
    no_draft_from = math.ceil(start)
    if no_draft_from < 2:
        return None
    config = engine_for(spec).adaptive_document(no_draft_from, num_steps, spec)
    return AdaptivePlan(no_draft_from, config, num_steps)


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
    engine: str  # spec.engine: whose adaptive speculation the message names

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
            or f"plain speculation stops paying at concurrency {break_even}: the speculative server runs {self.engine}'s adaptive speculation "
            f"with {self.plan.num_steps} draft steps below batch size {self.plan.no_draft_from} and none from there up",
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
    plan = adaptive_config(found, spec.drafter.num_steps, spec)
    if plan is None:
        return None
    unsupported = adaptive_unsupported_reason(spec)
    return unsupported if unsupported is not None else LoadAwareProbe(plan, plain, spec.engine)


def unsupported_note(reason: str, engine: str) -> LoadAwareStatus:
    return LoadAwareStatus(
        summary=f"unsupported: {reason}",
        reason=Reason.LOAD_AWARE_UNSUPPORTED,
        message=f"plain speculation wins at low load and loses at high, but {engine}'s adaptive speculation does not run with this spec: {reason}; "
        "the plain decision stands",
    )
