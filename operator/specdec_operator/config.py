"""What `specdec run` configures about the operator: where Services are reached, intervals, bounds."""

from __future__ import annotations

import dataclasses

import yaml

from . import manifests as m
from .errors import InputError
from .reconcile import Settings


class Endpoints:
    """Where the operator reaches a Service: cluster DNS, or an explicit mapping (operator configuration).

    The mapping (``namespace/service: URL``) is for an operator running outside the cluster (a laptop, the
    tests); it comes from the operator's command line, never from a custom resource.
    """

    def __init__(self, mapping: dict[str, str] | None = None, port: int = m.DEFAULT_PORT, domain: str = "svc") -> None:
        self.mapping = dict(mapping or {})
        self.port = port
        self.domain = domain

    @classmethod
    def from_file(cls, path: str, port: int = m.DEFAULT_PORT) -> Endpoints:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise InputError(f"--endpoints {path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"--endpoints {path}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"--endpoints {path}: must map 'namespace/service' to 'http://host:port'")
        for key, url in data.items():
            if not isinstance(key, str) or key.count("/") != 1 or not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise InputError(f"--endpoints {path}: entry {key!r}: must map 'namespace/service' to an http(s) URL, got {url!r}")
        return cls(data, port)

    def url(self, namespace: str, service: str) -> str:
        mapped = self.mapping.get(f"{namespace}/{service}")
        if mapped:
            return mapped.rstrip("/")
        return f"http://{service}.{namespace}.{self.domain}:{self.port}"


@dataclasses.dataclass
class OperatorConfig:
    """Everything `specdec run` configures about the handlers."""

    reconcile: Settings = dataclasses.field(default_factory=Settings)
    endpoints: Endpoints = dataclasses.field(default_factory=Endpoints)
    reconcile_interval: float = 10.0  # seconds between steps while a resource changes with time (loading, probing)
    # Seconds between steps of a settled resource (decided, its servers ready): a safety net only, since every
    # change that matters then arrives as an event. At 10 s, 1,000 settled resources kept 0.4 cores busy.
    resync_interval: float = 300.0
    probe_timeout: float = 3600.0  # bound of one whole probe (Inconclusive when spent)
    probe_request_timeout: float = 600.0
    scrape_timeout: float = 10.0
    # Probes measure throughput from this process: too many at once and the client, not the servers, sets the
    # pace (one probe streaming 28k tok/s takes 15 % of a core, docs/probe.md), biasing every measurement.
    max_concurrent_probes: int = 8
    # Steps making API calls at once (controller-runtime's MaxConcurrentReconciles). Without a bound, 1,000
    # resources woken together queued several thousand calls behind the client's connections, so every step
    # waited for all the others; bounded, a woken resource waits its turn (specdec_reconcile_queue_seconds) and
    # its step then runs at the API server's own pace.
    max_concurrent_reconciles: int = 16
    # A resource is stepped at most this often: child events arriving closer together (a pod scheduled,
    # started, ready within a second) are merged into one step and at most one status write.
    min_step_interval: float = 1.0
