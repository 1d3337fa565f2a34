"""What is decided for this revision: the validator's verdict, the probe's decision (stored, just measured, or
forced by a crash loop), the load-aware probe's never-slower rule, and the drift monitor undoing a promotion."""

from __future__ import annotations

from ..api import (
    Decision,
    Finding,
    LoadAware,
    MonitorStatus,
    Phase,
    ProbeStatus,
    Reason,
    SpeculativeServerSpec,
    ValidationStatus,
)
from ..choices import DRAFTER_FREE_ALGORITHMS
from ..monitor import observe_fleet
from ..probecost import decision_seconds
from .facts import BASE, SPECULATIVE, Facts
from .loadaware import LoadAwareProbe, adaptive_verdict, load_aware_probe_for, unsupported_note
from .pods import (
    validation_from_pods,
)


def settle_validation(facts: Facts) -> ValidationStatus | None:
    """The validator's verdict for this revision: stored, read from the speculative pod's init container, or None."""
    stored = facts.prev.validation
    if stored is not None and stored.revision == facts.revision and stored.compatible is not None:
        return stored
    drafter = facts.spec.drafter
    if not drafter.path:
        return ValidationStatus(
            compatible=True,
            revision=facts.revision,
            findings=[Finding(severity="info", code=Reason.NO_SEPARATE_DRAFTER, message=_no_drafter_message(drafter.algorithm))],
        )
    return validation_from_pods(facts.observed.pods, facts.revision)


def is_invalid(validation: ValidationStatus | None) -> bool:
    return validation is not None and validation.compatible is False


def settle_decision(facts: Facts, validation: ValidationStatus | None) -> ProbeStatus | None:
    """The decision for this revision: stored, just measured by the probe, or forced by a crash-looping server."""
    stored = facts.prev_probe_for_revision()
    if facts.load_aware_probe is None and stored is not None and stored.load_aware is not None and stored.load_aware.plain_probe is not None:
        # loadAware turned Off (or SGLang can no longer run it for this spec): the plain probe's decision is in force.
        return ProbeStatus.model_validate(stored.load_aware.plain_probe.model_dump())
    # A stored decision stands; a plain one stored before loadAware was turned on gives way to the load-aware probe it asks for.
    if (
        stored is not None
        and stored.decision
        and (facts.load_aware_probe is None or (stored.load_aware is not None and stored.load_aware.plain_probe is not None))
    ):
        return stored
    if is_invalid(validation) or facts.conflicts:
        return None
    result = facts.observed.probe_result
    if result is not None and result.reason == Reason.PROBE_FAILED and not all(facts.servers[v].ready for v in (BASE, SPECULATIVE)):
        # A server went away under the probe (a preempted or restarted pod): the failure says nothing about the
        # drafter. Nothing is decided; the probe starts again when both servers are back.
        result = None
    if result is not None and result.revision == facts.revision and result.decision:
        result = result.model_copy(
            update={
                "finished_at": result.finished_at or facts.now_s,
                "started_at": result.started_at or (stored.started_at if stored is not None else None),
            }
        )
        adaptive = result.load_aware is not None
        if facts.load_aware_probe is not None:
            # The plain result that opened the load-aware probe decides nothing: the adaptive server is measured next.
            return _adaptive_decision(facts, facts.load_aware_probe, result) if adaptive else None
        if not adaptive:
            return _with_unsupported_note(facts.spec, result)
    speculative = facts.servers[SPECULATIVE]
    if (
        validation is not None
        and validation.compatible
        and speculative.reason == Reason.CRASH_LOOP
        and speculative.restarts >= facts.settings.crash_restart_limit
    ):
        return ProbeStatus(
            decision=Decision.ROLLBACK,
            reason=Reason.PROBE_FAILED,
            rounds=0,
            revision=facts.revision,
            finished_at=facts.now_s,
            message=f"speculative server never became ready: {speculative.message}",
        )
    return None


def _adaptive_decision(facts: Facts, load_aware_probe: LoadAwareProbe, result: ProbeStatus) -> ProbeStatus:
    """The decision on the adaptive server's probe: never slower than the base, faster somewhere (loadaware.adaptive_verdict)."""
    decision, reason, message = adaptive_verdict(result, facts.spec.rollout.min_speedup)
    message = f"load-aware ({load_aware_probe.summary}): {message}"
    return result.model_copy(
        update={
            "decision": decision,
            "reason": reason,
            "message": message,
            # What kubectl shows as the break-even is where plain speculation stops paying: the table's origin.
            "break_even": load_aware_probe.plain.break_even,
            "load_aware": load_aware_probe.status(reason, message),
            # The decision took both probes: the plain one's GPU-seconds are part of its cost.
            "gpu_seconds": decision_seconds(load_aware_probe.plain.gpu_seconds, result.gpu_seconds),
        }
    )


def _with_unsupported_note(spec: SpeculativeServerSpec, result: ProbeStatus) -> ProbeStatus:
    """A plain decision whose curve asked for a load-aware probe the engine cannot run: say why in status (loadAware Auto only)."""
    found = load_aware_probe_for(spec, result) if spec.rollout.load_aware == LoadAware.AUTO else None
    if not isinstance(found, str):
        return result
    note = unsupported_note(found, spec.engine)
    return result.model_copy(update={"load_aware": note, "message": f"{result.message or result.reason}; load-aware speculation not tried: {found}"})


def is_promoted(decision: ProbeStatus | None) -> bool:
    return decision is not None and decision.decision == Decision.PROMOTE


def is_rolled_back(decision: ProbeStatus | None) -> bool:
    return decision is not None and decision.decision == Decision.ROLLBACK


def apply_drift(facts: Facts, decision: ProbeStatus | None) -> tuple[ProbeStatus | None, MonitorStatus | None]:
    """While promoted, feed a fresh scrape to the drift rule (monitor.py); a drift turns the decision into a rollback."""
    monitor_spec = facts.spec.monitor
    if is_promoted(decision) and monitor_spec.enabled:
        assert decision is not None
        stored = facts.prev.monitor if facts.prev.phase == Phase.PROMOTED else None
        monitor = stored if stored is not None else MonitorStatus(below_floor_count=0)
        if facts.observed.scrape is None:
            return decision, monitor
        verdict = observe_fleet(
            monitor,
            facts.observed.scrape,
            facts.observed.previous_scrape,
            floor=monitor_spec.accept_length_floor,
            window=monitor_spec.window,
        )
        if not verdict.drifted:
            return decision, verdict.status
        pods = verdict.status.pods or 0
        which = "acceptance length" if pods <= 1 else f"fleet's acceptance length (weighted by verify calls over {pods} pods)"
        message = (
            f"{which} {verdict.status.accept_length} stayed below monitor.acceptLengthFloor {monitor_spec.accept_length_floor} "
            f"for {verdict.status.below_floor_count} consecutive scrapes (promoted at speedup {decision.speedup}); "
            "not promoted again for this revision"
        )
        rollback = decision.model_copy(
            update={"decision": Decision.ROLLBACK.value, "reason": Reason.ACCEPTANCE_DRIFT.value, "message": message, "finished_at": facts.now_s}
        )
        return rollback, verdict.status
    if decision is not None and decision.reason == Reason.ACCEPTANCE_DRIFT:
        return decision, facts.prev.monitor  # the evidence of the drift rollback stays visible
    return decision, None


def never_started(decision: ProbeStatus | None) -> bool:
    """A ProbeFailed rollback before a single round: the speculative server cannot serve at all."""
    return is_rolled_back(decision) and decision is not None and decision.reason == Reason.PROBE_FAILED and not decision.rounds


def _no_drafter_message(algorithm: str) -> str:
    """What drafts when no drafter is read: the target's own MTP layers (NEXTN), or the text so far (NGRAM, SUFFIX)."""
    if algorithm in DRAFTER_FREE_ALGORITHMS:
        return f"{algorithm} drafts from the prompt and the output so far: no drafter model to validate"
    return f"{algorithm} drafts with the target's own layers"
