"""Load-aware speculation's decisions (pure): when the operator tries a load-aware probe after a plain one, what
status says of it, and the verdict on the adaptive server's probe. The table itself is derived from the curve in
loadaware.py; every Reason of load-aware speculation is set here.

* ``load_aware_probe_for(spec, plain)``: a LoadAwareProbe when plain speculation was rolled back for its speed, wins
  measurably at the lowest concurrency and stops paying at a break-even that leaves batch sizes to draft on; the
  engine's reason (a string) when it cannot run adaptive speculation for this spec; None otherwise.
* ``never_slower(probe, min_speedup)``: the decision on the adaptive server's probe. It is promoted only when every
  workload was measured, none is measurably slower than the base (every interval's high end at least 1) and at
  least one is measurably faster (its low end above ``min_speedup``); otherwise it rolls back with NoLoadWithSpeedup.
* ``adaptive_verdict(result, min_speedup)``: never-slower on an adaptive probe that measured speed; a probe that
  ended for another reason (ProbeFailed, OutputMismatch, DatasetInvalid) keeps it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..api import BreakEvenStatus, Decision, LoadAwareStatus, ProbeMeasurement, Reason, SpeculativeServerSpec, WorkloadResult
from ..loadaware import AdaptivePlan, adaptive_config, adaptive_unsupported_reason
from ..probe.curve import BreakEven

# Plain decisions that may hide a win at low load: the measured speedup did not clear the bar everywhere. A drafter
# that accepts nothing (DrafterNotAccepting) or a server that could not be measured (ProbeFailed) has no curve.
_LOAD_AWARE_PROBE_REASONS = (Reason.SPEEDUP_BELOW_THRESHOLD, Reason.INCONCLUSIVE)
# The adaptive probe's own verdicts on speed, which never-slower replaces. Any other reason stands: a server that
# could not be measured, outputs that differ from the base's or an unreadable dataset are never promoted.
_SPEED_VERDICTS = (Reason.SPEEDUP_CONFIRMED, Reason.SPEEDUP_BELOW_THRESHOLD, Reason.INCONCLUSIVE)
_REASONS = frozenset(r.value for r in Reason)


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
    """What load-aware speculation makes of a plain probe's decision (see the module docstring)."""
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
    """status.probe.loadAware when the curve asked for a load-aware probe the engine cannot run with this spec."""
    return LoadAwareStatus(
        summary=f"unsupported: {reason}",
        reason=Reason.LOAD_AWARE_UNSUPPORTED,
        message=f"plain speculation wins at low load and loses at high, but {engine}'s adaptive speculation does not run with this spec: {reason}; "
        "the plain decision stands",
    )


def _named(w: WorkloadResult) -> str:
    return f"{w.name} (c={w.concurrency})"


def never_slower(probe: ProbeMeasurement, min_speedup: float) -> tuple[Decision, Reason, str]:
    """The decision on an adaptive server's probe (see the module docstring)."""
    workloads = probe.workloads or []
    if not workloads:
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, "no workload was measured"
    slower = [w for w in workloads if w.speedup_high is not None and w.speedup_high < 1.0]
    if slower:
        return (
            Decision.ROLLBACK,
            Reason.NO_LOAD_WITH_SPEEDUP,
            "slower than the base at " + ", ".join(f"{_named(w)} {w.speedup}x [.., {w.speedup_high}]" for w in slower),
        )
    # A workload without a speedup (a probe that ran out of time before measuring it) may be exactly where drafting
    # loses: never slower is not shown.
    unmeasured = [w for w in workloads if w.speedup is None]
    if unmeasured:
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, f"not measured at {', '.join(map(_named, unmeasured))}, so never slower is not shown"
    faster = [w for w in workloads if w.speedup_low is not None and w.speedup_low > min_speedup]
    if not faster:
        return Decision.ROLLBACK, Reason.NO_LOAD_WITH_SPEEDUP, f"not slower at any workload, but faster than {min_speedup:g}x at none"
    return (
        Decision.PROMOTE,
        Reason.LOAD_AWARE_SPEEDUP,
        "never slower than the base, faster at " + ", ".join(f"{_named(w)} {w.speedup}x [{w.speedup_low}, ..]" for w in faster),
    )


def adaptive_verdict(result: ProbeMeasurement, min_speedup: float) -> tuple[Decision, Reason, str]:
    """The decision on the adaptive server's probe: never-slower when it measured speed, else its own reason stands."""
    if result.reason in _SPEED_VERDICTS:
        return never_slower(result, min_speedup)
    reason = Reason(result.reason) if result.reason in _REASONS else Reason.PROBE_FAILED
    default = "the adaptive server could not be measured" if reason == Reason.PROBE_FAILED else reason.value
    return Decision.ROLLBACK, reason, result.message or default
