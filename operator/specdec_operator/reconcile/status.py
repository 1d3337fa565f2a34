"""The new status: the phase with its reason and message, the probe section, the conditions, the fleet's fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import manifests as m
from .. import rollout
from ..api import (
    ConditionType,
    MonitorStatus,
    Phase,
    ProbeStatus,
    Reason,
    SpeculativeServerStatus,
    ValidationStatus,
    Variant,
)
from ..textutil import clip
from .conditions import Conditions
from .decision import is_invalid, is_promoted, is_rolled_back, never_started
from .facts import BASE, SPECULATIVE, Facts
from .fleet import Fleet, recreates, update_blocked
from .overrides import RETRIED_VALIDATION
from .pods import (
    VALIDATING_MESSAGE,
    error_codes,
    finding_summary,
)

# What one resource's status may weigh, as compact JSON. Every watcher of SpeculativeServers (the operator, kubectl,
# Argo CD) lists all of them, so at 1,000 resources each KiB of status is a MiB per list; the largest status the API
# allows (16 workloads, every section set, messages clipped) stays under it, and what a probe measures round by round
# goes to a child ConfigMap (<name>-probe-evidence) instead. benchmarks/scale.py reports the sizes at 1,000 resources.
STATUS_BYTES_BUDGET = 16 * 1024


@dataclass(frozen=True)
class PhaseOutcome:
    phase: Phase
    reason: str
    message: str
    probing: bool = False  # both servers ready, nothing decided: a probe should be running
    probe_started_at: str | None = None


def settle_phase(facts: Facts, validation: ValidationStatus | None, decision: ProbeStatus | None) -> PhaseOutcome:
    base, speculative = facts.servers[BASE], facts.servers[SPECULATIVE]
    observed = facts.observed
    if facts.conflicts:
        return PhaseOutcome(
            Phase.FAILED,
            Reason.NAME_CONFLICT,
            f"objects not owned by this SpeculativeServer already use its names: {', '.join(facts.conflicts)}; delete or rename them",
        )
    if validation is not None and is_invalid(validation):
        codes = error_codes(validation)
        return PhaseOutcome(
            Phase.INVALID,
            codes[0] if codes else Reason.DRAFTER_INCOMPATIBLE,
            clip(f"{invalid_cause(validation)}; the base server keeps serving"),
        )
    if decision is not None:
        promoted = is_promoted(decision)
        reason = decision.reason or (Reason.SPEEDUP_CONFIRMED if promoted else Reason.INCONCLUSIVE)
        if promoted and not speculative.any_ready and facts.prev.phase != Phase.PROMOTED:
            # Promoted by hand before the speculative server ever served (at creation, or over a rolled-back one whose
            # servers are scaled down): Promoted would claim a server that does not answer yet. Deploying until it
            # does; a promoted server that restarts later stays Promoted (the base answers meanwhile, choose_active).
            return PhaseOutcome(
                Phase.DEPLOYING, reason, clip(f"{decision.message or reason}; waiting for the speculative server: {speculative.message}")
            )
        return PhaseOutcome(Phase.PROMOTED if promoted else Phase.ROLLED_BACK, reason, decision.message or reason)
    if not observed.deployments and not observed.pods:
        return PhaseOutcome(Phase.PENDING, Reason.CREATING, "creating the base and speculative servers")
    if validation is None:
        if speculative.reason in (Reason.LOADING, Reason.READY) or speculative.message == VALIDATING_MESSAGE:
            message = f"{VALIDATING_MESSAGE}; base: {base.message}"
        elif speculative.reason == Reason.VALIDATING:  # the validator cannot start or failed without a verdict yet
            message = f"{speculative.message}; base: {base.message}"
        else:  # the validator has not started: say why (no node with free GPUs, image pull, ...)
            message = f"validating the drafter: speculative pod {speculative.message}; base: {base.message}"
        return PhaseOutcome(Phase.VALIDATING, Reason.VALIDATING, message)
    opening = f"load-aware trial ({facts.load_aware_probe.summary}): " if facts.load_aware_probe is not None else ""
    if not (base.ready and speculative.ready):
        return PhaseOutcome(Phase.DEPLOYING, Reason.LOADING, f"{opening}base: {base.message}; speculative: {speculative.message}")
    # A probe running in this process keeps its start time; a new one (first, or after a restart) starts now.
    stored = facts.prev_probe_for_revision()
    running = observed.probe_running == facts.probe_id
    started = (stored.started_at if stored is not None and running else None) or facts.now_s
    message = f"{opening}measuring the speculative server against the base ({len(facts.spec.rollout.workloads)} workloads) since {started}"
    if observed.probe_progress and running:
        message += f"; {observed.probe_progress}"
    return PhaseOutcome(Phase.PROBING, Reason.PROBING, message, probing=True, probe_started_at=started)


def walking_back(facts: Facts, fleet: Fleet, decision: ProbeStatus | None, outcome: PhaseOutcome) -> PhaseOutcome:
    """The phase of an undecided revision while the fleet walks back before the speculative template changes
    (plan_replicas): Deploying, reason WalkingToBase, saying so (the validator and the probe wait for the template)."""
    if not fleet.holding or outcome.phase in (Phase.FAILED, Phase.INVALID):
        return outcome
    blocked = update_blocked(facts, fleet)
    if blocked is not None:  # fail fast, the cause named; the old server keeps serving and the base may still come
        return PhaseOutcome(Phase.FAILED, Reason.UPDATE_BLOCKED, blocked)  # decided or not (a promotion by hand holds too)
    if decision is not None:
        return outcome
    state = fleet.state
    message = (
        f"walking back to the base before the speculative pod template changes (revision {facts.revision}): "
        f"{state.base.ready} base and {state.speculative.ready} speculative servers Ready "
        f"(base {fleet[BASE]}, speculative {fleet[SPECULATIVE]} asked); the new revision's canary starts when no "
        "speculative server of the old template is left"
    )
    return PhaseOutcome(Phase.DEPLOYING, Reason.WALKING_TO_BASE, message)


def invalid_cause(validation: ValidationStatus) -> str:
    """Why a revision is Invalid, in words that say whose fault it is: the validator could not check the drafter (its
    input could not be read, e.g. an empty model volume; it failed; it ran out of memory), or the drafter was checked and
    found incompatible."""
    errors = [f for f in validation.findings if f.severity == "error"]
    unchecked = [f for f in errors if f.code in RETRIED_VALIDATION]
    if unchecked and len(unchecked) == len(errors):
        first = unchecked[0]
        return f"the drafter could not be validated ({first.code}: {first.message or 'no message'}); fix the cause, then kubectl specdec retry"
    return f"drafter incompatible ({', '.join(f.code for f in errors)})"


def scaled_down_because(facts: Facts, variant: Variant, validation: ValidationStatus | None, decision: ProbeStatus | None, fleet: Fleet) -> str:
    """Why a server that the step scales to 0 (fleet[variant] == 0) is not asked for: the real cause, not a guess."""
    spec = facts.spec
    if spec.replicas == 0:
        return "spec.replicas is 0"
    if variant == SPECULATIVE:
        if is_invalid(validation):
            assert validation is not None
            return invalid_cause(validation)
        if fleet.holding:
            if recreates(facts):
                return (
                    "rollout.updateStrategy Recreate: the old speculative server goes before the new base starts (nothing serves until it is Ready)"
                )
            return "walking back to the base before the speculative pod template changes"
        if decision is None:
            return "rollout.updateStrategy Recreate: the speculative server starts once the base serves" if recreates(facts) else "not asked for yet"
        if never_started(decision):
            return f"it never became ready ({decision.message or decision.reason})"
        if is_rolled_back(decision):
            warm = "; rollout.keepSpeculativeWarm is false" if fleet.replicas < 2 else ""
            return f"rolled back ({decision.reason}){warm}"
        return "the fleet walks to the base"
    if is_promoted(decision):
        if fleet.replicas >= 2:
            return "the fleet walked to the speculative servers (a fleet keeps no warm base: rollout.keepBaseWarm is for one server)"
        return "the speculative server won the comparison and serves; rollout.keepBaseWarm is false"
    return "not asked for in this step"


def probe_status(facts: Facts, decision: ProbeStatus | None, outcome: PhaseOutcome) -> ProbeStatus | None:
    if decision is not None:
        return decision
    if facts.load_aware_probe is not None:  # stored at once: a restarted operator resumes the load-aware probe, not the plain one
        return ProbeStatus(
            revision=facts.revision, started_at=outcome.probe_started_at if outcome.probing else None, load_aware=facts.load_aware_probe.status()
        )
    if outcome.probing:
        return ProbeStatus(revision=facts.revision, started_at=outcome.probe_started_at)
    return facts.prev_probe_for_revision()


def build_conditions(
    facts: Facts,
    validation: ValidationStatus | None,
    decision: ProbeStatus | None,
    fleet: Fleet,
    active: Variant,
    outcome: PhaseOutcome,
    both: bool = False,
) -> Conditions:
    conditions = Conditions(facts.prev.conditions, facts.observed.generation, facts.now_s)
    invalid = is_invalid(validation)
    if validation is None:
        conditions.set(ConditionType.DRAFTER_COMPATIBLE, "Unknown", Reason.VALIDATING, "the validator runs as the speculative pod's init container")
    elif validation.compatible:
        warnings = finding_summary(validation, ("warning",))
        conditions.set(ConditionType.DRAFTER_COMPATIBLE, "True", Reason.COMPATIBLE, f"compatible; warnings: {warnings}" if warnings else "compatible")
    else:
        codes = error_codes(validation)
        conditions.set(
            ConditionType.DRAFTER_COMPATIBLE,
            "False",
            codes[0] if codes else Reason.DRAFTER_INCOMPATIBLE,
            finding_summary(validation, ("error", "warning")),
        )

    for ctype, variant in ((ConditionType.BASE_READY, BASE), (ConditionType.SPECULATIVE_READY, SPECULATIVE)):
        server = facts.servers[variant]
        if fleet[variant] == 0 and not server.ready:
            why = scaled_down_because(facts, variant, validation, decision, fleet)
            conditions.set(ctype, "False", Reason.SCALED_DOWN, clip(f"scaled to 0: {why}"))
        else:
            conditions.set(ctype, "True" if server.ready else "False", server.reason, server.message)

    if decision is not None:
        promoted = is_promoted(decision)
        conditions.set(
            ConditionType.SPEEDUP_VERIFIED,
            "True" if promoted else "False",
            decision.reason or (Reason.SPEEDUP_CONFIRMED if promoted else Reason.INCONCLUSIVE),
            decision.message or "",
        )
    elif invalid:
        conditions.set(ConditionType.SPEEDUP_VERIFIED, "False", Reason.NOT_PROBED, "the drafter is incompatible; nothing to measure")
    elif outcome.probing:
        conditions.set(ConditionType.SPEEDUP_VERIFIED, "Unknown", Reason.PROBING, outcome.message)
    else:
        conditions.set(ConditionType.SPEEDUP_VERIFIED, "Unknown", Reason.WAITING_FOR_SERVERS, "the probe starts when both servers are ready")

    # Ready means traffic sent to the stable Service is answered: the Service exists (it is created beside the
    # steps, so it can trail the servers under load) and the server it selects is ready.
    name = facts.name
    if name not in facts.conflicts and name not in facts.observed.services:
        conditions.set(
            ConditionType.READY, "False", Reason.SERVICE_PENDING, f"stable Service {name} is being created; it will select the {active} server"
        )
    else:
        serving = facts.servers[active].any_ready and name not in facts.conflicts
        detail = "" if serving else f", which is not ready ({facts.servers[active].message})"
        selected = "the servers of both variants while the fleet walks" if both else f"the {active} server"
        conditions.set(
            ConditionType.READY,
            "True" if serving else "False",
            Reason.SERVING if serving else Reason.NO_READY_SERVER,
            f"stable Service {name} selects {selected}{detail}",
        )
    if fleet.walks:
        assert fleet.toward is not None
        progress = rollout.progress(fleet.replicas, fleet.state)
        if fleet.done:
            conditions.set(ConditionType.ROLLED_OUT, "True", Reason.ROLLED_OUT, f"all {fleet.replicas} servers are {fleet.toward} ({progress})")
        else:
            reason = Reason.WALKING_TO_SPECULATIVE if fleet.toward == SPECULATIVE else Reason.WALKING_TO_BASE
            asked = f"base {fleet[BASE]}, speculative {fleet[SPECULATIVE]}"
            why = " before the speculative pod template changes" if fleet.holding else ""
            if fleet.base_rolling:
                why += ", waiting for the base servers' rolling update"
            if fleet.paused:
                reason = Reason.WALK_PAUSED
                why += ", paused by specdec.io/paused (kubectl specdec resume)"
            conditions.set(ConditionType.ROLLED_OUT, "False", reason, f"walking toward {fleet.toward}{why}: {progress} (Deployments at {asked})")
    elif conditions.get(ConditionType.ROLLED_OUT) is not None:
        conditions.remove(ConditionType.ROLLED_OUT)  # a new revision is probed, or the fleet is one server again
    return conditions


def build_status(
    facts: Facts,
    validation: ValidationStatus | None,
    decision: ProbeStatus | None,
    monitor: MonitorStatus | None,
    active: Variant,
    outcome: PhaseOutcome,
    conditions: Conditions,
    fleet: Fleet | None = None,
) -> SpeculativeServerStatus:
    accept = monitor.accept_length if monitor is not None else None
    if accept is None and decision is not None:
        accept = decision.accept_length
    return SpeculativeServerStatus(
        phase=outcome.phase,
        active_variant=active,
        reason=outcome.reason,
        message=clip(outcome.message),
        speedup=decision.speedup if decision is not None else None,
        accept_length=accept,
        observed_generation=facts.observed.generation,
        conditions=conditions.items(),
        validation=validation,
        probe=probe_status(facts, decision, outcome),
        monitor=monitor,
        service_address=_service_address(facts),
        **(_fleet_status(facts, fleet) if fleet is not None else {}),
    )


def _service_address(facts: Facts) -> str | None:
    """Where clients reach the servers, once the stable Service exists."""
    if m.child_name(facts.name, None) not in facts.observed.services:
        return None
    return m.service_address(facts.name, facts.observed.namespace, facts.settings.manifests)


def _fleet_status(facts: Facts, fleet: Fleet) -> dict[str, Any]:
    """The scale subresource's fields and the walk's progress (rollout.status_fields), as model fields."""
    fields = rollout.status_fields(fleet.replicas, fleet.state, m.fleet_selector(facts.name))
    return {
        "replicas": fields["replicas"],
        "ready_replicas": fields["readyReplicas"],
        "speculative_replicas": fields["speculativeReplicas"],
        "rollout_progress": fields["rolloutProgress"],
        "selector": fields["selector"],
    }
