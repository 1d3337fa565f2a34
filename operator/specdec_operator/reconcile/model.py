"""What one reconcile step takes and gives: the operator's settings, what was observed, the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .. import manifests as m
from ..api import ProbeStatus, SpeculativeServerStatus
from ..monitor import Sample
from ..resource import dump


@dataclass(frozen=True)
class Settings:
    """Operator settings the decisions depend on."""

    manifests: m.ManifestSettings = m.ManifestSettings()
    # A speculative server whose main container restarted this often (CrashLoopBackOff) is given up on:
    # the decision for its revision is ProbeFailed and it is scaled to 0 instead of holding its GPUs.
    crash_restart_limit: int = 3


@dataclass(frozen=True)
class Observed:
    """What the handlers saw in the cluster (and in their own process) for one SpeculativeServer."""

    name: str
    namespace: str
    uid: str
    generation: int
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name (and the LeaderWorkerSets of multi-node servers)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name
    config_maps: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name (the adaptive table's)
    # Server objects of the kind the spec no longer uses (Deployments of a spec now at resources.nodes > 1, or
    # LeaderWorkerSets of one now at 1), by object name: replaced by the other kind, then deleted (retire.py).
    retiring: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)  # pods labelled with this instance
    probe_running: str | None = None  # what the probe task running in this process measures (Facts.probe_id), if any
    probe_result: ProbeStatus | None = None  # a probe that just finished (its revision set; loadAware set: the adaptive server's)
    probe_progress: str | None = None  # what the running probe has done so far ("round 2 of up to 6")
    # A metrics scrape of every Ready speculative pod taken for this step (pod name -> Sample), and the pods'
    # scrapes before it (they tell an idle server from a working one, and give the verify calls in between).
    scrape: Mapping[str, Sample] | None = None
    previous_scrape: Mapping[str, Sample] | None = None

    def __post_init__(self) -> None:
        # A result written by hand (tests, tools) may come as status.probe's camelCase mapping.
        if isinstance(self.probe_result, Mapping):
            object.__setattr__(self, "probe_result", ProbeStatus.model_validate(self.probe_result))
        # A lone Sample (tests, tools): the scrape of the one speculative pod.
        for name in ("scrape", "previous_scrape"):
            value = getattr(self, name)
            if isinstance(value, Sample):
                object.__setattr__(self, name, {m.child_name(self.name, "speculative"): value})


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str
    rollback: bool = False  # the Event announces a rollback decision (counted in specdec_rollbacks_total)


@dataclass
class Plan:
    """What to do now."""

    revision: str
    apply: list[dict[str, Any]]  # children to create or update (server-side apply; owner reference added by the caller)
    new_status: SpeculativeServerStatus  # the complete new status
    events: list[Event]  # derived from the stored and the new status (events.transition_events)
    start_probe: bool  # start a probe of `probe_id` (none is running in this process)
    cancel_probe: bool  # the running probe measures something else (another revision, the plain server) or must not go on
    monitor_due: bool  # the speculative server should be scraped now (checked before the next step)
    next_scrape_in: float | None = None  # seconds until the next scrape is due (None: no monitoring)
    # Decided, and every server that should run is ready: nothing in the status changes with time alone, so only
    # an event (or the slow resync) needs a step. Unsettled resources are stepped often (deadlines, probe progress).
    settled: bool = False
    # Apply the Services before the Deployments: an existing Service is re-pointed while a Deployment changes
    # (traffic must leave a server before it is scaled to 0). Otherwise everything is applied at once.
    switch_first: bool = False
    desired: list[dict[str, Any]] = field(default_factory=list)  # all children this object should have
    probe_id: str = ""  # what a probe started now measures: the revision, or "<revision>/adaptive-<table hash>"
    adaptive_probe: bool = False  # the probe to start measures the load-aware (adaptive) speculative server
    # Server objects of the other kind to delete (a resources.nodes change, retire.py), after this plan's applies:
    # {"apiVersion", "kind", "metadata": {"name", "namespace", "uid"}}.
    delete: list[dict[str, Any]] = field(default_factory=list)

    @cached_property
    def status(self) -> dict[str, Any]:
        """The new status as the API server stores it (camelCase); every top-level field present, None if unset."""
        return status_document(self.new_status)


def status_document(status: SpeculativeServerStatus) -> dict[str, Any]:
    """``dump(status)`` with every top-level field present (None when unset): a merge patch from it removes them."""
    fields = {info.alias or name: None for name, info in SpeculativeServerStatus.model_fields.items()}
    return {**fields, **dump(status)}
