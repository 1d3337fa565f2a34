"""Starting, stopping and restarting a cluster: `up` (or reuse), `down`, `restart` (fault injection), `status`,
`reap_orphans`."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import realnode
from .commands import _commands
from .health import _api_get, _cluster_from_state, _health_checks, _running, _wait_component, _wait_healthy
from .lws import LWS_COMPONENT
from .node import _node_alive, _node_health_checks, _start_node, _stop_node
from .pki import _ensure_node_pki, _ensure_pki, _kubeconfig
from .processes import _choose_ports, _is_ours, _spawn, _stop_pid
from .state import (
    COMPONENTS,
    DEFAULT_NAME,
    NODES_MANIFEST,
    STAGES_MANIFEST,
    Cluster,
    ClusterError,
    _locked,
    _read_state,
    _state_path,
    _validate_name,
    _write_state,
    cache_dir,
    cluster_dir,
    missing_tools,
    tools_dir,
    versions,
)


def up(
    name: str = DEFAULT_NAME,
    *,
    tie_to_parent: bool = False,
    timeout: float = 180.0,
    log: Callable[[str], None] | None = None,
    controller_manager_args: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    kwok_options: dict[str, Any] | None = None,
    real_node: bool = False,
) -> Cluster:
    """Start the cluster ``name`` (or return it when it is already up and healthy).

    ``real_node``: also start one real node (containerd, kubelet, kube-proxy, CoreDNS: hack/devcluster/realnode.py) beside
    the kwok nodes; needs root, containerd/runc/CNI plugins from the machine and ``hack/tools.sh node``.

    ``controller_manager_args``, ``apiserver_args``: extra kube-controller-manager and kube-apiserver flags (kept
    for ``restart``). ``kwok_options``: KwokConfiguration options (e.g. ``podPlayStageParallelism``), added to
    kwok's configuration file.

    ``tie_to_parent``: the components receive SIGTERM when the calling process dies (pytest sessions use it so
    that even a killed session leaves nothing behind). Raises ClusterError with a one-line reason.
    """
    _validate_name(name)
    say = log or (lambda message: None)
    tools = _checked_tools(real_node)
    directory = cluster_dir(name)
    with _locked(name):
        state, alive = _running(name)
        if alive and real_node and not _node_alive(directory, state):
            alive = False  # asked for a real node that is not running: start over with one
        if alive and _health_checks(directory, {k: int(v) for k, v in state["ports"].items()})["kube-apiserver"]():
            say(f"cluster {name!r} is already up")
            return _cluster_from_state(name, state)
        _stop_all(name, state)
        shutil.rmtree(directory / "kubectl-cache", ignore_errors=True)  # a new API server: nothing cached is true

        started = time.monotonic()
        deadline = started + timeout
        ports = _choose_ports(name, state.get("ports"))
        node_ip = _prepare_directory(name, directory, ports, real_node, kwok_options)
        commands = _commands(directory, ports, tools, controller_manager_args, apiserver_args, node_ip)
        pids: dict[str, int] = {}
        state = {
            "name": name,
            "ports": ports,
            "pids": pids,
            "tools": str(tools),
            "owner_pid": os.getpid() if tie_to_parent else None,
            "versions": versions(),
            "controller_manager_args": list(controller_manager_args),
            "apiserver_args": list(apiserver_args),
            "node_ip": node_ip,
        }
        try:
            for component in COMPONENTS:
                pids[component] = _spawn(commands[component], directory / "logs" / f"{component}.log", directory, tie_to_parent)
                _write_state(name, state)
                if component in ("etcd", "kube-apiserver"):
                    # The apiserver gives up on an unreachable store, and the controller-manager and scheduler
                    # exit when RBAC is not bootstrapped yet: each waits for the one before it to be ready.
                    _wait_component(directory, ports, pids, component, deadline)
                    say(f"{component} ready after {time.monotonic() - started:.1f}s")
            cluster = _cluster_from_state(name, state)
            # The nodes are created while the controller-manager, scheduler and kwok start.
            _create_nodes(cluster)
            _wait_healthy(directory, ports, pids, deadline)
            say(f"all components healthy after {time.monotonic() - started:.1f}s")
            _wait_schedulable(cluster, deadline)
            if real_node:
                _start_node(cluster, state, tie_to_parent, max(deadline, time.monotonic() + 120), say)
        except BaseException:
            _stop_all(name, state)
            raise
        state["started_seconds"] = round(time.monotonic() - started, 2)
        _write_state(name, state)
        say(f"cluster {name!r} is up in {state['started_seconds']:.1f}s")
        return cluster


def _checked_tools(real_node: bool) -> Path:
    """The tools directory, or ClusterError naming what is missing and the make target that builds it."""
    tools = tools_dir()
    missing = missing_tools(tools)
    if missing:
        raise ClusterError(f"control-plane tools missing in {tools} ({', '.join(missing)}): run `make tools`")
    if real_node:
        why = realnode.can_run_containers()
        if why:
            raise ClusterError(f"cannot start a real node: {why}")
        missing = realnode.missing_node_tools(tools)
        if missing:
            raise ClusterError(f"real-node tools missing in {tools} ({', '.join(missing)}): run `make tools REAL_NODE=1`")
    return tools


def _prepare_directory(name: str, directory: Path, ports: dict[str, int], real_node: bool, kwok_options: dict[str, Any] | None) -> str | None:
    """The cluster directory for a fresh start: logs rotated, PKI, kubeconfigs, kwok's stages and an empty etcd.
    Returns the real node's IP (None without one)."""
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for log_file in logs.glob("*.log"):  # keep the previous run's logs, one generation
        log_file.replace(log_file.with_suffix(".previous"))
    pki = directory / "pki"
    _ensure_pki(pki)
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    for component in ("controller-manager", "scheduler", "kwok"):
        (directory / f"{component}.kubeconfig").write_text(_kubeconfig(server, pki, component, f"specdec-{name}", embed=False))
    node_ip = realnode.node_ip() if real_node else None
    if real_node:
        _ensure_node_pki(pki)
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(_kubeconfig(server, pki, "admin", f"specdec-{name}", embed=True))
    os.chmod(kubeconfig, 0o600)
    # kwok reads its Stages from a copy, so editing hack/kwok/ while a cluster runs changes nothing.
    shutil.copyfile(STAGES_MANIFEST, directory / "kwok-stages.yaml")
    if kwok_options:
        with open(directory / "kwok-stages.yaml", "a", encoding="utf-8") as fh:
            fh.write(
                "\n---\n" + json.dumps({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": kwok_options}) + "\n"
            )
    # Every `up` starts from an empty store: a cluster is disposable, its identity (ports, PKI) is not.
    shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    return node_ip


def restart(name: str, components: Sequence[str], *, down_seconds: float = 0.0, timeout: float = 120.0) -> None:
    """Stop some components of a running cluster and start them again (fault injection for tests).

    Unlike ``up``, etcd keeps its data. Components stop in reverse start order, stay down ``down_seconds``, and
    start in start order, each waited for until healthy. Components started here are tied to the calling process
    when the cluster was (``up(tie_to_parent=True)`` from this same process).
    """
    _validate_name(name)
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise ClusterError(f"unknown component(s) {', '.join(unknown)}: choose from {', '.join(COMPONENTS)}")
    directory = cluster_dir(name)
    with _locked(name):
        state, alive = _running(name)
        if not alive:
            raise ClusterError(f"cluster {name!r} is not running: `up` it first")
        ports = {k: int(v) for k, v in state["ports"].items()}
        commands = _commands(
            directory,
            ports,
            Path(state["tools"]),
            state.get("controller_manager_args") or (),
            state.get("apiserver_args") or (),
            state.get("node_ip"),
        )
        tie = state.get("owner_pid") == os.getpid()
        order = [c for c in COMPONENTS if c in components]
        for component in reversed(order):
            _stop_pid(int(state["pids"][component]), directory)
        time.sleep(down_seconds)
        deadline = time.monotonic() + timeout
        for component in order:
            state["pids"][component] = _spawn(commands[component], directory / "logs" / f"{component}.log", directory, tie)
            _write_state(name, state)
            _wait_component(directory, ports, state["pids"], component, deadline)


def _create_nodes(cluster: Cluster) -> None:
    """Apply hack/kwok/nodes.yaml (kwok starts managing them as soon as it is up)."""
    cluster.kubectl("apply", "-f", str(NODES_MANIFEST))


def _wait_schedulable(cluster: Cluster, deadline: float) -> None:
    """Wait until the cluster can run pods: every fake node Ready, the default ServiceAccount created."""
    expected = NODES_MANIFEST.read_text().count("\nkind: Node")

    def nodes_ready() -> bool:
        nodes = (_api_get(cluster, "/api/v1/nodes") or {}).get("items") or []
        ready = [
            n for n in nodes if any(c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
        ]
        return len(ready) >= expected

    # The ServiceAccount admission plugin rejects pods until the controller-manager created 'default'.
    def default_service_account() -> bool:
        return _api_get(cluster, "/api/v1/namespaces/default/serviceaccounts/default") is not None

    for what, check in (("nodes Ready", nodes_ready), ("default ServiceAccount", default_service_account)):
        while not check():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what} (logs in {cluster.directory / 'logs'})")
            time.sleep(0.1)


def _stop_all(name: str, state: dict) -> None:
    directory = cluster_dir(name)
    _stop_node(name, state)
    pids = state.get("pids") or {}
    if LWS_COMPONENT in pids:
        _stop_pid(int(pids[LWS_COMPONENT]), directory)
    for component in reversed(COMPONENTS):
        if component in pids:
            _stop_pid(int(pids[component]), directory)
    if state:
        state["pids"] = {}
        if _state_path(name).exists():
            _write_state(name, state)


def down(name: str = DEFAULT_NAME, *, purge: bool = False) -> bool:
    """Stop every component of ``name`` and drop its data; ``purge`` also removes certificates and ports.

    Returns True when something was running. Safe to call on a cluster that does not exist.
    """
    _validate_name(name)
    directory = cluster_dir(name)
    if not directory.exists():
        return False
    with _locked(name):
        state, _ = _running(name)
        was_running = any(_is_ours(int(pid), directory) for pid in (state.get("pids") or {}).values())
        was_running = was_running or _node_alive(directory, state, any_component=True)
        _stop_all(name, state)
        shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    if purge:
        shutil.rmtree(directory, ignore_errors=True)
    return was_running


def status(name: str = DEFAULT_NAME) -> dict:
    """Process and health status of every component, plus the kubeconfig path."""
    _validate_name(name)
    state = _read_state(name)
    directory = cluster_dir(name)
    components: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {"name": name, "kubeconfig": str(directory / "kubeconfig"), "components": components}
    if not state.get("ports"):
        report["state"] = "absent"
        return report
    ports = {k: int(v) for k, v in state["ports"].items()}
    checks = _health_checks(directory, ports)
    pids = state.get("pids") or {}
    for component in COMPONENTS:
        pid = int(pids.get(component, 0))
        running = _is_ours(pid, directory)
        report["components"][component] = {
            "pid": pid if running else None,
            "port": ports.get(component),
            "healthy": running and checks[component](),
        }
    node = state.get("real_node") or {}
    if node.get("pids"):
        node_checks = _node_health_checks(directory, node["ports"])
        for component in realnode.COMPONENTS:
            pid = int(node["pids"].get(component, 0))
            running = _is_ours(pid, directory)
            report["components"][f"node/{component}"] = {
                "pid": pid if running else None,
                "port": node["ports"].get(component),
                "healthy": running and node_checks[component](),
            }
    healthy = [c["healthy"] for c in report["components"].values()]
    report["state"] = "up" if all(healthy) else ("down" if not any(healthy) else "degraded")
    report["server"] = f"https://127.0.0.1:{ports['kube-apiserver']}"
    return report


def reap_orphans() -> list[str]:
    """Purge clusters started by processes that are gone (e.g. a pytest session killed with SIGKILL)."""
    reaped: list[str] = []
    root = cache_dir() / "cluster"
    if not root.is_dir():
        return reaped
    for directory in sorted(root.iterdir()):
        state = _read_state(directory.name)
        owner = state.get("owner_pid")
        if not owner:
            continue
        try:
            os.kill(int(owner), 0)
            continue  # owner alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        down(directory.name, purge=True)
        reaped.append(directory.name)
    return reaped
