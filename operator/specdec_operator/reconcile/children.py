"""The children a step wants: the adaptive table's ConfigMap, the three Services, the two servers (Deployments, or
LeaderWorkerSets of multi-node servers), Services first."""

from __future__ import annotations

from typing import Any

from .. import manifests as m
from ..api import (
    Variant,
)
from .capture import observed_capture_child, stored_capture, with_capture
from .facts import BASE, SPECULATIVE, Facts
from .fleet import Fleet
from .model import Observed


def desired_children(facts: Facts, fleet: Fleet | dict[Variant, int], active: Variant, both: bool = False) -> list[dict[str, Any]]:
    """The five children, Services first (see Plan.switch_first), and during load-aware speculation the adaptive
    table's ConfigMap before them all (the speculative pod mounts it).

    While a fleet walks back before its speculative template changes (Fleet.holding), the speculative server is
    replicas-only (manifests.replicas_only): its count changes, its old template stays; so is a fleet's base
    Deployment while its new template waits (Fleet.base_held).

    With spec.retraining.capture on, the capture objects join them (reconcile/capture.py: the claim and
    ``<name>-serving`` before the Services, the proxies' Deployment after the servers; the stable Service selects the
    proxies while one is Ready). No server object changes for capture."""
    name, namespace, ms = facts.name, facts.observed.namespace, facts.settings.manifests
    holding = isinstance(fleet, Fleet) and fleet.holding
    base_held = isinstance(fleet, Fleet) and fleet.base_held  # Deployments only (fleet.base_template_change)
    kind = m.LWS_KIND if facts.leader_worker_sets else "Deployment"
    held = [m.replicas_only(kind, name, namespace, SPECULATIVE, fleet[SPECULATIVE])] if holding else []
    held += [m.replicas_only(kind, name, namespace, BASE, fleet[BASE])] if base_held else []
    if facts.leader_worker_sets:  # multi-node: one LeaderWorkerSet per variant, its Services selecting the leaders
        groups = [m.with_replicas(facts.leader_worker_sets[v], fleet[v]) for v in (BASE, SPECULATIVE) if not (holding and v == SPECULATIVE)]
        leaders = [
            m.service(name, namespace, BASE, settings=ms, leaders_only=True),
            m.service(name, namespace, SPECULATIVE, settings=ms, leaders_only=True),
            m.service(name, namespace, None, active=active, settings=ms, both=both, leaders_only=True),
        ]
        tables = _tables(facts, name, namespace)
        before, proxies = _with_capture(facts, leaders)
        return tables + before + groups + proxies + held
    deployments = [
        m.deployment(
            name,
            namespace,
            facts.spec,
            variant,
            replicas=fleet[variant],
            revision=facts.revision,
            settings=ms,
            template=facts.templates[variant],
        )
        for variant in (BASE, SPECULATIVE)
        if not (holding and variant == SPECULATIVE) and not (base_held and variant == BASE)
    ]
    services = [
        m.service(name, namespace, BASE, settings=ms),
        m.service(name, namespace, SPECULATIVE, settings=ms),
        m.service(name, namespace, None, active=active, settings=ms, both=both),
    ]
    config_maps = _tables(facts, name, namespace)
    before, proxies = _with_capture(facts, services)
    return config_maps + before + deployments + proxies + held


def _with_capture(facts: Facts, services: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Services with the capture objects that go before the servers, and the proxies' Deployment (after them)."""
    captured = with_capture(facts.spec, facts.observed, facts.settings.manifests, services, stored_capture(facts.prev))
    return [o for o in captured if o["kind"] != "Deployment"], [o for o in captured if o["kind"] == "Deployment"]


def _tables(facts: Facts, name: str, namespace: str) -> list[dict[str, Any]]:
    """The load-aware table's ConfigMap, for an engine that reads it from a mounted file (SGLang); vLLM takes the
    table on its command line."""
    if facts.load_aware_probe is None or not m.adaptive_config_mounted(facts.spec):
        return []
    return [m.adaptive_config_map(name, namespace, facts.load_aware_probe.config_json)]


def observed_child(observed: Observed, obj: dict[str, Any]) -> dict[str, Any] | None:
    is_capture, found = observed_capture_child(observed, obj)
    if is_capture:  # the claim is never observed (reconcile/capture.py applies it only with its Deployment)
        return found
    # A variant's LeaderWorkerSet is observed with the Deployments (one server object per variant name).
    children = {"Deployment": observed.deployments, m.LWS_KIND: observed.deployments, "ConfigMap": observed.config_maps}.get(
        obj["kind"], observed.services
    )
    return children.get(obj["metadata"]["name"])
