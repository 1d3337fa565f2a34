"""The real node: containerd, kube-proxy, CoreDNS and a kubelet beside the kwok nodes (realnode.py holds their
configuration and the machine clean-up), started after the control plane and stopped before it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import realnode
from .health import _api_get, _get_ok, _tail
from .images import load_images
from .pki import _kubeconfig
from .processes import _alive, _exit_reason, _is_ours, _port_free, _proc_cmdline, _spawn, _stop_pid
from .state import PORT_BLOCK, PORT_RANGE, Cluster, ClusterError, _read_state, _state_path, _write_state, cluster_dir, tools_dir


def _node_alive(directory: Path, state: dict, any_component: bool = False) -> bool:
    pids = (state.get("real_node") or {}).get("pids") or {}
    if not pids:
        return False
    alive = [_is_ours(int(pids.get(c, 0)), directory) for c in realnode.COMPONENTS]
    return any(alive) if any_component else all(alive)


def _node_health_checks(directory: Path, ports: dict[str, int]) -> dict[str, Callable[[], bool]]:
    nd = realnode.node_dir(directory)

    def containerd() -> bool:
        return (nd / "containerd" / "containerd.sock").exists() and subprocess.run(
            ["ctr", "--address", str(nd / "containerd" / "containerd.sock"), "version"], capture_output=True, timeout=10
        ).returncode == 0

    return {
        "containerd": containerd,
        "kube-proxy": lambda: _get_ok(f"http://127.0.0.1:{ports['kube-proxy-healthz']}/livez"),
        "coredns": lambda: _get_ok(f"http://127.0.0.1:{ports['coredns-ready']}/ready"),
        "kubelet": lambda: _get_ok(f"http://127.0.0.1:{ports['kubelet-healthz']}/healthz"),
    }


def _choose_node_ports(name: str, previous: dict[str, int] | None) -> dict[str, int]:
    names = realnode.PORT_NAMES
    if previous and set(previous) == set(names) and all(_port_free(p) for p in previous.values()):
        return dict(previous)
    blocks = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_BLOCK
    start = int(hashlib.sha256(f"{name}/real-node".encode()).hexdigest(), 16) % blocks
    for step in range(blocks):
        base = PORT_RANGE[0] + ((start + step) % blocks) * PORT_BLOCK
        ports = {port_name: base + offset for offset, port_name in enumerate(names)}
        if all(_port_free(p) for p in ports.values()):
            return ports
    raise ClusterError(f"no free block of {len(names)} ports for the real node")


def _node_wait(what: str, check: Callable[[], Any], deadline: float, pid_of: Callable[[], list[tuple[str, int]]], directory: Path) -> Any:
    while True:
        result = check()
        if result:
            return result
        for component, pid in pid_of():
            if not _alive(pid, directory):
                log = directory / "logs" / f"node-{component}.log"
                raise ClusterError(f"real node: {component} {_exit_reason(pid)} while waiting for {what}; last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"real node: timed out waiting for {what} (logs in {directory / 'logs'}/node-*.log)")
        time.sleep(0.25)


def _start_node(cluster: Cluster, state: dict, tie_to_parent: bool, deadline: float, say: Callable[[str], None]) -> None:
    name, directory, tools = cluster.name, cluster.directory, cluster.tools
    started = time.monotonic()
    realnode.claim_machine(directory, lambda other: _node_alive(other, _read_state(other.name), any_component=True))
    nd = realnode.node_dir(directory)
    ip = state["node_ip"]
    previous = state.get("real_node") or {}
    node: dict[str, Any] = {
        "ip": ip,
        "ports": _choose_node_ports(name, previous.get("ports")),
        "pids": {},
        # Kept from an earlier run that did not finish its `down`: those are the machine's own values.
        "sysctls": previous.get("sysctls") or realnode.read_sysctls(),
        "bridge": realnode.bridge_name(name),
        "subnet": realnode.pod_subnet(name),
    }
    state["real_node"] = node
    _write_state(name, state)
    shutil.rmtree(nd, ignore_errors=True)
    for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "runc"):
        (nd / sub).mkdir(parents=True, exist_ok=True)
    pki = directory / "pki"
    ports = node["ports"]
    (nd / "containerd.toml").write_text(realnode._containerd_config(nd))
    (nd / "cni" / "net.d" / "10-specdec.conflist").write_text(realnode._cni_config(name, nd))
    (nd / "kubelet.json").write_text(realnode._kubelet_config(nd, pki, ports, ip))
    (nd / "kube-proxy.json").write_text(realnode._kube_proxy_config(name, nd, ports))
    (nd / "Corefile").write_text(realnode._corefile(nd, ports, ip))
    for user in ("kubelet", "kube-proxy", "coredns"):
        (nd / f"{user}.kubeconfig").write_text(_kubeconfig(cluster.server, pki, user, f"specdec-{name}", embed=False))
    labels = ",".join(f"{k}={v}" for k, v in realnode.NODE_LABELS.items())
    commands = {
        "containerd": ["containerd", "--config", str(nd / "containerd.toml"), "--log-level", "warn"],
        "kube-proxy": [str(tools / "kube-proxy"), f"--config={nd / 'kube-proxy.json'}", "--v=1"],
        "coredns": [str(tools / "coredns"), "-conf", str(nd / "Corefile")],
        "kubelet": [
            str(tools / "kubelet"),
            f"--config={nd / 'kubelet.json'}",
            f"--kubeconfig={nd / 'kubelet.kubeconfig'}",
            f"--root-dir={nd / 'kubelet'}",
            f"--cert-dir={nd / 'kubelet' / 'pki'}",
            f"--hostname-override={realnode.NODE_NAME}",
            f"--node-ip={ip}",
            f"--node-labels={labels}",
        ],
    }
    checks = _node_health_checks(directory, ports)

    def pids() -> list[tuple[str, int]]:
        return [(c, int(p)) for c, p in node["pids"].items()]

    def spawn(component: str) -> None:
        node["pids"][component] = _spawn(commands[component], directory / "logs" / f"node-{component}.log", directory, tie_to_parent)
        _write_state(name, state)

    spawn("containerd")
    _node_wait("containerd", checks["containerd"], deadline, pids, directory)
    archive = realnode.pause_archive(tools, nd / "pause.oci.tar")
    load_images(cluster, [archive])
    say(f"real node: containerd ready, pause image imported after {time.monotonic() - started:.1f}s")
    cluster.kubectl("apply", "-f", "-", input=realnode._dns_objects(ip, ports["coredns"]))
    for component in ("kube-proxy", "coredns", "kubelet"):
        spawn(component)

    def node_ready() -> bool:
        got = _api_get(cluster, f"/api/v1/nodes/{realnode.NODE_NAME}") or {}
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (got.get("status") or {}).get("conditions") or [])

    _node_wait(f"node {realnode.NODE_NAME} Ready", node_ready, deadline, pids, directory)
    # Simulated GPUs: an extended resource advertised in the node's status (the kubelet keeps it in allocatable).
    cluster.kubectl(
        "patch",
        "node",
        realnode.NODE_NAME,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"capacity": {"nvidia.com/gpu": realnode.GPU_COUNT}}}),
    )

    def gpus_allocatable() -> bool:
        got = _api_get(cluster, f"/api/v1/nodes/{realnode.NODE_NAME}") or {}
        return ((got.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu") == realnode.GPU_COUNT

    _node_wait("nvidia.com/gpu allocatable", gpus_allocatable, deadline, pids, directory)
    for component in ("kube-proxy", "coredns"):
        _node_wait(component, checks[component], deadline, pids, directory)
    node["started_seconds"] = round(time.monotonic() - started, 2)
    _write_state(name, state)
    say(
        f"real node {realnode.NODE_NAME} ({ip}, pods {node['subnet']}) Ready with {realnode.GPU_COUNT} simulated "
        f"GPUs after {node['started_seconds']:.1f}s"
    )


def _stop_node(name: str, state: dict) -> None:
    """Stop the real node and remove all it made on the machine (safe to call when there is none)."""
    node = state.get("real_node")
    if not node or not node.get("pids"):
        return  # this cluster runs no real node: the machine's kubepods, bridges and chains may be another's
    directory = cluster_dir(name)
    nd = realnode.node_dir(directory)
    pids = node.get("pids") or {}
    for component in ("kubelet", "coredns", "kube-proxy"):
        if component in pids:
            _stop_pid(int(pids[component]), directory, grace=5.0)
    owner = realnode.machine_owner()
    if owner is not None and owner != directory:
        # A stale record (its owner died, and another cluster's real node has the machine since): stop only what
        # is ours by pid; the kubepods cgroups, the chains and the sysctls are the other node's now.
        if "containerd" in pids:
            _stop_pid(int(pids["containerd"]), directory, grace=5.0)
        realnode.unmount_all(nd)
        if realnode.link_exists(node.get("bridge") or realnode.bridge_name(name)):
            subprocess.run(["ip", "link", "delete", node.get("bridge") or realnode.bridge_name(name)], capture_output=True)
        if not realnode.unmount_all(nd):
            shutil.rmtree(nd, ignore_errors=True)
        state["real_node"] = {"ports": node.get("ports")}
        if _state_path(name).exists():
            _write_state(name, state)
        return
    # Container processes and their shims: everything in the kubepods cgroups, then the shims of our containerd.
    realnode.kill_cgroup_processes()
    sock = str(nd / "containerd" / "containerd.sock")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmdline = _proc_cmdline(int(entry.name))
            if cmdline and "containerd-shim" in cmdline[0] and sock in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)
    if "containerd" in pids:
        _stop_pid(int(pids["containerd"]), directory, grace=5.0)
    realnode.kill_cgroup_processes()
    realnode.unmount_all(nd)
    realnode.remove_cgroups()
    if realnode.link_exists(node.get("bridge") or realnode.bridge_name(name)):
        subprocess.run(["ip", "link", "delete", node.get("bridge") or realnode.bridge_name(name)], capture_output=True)
    kube_proxy = Path(state.get("tools") or tools_dir()) / "kube-proxy"
    if kube_proxy.exists():
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, timeout=60)
    realnode.remove_iptables_leftovers()
    realnode.remove_dead_shim_sockets()
    realnode.restore_sysctls(node.get("sysctls") or {})
    realnode.release_machine(directory)
    if not realnode.unmount_all(nd):
        shutil.rmtree(nd, ignore_errors=True)
    state["real_node"] = {"ports": node.get("ports")}
    if _state_path(name).exists():
        _write_state(name, state)
