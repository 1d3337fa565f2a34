"""The fleet's walk from one variant to the other: pure functions that decide the next replica counts.

A fleet is two Deployments (or two sets of LeaderWorkerSet groups), base and speculative, behind one stable
Service. After a promotion the fleet walks from all-base to all-speculative; a rollback is the same walk toward
base, started from wherever the walk is; the probe's canary is a walk to a small goal (one speculative server and
one base comparison). ``plan_step`` is called on every reconcile with what the API server shows and returns the
counts to write into the two Deployments' spec.replicas. It keeps two invariants, the ones of a Deployment's
rolling update, but counted over both Deployments and over pods that exist rather than replicas asked for:

* requested: the servers that hold (or wait for) GPUs, base and speculative together, terminating pods included,
  never exceed the budget (spec.replicas + rollout.maxSurge). A new server is only asked for once an old one's pod
  is gone, so with maxSurge 0 a full node is never oversubscribed, not even for a moment;
* available: Ready servers never drop below spec.replicas - rollout.maxUnavailable because of a scale-down. A
  Deployment's scale-down removes not-Ready servers first (as the ReplicaSet controller does), so losing those is
  always allowed; a LeaderWorkerSet removes its highest group indexes, Ready or not (VariantState.ready_by_index).

With the defaults (maxSurge 0, maxUnavailable 1) one old server goes, its pod terminates, one new server comes,
and the next old one goes only when the new one is Ready. A change of spec.replicas mid-walk changes the goal and
the walk goes on from where it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import Variant


@dataclass(frozen=True)
class Counts:
    """Servers of each variant: a goal, or the spec.replicas of the two Deployments."""

    base: int
    speculative: int

    def __getitem__(self, variant: Variant | str) -> int:
        return self.base if variant == Variant.BASE else self.speculative

    @property
    def total(self) -> int:
        return self.base + self.speculative


@dataclass(frozen=True)
class VariantState:
    """What the API server shows of one variant.

    desired: the Deployment's spec.replicas. pods: its pods that exist (pending, running or terminating: each one
    holds or waits for a server's GPUs). ready: its Ready pods that are not being deleted. terminating: its pods
    being deleted (a deletionTimestamp), which the ReplicaSet controller already replaces while they still hold
    their GPUs.
    """

    desired: int
    pods: int
    ready: int
    terminating: int = 0
    # LeaderWorkerSet groups (multi-node servers): whether each group, by group index, is Ready. A LeaderWorkerSet
    # scales down like a StatefulSet, the highest indexes first, Ready or not; None: a Deployment, which deletes
    # not-Ready pods first.
    ready_by_index: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        if min(self.desired, self.pods, self.ready, self.terminating) < 0 or self.terminating > self.pods:
            raise ValueError(f"impossible counts in {self}")

    def ready_kept(self, desired: int) -> int:
        """Ready servers left once the controller has scaled this variant to `desired` (a pod already asked to go
        is counted gone even while it still reports Ready)."""
        if self.ready_by_index is not None:
            return sum(self.ready_by_index[:desired])
        # A Deployment deletes not-Ready pods (and never-created slots) first.
        return min(self.ready, desired)


@dataclass(frozen=True)
class FleetState:
    base: VariantState
    speculative: VariantState

    def __getitem__(self, variant: Variant | str) -> VariantState:
        return self.base if variant == Variant.BASE else self.speculative


def walk_goal(replicas: int, toward: Variant | str) -> Counts:
    """Where a walk ends: every server of one variant (toward speculative after a promotion, base on rollback)."""
    return Counts(base=replicas, speculative=0) if toward == Variant.BASE else Counts(base=0, speculative=replicas)


def canary_goal(replicas: int, max_surge: int) -> Counts:
    """The fleet while a speculative revision is probed: one speculative server (the canary) and the base servers,
    one of which is the probe's comparison.

    With maxSurge >= 1 the canary is the one extra server and every base server stays. With maxSurge 0 the canary
    replaces a base server, so the fleet keeps its size. A one-server fleet has no other server to replace: its
    trial needs the one extra server whatever maxSurge says (it cannot compare a server with itself).
    """
    if replicas <= 0:
        return Counts(base=0, speculative=0)
    if max_surge >= 1 or replicas == 1:
        return Counts(base=replicas, speculative=1)
    return Counts(base=replicas - 1, speculative=1)


def budget(replicas: int, max_surge: int, goal: Counts) -> int:
    """The most servers the fleet may request while it walks to goal: spec.replicas + maxSurge (or the goal itself,
    when the goal is larger: only the one-server fleet's canary)."""
    return max(replicas + max_surge, goal.total)


def floor(replicas: int, max_unavailable: int) -> int:
    """The fewest Ready servers a scale-down may leave."""
    return max(0, replicas - max_unavailable)


def _footprint(state: VariantState, desired: int) -> int:
    # Servers holding or waiting for GPUs once the Deployment has acted on `desired`: the terminating pods (they
    # hold their GPUs until they are gone, and the ReplicaSet controller does not count them) plus the live pods,
    # or the replicas asked for when those are more.
    return state.terminating + max(desired, state.pods - state.terminating)


def plan_step(goal: Counts, state: FleetState, *, replicas: int, max_surge: int, max_unavailable: int, rolling: Variant | None = None) -> Counts:
    """The next spec.replicas of the two Deployments, one step of the walk from `state` toward `goal`.

    Idempotent: called again on the same state it returns the same counts; it returns the current desired counts
    when nothing may change yet (a new server not Ready, an old pod still terminating).

    rolling: a variant whose Deployment replaces its servers with a new pod template (its own rolling update, which
    takes up to maxUnavailable Ready servers by itself). The walk waits for it: that variant is not scaled down
    (a scale-down mid-rollout may take a Ready server of the old template while the new one loads), and no
    scale-down of the other variant may take a Ready server either; scale-ups within the budget go on.
    """
    if max_surge < 0 or max_unavailable < 0 or replicas < 0:
        raise ValueError("replicas, maxSurge and maxUnavailable must not be negative")
    if max_surge == 0 and max_unavailable == 0:
        raise ValueError("rollout.maxSurge and rollout.maxUnavailable must not both be 0")
    variants = (Variant.BASE, Variant.SPECULATIVE)
    desired = {v: state[v].desired for v in variants}
    min_ready = floor(replicas, max_unavailable)
    if rolling is not None:  # the rolling update spends the unavailability: the walk may not lose a Ready server
        min_ready = max(min_ready, sum(state[v].ready_kept(desired[v]) for v in variants))

    # 1. Scale-downs, the old variant first (it is the one being replaced; the other shrinks only when the goal
    # itself shrank, e.g. kubectl scale mid-walk). Not-Ready servers go for free; Ready ones only above the floor.
    shrinking = sorted((v for v in variants if desired[v] > goal[v] and v != rolling), key=lambda v: goal[v] > 0)
    for variant in shrinking:
        for _ in range(desired[variant] - goal[variant]):
            before = sum(state[v].ready_kept(desired[v]) for v in variants)
            trial = {**desired, variant: desired[variant] - 1}
            after = sum(state[v].ready_kept(trial[v]) for v in variants)
            if after < before and after < min_ready:
                break
            desired = trial

    # 2. Scale-ups within the budget, counting the pods that still exist (terminating ones included).
    limit = budget(replicas, max_surge, goal)
    for variant in variants:
        while desired[variant] < goal[variant]:
            trial = {**desired, variant: desired[variant] + 1}
            if sum(_footprint(state[v], trial[v]) for v in variants) > limit:
                break
            desired = trial
    return Counts(base=desired[Variant.BASE], speculative=desired[Variant.SPECULATIVE])


def walk_done(goal: Counts, state: FleetState) -> bool:
    """The walk has arrived: the Deployments ask for the goal, every server of it is Ready and no other pod is left."""
    return all(state[v].desired == goal[v] and state[v].ready == goal[v] and state[v].pods == goal[v] for v in (Variant.BASE, Variant.SPECULATIVE))


def progress(replicas: int, state: FleetState) -> str:
    """status.rolloutProgress: Ready speculative servers out of spec.replicas, e.g. '3/8 speculative'."""
    return f"{min(state.speculative.ready, replicas)}/{replicas} speculative"


def status_fields(replicas: int, state: FleetState, selector: str) -> dict[str, object]:
    """The fleet's part of the status (camelCase, as written): the scale subresource's replicas and selector, the
    Ready counts and the walk's progress."""
    return {
        "replicas": state.base.pods - state.base.terminating + state.speculative.pods - state.speculative.terminating,
        "readyReplicas": state.base.ready + state.speculative.ready,
        "speculativeReplicas": state.speculative.ready,
        "rolloutProgress": progress(replicas, state),
        "selector": selector,
    }
