"""What one step knows before it decides anything (``Facts``): the stored status, what exists, the pod templates
of this generation, each server's state, the names others hold, and whether a load-aware probe is on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import manifests as m
from ..api import (
    LoadAware,
    ProbeStatus,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
    Variant,
)
from ..steering import Steering
from ..textutil import rfc3339
from .diff import labels_of, owned_by
from .loadaware import LoadAwareProbe, load_aware_probe_for
from .model import Observed, Settings
from .pods import (
    ServerState,
    pods_of,
    server_state,
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
    load_aware_probe: LoadAwareProbe | None = None  # a load-aware probe: the speculative server runs SGLang's adaptive speculation
    # Multi-node servers (resources.nodes > 1): each variant's LeaderWorkerSet, rendered with 0 replicas (the
    # count is set per step); its leader template is the one in `templates` (the leader serves, and says if its
    # group is Ready).
    leader_worker_sets: dict[Variant, dict[str, Any]] = field(default_factory=dict)
    # The templates above (and the LeaderWorkerSets) by variant and table, for the caller to keep (Plan.rendered).
    rendered: dict[str, Any] = field(default_factory=dict)
    # What was asked by hand (the specdec.io/* annotations, steering.py): a paused walk, an abort, a promotion.
    steering: Steering = field(default_factory=Steering)

    @property
    def probe_id(self) -> str:
        """What the probe of this step measures: the revision, or the revision's adaptive server (its table's hash)."""
        return self.revision if self.load_aware_probe is None else f"{self.revision}/adaptive-{self.load_aware_probe.config_hash}"

    @property
    def now_s(self) -> str:
        return rfc3339(self.now)

    @property
    def name(self) -> str:
        return self.observed.name

    def prev_probe_for_revision(self) -> ProbeStatus | None:
        return stored_probe(self.prev, self.revision)


def stored_probe(prev: SpeculativeServerStatus, revision: str) -> ProbeStatus | None:
    probe = prev.probe
    return probe if probe is not None and probe.revision == revision else None


def settle_load_aware_probe(spec: SpeculativeServerSpec, stored: ProbeStatus | None, result: ProbeStatus | None) -> LoadAwareProbe | None:
    """The load-aware probe in force for this revision, if any (loadaware.load_aware_probe_for says when there is one).

    It comes from the plain probe: the one stored with a load-aware probe already under way (or decided), a plain decision
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
    found = load_aware_probe_for(spec, plain) if plain is not None else None
    return found if isinstance(found, LoadAwareProbe) else None


# (spec, variant, adaptive_config_path=None, adaptive_config=None, worker=False) -> the server's command line (Engine.render_argv)
RenderArgv = Callable[..., list[str]]


def _adaptive_args(load_aware_probe: LoadAwareProbe | None) -> dict[str, Any]:
    """The renderer's load-aware arguments: the table as a mounted file (SGLang reads it there) and as JSON (vLLM
    takes it inline in --speculative-config)."""
    if load_aware_probe is None:
        return {}
    return {"adaptive_config_path": m.ADAPTIVE_CONFIG_PATH, "adaptive_config": load_aware_probe.config_json}


def gather_facts(
    spec: SpeculativeServerSpec,
    observed: Observed,
    prev: SpeculativeServerStatus,
    now: datetime,
    revision: str,
    settings: Settings,
    render_argv: RenderArgv,
    rendered: Mapping[str, Any],
    load_aware_probe: LoadAwareProbe | None = None,
) -> Facts:
    """What exists, and the pod templates of this step: those in ``rendered`` (the caller's, for this generation)
    are reused, the others rendered; all of them are in ``Facts.rendered`` (the argument is not changed)."""
    used: dict[str, Any] = {}
    templates = {}
    groups: dict[Variant, dict[str, Any]] = {}
    for variant in (BASE, SPECULATIVE):
        adaptive = load_aware_probe is not None and variant == SPECULATIVE
        table_hash = load_aware_probe.config_hash if adaptive and load_aware_probe is not None else None
        key = f"{variant}/adaptive-{table_hash}" if table_hash else str(variant)
        if m.multi_node(spec):
            key += "/lws"
            used[key] = (
                rendered[key]
                if key in rendered
                else _leader_worker_set(spec, observed, variant, revision, settings, render_argv, table_hash, load_aware_probe)
            )
            groups[variant] = used[key]
            templates[variant] = m.leader_template(used[key])
            continue
        if key in rendered:
            used[key] = rendered[key]
        else:
            argv = render_argv(spec, variant, **_adaptive_args(load_aware_probe)) if adaptive else render_argv(spec, variant)
            used[key] = m.pod_template(observed.name, spec, variant, argv, revision, settings.manifests, adaptive_config_hash=table_hash)
        templates[variant] = used[key]
    servers = {
        variant: server_state(
            serving_pods(observed.pods, variant),
            templates[variant]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH],
            observed.pod_events,
            None if spec.resources.gpu_family == "any" else str(spec.resources.gpu_family),
        )
        for variant in (BASE, SPECULATIVE)
    }
    children = {**observed.deployments, **observed.services}
    children.update(observed.config_maps)
    own_names = (m.child_name(observed.name, BASE), m.child_name(observed.name, SPECULATIVE), observed.name) + (
        (m.adaptive_config_map_name(observed.name),) if load_aware_probe is not None and m.adaptive_config_mounted(spec) else ()
    )
    conflicts = sorted(n for n in own_names if n in children and not owned_by(children[n], observed.uid))
    return Facts(spec, observed, prev, now, revision, settings, templates, servers, conflicts, load_aware_probe, groups, used)


def _leader_worker_set(
    spec: SpeculativeServerSpec,
    observed: Observed,
    variant: Variant,
    revision: str,
    settings: Settings,
    render_argv: RenderArgv,
    table_hash: str | None,
    load_aware_probe: LoadAwareProbe | None = None,
) -> dict[str, Any]:
    """A variant's LeaderWorkerSet (multi-node), rendered with 0 replicas: the count is set per step."""
    extra = _adaptive_args(load_aware_probe) if table_hash else {}
    return m.leader_worker_set(
        observed.name,
        observed.namespace,
        spec,
        variant,
        leader_command=render_argv(spec, variant, **extra),
        worker_command=render_argv(spec, variant, worker=True, **extra),
        replicas=0,
        revision=revision,
        settings=settings.manifests,
        adaptive_config_hash=table_hash,
    )


def serving_pods(pods: list[dict[str, Any]], variant: Variant) -> list[dict[str, Any]]:
    """A variant's pods that serve: all of them, or of multi-node groups the leaders (a group is Ready when its leader is)."""
    return [p for p in pods_of(pods, variant) if labels_of(p).get(m.LABEL_ROLE) != m.ROLE_WORKER]
