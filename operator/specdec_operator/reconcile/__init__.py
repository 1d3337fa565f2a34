"""One reconcile step of a SpeculativeServer, as a pure function.

``reconcile(spec, observed, status, now)`` looks at what exists (the five children, their pods, the result of
a probe that just finished, a fresh metrics scrape, and why the spec cannot be served: it does not parse, the
cluster lacks the LeaderWorkerSet CRD, the API server refused a request) and at the stored status, and returns
a :class:`Plan`: the children to create or change, the complete new status, the Events to post, and whether a
probe must start (or stop). It is the only code that decides a status. The controller gathers ``observed``,
calls this, and executes the plan; nothing here talks to anything.

The step is a pipeline of named pure functions, one module per concern::

    refused.refusal                          a spec that is not served: phase Failed (refused.py)
    steering.read -> overrides.before_settling     requests made by hand (annotations; overrides.py)
    facts = gather_facts(...)                what exists, the pod templates, each server's state (facts.py)
      -> settle_validation -> settle_decision -> apply_drift                             (decision.py)
      -> overrides.override                  an abort or a promotion by hand replaces the decision
      -> plan_replicas, deadline.waiting_for / waiting_since    the wait and its deadline (deadline.py:
                                             past it the speculative side is rolled back, the fleet replanned)
      -> choose_active, route_both                                              (fleet.py: fleet routing)
      -> settle_phase -> walking_back (-> deadline.base_expired) -> build_conditions / build_status
         with gpu_status and overrides.steering_status                               (status.py, gpus.py)
      -> desired_children                                                                  (children.py)
    events = transition_events(stored status, new status)      (events.py: the only place Events are made)
    capture.finish                           spec.retraining.capture's status, Events and deletions (capture.py)
    training.finish                          spec.retraining.training: the training Job to start, its status and Events
                                             (training.py: retrain.decide_retrain, trainjob.training_job, retrain_progress)

A spec that names more than spec.drafter is a race (candidate_race.py): the same pipeline runs for one candidate at a
time in spec.drafter's place, and the race records each candidate's decision in status.candidates, chooses the next
candidate or the winner, and adds its Events (CandidateMeasured, RaceWon, RaceQueued) to the pipeline's.

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

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from .. import manifests as m
from .. import steering
from ..api import (
    Phase,
    ProbeStatus,
    Reason,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
    ValidationStatus,
    Variant,
    names_more_than_the_drafter,
)
from ..errors import InputError
from ..resource import speculative_revision
from ..textutil import clip, parse_time
from . import candidate_race, capture, deadline, overrides, refused, retire, revision, training
from .children import desired_children, observed_child
from .decision import apply_drift, is_invalid, is_promoted, settle_decision, settle_validation
from .diff import merge_patch, needs_apply, owned_by
from .events import transition_events
from .facts import BASE, SPECULATIVE, Facts, gather_facts, settle_load_aware_probe, stored_probe
from .fleet import Fleet, choose_active, plan_replicas, route_both
from .gpus import gpu_status
from .model import ApiRefusal, Event, Observed, Plan, ProbeAction, Settings, StartProbe, StopProbe, status_document
from .pods import ServerState, parse_validator_report, server_state, validation_from_pods
from .status import PhaseOutcome, build_conditions, build_status, settle_phase, walking_back

__all__ = [
    "ApiRefusal",
    "Event",
    "Observed",
    "Plan",
    "ProbeAction",
    "ServerState",
    "Settings",
    "StartProbe",
    "StopProbe",
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


def _default_render(
    spec: SpeculativeServerSpec, variant: Variant, adaptive_config_path: str | None = None, adaptive_config: str | None = None, worker: bool = False
) -> list[str]:
    """The command line of spec.engine's server (engines/)."""
    from ..engines import engine_for

    return engine_for(spec).render_argv(spec, variant, adaptive_config_path=adaptive_config_path, adaptive_config=adaptive_config, worker=worker)


def reconcile(
    spec: SpeculativeServerSpec | None,
    observed: Observed,
    status: SpeculativeServerStatus | Mapping[str, Any] | None,
    now: datetime,
    settings: Settings = Settings(),
    render_argv: Callable[..., list[str]] = _default_render,
    rendered: Mapping[str, Any] | None = None,
) -> Plan:
    """Compute the next step for one SpeculativeServer (see the module docstring).

    ``spec``: None when it did not parse (``observed.spec_error`` says why) or is not known (``observed.api_refusal``:
    a refused request reported from outside a step). ``rendered``: ``Plan.rendered`` of an earlier step of the same
    generation; its pod templates are reused instead of rendered again.
    """
    prev = read_status(status)
    if observed.api_refusal is not None:
        return refused.api_refused_plan(prev, observed, now, observed.api_refusal)
    refusal = refused.refusal(spec, observed)
    if refusal is not None:
        return refused.refused_plan(prev, observed, now, *refusal)
    if spec is None:
        raise ValueError("reconcile: no spec, and observed says no reason (spec_error)")
    user_spec = spec
    # spec.retraining: the trained revision that serves in spec.drafter's place, and one racing as a candidate (revision.py).
    spec = revision.effective_spec(spec, prev, observed.name)
    try:
        if names_more_than_the_drafter(spec):  # a race of candidates, each run by the same lifecycle in turn

            def lifecycle(candidate: SpeculativeServerSpec, seen: Observed, told: SpeculativeServerStatus, cached: Mapping[str, Any]) -> Plan:
                return _serve(candidate, seen, told, now, settings, render_argv, cached, gpu_pods=observed.pods)

            limit = settings.max_concurrent_races
            plan = candidate_race.run(
                spec, observed, prev, rendered or {}, lifecycle, queue_full=limit is not None and observed.races_elsewhere >= limit
            )
        else:
            plan = _serve(spec, observed, prev, now, settings, render_argv, rendered or {})
        # spec.retraining.capture: status.retraining.capture, its Events, what turning it off deletes (capture.py).
        plan = capture.finish(plan, user_spec, observed, prev)
        # spec.retraining.training: the training Job to start, status.retraining.training, the revisions and their Events
        # (training.py, revision.py).
        return training.finish(plan, user_spec, observed, prev, now, settings)
    except InputError as exc:  # e.g. an sglangVersion the command-line renderer does not know
        return refused.refused_plan(prev, observed, now, Reason.INVALID_SPEC, str(exc))


def _serve(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    now: datetime,
    settings: Settings,
    render_argv: Callable[..., list[str]],
    rendered: Mapping[str, Any],
    gpu_pods: list[dict[str, Any]] | None = None,
) -> Plan:
    """The one-drafter lifecycle (the module docstring's pipeline). ``gpu_pods``: the pods whose GPUs status.gpus counts,
    when the lifecycle sees fewer (a race's candidate sees only its own revision's speculative pods)."""
    revision = speculative_revision(spec)
    stored = prev
    asked = steering.read(observed.annotations, prev.steering.retried if prev.steering is not None else None)
    prev = overrides.before_settling(prev, asked, revision)
    retirement = retire.retiring(spec, observed)
    pods = observed.pods if gpu_pods is None else gpu_pods  # status.gpus counts every pod that holds GPUs, the retiring kind's too
    if retirement is not None:  # resources.nodes changed kind: the lifecycle sees the new kind's pods only
        observed = retire.without_old_pods(observed, retirement)
    load_aware_probe = settle_load_aware_probe(
        spec, stored_probe(prev, revision), observed.probe_result if observed.probe_result and observed.probe_result.revision == revision else None
    )
    facts = gather_facts(spec, observed, prev, now, revision, settings, render_argv, rendered, load_aware_probe)
    facts = dataclasses.replace(facts, steering=asked)
    validation = settle_validation(facts)
    decision = settle_decision(facts, validation)
    decision, monitor = apply_drift(facts, decision)
    decision = overrides.override(decision, asked, revision, facts.now_s, is_invalid(validation))
    decision, fleet, wait, since = _within_deadline(facts, stored, validation, decision)
    active = choose_active(facts, decision, fleet.holding)
    both = route_both(facts, fleet, decision, validation)
    outcome = walking_back(facts, fleet, decision, settle_phase(facts, validation, decision))
    if wait is not None and since is not None and wait.side == Variant.BASE and deadline.passed(since, now, spec.progress_deadline_seconds):
        outcome = deadline.base_expired(facts, wait, since, outcome)
    conditions = build_conditions(facts, validation, decision, fleet, active, outcome, both)
    new_status = build_status(facts, validation, decision, monitor, active, outcome, conditions, fleet)
    serving = {Variant.BASE, Variant.SPECULATIVE} if both else {active}
    new_status = new_status.model_copy(
        update={
            "gpus": gpu_status(pods, serving, outcome.probing),
            "steering": overrides.steering_status(stored, asked, decision, fleet.walks),
            "waiting_for": wait.what if wait is not None else None,
            "waiting_since": since,
        }
    )

    desired = desired_children(facts, fleet, active, both)
    delete: list[dict[str, Any]] = []
    if retirement is not None:
        desired, delete, note = retire.adjust(retirement, desired, observed, spec, fleet.state, active)
        new_status = new_status.model_copy(update={"message": clip(f"{note}; {new_status.message or ''}")})
    to_apply = [obj for obj in desired if obj["metadata"]["name"] not in facts.conflicts and needs_apply(obj, observed_child(facts.observed, obj))]
    probe = _probe_action(facts, outcome, decision, validation, new_status)
    monitor_due, next_scrape_in = _scrape_schedule(facts, new_status)
    workloads = [w.name for w in spec.rollout.workloads]
    return Plan(
        revision=revision,
        apply=to_apply,
        new_status=new_status,
        events=transition_events(
            stored,
            new_status,
            name=observed.name,
            workloads=workloads,
            probe_starting=isinstance(probe, StartProbe),
            replicas=spec.replicas,
            both=both,
        ),
        probe=probe,
        monitor_due=monitor_due,
        next_scrape_in=next_scrape_in,
        settled=_settled(facts, outcome, to_apply, fleet) and retirement is None,
        # Services before Deployments when one step both re-points an existing Service and changes a Deployment
        # (switch, then scale the loser to 0): traffic must leave a server before it goes away.
        switch_first=any(o["kind"] in ("Deployment", m.LWS_KIND) for o in to_apply)
        and any(o["kind"] == "Service" and o["metadata"]["name"] in observed.services for o in to_apply),
        delete=delete,
        rendered=facts.rendered,
    )


def _within_deadline(
    facts: Facts, stored: SpeculativeServerStatus, validation: ValidationStatus | None, decision: ProbeStatus | None
) -> tuple[ProbeStatus | None, Fleet, deadline.Wait | None, str | None]:
    """The fleet for ``decision``, what the step waits for and since when; a speculative side that waited past
    spec.progressDeadlineSeconds is given up for the revision (deadline.py), and the fleet follows that."""
    fleet = plan_replicas(facts, validation, decision)
    wait = deadline.waiting_for(facts, validation, decision, fleet)
    since = deadline.waiting_since(stored, wait, facts.now_s)
    expired = wait is not None and since is not None and deadline.passed(since, facts.now, facts.spec.progress_deadline_seconds)
    if expired and wait is not None and since is not None and wait.side == Variant.SPECULATIVE and (decision is None or is_promoted(decision)):
        decision = deadline.speculative_expired(facts, wait, since)
        fleet = plan_replicas(facts, validation, decision)
        wait = deadline.waiting_for(facts, validation, decision, fleet)
        since = deadline.waiting_since(stored, wait, facts.now_s)
    return decision, fleet, wait, since


def _probe_action(
    facts: Facts, outcome: PhaseOutcome, decision: ProbeStatus | None, validation: ValidationStatus | None, new_status: SpeculativeServerStatus
) -> ProbeAction | None:
    """Start a probe when both servers are ready and this step's probe is not the one running; stop the running one
    when it measures something else, or a decision, a name conflict or an incompatible drafter ends it."""
    running = facts.observed.probe_running
    if outcome.probing and running != facts.probe_id:
        load_aware = new_status.probe.load_aware if facts.load_aware_probe is not None and new_status.probe is not None else None
        return StartProbe(facts.probe_id, facts.revision, load_aware)
    if running is not None and (running != facts.probe_id or decision is not None or bool(facts.conflicts) or is_invalid(validation)):
        return StopProbe()
    return None


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


def _settled(facts: Facts, outcome: PhaseOutcome, to_apply: list[dict[str, Any]], fleet: Fleet) -> bool:
    """Decided, nothing to apply, every server that should run is ready and a fleet's walk has arrived: nothing
    changes with time alone."""
    return (
        outcome.phase in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.INVALID)
        and not outcome.probing
        and not to_apply
        and all(facts.servers[v].ready for v in (BASE, SPECULATIVE) if fleet[v] > 0)
        and (fleet.replicas < 2 or fleet.done)
    )
