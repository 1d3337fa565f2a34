"""The operator's own Prometheus metrics (prometheus-client), served on --metrics-port at /metrics.

Per SpeculativeServer (labels namespace, name): the measured speedup, the acceptance length (probe, then the
drift monitor), which variant the stable Service selects, and the phase. Counters: probes by outcome reason,
the probes' GPU-seconds, rollbacks by reason, reconcile errors; a histogram of reconcile step durations.

A registry per operator instance (not the process-global default), so that tests can run several operators in
one process and read their metrics apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from ..api import CandidateState, Phase, Reason, Variant


class ServerRecord(NamedTuple):
    phase: str | None
    active_variant: str | None
    speedup: float | None
    accept_length: float | None
    reason: str | None = None
    gpus: dict[str, int] | None = None  # status.gpus: base, speculative, idle
    # The sides that waited past spec.progressDeadlineSeconds (deadline_sides): a speculative side given up for
    # its revision while the base serves is not the base failing to serve, and the alerts tell them apart.
    deadline: frozenset[str] = frozenset()
    race: dict[str, int] | None = None  # a race of candidates: how many candidates are in each state (status.candidates)


def race_states(status: dict) -> dict[str, int] | None:
    """How many of a race's candidates are in each state; None without a race. The candidates' names are no label: the
    series stay as many as the states (bounded), whatever the candidates are called."""
    if not status.get("race"):
        return None
    counts: dict[str, int] = {}
    for row in status.get("candidates") or []:
        counts[row.get("state") or "Waiting"] = counts.get(row.get("state") or "Waiting", 0) + 1
    return counts


def deadline_sides(status: dict) -> frozenset[str]:
    """The variants whose wait passed spec.progressDeadlineSeconds (reconcile/deadline.py): the base when the phase
    is Failed with ProgressDeadlineExceeded (nothing serves on the current template), the speculative side when the
    revision's decision is a ProgressDeadlineExceeded rollback (status.probe; the base serves)."""
    exceeded = Reason.PROGRESS_DEADLINE_EXCEEDED.value
    sides = set()
    if status.get("phase") == Phase.FAILED.value and status.get("reason") == exceeded:
        sides.add(Variant.BASE.value)
    if ((status.get("probe") or {}).get("reason")) == exceeded:
        sides.add(Variant.SPECULATIVE.value)
    return frozenset(sides)


class ServerStatusCollector:
    """specdec_speedup, specdec_accept_length, specdec_active_variant and specdec_phase of every resource."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], ServerRecord] = {}

    def observe(self, namespace: str, name: str, status: dict) -> None:
        old = self.records.get((namespace, name))
        speedup, accept = status.get("speedup"), status.get("acceptLength")
        self.records[(namespace, name)] = ServerRecord(
            status.get("phase"),
            status.get("activeVariant"),
            float(speedup) if speedup is not None else (old.speedup if old else None),
            float(accept) if accept is not None else (old.accept_length if old else None),
            status.get("reason"),
            {k: int(v) for k, v in (status.get("gpus") or {}).items() if isinstance(v, int)} if status.get("gpus") else None,
            deadline_sides(status),
            race_states(status),
        )

    def forget(self, namespace: str, name: str) -> None:
        self.records.pop((namespace, name), None)

    def describe(self) -> list[Metric]:
        return []  # nothing to check against other collectors' names at registration

    def collect(self) -> Iterator[Metric]:
        speedup = GaugeMetricFamily(
            "specdec_speedup", "Measured speedup of the speculative server over its base (last probe).", labels=["namespace", "name"]
        )
        accept = GaugeMetricFamily(
            "specdec_accept_length", "Acceptance length of the speculative server (probe, then drift monitor).", labels=["namespace", "name"]
        )
        active = GaugeMetricFamily(
            "specdec_active_variant", "1 for the variant the stable Service selects, 0 for the other.", labels=["namespace", "name", "variant"]
        )
        phase = GaugeMetricFamily("specdec_phase", "1 for the current phase of each SpeculativeServer.", labels=["namespace", "name", "phase"])
        deadline = GaugeMetricFamily(
            "specdec_progress_deadline_exceeded",
            "1 while a side of a SpeculativeServer has waited past spec.progressDeadlineSeconds: variant base (phase Failed, "
            "reason ProgressDeadlineExceeded; nothing serves on the current template) or speculative (the revision rolled back "
            "with ProgressDeadlineExceeded; the base serves).",
            labels=["namespace", "name", "variant"],
        )
        gpus = GaugeMetricFamily("specdec_gpus", "GPUs held by each variant's pods (status.gpus).", labels=["namespace", "name", "variant"])
        idle = GaugeMetricFamily(
            "specdec_idle_gpus",
            "GPUs held by servers that serve no traffic and are not being probed (a warm base, a kept loser, pods going away).",
            labels=["namespace", "name"],
        )
        race = GaugeMetricFamily(
            "specdec_race_candidates",
            "Candidates of a race (spec.candidates) in each state: Waiting, Measuring, Passed, Serving, Lost, Eliminated, "
            "Skipped, Invalid, Drifted (status.candidates).",
            labels=["namespace", "name", "state"],
        )
        # Scrapes run on the HTTP server's thread: iterate over a copy (taken under the GIL) of the records.
        for (namespace, name), record in sorted(self.records.copy().items()):
            if record.speedup is not None:
                speedup.add_metric([namespace, name], record.speedup)
            if record.accept_length is not None:
                accept.add_metric([namespace, name], record.accept_length)
            for variant in Variant:
                active.add_metric([namespace, name, variant.value], 1.0 if record.active_variant == variant.value else 0.0)
            for value in Phase:
                phase.add_metric([namespace, name, value.value], 1.0 if record.phase == value.value else 0.0)
            for variant in Variant:
                deadline.add_metric([namespace, name, variant.value], 1.0 if variant.value in record.deadline else 0.0)
            if record.gpus is not None:
                for variant in Variant:
                    gpus.add_metric([namespace, name, variant.value], float(record.gpus.get(variant.value, 0)))
                idle.add_metric([namespace, name], float(record.gpus.get("idle", 0)))
            if record.race is not None:
                for state in get_args(CandidateState):
                    race.add_metric([namespace, name, state], float(record.race.get(state, 0)))
        yield from (speedup, accept, active, phase, deadline, gpus, idle, race)


class OperatorMetrics:
    """All metrics of one operator instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # The per-object gauges are produced at scrape time from one small record per resource (as
        # kube-state-metrics does): a labelled Gauge child per series cost 8.4 MB per 1,000 resources (12 series
        # each: the one-hot phase and variant), the records a few hundred KB (docs/scale.md).
        self.servers = ServerStatusCollector()
        r.register(self.servers)
        # Counters carry namespace and name too, so an alert can say which server rolled back.
        self.probes = Counter(
            "specdec_probes_total", "Probes finished, by decision and reason.", ["namespace", "name", "decision", "reason"], registry=r
        )
        # What the decisions cost (status.probe.gpuSeconds of each probe): per resource, as the probes counter.
        self.probe_gpu_seconds = Counter(
            "specdec_probe_gpu_seconds_total",
            "GPU-seconds the finished probes held: the two probed servers' declared GPUs times each probe's time.",
            ["namespace", "name"],
            registry=r,
        )
        self.rollbacks = Counter(
            "specdec_rollbacks_total", "Rollbacks (probe decisions and drift), by reason.", ["namespace", "name", "reason"], registry=r
        )
        self.reconcile_errors = Counter("specdec_reconcile_errors_total", "Reconcile steps that failed (retried).", ["kind"], registry=r)
        self.reconcile_seconds = Histogram(
            "specdec_reconcile_duration_seconds",
            "Duration of one reconcile step (observe, decide, apply).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        # Seen from the client: when steps are slow, this says whether the API server is the slow part.
        self.api_request_seconds = Histogram(
            "specdec_api_request_duration_seconds",
            "Duration of the operator's own Kubernetes API requests (not Kopf's watches), by verb and resource.",
            ["verb", "resource"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.reconcile_queue_seconds = Histogram(
            "specdec_reconcile_queue_seconds",
            "How long a woken resource waited for a step slot (--max-concurrent-reconciles) before its step ran.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )

    def observe_status(self, namespace: str, name: str, status: dict) -> None:
        """Refresh the per-object gauges from a status (a speedup or acceptance length, once measured, is kept)."""
        self.servers.observe(namespace, name, status)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-object series of a deleted SpeculativeServer."""
        for counter in (self.probes, self.probe_gpu_seconds, self.rollbacks):
            for labels in [key for key in _label_sets(counter) if key[:2] == (namespace, name)]:
                counter.remove(*labels)
        self.servers.forget(namespace, name)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose /metrics on a background thread."""
        start_http_server(port, addr=addr, registry=self.registry)


def _label_sets(metric) -> list[tuple[str, ...]]:
    """Label values of every child of a labelled metric (prometheus-client keeps them in _metrics)."""
    with metric._lock:
        return list(metric._metrics)
