"""One reconcile step of a SpeculativeServer, as a pure function.

``reconcile(spec, observed, status, now)`` looks at what exists (the five children, their pods, the result of
a probe that just finished, a fresh metrics scrape) and at the stored status, and returns a :class:`Plan`: the
children to create or change, the complete new status, the Events to post, and whether a probe must start (or
stop). The Kopf handlers gather ``observed``, call this, and execute the plan; nothing here talks to anything.

The step is a pipeline of named pure functions (lifecycle.py)::

    facts = gather_facts(...)  ->  settle_validation  ->  settle_decision  ->  apply_drift  ->  plan_replicas
          ->  choose_active  ->  settle_phase  ->  build_conditions / build_status
    events = transition_events(stored status, new status)      (events.py: the only place Events are made)

Restart safety comes from the status: the validation result and every decision are stored with the speculative
revision they are for (``resource.speculative_revision``). A decided revision is never probed again, so a
restarted operator reads its decisions back instead of making them again; a probe that was running when the
operator stopped (phase Probing, no decision for the revision) is simply started again. Events are derived from
the difference between the stored status and the new one, so a restart does not repeat them either.

The lifecycle (docs/operator.md)::

    Pending -> Validating -> Invalid                           (drafter incompatible; base keeps serving)
                          -> Deploying -> Probing -> Promoted   (stable Service -> speculative)
                                                  -> RolledBack (stable Service -> base; reason recorded)
    Promoted -> RolledBack                                      (AcceptanceDrift)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from .. import manifests as m
from ..api import Phase, ProbeStatus, Reason, SpeculativeServerSpec, SpeculativeServerStatus, Variant
from ..resource import speculative_revision
from ..textutil import clip, parse_time
from . import retire
from .diff import merge_patch, needs_apply, owned_by
from .events import transition_events
from .lifecycle import (
    BASE,
    SPECULATIVE,
    Facts,
    Fleet,
    PhaseOutcome,
    apply_drift,
    build_conditions,
    build_status,
    choose_active,
    gather_facts,
    is_invalid,
    is_promoted,
    plan_replicas,
    selects_both,
    settle_decision,
    settle_phase,
    settle_trial,
    settle_validation,
    stored_probe,
)
from .model import Event, Observed, Plan, Settings, status_document
from .pods import ServerState, parse_validator_report, server_state, validation_from_pods

__all__ = [
    "Event",
    "Observed",
    "Plan",
    "ServerState",
    "Settings",
    "merge_patch",
    "needs_apply",
    "owned_by",
    "parse_validator_report",
    "read_status",
    "reconcile",
    "server_state",
    "status_document",
    "transition_events",
    "validation_from_pods",
]

_STATUS_FIELDS = {info.alias or name for name, info in SpeculativeServerStatus.model_fields.items()}


def read_status(stored: SpeculativeServerStatus | Mapping[str, Any] | None) -> SpeculativeServerStatus:
    """The stored status, typed. A section that does not parse (edited by hand) is dropped, the rest is kept:
    losing a stored decision would mean deciding again, so one bad condition must not cost the probe result."""
    if isinstance(stored, SpeculativeServerStatus):
        return stored
    known = {k: v for k, v in (stored or {}).items() if k in _STATUS_FIELDS and v is not None}
    try:
        return SpeculativeServerStatus.model_validate(known)
    except ValidationError:
        readable = {}
        for key, value in known.items():
            try:
                SpeculativeServerStatus.model_validate({key: value})
            except ValidationError:
                continue
            readable[key] = value
        return SpeculativeServerStatus.model_validate(readable)


def _default_render(spec: SpeculativeServerSpec, variant: str, adaptive_config_path: str | None = None, worker: bool = False) -> list[str]:
    from ..sglang import render_argv

    return render_argv(spec, Variant(variant), adaptive_config_path=adaptive_config_path, worker=worker)


def reconcile(
    spec: SpeculativeServerSpec,
    observed: Observed,
    status: SpeculativeServerStatus | Mapping[str, Any] | None,
    now: datetime,
    settings: Settings = Settings(),
    render_argv: Callable[..., list[str]] = _default_render,
    rendered: dict[str, Any] | None = None,
) -> Plan:
    """Compute the next step for one SpeculativeServer (see the module docstring).

    ``rendered``: a dict the caller keeps for this object while its spec (generation) stays the same; the pod
    templates are rendered into it once instead of on every step (they were a third of a step's CPU).
    """
    prev = read_status(status)
    revision = speculative_revision(spec)
    retirement = retire.retiring(spec, observed)
    if retirement is not None:  # resources.nodes changed kind: the lifecycle sees the new kind's pods only
        observed = retire.without_old_pods(observed, retirement)
    trial = settle_trial(
        spec, stored_probe(prev, revision), observed.probe_result if observed.probe_result and observed.probe_result.revision == revision else None
    )
    facts = gather_facts(spec, observed, prev, now, revision, settings, render_argv, rendered if rendered is not None else {}, trial)
    validation = settle_validation(facts)
    decision = settle_decision(facts, validation)
    decision, monitor = apply_drift(facts, decision)
    replicas = plan_replicas(facts, validation, decision)
    active = choose_active(facts, decision, replicas.holding)
    both = selects_both(facts, replicas, decision, validation)
    outcome = walking_back(facts, replicas, decision, settle_phase(facts, validation, decision))
    conditions = build_conditions(facts, validation, decision, replicas, active, outcome, both)
    new_status = build_status(facts, validation, decision, monitor, active, outcome, conditions, replicas)

    desired = desired_children(facts, replicas, active, both)
    delete: list[dict[str, Any]] = []
    if retirement is not None:
        desired, delete, note = retire.adjust(retirement, desired, observed, spec, replicas.state, active)
        new_status = new_status.model_copy(update={"message": clip(f"{note}; {new_status.message or ''}")})
    to_apply = [obj for obj in desired if obj["metadata"]["name"] not in facts.conflicts and needs_apply(obj, _observed_child(facts.observed, obj))]
    probe_running = observed.probe_running
    start_probe = outcome.probing and probe_running != facts.probe_id
    monitor_due, next_scrape_in = _scrape_schedule(facts, new_status)
    workloads = [w.name for w in spec.rollout.workloads]
    return Plan(
        revision=revision,
        apply=to_apply,
        new_status=new_status,
        events=transition_events(
            prev, new_status, name=observed.name, workloads=workloads, probe_starting=start_probe, replicas=spec.replicas, both=both
        ),
        start_probe=start_probe,
        cancel_probe=probe_running is not None
        and (probe_running != facts.probe_id or decision is not None or bool(facts.conflicts) or is_invalid(validation)),
        monitor_due=monitor_due,
        next_scrape_in=next_scrape_in,
        settled=_settled(facts, outcome, to_apply, replicas) and retirement is None,
        # Services before Deployments when one step both re-points an existing Service and changes a Deployment
        # (switch, then scale the loser to 0): traffic must leave a server before it goes away.
        switch_first=any(o["kind"] in ("Deployment", m.LWS_KIND) for o in to_apply)
        and any(o["kind"] == "Service" and o["metadata"]["name"] in observed.services for o in to_apply),
        desired=desired,
        probe_id=facts.probe_id,
        adaptive_probe=trial is not None,
        delete=delete,
    )


def walking_back(facts: Facts, fleet: Fleet, decision: ProbeStatus | None, outcome: PhaseOutcome) -> PhaseOutcome:
    """The phase of an undecided revision while the fleet walks back before the speculative template changes
    (plan_replicas): Deploying, reason WalkingToBase, saying so (the validator and the probe wait for the template)."""
    if not fleet.holding or decision is not None or outcome.phase in (Phase.FAILED, Phase.INVALID):
        return outcome
    state = fleet.state
    message = (
        f"walking back to the base before the speculative pod template changes (revision {facts.revision}): "
        f"{state.base.ready} base and {state.speculative.ready} speculative servers Ready "
        f"(base {fleet[BASE]}, speculative {fleet[SPECULATIVE]} asked); the new revision's canary starts when no "
        "speculative server of the old template is left"
    )
    return PhaseOutcome(Phase.DEPLOYING, Reason.WALKING_TO_BASE, message)


def desired_children(facts: Facts, replicas: Fleet | dict[Variant, int], active: Variant, both: bool = False) -> list[dict[str, Any]]:
    """The five children, Services first (see Plan.switch_first), and during load-aware speculation the adaptive
    table's ConfigMap before them all (the speculative pod mounts it).

    While a fleet walks back before its speculative template changes (Fleet.holding), the speculative server is
    replicas-only (manifests.replicas_only): its count changes, its old template stays."""
    name, namespace, ms = facts.name, facts.observed.namespace, facts.settings.manifests
    holding = isinstance(replicas, Fleet) and replicas.holding
    kind = m.LWS_KIND if facts.leader_worker_sets else "Deployment"
    held = [m.replicas_only(kind, name, namespace, SPECULATIVE.value, replicas[SPECULATIVE])] if holding else []
    if facts.leader_worker_sets:  # multi-node: one LeaderWorkerSet per variant, its Services selecting the leaders
        groups = [m.with_replicas(facts.leader_worker_sets[v], replicas[v]) for v in (BASE, SPECULATIVE) if not (holding and v == SPECULATIVE)]
        leaders = [
            m.service(name, namespace, BASE.value, settings=ms, leaders_only=True),
            m.service(name, namespace, SPECULATIVE.value, settings=ms, leaders_only=True),
            m.service(name, namespace, None, active=active.value, settings=ms, both=both, leaders_only=True),
        ]
        tables = [m.adaptive_config_map(name, namespace, facts.trial.config_json)] if facts.trial is not None else []
        return tables + leaders + groups + held
    deployments = [
        m.deployment(
            name,
            namespace,
            facts.spec,
            variant.value,
            replicas=replicas[variant],
            revision=facts.revision,
            settings=ms,
            template=facts.templates[variant],
        )
        for variant in (BASE, SPECULATIVE)
        if not (holding and variant == SPECULATIVE)
    ]
    services = [
        m.service(name, namespace, BASE.value, settings=ms),
        m.service(name, namespace, SPECULATIVE.value, settings=ms),
        m.service(name, namespace, None, active=active.value, settings=ms, both=both),
    ]
    config_maps = [m.adaptive_config_map(name, namespace, facts.trial.config_json)] if facts.trial is not None else []
    return config_maps + services + deployments + held


def _observed_child(observed: Observed, obj: dict[str, Any]) -> dict[str, Any] | None:
    # A variant's LeaderWorkerSet is observed with the Deployments (one server object per variant name).
    children = {"Deployment": observed.deployments, m.LWS_KIND: observed.deployments, "ConfigMap": observed.config_maps}.get(
        obj["kind"], observed.services
    )
    return children.get(obj["metadata"]["name"])


def _scrape_schedule(facts: Facts, new_status: SpeculativeServerStatus) -> tuple[bool, float | None]:
    """Whether the promoted speculative server is due for a drift scrape now, and in how many seconds otherwise."""
    monitor = facts.spec.monitor
    if not (is_promoted(new_status.probe) and monitor.enabled and new_status.phase == Phase.PROMOTED):
        return False, None
    last = parse_time(new_status.monitor.last_scrape_time if new_status.monitor else None)
    if last is None:
        return True, 0.0
    elapsed = (facts.now - last).total_seconds()
    return elapsed >= monitor.interval, max(0.0, monitor.interval - elapsed)


def _settled(facts: Facts, outcome: PhaseOutcome, to_apply: list[dict[str, Any]], replicas: Fleet) -> bool:
    """Decided, nothing to apply, every server that should run is ready and a fleet's walk has arrived: nothing
    changes with time alone."""
    return (
        outcome.phase in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.INVALID)
        and not outcome.probing
        and not to_apply
        and all(facts.servers[v].ready for v in (BASE, SPECULATIVE) if replicas[v] > 0)
        and (replicas.replicas < 2 or replicas.done)
    )
