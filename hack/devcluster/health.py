"""Health checks of the components, and waiting for them (with the last lines of the log of one that exited)."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .processes import _alive, _exit_reason, _is_ours
from .state import COMPONENTS, Cluster, ClusterError, _read_state, cluster_dir, tools_dir


def _admin_ssl(pki: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def _insecure_ssl() -> ssl.SSLContext:
    # The controller-manager and scheduler serve /healthz with self-signed certificates of their own.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _get_ok(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _health_checks(directory: Path, ports: dict[str, int]) -> dict[str, Callable[[], bool]]:
    pki = directory / "pki"
    return {
        "etcd": lambda: _get_ok(f"http://127.0.0.1:{ports['etcd']}/health"),
        "kube-apiserver": lambda: _get_ok(f"https://127.0.0.1:{ports['kube-apiserver']}/readyz", _admin_ssl(pki)),
        "kube-controller-manager": lambda: _get_ok(f"https://127.0.0.1:{ports['kube-controller-manager']}/healthz", _insecure_ssl()),
        "kube-scheduler": lambda: _get_ok(f"https://127.0.0.1:{ports['kube-scheduler']}/healthz", _insecure_ssl()),
        "kwok": lambda: _get_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"),
    }


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait_healthy(directory: Path, ports: dict[str, int], pids: dict[str, int], deadline: float) -> None:
    checks = _health_checks(directory, ports)
    pending = list(COMPONENTS)
    while pending:
        for component in list(pending):
            if not _alive(pids[component], directory):
                log = directory / "logs" / f"{component}.log"
                raise ClusterError(f"{component} {_exit_reason(pids[component])} during startup; last lines of {log}:\n{_tail(log)}")
            if checks[component]():
                pending.remove(component)
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"not healthy in time: {', '.join(pending)} (logs in {directory / 'logs'})")
        if pending:
            time.sleep(0.2)


def _running(name: str) -> tuple[dict, bool]:
    state = _read_state(name)
    pids = state.get("pids") or {}
    directory = cluster_dir(name)
    alive = bool(pids) and all(_is_ours(int(pids.get(c, 0)), directory) for c in COMPONENTS)
    return state, alive


def _cluster_from_state(name: str, state: dict) -> Cluster:
    directory = cluster_dir(name)
    ports = {k: int(v) for k, v in state["ports"].items()}
    return Cluster(
        name=name,
        directory=directory,
        kubeconfig=directory / "kubeconfig",
        server=f"https://127.0.0.1:{ports['kube-apiserver']}",
        ports=ports,
        tools=Path(state.get("tools") or tools_dir()),
    )


def _wait_component(directory: Path, ports: dict[str, int], pids: dict[str, int], component: str, deadline: float) -> None:
    check = _health_checks(directory, ports)[component]
    while not check():
        if not _alive(pids[component], directory):
            log = directory / "logs" / f"{component}.log"
            raise ClusterError(f"{component} {_exit_reason(pids[component])} during startup; last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{component} not healthy in time (log: {directory / 'logs' / component}.log)")
        time.sleep(0.1)


def _api_get(cluster: Cluster, path: str) -> dict | None:
    """GET a path of the cluster's API as the admin; None on any error (the caller polls)."""
    try:
        with urllib.request.urlopen(cluster.server + path, context=_admin_ssl(cluster.directory / "pki"), timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return None
