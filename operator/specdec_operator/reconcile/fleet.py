"""Fleet routing: how many servers each variant gets (the canary, the walk, the walk back before a template
changes) and what the stable Service selects (one variant, or both while a fleet's servers of both may serve)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import manifests as m
from .. import rollout
from ..api import (
    ProbeStatus,
    Reason,
    ValidationStatus,
    Variant,
)
from .capture_objects import routing_service
from .decision import is_invalid, is_promoted, is_rolled_back, never_started
from .diff import annotations_of, labels_of, owned_by, template_differs
from .facts import BASE, SPECULATIVE, Facts
from .gpus import pod_gpus
from .pods import (
    group_state,
    is_ready,
    live,
    pods_of,
)


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
    paused: bool = False  # specdec.io/paused holds the walk where it is
    # A base pod template change of a fleet (base_template_change): the base Deployment keeps its old template (a
    # replicas-only write) until its rolling update cannot take the fleet under its floor of Ready servers ...
    base_held: bool = False
    # ... and while it rolls the walk waits for it (it also waits while the new template is held).
    base_rolling: bool = False

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
        deployment = facts.observed.deployments.get(m.child_name(facts.name, variant))
        desired = 0
        if deployment is not None and owned_by(deployment, facts.observed.uid):
            asked = (deployment.get("spec") or {}).get("replicas")
            desired = 1 if asked is None else int(asked)
        if facts.leader_worker_sets:  # multi-node: groups, counted by their leaders, by group index
            variants[variant] = group_state(desired, facts.observed.pods, variant)
            continue
        pods = [p for p in facts.observed.pods if labels_of(p).get(m.LABEL_VARIANT) == variant]
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
    server = facts.observed.deployments.get(m.child_name(facts.name, SPECULATIVE))
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


@dataclass(frozen=True)
class BaseChange:
    """A fleet's base Deployment and its pod template (Deployments only: a LeaderWorkerSet rolls group by group
    and is left to its controller).

    pending: the base template of this step differs from the Deployment's, which has servers (a new image, new
    arguments). rolling: base pods of a template older than the Deployment's are still there, i.e. its rolling
    update is under way. Either way the walk waits (rollout.plan_step's ``rolling``): the rolling update already
    takes up to maxUnavailable Ready servers, and a walk step beside it would take one more."""

    pending: bool = False
    rolling: bool = False

    @property
    def walk_waits(self) -> bool:
        return self.pending or self.rolling


def base_template_change(facts: Facts, state: rollout.FleetState) -> BaseChange:
    """What the API server shows of a fleet's base template change (none for one server or LeaderWorkerSets)."""
    if facts.leader_worker_sets or facts.spec.replicas < 2:
        return BaseChange()
    server = facts.observed.deployments.get(m.child_name(facts.name, BASE))
    if server is None or not owned_by(server, facts.observed.uid) or server.get("kind", "Deployment") != "Deployment":
        return BaseChange()
    have = annotations_of((server.get("spec") or {}).get("template") or {}).get(m.ANNOTATION_TEMPLATE_HASH)
    rolling = any(annotations_of(p).get(m.ANNOTATION_TEMPLATE_HASH) != have for p in pods_of(facts.observed.pods, BASE))
    desired = {"kind": "Deployment", "spec": {"template": facts.templates[BASE]}}
    pending = template_differs(desired, server) and (state.base.desired > 0 or state.base.pods > 0)
    return BaseChange(pending=pending, rolling=rolling)


def base_ready_through_rollout(state: rollout.FleetState, base_replicas: int, max_unavailable: int) -> int:
    """The fewest Ready base servers a rolling update of `base_replicas` leaves: the Deployment controller keeps
    base_replicas - maxUnavailable available, and never takes a Ready server below that (or below what is Ready)."""
    return min(state.base.ready, max(0, base_replicas - max_unavailable))


def base_template_may_change(n: int, state: rollout.FleetState, counts: rollout.Counts, max_unavailable: int) -> bool:
    """Whether the base Deployment may get its new template with this step's counts: the Ready servers its rolling
    update leaves, beside the speculative servers this step keeps, keep the floor (spec.replicas - maxUnavailable),
    or, when the fleet is already under it (servers loading, crash-looping), are no fewer than now."""
    ready_now = state.base.ready + state.speculative.ready
    kept = state.speculative.ready_kept(counts.speculative) + base_ready_through_rollout(state, counts.base, max_unavailable)
    return kept >= min(rollout.floor(n, max_unavailable), ready_now)


def _with_base_change(fleet: Fleet, change: BaseChange, max_unavailable: int, recreating: bool) -> Fleet:
    """The fleet with the base template held, or let go, and the walk's wait for the base rollout said.

    recreating: the speculative template changes in this step (its Recreate takes its servers at once): the base
    template waits until those are back, so that the two never take servers at the same time."""
    if not change.walk_waits:
        return fleet
    counts = rollout.Counts(base=fleet[BASE], speculative=fleet[SPECULATIVE])
    held = change.pending and (recreating or not base_template_may_change(fleet.replicas, fleet.state, counts, max_unavailable))
    return dataclasses.replace(fleet, base_held=held, base_rolling=change.rolling or (change.pending and not held))


def _walked_back_one_server(facts: Facts) -> bool:
    """A one-server resource may change its speculative template once the base serves and the stable Service
    selects it (observed): the old speculative server answered until then."""
    stable = routing_service(facts.observed.services, facts.name)
    return facts.servers[BASE].ready and stable is not None and not m.selects_both(stable) and m.service_variant(stable) == BASE


def recreates(facts: Facts) -> bool:
    """rollout.updateStrategy Recreate on a one-server resource (a fleet walks within maxSurge/maxUnavailable)."""
    return facts.spec.replicas == 1 and facts.spec.rollout.update_strategy == "Recreate"


def update_blocked(facts: Facts, fleet: Fleet) -> str | None:
    """Why a one-server resource's new pod template cannot start, or None: it keeps its old speculative server until
    the new base serves (plan_replicas, updateStrategy RollingUpdate), and the new base cannot be scheduled while
    that server holds its GPUs. Nothing frees them by itself: without this the resource would wait for
    spec.progressDeadlineSeconds (an hour by default) and then fail without naming the old server."""
    base = facts.servers[BASE]
    if fleet.replicas != 1 or not fleet.holding or base.ready or base.reason != Reason.UNSCHEDULABLE:
        return None
    old = [p for p in live(pods_of(facts.observed.pods, SPECULATIVE)) if pod_gpus(p) > 0]
    if not old:
        return None
    held = ", ".join(f"{(p.get('metadata') or {}).get('name')} ({pod_gpus(p)} {m.GPU_RESOURCE})" for p in old)
    serving = "serves until then" if facts.servers[SPECULATIVE].any_ready else "is not Ready either"
    return (
        f"the new base server cannot be scheduled while the old speculative pod {held} holds its GPUs and {serving}; "
        "nothing frees them: free GPUs for one more server, or set spec.rollout.updateStrategy: Recreate to replace the old "
        f"server first (downtime until the new base is Ready). Base: {base.message}"
    )


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

    A base template change of a fleet (a new image, new arguments; base_template_change) rolls the base Deployment
    within maxSurge/maxUnavailable, and the walk waits for it (no walk step takes a Ready server while the base
    rolls). The new base template is written only when the rolling update cannot take the fleet under its floor
    beside this step's counts, and not in a step that recreates the speculative servers; until then the base
    Deployment keeps its old template (Fleet.base_held).
    """
    n = facts.spec.replicas
    state = fleet_state(facts)
    # A race waiting for a slot (candidate_race.queued) holds no speculative server either, as a broken one does not.
    broken = is_invalid(validation) or never_started(decision) or (decision is not None and decision.reason == Reason.RACE_QUEUED)
    toward = None if decision is None and not broken else (SPECULATIVE if is_promoted(decision) and not broken else BASE)
    old = old_speculative_servers(facts)
    if n == 1 and old and not _walked_back_one_server(facts):
        if recreates(facts):
            # rollout.updateStrategy Recreate: the old server goes first (its template kept, a replicas-only write),
            # freeing its GPUs for the new base; nothing serves until the base does (documented downtime).
            return Fleet(n, rollout.Counts(base=1, speculative=0), state, {BASE: 1, SPECULATIVE: 0}, None, holding=True)
        held = rollout.Counts(base=1, speculative=old)
        return Fleet(n, held, state, {BASE: 1, SPECULATIVE: old}, None, holding=True)
    ro = facts.spec.rollout
    change = base_template_change(facts, state)
    rolling = BASE if change.walk_waits else None
    # While the base rolls, count only the base servers its rolling update is sure to leave.
    base_ready = base_ready_through_rollout(state, state.base.desired, ro.max_unavailable) if change.rolling else state.base.ready
    if n >= 2 and old and base_ready < max(1, rollout.floor(n, ro.max_unavailable)):
        # The old speculative servers may all go at once (the template change) only when the Ready base servers
        # alone keep the floor: a canary beside N - 1 base servers is replaced at once, a walked fleet walks back.
        after = rollout.canary_goal(n, ro.max_surge) if toward is None else rollout.walk_goal(n, toward)
        # The walk back ends at the base servers the next goal keeps, and never below the floor of Ready servers.
        back = rollout.Counts(base=max(after.base, rollout.floor(n, ro.max_unavailable), 1), speculative=0)
        counts = rollout.plan_step(back, state, replicas=n, max_surge=ro.max_surge, max_unavailable=ro.max_unavailable, rolling=rolling)
        walking_back = Fleet(n, back, state, {BASE: counts.base, SPECULATIVE: counts.speculative}, BASE, holding=True)
        return _with_base_change(walking_back, change, ro.max_unavailable, recreating=False)
    if n == 1:
        replicas = {BASE: 1, SPECULATIVE: 1}
        if broken:
            replicas[SPECULATIVE] = 0  # an incompatible or broken speculative server does not hold GPUs
        if decision is None and recreates(facts) and not facts.servers[BASE].any_ready:
            # Recreate: one server at a time, the base first, so that the GPUs the old server freed go to the base
            # (a speculative server that took them would leave the base unschedulable and nothing serving).
            replicas[SPECULATIVE] = 0
        # The loser is scaled to 0 only once the winner serves, so traffic never lands on nothing; it stays warm
        # only where the user asked for it (keepBaseWarm keeps a base, keepSpeculativeWarm a speculative server).
        if is_promoted(decision) and not ro.keep_base_warm and facts.servers[SPECULATIVE].any_ready:
            replicas[BASE] = 0
        if is_rolled_back(decision) and not ro.keep_speculative_warm and facts.servers[BASE].any_ready:
            replicas[SPECULATIVE] = 0
        goal = rollout.Counts(base=replicas[BASE], speculative=replicas[SPECULATIVE])
        return Fleet(n, goal, state, replicas, toward)
    # A fleet walks to the winner whatever rollout.keepBaseWarm says: a warm loser beside it would be a second
    # fleet, beyond rollout.maxSurge (docs/operator.md).
    goal = rollout.canary_goal(n, ro.max_surge) if toward is None else rollout.walk_goal(n, toward)
    if facts.steering.paused and state.base.desired + state.speculative.desired > 0:
        # specdec.io/paused: the walk takes no step; the Deployments keep asking for what they ask for.
        standing = {BASE: state.base.desired, SPECULATIVE: state.speculative.desired}
        return _with_base_change(Fleet(n, goal, state, standing, toward, paused=True), change, ro.max_unavailable, recreating=bool(old))
    counts = rollout.plan_step(goal, state, replicas=n, max_surge=ro.max_surge, max_unavailable=ro.max_unavailable, rolling=rolling)
    fleet = Fleet(n, goal, state, {BASE: counts.base, SPECULATIVE: counts.speculative}, toward)
    return _with_base_change(fleet, change, ro.max_unavailable, recreating=bool(old))


def choose_active(facts: Facts, decision: ProbeStatus | None, holding: bool = False) -> Variant:
    """The server the stable Service selects: the decided one, unless it cannot answer and the other can.

    holding: the speculative servers keep an old template until the fleet has walked back (plan_replicas): the
    base, as soon as it serves on its current template (an older one is being replaced too)."""
    desired = SPECULATIVE if is_promoted(decision) and not (holding and facts.servers[BASE].ready) else BASE
    if facts.servers[desired].any_ready:
        return desired
    stable = routing_service(facts.observed.services, facts.name)
    current = m.service_variant(stable) if stable else None
    if stable is not None and m.selects_both(stable):
        current = SPECULATIVE  # a fleet walking back: its speculative servers answer until the base serves
    # Never route to nothing while the other server can answer (both give the same answers):
    if desired == SPECULATIVE and facts.servers[BASE].any_ready:
        return BASE  # the promoted server is restarting: the base answers meanwhile
    if current == SPECULATIVE and facts.servers[SPECULATIVE].any_ready:
        return SPECULATIVE  # a rollback to a cold base waits until the base serves
    return desired


def route_both(facts: Facts, fleet: Fleet, decision: ProbeStatus | None, validation: ValidationStatus | None = None) -> bool:
    """Whether the stable Service is to select both variants (``manifests.selects_both`` then says so of it): a fleet
    whose servers of both variants may serve.

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
        stable = routing_service(facts.observed.services, facts.name)
        served = stable is not None and (m.selects_both(stable) or m.service_variant(stable) == SPECULATIVE)
        # ... unless the speculative servers were only ever the canary: a decision against them takes them out at once.
        served = served and fleet.state.speculative.desired > 1
    return served and facts.servers[BASE].any_ready and facts.servers[SPECULATIVE].any_ready
