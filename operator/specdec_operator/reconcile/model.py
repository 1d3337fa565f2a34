"""What one reconcile step takes and gives: the operator's settings, what was observed, the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .. import manifests as m
from ..api import LoadAwareStatus, ProbeStatus, SpeculativeServerSpec, SpeculativeServerStatus
from ..monitor import Sample
from ..resource import dump
from ..trainjob import TrainingJobSettings


@dataclass(frozen=True)
class Settings:
    """Operator settings the decisions depend on."""

    manifests: m.ManifestSettings = m.ManifestSettings()
    # A speculative server whose main container restarted this often (CrashLoopBackOff) is given up on:
    # the decision for its revision is ProbeFailed and it is scaled to 0 instead of holding its GPUs.
    crash_restart_limit: int = 3
    # Races of candidates measured at once over the whole operator (specdec run --max-concurrent-races; None: no
    # limit): a race holds a speculative server's GPUs for as long as it runs, and a Kimi server is 8 GPUs.
    max_concurrent_races: int | None = None
    # Training Jobs (spec.retraining.training): image, priority class, the cluster-wide cap (trainjob.py).
    training: TrainingJobSettings = TrainingJobSettings()


@dataclass(frozen=True)
class ApiRefusal:
    """A request the API server refused (the controller caught it): reconcile decides whether status says so."""

    status: int  # the HTTP status
    message: str  # the message of the API server's Status answer, or the HTTP reason
    body: str = ""  # the answer as it came (server-side apply's typed-patch failures are told by it)


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
    # Events about those pods (read while a server waits): the kubelet reports a volume that does not mount only
    # there (FailedMount), never in the pod's status (reconcile/stuck.py).
    pod_events: list[dict[str, Any]] = field(default_factory=list)
    # The resource's own metadata.annotations: the specdec.io/* requests made by hand (steering.py).
    annotations: Mapping[str, str] = field(default_factory=dict)
    probe_running: str | None = None  # what the probe task running in this process measures (Facts.probe_id), if any
    probe_result: ProbeStatus | None = None  # a probe that just finished (its revision set; loadAware set: the adaptive server's)
    probe_progress: str | None = None  # what the running probe has done so far ("round 2 of up to 6")
    # A metrics scrape of every Ready speculative pod taken for this step (pod name -> Sample), and the pods'
    # scrapes before it (they tell an idle server from a working one, and give the verify calls in between).
    scrape: Mapping[str, Sample] | None = None
    previous_scrape: Mapping[str, Sample] | None = None
    # Why the spec cannot be served at all, as the controller found it: the spec did not parse (its one-line
    # error), the cluster does not serve LeaderWorkerSets (asked only for multi-node specs), or a request of the
    # last step was refused. reconcile turns each into phase Failed (refused.py).
    spec_error: str | None = None
    leader_worker_sets_served: bool = True
    api_refusal: ApiRefusal | None = None
    # Races of candidates running in other resources now (status.race.state Running): against Settings.max_concurrent_races.
    races_elsewhere: int = 0
    # spec.retraining.training (reconcile/training.py): this resource's training Jobs by name (the Job index), the pods of
    # those Jobs, the operator's training Jobs still active in the whole cluster (the cap), the captured conversations
    # as the capture proxies count them (controller/capturecount.py; None: not known now), and the Warning Events of
    # its Jobs that have no pod (read only then: the Job controller tells a quota's refusal there).
    training_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    training_pods: list[dict[str, Any]] = field(default_factory=list)
    training_jobs_running: int = 0
    captured_samples: int | None = None
    # (the last training Job's startedAt, the conversations captured at or after it) as the proxies count them: the
    # "new since" of the lost-retrain rule, which retention deleting old files does not lower (None: not known)
    captured_since: tuple[str, int] | None = None
    training_events: list[dict[str, Any]] = field(default_factory=list)  # Warning Events of training Jobs without a pod

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


@dataclass(frozen=True)
class StartProbe:
    """Start a probe of this resource (stopping the one running, which measures something else)."""

    probe_id: str  # what it measures: the revision, or "<revision>/adaptive-<table hash>" (the load-aware probe)
    revision: str
    # The load-aware probe: the adaptive table the speculative server runs (its result carries it). None: a plain probe.
    load_aware_probe: LoadAwareStatus | None = None
    # A candidate of a race (reconcile/candidate_race.py): the arms the error budget is shared with over the race, and
    # the best low end a candidate measured before passed with (below it this one cannot win). RaceRules.family/bar.
    family: int = 1
    bar: float | None = None
    candidate: str | None = None  # the race's candidate this probe measures (its name), None outside a race
    # The spec the probe measures under: a race's candidate's (candidate_race.measured_spec: its method in spec.drafter's
    # place, decided plainly), None for the resource's own.
    spec: SpeculativeServerSpec | None = None


@dataclass(frozen=True)
class StopProbe:
    """Stop the running probe: it measures something else (another revision, the plain server) or must not go on."""


ProbeAction = StartProbe | StopProbe


@dataclass
class Plan:
    """What to do now."""

    revision: str
    apply: list[dict[str, Any]]  # children to create or update (server-side apply; owner reference added by the caller)
    new_status: SpeculativeServerStatus  # the complete new status
    events: list[Event]  # derived from the stored and the new status (events.transition_events)
    probe: ProbeAction | None = None  # start or stop this resource's probe; None: leave it as it is
    monitor_due: bool = False  # the speculative server should be scraped now (checked before the next step)
    next_scrape_in: float | None = None  # seconds until the next scrape is due (None: no monitoring)
    # Decided, and every server that should run is ready: nothing in the status changes with time alone, so only
    # an event (or the slow resync) needs a step. Unsettled resources are stepped often (deadlines, probe progress).
    settled: bool = False
    # Apply the Services before the Deployments: an existing Service is re-pointed while a Deployment changes
    # (traffic must leave a server before it is scaled to 0). Otherwise everything is applied at once.
    switch_first: bool = False
    # Server objects of the other kind to delete (a resources.nodes change, retire.py), after this plan's applies:
    # {"apiVersion", "kind", "metadata": {"name", "namespace", "uid"}}.
    delete: list[dict[str, Any]] = field(default_factory=list)
    # The pod templates (and LeaderWorkerSets) this step used, by variant and table: the caller keeps them for the
    # next step of the same generation and hands them back (rendering them was a third of a step's CPU).
    rendered: dict[str, Any] = field(default_factory=dict)
    # The spec is not served (InvalidSpec, LeaderWorkerSetMissing, an API refusal: refused.py): only the status
    # and its Events are written; no child, no probe.
    refused: bool = False
    # The revisions of a race's candidates whose probe results this step recorded (their metrics are counted as the
    # plan's own revision's are).
    measured: tuple[str, ...] = ()
    # Seconds until a step is due for a time this plan waits on (a training Job's cooldown or maxPerDay ending).
    next_step_in: float | None = None

    @property
    def starts_probe(self) -> bool:
        return isinstance(self.probe, StartProbe)

    @property
    def stops_probe(self) -> bool:
        """The running probe, if any, stops (a probe started by this plan replaces it)."""
        return self.probe is not None

    @cached_property
    def status(self) -> dict[str, Any]:
        """The new status as the API server stores it (camelCase); every top-level field present, None if unset."""
        return status_document(self.new_status)


def status_document(status: SpeculativeServerStatus) -> dict[str, Any]:
    """``dump(status)`` with every top-level field present (None when unset): a merge patch from it removes them."""
    fields = {info.alias or name: None for name, info in SpeculativeServerStatus.model_fields.items()}
    return {**fields, **dump(status)}
