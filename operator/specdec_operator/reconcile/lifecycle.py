"""The lifecycle as a pipeline of pure steps over what one step knows (``Facts``).

Each step answers one question and returns a typed answer; ``reconcile`` (``__init__.py``) runs them in order:

    settle_trial       is a load-aware trial on? (plain probe won at low load, lost at high; loadaware.py)
    gather_facts       what exists: desired pod templates, each server's state, names taken by others
    settle_validation  is the drafter compatible with the target? (stored, read from the validator, or unknown)
    settle_decision    what was decided for this revision? (stored, just measured, or forced by a crash loop)
    apply_drift        does the drift monitor undo a promotion? (only while promoted)
    plan_replicas      how many replicas each server gets
    choose_active      which server the stable Service selects
    settle_phase       the phase, its reason and message, whether a probe should run
    build_status       conditions and the complete new status
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import manifests as m
from .. import rollout
from ..api import (
    ConditionType,
    Decision,
    Finding,
    LoadAware,
    MonitorStatus,
    Phase,
    ProbeStatus,
    Reason,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
    ValidationStatus,
    Variant,
)
from ..loadaware import Trial, never_slower, trial_for, unsupported_note
from ..monitor import observe_fleet
from ..textutil import clip, rfc3339
from .conditions import Conditions
from .diff import labels_of, owned_by, template_differs
from .model import Observed, Settings
from .pods import (
    VALIDATING_MESSAGE,
    ServerState,
    error_codes,
    finding_summary,
    group_state,
    is_ready,
    live,
    pods_of,
    server_state,
    validation_from_pods,
)

BASE, SPECULATIVE = Variant.BASE, Variant.SPECULATIVE


@dataclass(frozen=True)
class Facts:
    """What one step knows before it decides anything."""

    spec: SpeculativeServerSpec
    observed: Observed
    prev: SpeculativeServerStatus  # the stored status
    now: datetime
    revision: str  # resource.speculative_revision(spec)
    settings: Settings
    templates: dict[Variant, dict[str, Any]]  # the pod template of each server, rendered for this generation
    servers: dict[Variant, ServerState]
    conflicts: list[str]  # names of children that objects not owned by this resource already use
    trial: Trial | None = None  # a load-aware trial: the speculative server runs SGLang's adaptive speculation
    # Multi-node servers (resources.nodes > 1): each variant's LeaderWorkerSet, rendered with 0 replicas (the
    # count is set per step); its leader template is the one in `templates` (the leader serves, and says if its
    # group is Ready).
    leader_worker_sets: dict[Variant, dict[str, Any]] = field(default_factory=dict)

    @property
    def probe_id(self) -> str:
        """What the probe of this step measures: the revision, or the revision's adaptive server (its table's hash)."""
        return self.revision if self.trial is None else f"{self.revision}/adaptive-{self.trial.config_hash}"

    @property
    def now_s(self) -> str:
        return rfc3339(self.now)

    @property
    def name(self) -> str:
        return self.observed.name

    def prev_probe_for_revision(self) -> ProbeStatus | None:
        return stored_probe(self.prev, self.revision)


@dataclass(frozen=True)
class PhaseOutcome:
    phase: Phase
    reason: str
    message: str
    probing: bool = False  # both servers ready, nothing decided: a probe should be running
    probe_started_at: str | None = None


def stored_probe(prev: SpeculativeServerStatus, revision: str) -> ProbeStatus | None:
    probe = prev.probe
    return probe if probe is not None and probe.revision == revision else None


def settle_trial(spec: SpeculativeServerSpec, stored: ProbeStatus | None, result: ProbeStatus | None) -> Trial | None:
    """The load-aware trial in force for this revision, if any (loadaware.trial_for says when there is one).

    It comes from the plain probe: the one stored with a trial already under way (or decided), a plain decision
    stored earlier (loadAware turned on after it), or the plain result that just arrived.
    """
    if spec.rollout.load_aware == LoadAware.OFF:
        return None
    if stored is not None and stored.load_aware is not None and stored.load_aware.plain_probe is not None:
        plain: ProbeStatus | None = ProbeStatus.model_validate(stored.load_aware.plain_probe.model_dump())
    elif stored is not None and stored.decision:
        plain = stored
    elif result is not None and result.decision and result.load_aware is None:
        plain = result
    else:
        plain = None
    found = trial_for(spec, plain) if plain is not None else None
    return found if isinstance(found, Trial) else None


RenderArgv = Callable[..., list[str]]  # (spec, variant, adaptive_config_path=None, worker=False) -> the server's command line


def gather_facts(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    now: datetime,
    revision: str,
    settings: Settings,
    render_argv: RenderArgv,
    rendered: dict[str, Any],
    trial: Trial | None = None,
) -> Facts:
    templates = {}
    groups: dict[Variant, dict[str, Any]] = {}
    for variant in (BASE, SPECULATIVE):
        adaptive = trial is not None and variant == SPECULATIVE
        key = f"{variant.value}/adaptive-{trial.config_hash}" if adaptive and trial is not None else variant.value
        if m.multi_node(spec):
            key += "/lws"
            if key not in rendered:
                extra = {"adaptive_config_path": m.ADAPTIVE_CONFIG_PATH} if adaptive else {}
                rendered[key] = m.leader_worker_set(
                    observed.name,
                    observed.namespace,
                    spec,
                    variant.value,
                    leader_command=render_argv(spec, variant.value, **extra),
                    worker_command=render_argv(spec, variant.value, worker=True, **extra),
                    replicas=0,
                    revision=revision,
                    settings=settings.manifests,
                    adaptive_config_hash=trial.config_hash if adaptive and trial is not None else None,
                )
            groups[variant] = rendered[key]
            templates[variant] = m.leader_template(rendered[key])
            continue
        if key not in rendered:
            argv = render_argv(spec, variant.value, adaptive_config_path=m.ADAPTIVE_CONFIG_PATH) if adaptive else render_argv(spec, variant.value)
            rendered[key] = m.pod_template(
                observed.name,
                spec,
                variant.value,
                argv,
                revision,
                settings.manifests,
                adaptive_config_hash=trial.config_hash if adaptive and trial is not None else None,
            )
        templates[variant] = rendered[key]
    servers = {
        variant: server_state(serving_pods(observed.pods, variant), templates[variant]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH])
        for variant in (BASE, SPECULATIVE)
    }
    children = {**observed.deployments, **observed.services}
    children.update(observed.config_maps)
    own_names = (m.child_name(observed.name, BASE.value), m.child_name(observed.name, SPECULATIVE.value), observed.name) + (
        (m.adaptive_config_map_name(observed.name),) if trial is not None else ()
    )
    conflicts = sorted(n for n in own_names if n in children and not owned_by(children[n], observed.uid))
    return Facts(spec, observed, prev, now, revision, settings, templates, servers, conflicts, trial, groups)


def serving_pods(pods: list[dict[str, Any]], variant: Variant) -> list[dict[str, Any]]:
    """A variant's pods that serve: all of them, or of multi-node groups the leaders (a group is Ready when its leader is)."""
    return [p for p in pods_of(pods, variant) if labels_of(p).get(m.LABEL_ROLE) != m.ROLE_WORKER]


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
            findings=[Finding(severity="info", code=Reason.NO_SEPARATE_DRAFTER, message=f"{drafter.algorithm} drafts with the target's own layers")],
        )
    return validation_from_pods(facts.observed.pods, facts.revision)


def is_invalid(validation: ValidationStatus | None) -> bool:
    return validation is not None and validation.compatible is False


def settle_decision(facts: Facts, validation: ValidationStatus | None) -> ProbeStatus | None:
    """The decision for this revision: stored, just measured by the probe, or forced by a crash-looping server."""
    stored = facts.prev_probe_for_revision()
    if facts.trial is None and stored is not None and stored.load_aware is not None and stored.load_aware.plain_probe is not None:
        # loadAware turned Off (or SGLang can no longer run it for this spec): the plain probe's decision is in force.
        return ProbeStatus.model_validate(stored.load_aware.plain_probe.model_dump())
    # A stored decision stands; a plain one stored before loadAware was turned on gives way to the trial it asks for.
    if (
        stored is not None
        and stored.decision
        and (facts.trial is None or (stored.load_aware is not None and stored.load_aware.plain_probe is not None))
    ):
        return stored
    if is_invalid(validation) or facts.conflicts:
        return None
    result = facts.observed.probe_result
    if result is not None and result.revision == facts.revision and result.decision:
        result = result.model_copy(
            update={
                "finished_at": result.finished_at or facts.now_s,
                "started_at": result.started_at or (stored.started_at if stored is not None else None),
            }
        )
        adaptive = result.load_aware is not None
        if facts.trial is not None:
            # The plain result that opened the trial decides nothing: the adaptive server is measured next.
            return _adaptive_decision(facts, facts.trial, result) if adaptive else None
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


def _adaptive_decision(facts: Facts, trial: Trial, result: ProbeStatus) -> ProbeStatus:
    """The decision on the adaptive server's probe: never slower than the base, faster somewhere (loadaware.never_slower)."""
    if result.reason == Reason.PROBE_FAILED:
        decision, reason, message = Decision.ROLLBACK, Reason.PROBE_FAILED, result.message or "the adaptive server could not be measured"
    else:
        decision, reason, message = never_slower(result, facts.spec.rollout.min_speedup)
    message = f"load-aware ({trial.summary}): {message}"
    return result.model_copy(
        update={
            "decision": decision,
            "reason": reason,
            "message": message,
            # What kubectl shows as the break-even is where plain speculation stops paying: the table's origin.
            "break_even": trial.plain.break_even,
            "load_aware": trial.status(reason, message),
        }
    )


def _with_unsupported_note(spec: SpeculativeServerSpec, result: ProbeStatus) -> ProbeStatus:
    """A plain decision whose curve asked for a trial SGLang cannot run: say why in status (loadAware Auto only)."""
    found = trial_for(spec, result) if spec.rollout.load_aware == LoadAware.AUTO else None
    if not isinstance(found, str):
        return result
    note = unsupported_note(found)
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


@dataclass(frozen=True)
class Fleet:
    """How many servers each variant gets (plan_replicas): the walk's goal, what the API server shows, the next step."""

    replicas: int  # spec.replicas
    goal: rollout.Counts
    state: rollout.FleetState
    counts: dict[Variant, int]  # the next spec.replicas of each Deployment
    toward: Variant | None = None  # the variant a decided fleet walks to (None before a decision)
    # Walking back to the base before the speculative template changes (old_speculative_servers): the speculative
    # server keeps its old template (a replicas-only write) until this walk has finished.
    holding: bool = False

    def __getitem__(self, variant: Variant) -> int:
        return self.counts[variant]

    @property
    def done(self) -> bool:
        """Arrived: the Deployments ask for the goal, every server of it is Ready and no other pod is left."""
        return rollout.walk_done(self.goal, self.state)

    @property
    def walks(self) -> bool:
        """A fleet (2 or more servers) that walks from one variant to the other after a decision."""
        return self.replicas >= 2 and self.toward is not None


def fleet_state(facts: Facts) -> rollout.FleetState:
    """What the API server shows of each variant: the Deployment's spec.replicas, its pods (terminating ones included:
    they hold their GPUs until they are gone), the Ready ones."""
    variants = {}
    for variant in (BASE, SPECULATIVE):
        deployment = facts.observed.deployments.get(m.child_name(facts.name, variant.value))
        desired = 0
        if deployment is not None and owned_by(deployment, facts.observed.uid):
            asked = (deployment.get("spec") or {}).get("replicas")
            desired = 1 if asked is None else int(asked)
        if facts.leader_worker_sets:  # multi-node: groups, counted by their leaders, by group index
            variants[variant] = group_state(desired, facts.observed.pods, variant)
            continue
        pods = [p for p in facts.observed.pods if labels_of(p).get(m.LABEL_VARIANT) == variant.value]
        terminating = sum(1 for p in pods if (p.get("metadata") or {}).get("deletionTimestamp"))
        ready = sum(1 for p in live(pods) if is_ready(p))
        variants[variant] = rollout.VariantState(desired=desired, pods=len(pods), ready=ready, terminating=terminating)
    return rollout.FleetState(base=variants[BASE], speculative=variants[SPECULATIVE])


def old_speculative_servers(facts: Facts) -> int:
    """Servers the speculative Deployment (or LeaderWorkerSet) asks for on a pod template older than this step's.

    Changing the template of a server that serves would replace its pods at once (a Deployment's Recreate), so
    while this is more than 0 and the base alone cannot serve, the fleet first walks back to the base
    (plan_replicas) and the template waits.
    0 when the speculative server does not exist, is not ours, is of the other kind (resources.nodes changed:
    the other kind's servers are replaced beside, see retiring_servers) or already runs this step's template.
    """
    server = facts.observed.deployments.get(m.child_name(facts.name, SPECULATIVE.value))
    if server is None or not owned_by(server, facts.observed.uid):
        return 0
    if facts.leader_worker_sets:
        desired: dict[str, Any] = facts.leader_worker_sets[SPECULATIVE]
    else:
        desired = {"kind": "Deployment", "spec": {"template": facts.templates[SPECULATIVE]}}
    if server.get("kind", desired["kind"]) != desired["kind"] or not template_differs(desired, server):
        return 0
    asked = (server.get("spec") or {}).get("replicas")
    return 1 if asked is None else int(asked)


def _walked_back_one_server(facts: Facts) -> bool:
    """A one-server resource may change its speculative template once the base serves and the stable Service
    selects it (observed): the old speculative server answered until then."""
    stable = facts.observed.services.get(facts.name)
    return facts.servers[BASE].ready and stable is not None and not m.selects_both(stable) and m.service_variant(stable) == BASE.value


def plan_replicas(facts: Facts, validation: ValidationStatus | None, decision: ProbeStatus | None) -> Fleet:
    """The next spec.replicas of the two Deployments.

    One server (spec.replicas 1): a base and a speculative server while undecided, the loser scaled to 0 once the
    winner serves (unless rollout.keepBaseWarm). A fleet: one step of rollout.plan_step toward the goal (the canary
    while undecided, every server on the winner after the decision), within rollout.maxSurge/maxUnavailable.

    Before the speculative pod template changes (a new drafter, any field the speculative pod is made of) while
    old speculative servers run and the Ready base servers alone are fewer than max(1, N - maxUnavailable), the
    fleet walks back to the base first (the walk of a rollback, within maxSurge/maxUnavailable) and the
    speculative servers keep their old template until the base servers keep that floor; then the template changes
    (its Recreate replaces what is left of the old servers) and gets its canary (or, for a decided revision, its
    walk) as usual. A one-server resource keeps its
    old speculative server until its base serves and the stable Service selects the base.
    """
    n = facts.spec.replicas
    state = fleet_state(facts)
    broken = is_invalid(validation) or never_started(decision)
    toward = None if decision is None and not broken else (SPECULATIVE if is_promoted(decision) and not broken else BASE)
    old = old_speculative_servers(facts)
    if n == 1 and old and not _walked_back_one_server(facts):
        held = rollout.Counts(base=1, speculative=old)
        return Fleet(n, held, state, {BASE: 1, SPECULATIVE: old}, None, holding=True)
    ro = facts.spec.rollout
    if n >= 2 and old and state.base.ready < max(1, rollout.floor(n, ro.max_unavailable)):
        # The old speculative servers may all go at once (the template change) only when the Ready base servers
        # alone keep the floor: a canary beside N - 1 base servers is replaced at once, a walked fleet walks back.
        after = rollout.canary_goal(n, ro.max_surge) if toward is None else rollout.walk_goal(n, toward)
        # The walk back ends at the base servers the next goal keeps, and never below the floor of Ready servers.
        back = rollout.Counts(base=max(after.base, rollout.floor(n, ro.max_unavailable), 1), speculative=0)
        counts = rollout.plan_step(back, state, replicas=n, max_surge=ro.max_surge, max_unavailable=ro.max_unavailable)
        return Fleet(n, back, state, {BASE: counts.base, SPECULATIVE: counts.speculative}, BASE, holding=True)
    if n == 1:
        replicas = {BASE: 1, SPECULATIVE: 1}
        if broken:
            replicas[SPECULATIVE] = 0  # an incompatible or broken speculative server does not hold GPUs
        if decision is not None and not facts.spec.rollout.keep_base_warm:
            # The loser is scaled to 0 only once the winner serves, so traffic never lands on nothing.
            if is_promoted(decision) and facts.servers[SPECULATIVE].any_ready:
                replicas[BASE] = 0
            if is_rolled_back(decision) and facts.servers[BASE].any_ready:
                replicas[SPECULATIVE] = 0
        goal = rollout.Counts(base=replicas[BASE], speculative=replicas[SPECULATIVE])
        return Fleet(n, goal, state, replicas, toward)
    ro = facts.spec.rollout
    # A fleet walks to the winner whatever rollout.keepBaseWarm says: a warm loser beside it would be a second
    # fleet, beyond rollout.maxSurge (docs/operator.md).
    goal = rollout.canary_goal(n, ro.max_surge) if toward is None else rollout.walk_goal(n, toward)
    counts = rollout.plan_step(goal, state, replicas=n, max_surge=ro.max_surge, max_unavailable=ro.max_unavailable)
    return Fleet(n, goal, state, {BASE: counts.base, SPECULATIVE: counts.speculative}, toward)


def choose_active(facts: Facts, decision: ProbeStatus | None, holding: bool = False) -> Variant:
    """The server the stable Service selects: the decided one, unless it cannot answer and the other can.

    holding: the speculative servers keep an old template until the fleet has walked back (plan_replicas): the
    base, as soon as it serves on its current template (an older one is being replaced too)."""
    desired = SPECULATIVE if is_promoted(decision) and not (holding and facts.servers[BASE].ready) else BASE
    if facts.servers[desired].any_ready:
        return desired
    stable = facts.observed.services.get(facts.name)
    current = m.service_variant(stable) if stable else None
    if stable is not None and m.selects_both(stable):
        current = SPECULATIVE.value  # a fleet walking back: its speculative servers answer until the base serves
    # Never route to nothing while the other server can answer (both give the same answers):
    if desired == SPECULATIVE and facts.servers[BASE].any_ready:
        return BASE  # the promoted server is restarting: the base answers meanwhile
    if current == SPECULATIVE.value and facts.servers[SPECULATIVE].any_ready:
        return SPECULATIVE  # a rollback to a cold base waits until the base serves
    return desired


def selects_both(facts: Facts, fleet: Fleet, decision: ProbeStatus | None, validation: ValidationStatus | None = None) -> bool:
    """Whether the stable Service selects both variants: a fleet whose servers of both variants may serve.

    While a fleet's canary is probed, the canary serves its share of live traffic beside the base servers, so that
    the probe compares two servers under the same live load (docs/operator.md, "The canary": a comparison base
    server that serves live traffic against a canary that does not makes the drafter look faster than it is).
    After a promotion, and walking back from one (AcceptanceDrift), the servers of the walk. Never a speculative
    server that is not Ready on the current template, nor one rolled back without having served (Invalid,
    ProbeFailed, a lost comparison), nor a one-server resource's (it keeps today's switch).
    """
    if fleet.replicas < 2 or facts.conflicts or is_invalid(validation):
        return False
    if fleet.holding:  # walking back before the speculative template changes: its old servers answer meanwhile
        return facts.servers[BASE].any_ready and facts.servers[SPECULATIVE].any_ready
    if decision is None:
        return facts.servers[SPECULATIVE].ready and facts.servers[BASE].any_ready
    if not fleet.walks or fleet.done:
        return False
    served = is_promoted(decision) or decision.reason == Reason.ACCEPTANCE_DRIFT
    if not served:
        stable = facts.observed.services.get(facts.name)
        served = stable is not None and (m.selects_both(stable) or m.service_variant(stable) == SPECULATIVE.value)
        # ... unless the speculative servers were only ever the canary: a decision against them takes them out at once.
        served = served and fleet.state.speculative.desired > 1
    return served and facts.servers[BASE].any_ready and facts.servers[SPECULATIVE].any_ready


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
            f"drafter incompatible ({', '.join(codes)}); the base server keeps serving",
        )
    if decision is not None:
        promoted = is_promoted(decision)
        reason = decision.reason or (Reason.SPEEDUP_CONFIRMED if promoted else Reason.INCONCLUSIVE)
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
    trial = f"load-aware trial ({facts.trial.summary}): " if facts.trial is not None else ""
    if not (base.ready and speculative.ready):
        return PhaseOutcome(Phase.DEPLOYING, Reason.LOADING, f"{trial}base: {base.message}; speculative: {speculative.message}")
    # A probe running in this process keeps its start time; a new one (first, or after a restart) starts now.
    stored = facts.prev_probe_for_revision()
    running = observed.probe_running == facts.probe_id
    started = (stored.started_at if stored is not None and running else None) or facts.now_s
    message = f"{trial}measuring the speculative server against the base ({len(facts.spec.rollout.workloads)} workloads) since {started}"
    if observed.probe_progress and running:
        message += f"; {observed.probe_progress}"
    return PhaseOutcome(Phase.PROBING, Reason.PROBING, message, probing=True, probe_started_at=started)


def probe_status(facts: Facts, decision: ProbeStatus | None, outcome: PhaseOutcome) -> ProbeStatus | None:
    if decision is not None:
        return decision
    if facts.trial is not None:  # stored at once: a restarted operator resumes the trial, not the plain probe
        return ProbeStatus(revision=facts.revision, started_at=outcome.probe_started_at if outcome.probing else None, load_aware=facts.trial.status())
    if outcome.probing:
        return ProbeStatus(revision=facts.revision, started_at=outcome.probe_started_at)
    return facts.prev_probe_for_revision()


def build_conditions(
    facts: Facts,
    validation: ValidationStatus | None,
    decision: ProbeStatus | None,
    replicas: Fleet,
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
        if replicas[variant] == 0 and not server.ready:
            why = "drafter incompatible" if variant == SPECULATIVE and invalid else "it lost the comparison and rollout.keepBaseWarm is false"
            if variant == SPECULATIVE and not invalid and never_started(decision):
                why = "it never became ready"
            conditions.set(ctype, "False", Reason.SCALED_DOWN, f"scaled to 0: {why}")
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
            ConditionType.READY, "False", Reason.SERVICE_PENDING, f"stable Service {name} is being created; it will select the {active.value} server"
        )
    else:
        serving = facts.servers[active].any_ready and name not in facts.conflicts
        detail = "" if serving else f", which is not ready ({facts.servers[active].message})"
        selected = "the servers of both variants while the fleet walks" if both else f"the {active.value} server"
        conditions.set(
            ConditionType.READY,
            "True" if serving else "False",
            Reason.SERVING if serving else Reason.NO_READY_SERVER,
            f"stable Service {name} selects {selected}{detail}",
        )
    if replicas.walks:
        assert replicas.toward is not None
        progress = rollout.progress(replicas.replicas, replicas.state)
        if replicas.done:
            conditions.set(
                ConditionType.ROLLED_OUT, "True", Reason.ROLLED_OUT, f"all {replicas.replicas} servers are {replicas.toward.value} ({progress})"
            )
        else:
            reason = Reason.WALKING_TO_SPECULATIVE if replicas.toward == SPECULATIVE else Reason.WALKING_TO_BASE
            asked = f"base {replicas[BASE]}, speculative {replicas[SPECULATIVE]}"
            why = " before the speculative pod template changes" if replicas.holding else ""
            conditions.set(
                ConditionType.ROLLED_OUT, "False", reason, f"walking toward {replicas.toward.value}{why}: {progress} (Deployments at {asked})"
            )
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
        **(_fleet_status(facts, fleet) if fleet is not None else {}),
    )


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
