"""A race's speculative slot pointed at the simulator of the candidate in it, outside a cluster (issue 35).

A race's candidates take the speculative server's slot one after another: the operator re-renders ``<name>-spec``'s
Deployment for each, with the candidate's speculative revision in its pod template (``specdec.io/revision``,
reconcile/candidate_race.py ``revisions``). On the local control plane nothing runs in the pods (kwok plays the
kubelets) and the operator reaches each server through ``--endpoints`` (``<namespace>/<name>-spec`` -> URL), so a
simulator must stand behind the slot for whichever candidate is in it: each candidate has its own simulator profile.

:class:`SlotRouter` follows the speculative Deployments and maps each slot's Service to the simulator of the candidate
whose revision the template carries, by rewriting the endpoints file (the operator reads it again when it changes:
controller/config.py ``Endpoints.refresh``; written whole and renamed into place, so it never reads half a file).
It re-points the mapping rather than proxying requests: a proxy in front of the speculative side only would add its
latency to one side of every paired round and bias the measured speedups down, most for the fastest candidate.

From a cluster test (the `operator` and `sims` fixtures, tests/support/operator_process.py)::

    routes = {"eagle3": sims.start("llama31-8b-eagle3").url, "ngram": sims.start("llama31-8b-ngram").url}
    operator.map(f"{name}-base", sims.start("llama31-8b-base").url)
    operator.start()                                 # writes tmp_path/endpoints.yaml from operator.endpoints
    router = SlotRouter(tmp_path / "endpoints.yaml", namespace, deployment_revisions(apps_v1))
    router.fixed = dict(operator.endpoints)          # the base Services and anything else mapped by hand
    router.add_race(name, cr["spec"], routes)        # rewrites the file: the fixed entries and the slot
    router.start(); ...; router.stop()

The router owns the file once started: ``Operator.start`` (a restart too) rewrites it from ``operator.endpoints``
alone, so call ``router.write()`` after any restart.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from specdec_operator import manifests as m
from specdec_operator.api import Variant
from specdec_operator.reconcile.candidate_race import revisions
from specdec_operator.resource import parse_spec

# namespace -> {Deployment name: the revision in its pod template}, read from the API server
ReadRevisions = Callable[[str], Mapping[str, str]]


def candidate_revisions(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each candidate's speculative revision (name -> revision), as the operator computes it from the spec."""
    return revisions(parse_spec(dict(spec), check_rules=True))


def slot_name(name: str) -> str:
    """The speculative slot's Deployment and Service: ``<name>-spec``."""
    return m.child_name(name, Variant.SPECULATIVE.value)


def template_revisions(deployments: list[dict[str, Any]]) -> dict[str, str]:
    """{Deployment name: specdec.io/revision of its pod template} of the Deployments that carry one (API objects as
    dicts). Pure."""
    out = {}
    for d in deployments:
        template = ((d.get("spec") or {}).get("template") or {}).get("metadata") or {}
        revision = (template.get("annotations") or {}).get(m.ANNOTATION_REVISION)
        if revision:
            out[d["metadata"]["name"]] = revision
    return out


def deployment_revisions(apps_v1: Any) -> ReadRevisions:
    """A ReadRevisions over a kubernetes AppsV1Api: one list of the namespace's speculative Deployments per call."""
    api_client = apps_v1.api_client

    def read(namespace: str) -> Mapping[str, str]:
        listed = apps_v1.list_namespaced_deployment(namespace, label_selector=f"{m.LABEL_VARIANT}={Variant.SPECULATIVE.value}")
        return template_revisions([api_client.sanitize_for_serialization(d) for d in listed.items])

    return read


def kubeconfig_revisions(kubeconfig: str) -> ReadRevisions:
    """deployment_revisions with a client of its own for ``kubeconfig`` (the demo: no test fixtures)."""
    from kubernetes import client, config

    return deployment_revisions(client.AppsV1Api(config.new_client_from_config(config_file=kubeconfig)))


class SlotRouter:
    """Keeps ``<namespace>/<name>-spec`` in the endpoints file on the simulator of the candidate in each race's slot."""

    def __init__(self, endpoints_file: Path, namespace: str, read_revisions: ReadRevisions, interval: float = 0.3) -> None:
        self.path = Path(endpoints_file)
        self.namespace = namespace
        self.read_revisions = read_revisions
        self.interval = interval
        self.fixed: dict[str, str] = {}  # every other mapping of the file ('namespace/service' -> URL)
        self.routes: dict[str, dict[str, tuple[str, str]]] = {}  # slot Deployment -> revision -> (candidate, URL)
        self.current: dict[str, str] = {}  # slot Deployment -> the candidate it points at
        self.switches: list[tuple[float, str, str]] = []  # (monotonic time, resource, candidate): each re-pointing
        self.errors = 0  # failed reads of the Deployments (the API server restarting): the last mapping stays
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_race(self, name: str, spec: Mapping[str, Any], urls: Mapping[str, str]) -> dict[str, str]:
        """Route resource ``name``'s slot: ``urls`` maps each candidate of ``spec`` to its simulator. Until the operator
        renders the slot it points at the first candidate's. Returns the candidates' revisions."""
        revs = candidate_revisions(spec)
        missing = sorted(set(revs) - set(urls))
        if missing:
            raise ValueError(f"race {name}: no simulator for candidate(s) {', '.join(missing)} (candidates: {', '.join(revs)})")
        self.routes[slot_name(name)] = {rev: (cand, urls[cand]) for cand, rev in revs.items()}
        self.current[slot_name(name)] = next(iter(revs))
        self.write()
        return revs

    def mapping(self) -> dict[str, str]:
        """The endpoints file's mapping now: the fixed entries and each slot's current candidate."""
        out = dict(self.fixed)
        for slot, candidate in self.current.items():
            url = next(u for c, u in self.routes[slot].values() if c == candidate)
            out[f"{self.namespace}/{slot}"] = url
        return out

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(yaml.safe_dump(self.mapping()))
        os.replace(tmp, self.path)

    def follow(self, templates: Mapping[str, str]) -> list[tuple[str, str]]:
        """Re-point every slot whose template now carries another candidate's revision; the (slot, candidate) pairs
        that changed (the file rewritten once for all). A revision of no candidate (the spec changed) is left alone."""
        changed = []
        for slot, routes in self.routes.items():
            found = routes.get(templates.get(slot, ""))
            if found is not None and found[0] != self.current.get(slot):
                self.current[slot] = found[0]
                changed.append((slot, found[0]))
        if changed:
            self.write()
            now = time.monotonic()
            self.switches += [(now, slot.removesuffix("-spec"), cand) for slot, cand in changed]
        return changed

    def poll(self) -> list[tuple[str, str]]:
        try:
            templates = self.read_revisions(self.namespace)
        except Exception:  # the API server is unavailable for a moment: keep the mapping, try again
            self.errors += 1
            return []
        return self.follow(templates)

    def start(self) -> SlotRouter:
        def run() -> None:
            while not self._stop.wait(self.interval):
                self.poll()

        self.write()
        self._thread = threading.Thread(target=run, name="slot-router", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
