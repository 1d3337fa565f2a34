"""A change of resources.nodes between 1 and more: the servers of the kind the spec no longer uses.

A one-node server is a Deployment's pod, a multi-node one a LeaderWorkerSet group; both kinds use the names
``<name>-base`` and ``<name>-spec``. When the spec changes kind, the old kind's objects (owned by this resource,
``Observed.retiring``) are replaced by the new kind's and then deleted. A server of the other shape holds other
GPUs (resources.gpus per node times nodes), so the walk cannot exchange them one for one; the rule is:

* ``rollout.maxSurge >= spec.replicas`` (room for a whole second fleet): the new kind's servers come up beside the
  old ones, which keep serving, with the Services left as they are (their selectors are the old kind's: a
  LeaderWorkerSet's select leaders only); once the new kind's Ready servers of the active variant reach
  ``max(1, replicas - maxUnavailable)`` the Services take the new kind's selectors and the old objects are deleted
  in the same step, after the Services are written;
* otherwise (the default maxSurge 0) the two cannot overlap without oversubscribing the GPUs: the old objects are
  deleted at once and the new kind's servers are asked for (spec.replicas above 0) only once the old pods are gone.
  The resource serves nothing until the new servers are Ready (a model load); the status message says so.

The pods of the old kind are told from the new kind's by the role label of a group's templates (leader or worker),
which a Deployment's pods never carry; the lifecycle sees the new kind's pods only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import manifests as m
from .. import rollout
from ..api import SpeculativeServerSpec, Variant
from .diff import labels_of, owned_by
from .model import Observed


@dataclass(frozen=True)
class Retirement:
    objects: list[dict[str, Any]]  # the old kind's server objects owned by this resource
    pods: list[dict[str, Any]]  # their pods (they hold GPUs until they are gone)
    old_kind: str  # Deployment or LeaderWorkerSet
    overlap: bool  # rollout.maxSurge >= spec.replicas: the new kind comes up beside the old

    @property
    def new_kind(self) -> str:
        return "Deployment" if self.old_kind == m.LWS_KIND else m.LWS_KIND


def is_group_pod(pod: dict[str, Any]) -> bool:
    """A pod of a LeaderWorkerSet group: its template's role label (leader or worker, manifests._rank_template),
    which a Deployment's pods never carry."""
    return m.LABEL_ROLE in labels_of(pod)


def retiring(spec: SpeculativeServerSpec, observed: Observed) -> Retirement | None:
    """The old kind's servers to replace, or None (nothing of the other kind is ours)."""
    objects = [
        o
        for o in observed.retiring.values()
        if owned_by(o, observed.uid)
        and labels_of(o).get(m.LABEL_INSTANCE) == observed.name
        and o.get("kind") in ("Deployment", m.LWS_KIND)
        # The capture proxy's Deployment is no server (a multi-node resource's watch files it with the old kind's).
        and labels_of(o).get(m.LABEL_NAME) == m.APP_NAME
    ]
    if not objects:
        return None
    old_kind = "Deployment" if m.multi_node(spec) else m.LWS_KIND
    pods = [p for p in observed.pods if is_group_pod(p) == (old_kind == m.LWS_KIND)]
    return Retirement(objects, pods, old_kind, spec.rollout.max_surge >= spec.replicas)


def without_old_pods(observed: Observed, retirement: Retirement) -> Observed:
    """What the lifecycle sees: the new kind's pods only."""
    old = {id(p) for p in retirement.pods}
    return replace(observed, pods=[p for p in observed.pods if id(p) not in old])


def deletion(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    api_version = "apps/v1" if obj["kind"] == "Deployment" else m.LWS_API_VERSION
    return {"apiVersion": api_version, "kind": obj["kind"], "metadata": {"name": meta["name"], "namespace": namespace, "uid": meta.get("uid")}}


def adjust(
    retirement: Retirement,
    desired: list[dict[str, Any]],
    observed: Observed,
    spec: SpeculativeServerSpec,
    state: rollout.FleetState,
    active: Variant,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The children to write, the old objects to delete now, and what the status message says of it."""
    old, new = _words(retirement.old_kind), _words(retirement.new_kind)
    deletions = [deletion(o, observed.namespace) for o in retirement.objects]
    if retirement.overlap:
        needed = max(1, rollout.floor(spec.replicas, spec.rollout.max_unavailable))
        if state[active].ready >= needed:
            return desired, deletions, f"resources.nodes changed: the {new} serve, deleting the {old}"
        kept = [o for o in desired if not (o["kind"] == "Service" and o["metadata"]["name"] in observed.services)]
        note = (
            f"resources.nodes changed: the {new} come up beside the {old} (rollout.maxSurge >= replicas), which serve until "
            f"{needed} {active.value} {'server is' if needed == 1 else 'servers are'} Ready"
        )
        return kept, [], note
    note = (
        f"resources.nodes changed: no room for the {new} beside the {old} (rollout.maxSurge < replicas): the {old} are deleted "
        "and the new servers asked for once their pods are gone; nothing serves until they are Ready"
    )
    if retirement.pods:
        desired = [{**o, "spec": {**o["spec"], "replicas": 0}} if o["kind"] == retirement.new_kind else o for o in desired]
    return desired, deletions, note


def _words(kind: str) -> str:
    return "LeaderWorkerSets" if kind == m.LWS_KIND else "Deployments"
