"""The fleet's walk (rollout.plan_step), simulated step by step against a model of two Deployments.

The model is the ReplicaSet controller's behaviour that the invariants depend on: a Deployment creates pods up to
spec.replicas at once (each Ready after its own delay), deletes the surplus not-Ready first, and a deleted pod
holds its GPUs until it has terminated (its own delay). At every step the test checks, from the pods, that no new
pod made the fleet request more than the budget and that no deletion left fewer Ready servers than the floor.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass, field

import pytest

from specdec_operator.api import Variant
from specdec_operator.rollout import (
    Counts,
    FleetState,
    VariantState,
    budget,
    canary_goal,
    floor,
    plan_step,
    progress,
    status_fields,
    walk_done,
    walk_goal,
)

BASE, SPEC = Variant.BASE, Variant.SPECULATIVE


@dataclass
class Pod:
    ready_at: int
    gone_at: int | None = None  # set when deleted: it terminates until then


@dataclass
class Deployment:
    desired: int = 0
    pods: list[Pod] = field(default_factory=list)

    def active(self) -> list[Pod]:
        return [p for p in self.pods if p.gone_at is None]

    def state(self, now: int, ordered: bool = False) -> VariantState:
        ready = sum(1 for p in self.active() if p.ready_at <= now)
        by_index = tuple(p.ready_at <= now for p in self.active()) if ordered else None
        return VariantState(
            desired=self.desired, pods=len(self.pods), ready=ready, terminating=len(self.pods) - len(self.active()), ready_by_index=by_index
        )


class Fleet:
    def __init__(
        self, rng: random.Random, base: int = 0, speculative: int = 0, max_ready_delay: int = 4, max_term_delay: int = 3, ordered: bool = False
    ):
        # ordered: LeaderWorkerSet groups (a scale-down removes the highest indexes, Ready or not).
        self.rng, self.now, self.ordered = rng, 0, ordered
        self.max_ready_delay, self.max_term_delay = max_ready_delay, max_term_delay
        self.deps = {BASE: Deployment(base, [Pod(0) for _ in range(base)]), SPEC: Deployment(speculative, [Pod(0) for _ in range(speculative)])}
        self.created = 0

    def state(self) -> FleetState:
        return FleetState(base=self.deps[BASE].state(self.now, self.ordered), speculative=self.deps[SPEC].state(self.now, self.ordered))

    def ready(self) -> int:
        return sum(self.deps[v].state(self.now).ready for v in (BASE, SPEC))

    def requested(self) -> int:
        return sum(len(d.pods) for d in self.deps.values())

    def reconcile(self, counts: Counts) -> bool:
        """The ReplicaSet controllers act on new spec.replicas; True when a pod was created."""
        created = False
        for variant, dep in self.deps.items():
            dep.desired = counts[variant]
            active = dep.active()
            surplus = len(active) - dep.desired
            if surplus > 0:
                # Not-Ready first, then the youngest Ready (the ReplicaSet controller's ranking); for groups the
                # highest indexes (the last created).
                ranked = active[::-1] if self.ordered else sorted(active, key=lambda p: (p.ready_at <= self.now, -p.ready_at))
                for pod in ranked[:surplus]:
                    pod.gone_at = self.now + self.rng.randint(0, self.max_term_delay)
            for _ in range(-surplus):
                dep.pods.append(Pod(self.now + self.rng.randint(1, self.max_ready_delay)))
                created = True
                self.created += 1
        return created

    def tick(self) -> None:
        self.now += 1
        for dep in self.deps.values():
            dep.pods = [p for p in dep.pods if p.gone_at is None or p.gone_at > self.now]


def walk(fleet: Fleet, goal: Counts, *, replicas: int, surge: int, unavailable: int, ticks: int = 400, events=None) -> int:
    """Step until the walk is done, checking the invariants at every step; returns the ticks it took.

    events: {tick: callable(goal, replicas) -> (goal, replicas)} for mid-walk changes (rollback, kubectl scale).
    """
    events = dict(events or {})
    for t in range(ticks):
        if t in events:
            goal, replicas = events.pop(t)(goal, replicas)
        state = fleet.state()
        if walk_done(goal, state) and not events:
            return t
        counts = plan_step(goal, state, replicas=replicas, max_surge=surge, max_unavailable=unavailable)
        assert counts.base >= 0 and counts.speculative >= 0
        # Idempotent: asked again with its own answer written, the planner stands still.
        again = FleetState(
            base=dataclasses.replace(state.base, desired=counts.base),
            speculative=dataclasses.replace(state.speculative, desired=counts.speculative),
        )
        assert plan_step(goal, again, replicas=replicas, max_surge=surge, max_unavailable=unavailable) == counts
        ready_before, requested_before = fleet.ready(), fleet.requested()
        created = fleet.reconcile(counts)
        limit = budget(replicas, surge, goal)
        if created:
            assert fleet.requested() <= limit, f"t={t}: {fleet.requested()} servers requested, budget {limit} ({state} -> {counts})"
        assert fleet.requested() <= max(limit, requested_before)
        lowest = floor(replicas, unavailable)
        assert fleet.ready() >= min(lowest, ready_before), f"t={t}: {fleet.ready()} Ready after a scale-down, floor {lowest} ({state} -> {counts})"
        fleet.tick()
    raise AssertionError(f"the walk to {goal} did not finish in {ticks} steps: {fleet.state()}")


COMBOS = [(n, s, u) for n, s, u in itertools.product(range(0, 10), range(0, 4), range(0, 4)) if s or u]


@pytest.mark.parametrize("ordered", [False, True], ids=["deployment", "leaderworkerset"])
@pytest.mark.parametrize(("replicas", "surge", "unavailable"), COMBOS)
def test_promotion_rollback_and_canary_keep_the_invariants(replicas: int, surge: int, unavailable: int, ordered: bool) -> None:
    for seed in range(6 if not ordered else 3):
        rng = random.Random(f"{replicas}-{surge}-{unavailable}-{seed}")
        fleet = Fleet(rng, base=replicas, ordered=ordered)
        kw = {"replicas": replicas, "surge": surge, "unavailable": unavailable}
        # The canary, then the walk to speculative (a promotion), then back (a rollback).
        walk(fleet, canary_goal(replicas, surge), **kw)
        walk(fleet, walk_goal(replicas, SPEC), **kw)
        assert fleet.state().speculative.ready == replicas
        walk(fleet, walk_goal(replicas, BASE), **kw)
        assert fleet.state().base.ready == replicas and fleet.requested() == replicas


@pytest.mark.parametrize(("replicas", "surge", "unavailable"), COMBOS[::3])
def test_rollback_mid_walk_and_scale_mid_walk(replicas: int, surge: int, unavailable: int) -> None:
    for seed in range(8):
        rng = random.Random(f"mid-{replicas}-{surge}-{unavailable}-{seed}")
        fleet = Fleet(rng, base=replicas, ordered=seed % 2 == 1)
        kw = {"surge": surge, "unavailable": unavailable}
        flip_at, scale_at, new_replicas = rng.randint(0, 12), rng.randint(0, 20), rng.randint(0, 12)

        def rollback(goal: Counts, n: int) -> tuple[Counts, int]:
            return walk_goal(n, BASE), n

        def scale(goal: Counts, n: int) -> tuple[Counts, int]:
            return walk_goal(new_replicas, BASE if goal.base else SPEC), new_replicas

        events = {flip_at: rollback} if flip_at != scale_at else {}
        events[scale_at] = scale
        walk(fleet, walk_goal(replicas, SPEC), replicas=replicas, events=events, **kw)
        state = fleet.state()
        assert state.base.ready + state.speculative.ready == new_replicas == fleet.requested()


def test_defaults_replace_one_server_at_a_time_each_new_one_ready_before_the_next_old_goes() -> None:
    # maxSurge 0, maxUnavailable 1, 4 servers, pods Ready 2 steps after creation, terminating for 1 step.
    fleet = Fleet(random.Random(0), base=4, max_ready_delay=1, max_term_delay=0)
    goal = walk_goal(4, SPEC)
    trace = []
    for _ in range(60):
        state = fleet.state()
        if walk_done(goal, state):
            break
        counts = plan_step(goal, state, replicas=4, max_surge=0, max_unavailable=1)
        fleet.reconcile(counts)
        trace.append((counts.base, counts.speculative, fleet.requested(), fleet.ready()))
        fleet.tick()
    assert walk_done(goal, fleet.state())
    assert max(r for _, _, r, _ in trace) == 4  # never a fifth server's GPUs
    assert min(r for _, _, _, r in trace) == 3  # never two servers down
    # The desired counts go 4/0 -> 3/0 -> 3/1 -> 2/1 -> 2/2 -> ... : one old, then one new.
    steps = [c[:2] for i, c in enumerate(trace) if i == 0 or trace[i - 1][:2] != c[:2]]
    assert steps == [(3, 0), (3, 1), (2, 1), (2, 2), (1, 2), (1, 3), (0, 3), (0, 4)]


def test_canary_goals() -> None:
    assert canary_goal(6, 0) == Counts(base=5, speculative=1)  # no spare GPUs: the canary replaces a base server
    assert canary_goal(6, 1) == Counts(base=6, speculative=1)  # one extra server
    assert canary_goal(1, 0) == Counts(base=1, speculative=1)  # a one-server fleet needs the one extra server
    assert budget(1, 0, canary_goal(1, 0)) == 2 and budget(6, 0, canary_goal(6, 0)) == 6
    assert canary_goal(0, 0) == Counts(base=0, speculative=0)


def test_a_stuck_new_server_stops_the_walk() -> None:
    # The first speculative server never becomes Ready (crash loop): no second base server goes.
    fleet = Fleet(random.Random(1), base=4)
    goal = walk_goal(4, SPEC)
    for _ in range(30):
        counts = plan_step(goal, fleet.state(), replicas=4, max_surge=0, max_unavailable=1)
        fleet.reconcile(counts)
        for pod in fleet.deps[SPEC].pods:
            pod.ready_at = 10**9
        fleet.tick()
    assert fleet.deps[BASE].desired == 3 and fleet.deps[SPEC].desired == 1 and fleet.ready() == 3


def test_unready_old_servers_go_first_even_below_the_floor() -> None:
    # Two of four base servers crash-loop: the floor is 3 but only 2 are Ready; the walk may still remove the
    # broken ones (no Ready server is lost), never a Ready one.
    state = FleetState(base=VariantState(desired=4, pods=4, ready=2), speculative=VariantState(0, 0, 0))
    counts = plan_step(walk_goal(4, SPEC), state, replicas=4, max_surge=0, max_unavailable=1)
    assert counts == Counts(base=2, speculative=0)


def test_the_walk_waits_for_a_rolling_base() -> None:
    # 6 base servers at rest, a new base template rolling (the Deployment has taken one): the canary's scale-down of
    # a base server would be a second unavailable server, so the walk takes none; Ready-neutral steps go on.
    rolling = FleetState(base=VariantState(desired=6, pods=6, ready=5), speculative=VariantState(0, 0, 0))
    canary = canary_goal(6, 0)
    assert plan_step(canary, rolling, replicas=6, max_surge=0, max_unavailable=1) == Counts(base=5, speculative=0)  # without the wait
    assert plan_step(canary, rolling, replicas=6, max_surge=0, max_unavailable=1, rolling=BASE) == Counts(base=6, speculative=0)
    # A walk back whose speculative servers crash-loop: those go (no Ready one lost), the base is not scaled down.
    back = FleetState(base=VariantState(desired=3, pods=3, ready=2), speculative=VariantState(desired=3, pods=3, ready=2))
    assert plan_step(walk_goal(6, BASE), back, replicas=6, max_surge=0, max_unavailable=1, rolling=BASE) == Counts(base=3, speculative=2)
    # With room in the budget, scale-ups go on while the base rolls.
    room = FleetState(base=VariantState(desired=6, pods=6, ready=5), speculative=VariantState(0, 0, 0))
    assert plan_step(canary_goal(6, 1), room, replicas=6, max_surge=1, max_unavailable=0, rolling=BASE) == Counts(base=6, speculative=1)


def test_bad_parameters_are_refused() -> None:
    state = FleetState(base=VariantState(1, 1, 1), speculative=VariantState(0, 0, 0))
    with pytest.raises(ValueError, match="both be 0"):
        plan_step(walk_goal(1, SPEC), state, replicas=1, max_surge=0, max_unavailable=0)
    with pytest.raises(ValueError):
        VariantState(-1, 0, 0)


def test_progress() -> None:
    state = FleetState(base=VariantState(5, 5, 5), speculative=VariantState(3, 3, 3))
    assert progress(8, state) == "3/8 speculative"


def test_a_leaderworkerset_scale_down_takes_the_highest_group_ready_or_not() -> None:
    # Group 1 of 3 is not Ready. A Deployment would delete it first; a LeaderWorkerSet deletes group 2, a Ready
    # one, which the floor (3 - 1) forbids while group 1 is down.
    goal = walk_goal(3, SPEC)
    deployment = FleetState(base=VariantState(3, 3, 2), speculative=VariantState(0, 0, 0))
    groups = FleetState(base=VariantState(3, 3, 2, ready_by_index=(True, False, True)), speculative=VariantState(0, 0, 0))
    assert plan_step(goal, deployment, replicas=3, max_surge=0, max_unavailable=1) == Counts(base=2, speculative=0)
    assert plan_step(goal, groups, replicas=3, max_surge=0, max_unavailable=1) == Counts(base=3, speculative=0)
    last_down = FleetState(base=VariantState(3, 3, 2, ready_by_index=(True, True, False)), speculative=VariantState(0, 0, 0))
    assert plan_step(goal, last_down, replicas=3, max_surge=0, max_unavailable=1) == Counts(base=2, speculative=0)


def test_status_fields() -> None:
    from specdec_operator.manifests import fleet_selector

    state = FleetState(base=VariantState(5, 6, 5, terminating=1), speculative=VariantState(3, 3, 2))
    assert status_fields(8, state, fleet_selector("kimi")) == {
        "replicas": 8,
        "readyReplicas": 7,
        "speculativeReplicas": 2,
        "rolloutProgress": "2/8 speculative",
        "selector": "app.kubernetes.io/instance=kimi,app.kubernetes.io/name=sglang",
    }
