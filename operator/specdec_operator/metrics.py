"""The operator's own Prometheus metrics (prometheus-client), served on --metrics-port at /metrics.

Per SpeculativeServer (labels namespace, name): the measured speedup, the acceptance length (probe, then the
drift monitor), which variant the stable Service selects, and the phase. Counters: probes by outcome reason,
rollbacks by reason, reconcile errors; a histogram of reconcile step durations.

A registry per operator instance (not the process-global default), so that tests can run several operators in
one process and read their metrics apart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .api import Phase, Variant


class OperatorMetrics:
    """All metrics of one operator instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.speedup = Gauge("specdec_speedup", "Measured speedup of the speculative server over its base (last probe).", ["namespace", "name"], registry=r)
        self.accept_length = Gauge(
            "specdec_accept_length", "Acceptance length of the speculative server (probe, then drift monitor).", ["namespace", "name"], registry=r
        )
        self.active_variant = Gauge(
            "specdec_active_variant", "1 for the variant the stable Service selects, 0 for the other.", ["namespace", "name", "variant"], registry=r
        )
        self.phase = Gauge("specdec_phase", "1 for the current phase of each SpeculativeServer.", ["namespace", "name", "phase"], registry=r)
        # Counters carry namespace and name too, so an alert can say which server rolled back.
        self.probes = Counter("specdec_probes_total", "Probes finished, by decision and reason.", ["namespace", "name", "decision", "reason"], registry=r)
        self.rollbacks = Counter("specdec_rollbacks_total", "Rollbacks (probe decisions and drift), by reason.", ["namespace", "name", "reason"], registry=r)
        self.reconcile_errors = Counter("specdec_reconcile_errors_total", "Reconcile steps that failed (retried).", ["kind"], registry=r)
        self.reconcile_seconds = Histogram(
            "specdec_reconcile_duration_seconds",
            "Duration of one reconcile step (observe, decide, apply).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )

    def observe_status(self, namespace: str, name: str, status: dict) -> None:
        """Refresh the per-object gauges from a status."""
        if status.get("speedup") is not None:
            self.speedup.labels(namespace, name).set(float(status["speedup"]))
        if status.get("acceptLength") is not None:
            self.accept_length.labels(namespace, name).set(float(status["acceptLength"]))
        active = status.get("activeVariant")
        for variant in Variant:
            self.active_variant.labels(namespace, name, variant.value).set(1.0 if active == variant.value else 0.0)
        for phase in Phase:
            self.phase.labels(namespace, name, phase.value).set(1.0 if status.get("phase") == phase.value else 0.0)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-object series of a deleted SpeculativeServer."""
        for counter in (self.probes, self.rollbacks):
            for labels in [key for key in _label_sets(counter) if key[:2] == (namespace, name)]:
                counter.remove(*labels)
        for gauge in (self.speedup, self.accept_length):
            try:
                gauge.remove(namespace, name)
            except KeyError:
                pass
        for variant in Variant:
            try:
                self.active_variant.remove(namespace, name, variant.value)
            except KeyError:
                pass
        for phase in Phase:
            try:
                self.phase.remove(namespace, name, phase.value)
            except KeyError:
                pass

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose /metrics on a background thread."""
        start_http_server(port, addr=addr, registry=self.registry)


def _label_sets(metric) -> list[tuple[str, ...]]:
    """Label values of every child of a labelled metric (prometheus-client keeps them in _metrics)."""
    with metric._lock:
        return list(metric._metrics)
