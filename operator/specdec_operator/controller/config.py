"""What `specdec run` configures about the operator: where Services are reached, intervals, bounds."""

from __future__ import annotations

import dataclasses
import os

import yaml

from .. import manifests as m
from ..errors import InputError
from ..poddefaults import ServerPodDefaults
from ..reconcile import Settings


class Endpoints:
    """Where the operator reaches a Service or a pod: cluster DNS and pod IPs, or an explicit mapping (operator configuration).

    The mapping is for an operator running outside the cluster (a laptop, the tests); it comes from the operator's
    command line, never from a custom resource. Keys: ``namespace/service`` (a variant's Service: the probe, and
    the monitor's fallback for its pods) and ``namespace/pod/<pod>`` (one pod, for the drift monitor). A mapping
    read from a file is read again when the file changes (so a pod created later can be mapped); a file that no
    longer parses keeps the mapping it had, with the error in ``reload_error``.
    """

    def __init__(self, mapping: dict[str, str] | None = None, port: int = m.DEFAULT_PORT, domain: str = "svc", path: str | None = None) -> None:
        self.mapping = dict(mapping or {})
        self.port = port
        self.domain = domain
        self.path = path
        self.reload_error: str | None = None
        self._stamp = _stamp(path) if path else None

    @staticmethod
    def read(path: str) -> dict[str, str]:
        """The mapping in a file (one-line InputError naming the file and the entry when it is not one)."""
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise InputError(f"--endpoints {path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"--endpoints {path}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"--endpoints {path}: must map 'namespace/service' (or 'namespace/pod/<pod>') to 'http://host:port'")
        for key, url in data.items():
            if not _valid_key(key) or not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise InputError(
                    f"--endpoints {path}: entry {key!r}: must map 'namespace/service' or 'namespace/pod/<pod>' to an http(s) URL, got {url!r}"
                )
        return data

    @classmethod
    def from_file(cls, path: str, port: int = m.DEFAULT_PORT) -> Endpoints:
        return cls(cls.read(path), port, path=path)

    def refresh(self) -> None:
        """Read the file again if it changed since it was last read."""
        if self.path is None:
            return
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.mapping, self.reload_error = self.read(self.path), None
        except InputError as exc:
            self.reload_error = str(exc)

    def url(self, namespace: str, service: str) -> str:
        self.refresh()
        mapped = self.mapping.get(f"{namespace}/{service}")
        if mapped:
            return mapped.rstrip("/")
        return f"http://{service}.{namespace}.{self.domain}:{self.port}"

    def pod_url(self, namespace: str, pod: str, pod_ip: str | None, service: str, *, port: int | None = None) -> str | None:
        """Where the monitor scrapes one pod: its mapping, else its variant Service's mapping, else its IP (None: no IP yet).

        ``port``: the pod's own port when it is not a server's (a File dataset's reader pod)."""
        self.refresh()
        mapped = self.mapping.get(f"{namespace}/pod/{pod}") or self.mapping.get(f"{namespace}/{service}")
        if mapped:
            return mapped.rstrip("/")
        if not pod_ip:
            return None
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        return f"http://{host}:{port or self.port}"


def _valid_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    parts = key.split("/")
    return (len(parts) == 2 and all(parts)) or (len(parts) == 3 and parts[1] == "pod" and bool(parts[0]) and bool(parts[2]))


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclasses.dataclass
class OperatorConfig:
    """Everything `specdec run` configures about the handlers."""

    reconcile: Settings = dataclasses.field(default_factory=Settings)
    # Operator-wide defaults merged under every resource's spec.podTemplate (poddefaults.py; the resource wins).
    server_pod_defaults: ServerPodDefaults = dataclasses.field(default_factory=ServerPodDefaults)
    endpoints: Endpoints = dataclasses.field(default_factory=Endpoints)
    reconcile_interval: float = 10.0  # seconds between steps while a resource changes with time (loading, probing)
    # Seconds between steps of a settled resource (decided, its servers ready): a safety net only, since every
    # change that matters then arrives as an event. At 10 s, 1,000 settled resources kept 0.4 cores busy.
    resync_interval: float = 300.0
    probe_timeout: float = 3600.0  # bound of one whole probe (Inconclusive when spent)
    probe_request_timeout: float = 600.0
    # A probe that failed on a transient error (ProbeRequestError.transient) is run again from the start, at most
    # this many attempts in all, after probe_retry_backoff seconds, doubled each time (30 s, 60 s: under two
    # minutes, within which a preempted pod's replacement is usually not Ready; the deadline covers longer waits).
    probe_attempts: int = 3
    probe_retry_backoff: float = 30.0
    # How long a File prompt source's reader pod may take to be scheduled, start and serve the dataset (its image
    # is the operator's, usually cached on the GPU nodes); then the probe ends DatasetInvalid, naming the pod's state.
    dataset_reader_timeout: float = 300.0
    # --probe-script: a file of scripted probes (probe/scripted.py) for tests and demos; None: every probe measures.
    probe_script: str | None = None
    scrape_timeout: float = 10.0
    # Drift scrapes in flight at once, over every resource's speculative pods (a 40-pod fleet is scraped
    # concurrently, but never more than this many connections at a time).
    max_concurrent_scrapes: int = 32
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
