"""The Helm chart as the tests render it (the real helm binary), and what the operator does with the API: the
rules the chart's RBAC must grant, checked statically (tests/unit/test_chart.py) and with `kubectl auth can-i`
(tests/cluster/test_chart_cluster.py)."""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specdec-operator"


def helm(helm_bin: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


def render(
    helm_bin: str, values: pathlib.Path | None = None, *extra: str, namespace: str = "specdec-system", crds: bool = False
) -> list[dict[str, Any]]:
    args = ["template", "specdec", str(CHART), "--namespace", namespace, *extra]
    if crds:
        args.append("--include-crds")
    if values is not None:
        args += ["--values", str(values)]
    out = helm(helm_bin, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# What the operator does with the API, as measured by tests/cluster/test_chart_cluster.py: (apiGroup, resource) -> verbs.
OPERATOR_NAMESPACED_USAGE: dict[tuple[str, str], set[str]] = {
    ("specdec.io", "speculativeservers"): {"list", "watch", "patch"},
    ("specdec.io", "speculativeservers/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},  # delete: <name>-serving, capture turned off
    ("", "persistentvolumeclaims"): {"get", "create", "patch", "delete"},  # spec.retraining.capture's claim (docs/capture.md)
    ("batch", "jobs"): {"get", "list", "watch", "create", "patch"},  # spec.retraining.training's Jobs (docs/retraining.md)
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},  # delete: a probe's spent evidence
    ("", "pods"): {"list", "watch", "create", "delete"},  # create, delete: a File dataset's reader pod
    ("", "events"): {"create", "list"},  # list: the Warning Events of a waiting pod (reconcile/stuck.py)
}
CRD_DISCOVERY: dict[tuple[str, str], set[str]] = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
# Namespaced mode only: Kopf lists namespaces to resolve --namespace patterns (serving all, it does not).
NAMESPACE_DISCOVERY: dict[tuple[str, str], set[str]] = {("", "namespaces"): {"list", "watch"}}
DISCOVERY_USAGE = {**CRD_DISCOVERY, **NAMESPACE_DISCOVERY}
PEERING_VERBS = {"list", "watch", "patch"}  # the chart creates the peering object itself; patch names it


def api_request_kinds(method: str, path: str, query: str, status: int) -> list[tuple[str, str, str]]:
    """What the RBAC authorizer checked for one request: a server-side apply (PATCH) that created the object
    (201) was also authorized as create."""
    kind = api_request_kind(method, path, query)
    if kind is None:
        return []
    return [kind, ("create", kind[1], kind[2])] if method == "PATCH" and status == 201 else [kind]


def api_request_kind(method: str, path: str, query: str) -> tuple[str, str, str] | None:
    """(verb, apiGroup, resource[/subresource]) of a resource request, as the RBAC authorizer sees it.

    None for discovery and other non-resource URLs (/api, /apis, /apis/<group>/<version>, /version, ...).
    """
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource: drop "namespaces/<ns>"
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    watch = re.search(r"(^|&)watch=(true|1)($|&)", query) is not None
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return verb, group, f"{resource}/{sub}" if sub else resource
