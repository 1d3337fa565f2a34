#!/usr/bin/env python3
"""A local Kubernetes control plane with simulated 8-GPU nodes, supervised by this script.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by ``hack/tools.sh``) and a
kwok controller that plays the kubelet of the fake nodes in ``hack/kwok/nodes.yaml``, following the Stages in
``hack/kwok/stages.yaml``. No containers, no Docker: every component is a local process.

Each cluster has a name and a directory ``~/.cache/specdec-operator/cluster/<name>/`` holding its certificates,
kubeconfig, logs, etcd data and a state file. Ports and certificates are kept across ``down``/``up``, so the
kubeconfig path and contents stay the same for a given name.

Command line::

    python hack/devcluster.py up [--name specdec]       # start (or reuse) and print the kubeconfig path
    python hack/devcluster.py down [--name specdec] [--purge]
    python hack/devcluster.py status [--name specdec]

Python::

    import devcluster                      # with hack/ on sys.path
    cluster = devcluster.up("specdec")     # -> Cluster(kubeconfig=..., server=..., ...)
    cluster.kubectl("get", "nodes")
    devcluster.down("specdec")

Only the Python standard library is used, so the script runs with any Python >= 3.10.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__:  # imported as hack.devcluster (the tests)
    from . import realnode  # the optional real node
else:  # run as a script (python3 hack/devcluster.py): its directory is on sys.path
    import realnode  # type: ignore[no-redef]

HACK_DIR = Path(__file__).resolve().parent

REPO_DIR = HACK_DIR.parent
NODES_MANIFEST = HACK_DIR / "kwok" / "nodes.yaml"
STAGES_MANIFEST = HACK_DIR / "kwok" / "stages.yaml"
VERSIONS_FILE = HACK_DIR / "versions.env"

DEFAULT_NAME = "specdec"
# Binaries the cluster needs from the tools directory (hack/tools.sh builds them).
REQUIRED_TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl")
# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PORT_NAMES = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Ports are taken from this range, outside Linux's ephemeral range (32768-60999), so that outgoing
# connections never grab them between a `down` and the next `up`.
PORT_RANGE = (20000, 32000)
PORT_BLOCK = 10
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"


class ClusterError(Exception):
    """A problem starting or stopping the cluster, stated in one line with what to do about it."""


def cache_dir() -> Path:
    """Root of everything this script writes: ``$SPECDEC_CACHE_DIR`` or ``~/.cache/specdec-operator``."""
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or "~/.cache/specdec-operator").expanduser()


def tools_dir() -> Path:
    """Where hack/tools.sh puts the binaries: ``$SPECDEC_TOOLS_DIR`` or ``<cache>/bin``."""
    return Path(os.environ.get("SPECDEC_TOOLS_DIR") or cache_dir() / "bin").expanduser()


def cluster_dir(name: str) -> Path:
    """The directory of the cluster called ``name``."""
    return cache_dir() / "cluster" / name


def versions() -> dict[str, str]:
    """The pinned tool versions from hack/versions.env."""
    pins = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key.strip()] = value.strip()
    return pins


def missing_tools(directory: Path | None = None) -> list[str]:
    """Names of required binaries absent from the tools directory (empty when all are there)."""
    directory = directory or tools_dir()
    return [tool for tool in REQUIRED_TOOLS if not os.access(directory / tool, os.X_OK)]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running local cluster and how to reach it."""

    name: str
    directory: Path
    kubeconfig: Path
    server: str
    ports: dict[str, int]
    tools: Path

    @property
    def kubectl_path(self) -> Path:
        """The kubectl built with the control plane (same version)."""
        return self.tools / "kubectl"

    @property
    def helm_path(self) -> Path:
        """The pinned helm binary."""
        return self.tools / "helm"

    @property
    def kubectl_cache(self) -> Path:
        """kubectl's discovery cache for this cluster.

        The default (~/.kube/cache/discovery/<host_port>) is shared by every cluster that ever used the same
        port and may hold another cluster's API list: kubectl then answers "no matches for kind" for a CRD
        that is installed. Each cluster run gets its own, emptied by ``up`` (see ``forget_discovery``).
        """
        return self.directory / "kubectl-cache"

    def forget_discovery(self) -> None:
        """Drop kubectl's cached API list (after installing CRDs: the next call sees them at once)."""
        shutil.rmtree(self.kubectl_cache, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG (and kubectl's cache) for this cluster and the tools directory first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["KUBECACHEDIR"] = str(self.kubectl_cache)
        env["PATH"] = f"{self.tools}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster and return the completed process (text output captured)."""
        proc = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.kubectl_cache), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc


# ------------------------------------------------------------------------------------------------------------
# State and locking


def _state_path(name: str) -> Path:
    return cluster_dir(name) / "state.json"


def _read_state(name: str) -> dict:
    try:
        return json.loads(_state_path(name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_state(name: str, state: dict) -> None:
    path = _state_path(name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(path)


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise up/down of one cluster across processes (pytest sessions, make targets)."""
    directory = cluster_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _validate_name(name: str) -> None:
    if not name or len(name) > 40 or not all(c.isalnum() or c in "-_" for c in name) or name[0] in "-_":
        raise ClusterError(f"invalid cluster name {name!r}: use letters, digits, '-' and '_' (at most 40)")


# ------------------------------------------------------------------------------------------------------------
# Processes


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_ours(pid: int, directory: Path) -> bool:
    """True when ``pid`` is a live component of the cluster in ``directory`` (guards against reused pids)."""
    if pid <= 0:
        return False
    cmdline = _proc_cmdline(pid)
    if not cmdline:
        return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        if status.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is gone for our purposes
            return False
    except (OSError, IndexError):
        return False
    # Every component gets a path inside its cluster directory on its command line; the trailing slash keeps
    # cluster "a" from claiming the processes of cluster "a2".
    marker = f"{directory}/"
    return any(marker in arg for arg in cmdline[1:])


def _stop_pid(pid: int, directory: Path, grace: float = 10.0) -> None:
    """SIGTERM the component's process group, wait, then SIGKILL what is left of it."""
    if not _is_ours(pid, directory):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _is_ours(pid, directory):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # Reap it when it is our child (pytest session that started the cluster).
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
    else:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the child when the process that started it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


# Components started by this process, by pid: their exit status is known exactly (no /proc guessing while a
# component starts), and keeping the Popen objects avoids "subprocess still running" warnings.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _alive(pid: int, directory: Path) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    return _is_ours(pid, directory)


def _exit_reason(pid: int) -> str:
    child = _CHILDREN.get(pid)
    if child is None or child.returncode is None:
        return "exited"
    if child.returncode < 0:
        return f"was killed by signal {signal.Signals(-child.returncode).name}"
    return f"exited with code {child.returncode}"


def _spawn(cmd: Sequence[str], log: Path, cwd: Path, tie_to_parent: bool) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # own process group: `down` kills the whole group
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


# ------------------------------------------------------------------------------------------------------------
# Ports


def _port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port (connections lingering in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the Go servers that will bind it: only an active listener makes the port unusable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _choose_ports(name: str, previous: dict[str, int] | None) -> dict[str, int]:
    """Ports for every component: the previous ones when still free, else a free block derived from the name."""
    if previous and set(previous) == set(PORT_NAMES) and all(_port_free(p) for p in previous.values()):
        return dict(previous)
    blocks = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_BLOCK
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % blocks
    for step in range(blocks):
        base = PORT_RANGE[0] + ((start + step) % blocks) * PORT_BLOCK
        ports = {port_name: base + offset for offset, port_name in enumerate(PORT_NAMES)}
        if all(_port_free(p) for p in ports.values()):
            return ports
    raise ClusterError(f"no free block of {len(PORT_NAMES)} ports in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


# ------------------------------------------------------------------------------------------------------------
# Certificates (openssl CLI; generated once per cluster directory and kept)

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
DNS.1 = localhost
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
IP.1 = 127.0.0.1
IP.2 = 10.96.0.1
"""

# (file stem, subject, profile): who talks to the apiserver with which identity.
_CERTS = (
    ("apiserver", "/CN=kube-apiserver", "server"),
    ("admin", "/O=system:masters/CN=specdec-admin", "client"),
    ("controller-manager", "/CN=system:kube-controller-manager", "client"),
    ("scheduler", "/CN=system:kube-scheduler", "client"),
    # kwok plays every kubelet and patches pod/node status across namespaces.
    ("kwok", "/O=system:masters/CN=kwok-controller", "client"),
)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def _ensure_pki(pki: Path) -> None:
    if all((pki / f"{stem}.crt").exists() for stem, _, _ in _CERTS) and (pki / "sa.key").exists():
        return
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is not installed; install it (apt-get install openssl) and rerun")
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    config = pki / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=specdec-dev-ca",
        "-config",
        "openssl.cnf",
        "-extensions",
        "ca",
        cwd=pki,
    )
    for stem, subject, profile in _CERTS:
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{stem}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")),
            "-days",
            "3650",
            "-out",
            f"{stem}.crt",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            profile,
            cwd=pki,
        )
        (pki / f"{stem}.csr").unlink()
    # Service-account token signing key (the apiserver signs, the controller-manager signs legacy tokens).
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


# The real node's identities, made only for clusters started with a real node (signed by the same CA).
_NODE_CERTS = (
    ("kubelet", f"/O=system:nodes/CN=system:node:{realnode.NODE_NAME}", "client"),
    ("kube-proxy", "/CN=system:kube-proxy", "client"),
    ("coredns", "/CN=specdec:coredns", "client"),
    # The API server's client certificate towards the kubelet (logs, exec, port-forward).
    ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "client"),
)


def _ensure_node_pki(pki: Path) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for stem, subject, profile in _NODE_CERTS:
        if (pki / f"{stem}.crt").exists():
            continue
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{stem}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")),
            "-days",
            "3650",
            "-out",
            f"{stem}.crt",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            profile,
            cwd=pki,
        )
        (pki / f"{stem}.csr").unlink()


def _kubeconfig(server: str, pki: Path, user: str, context: str, embed: bool) -> str:
    """A kubeconfig for one identity; ``embed`` inlines the certificates so the file can be copied alone."""

    def ref(key: str, path: Path) -> str:
        if embed:
            return f"{key}-data: {base64.b64encode(path.read_bytes()).decode()}"
        return f"{key}: {path}"

    return f"""apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server}
    {ref("certificate-authority", pki / "ca.crt")}
users:
- name: {context}-{user}
  user:
    {ref("client-certificate", pki / f"{user}.crt")}
    {ref("client-key", pki / f"{user}.key")}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {context}-{user}
current-context: {context}
"""


# ------------------------------------------------------------------------------------------------------------
# Commands of the components


def _commands(
    directory: Path,
    ports: dict[str, int],
    tools: Path,
    controller_manager_args: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    node_ip: str | None = None,
) -> dict[str, list[str]]:
    pki = directory / "pki"
    data = directory / "etcd-data"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    component_kubeconfig = {c: directory / f"{c}.kubeconfig" for c in ("controller-manager", "scheduler", "kwok")}
    if node_ip:
        # A real node: pods reach the API server through the `kubernetes` Service, whose endpoint is this
        # address (a loopback address cannot be one), and the API server reaches the kubelet.
        apiserver_network = [
            "--bind-address=0.0.0.0",
            f"--advertise-address={node_ip}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        apiserver_network = [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The 'kubernetes' Service cannot point at a loopback address; nothing in the cluster needs it.
            "--endpoint-reconciler-type=none",
        ]
    return {
        "etcd": [
            str(tools / "etcd"),
            "--name=default",
            f"--data-dir={data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--initial-cluster-state=new",
            # A throwaway test store: skipping fsync makes writes cheap on slow disks.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=2147483648",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(tools / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            *apiserver_network,
            f"--secure-port={ports['kube-apiserver']}",
            f"--cert-dir={directory / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--allow-privileged=true",
            "--profiling=false",
            # e.g. an audit log: benchmarks/scale.py --audit attributes the API server's requests to their clients.
            *apiserver_args,
            "--v=1",
        ],
        "kube-controller-manager": [
            str(tools / "kube-controller-manager"),
            f"--kubeconfig={component_kubeconfig['controller-manager']}",
            f"--authentication-kubeconfig={component_kubeconfig['controller-manager']}",
            f"--authorization-kubeconfig={component_kubeconfig['controller-manager']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--cert-dir={directory / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--controllers=*",
            # Each controller uses its own service account, as in a real cluster (RBAC is exercised).
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The defaults (client QPS 20 per controller, 5 deployment/replicaset workers) unless the caller adds
            # flags: benchmarks/scale.py --tuned-control-plane does, for 2,000 Deployments (docs/scale.md).
            *controller_manager_args,
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(tools / "kube-scheduler"),
            f"--kubeconfig={component_kubeconfig['scheduler']}",
            f"--authentication-kubeconfig={component_kubeconfig['scheduler']}",
            f"--authorization-kubeconfig={component_kubeconfig['scheduler']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-scheduler']}",
            f"--cert-dir={directory / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            str(tools / "kwok"),
            f"--kubeconfig={component_kubeconfig['kwok']}",
            f"--config={directory / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.200.0.1",
        ],
    }


# ------------------------------------------------------------------------------------------------------------
# Health


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


# ------------------------------------------------------------------------------------------------------------
# The real node (hack/realnode.py holds its configuration and the machine clean-up)


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


def node_ctr(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `ctr` against the real node's containerd, in the CRI's namespace (k8s.io)."""
    sock = realnode.node_dir(cluster.directory) / "containerd" / "containerd.sock"
    return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args], capture_output=True, text=True, timeout=timeout)


def load_images(cluster: Cluster, archives: Sequence[Path | str]) -> list[str]:
    """Import OCI/Docker image archives into the real node's containerd; returns the image names imported."""
    if not (realnode.node_dir(cluster.directory) / "containerd" / "containerd.sock").exists():
        raise ClusterError(f"cluster {cluster.name!r} has no real node: `up --real-node` first")
    names = []
    for archive in archives:
        if not Path(archive).is_file():
            raise ClusterError(f"image archive {archive} not found: build it first (make images-local)")
        proc = node_ctr(cluster, "images", "import", str(archive))
        if proc.returncode != 0:
            raise ClusterError(f"ctr images import {archive} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
        names += re.findall(r"^unpacking (\S+)", proc.stdout, flags=re.M)
    return names


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


# ------------------------------------------------------------------------------------------------------------
# Public API


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

    ``real_node``: also start one real node (containerd, kubelet, kube-proxy, CoreDNS: hack/realnode.py) beside
    the kwok nodes; needs root, containerd/runc/CNI plugins from the machine and ``hack/tools.sh node``.

    ``controller_manager_args``, ``apiserver_args``: extra kube-controller-manager and kube-apiserver flags (kept
    for ``restart``). ``kwok_options``: KwokConfiguration options (e.g. ``podPlayStageParallelism``), added to
    kwok's configuration file.

    ``tie_to_parent``: the components receive SIGTERM when the calling process dies (pytest sessions use it so
    that even a killed session leaves nothing behind). Raises ClusterError with a one-line reason.
    """
    _validate_name(name)
    say = log or (lambda message: None)
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
        logs = directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for log_file in logs.glob("*.log"):  # keep the previous run's logs, one generation
            log_file.replace(log_file.with_suffix(".previous"))
        pki = directory / "pki"
        _ensure_pki(pki)
        ports = _choose_ports(name, state.get("ports"))
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
                    "\n---\n"
                    + json.dumps({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": kwok_options})
                    + "\n"
                )
        # Every `up` starts from an empty store: a cluster is disposable, its identity (ports, PKI) is not.
        shutil.rmtree(directory / "etcd-data", ignore_errors=True)

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


def _wait_component(directory: Path, ports: dict[str, int], pids: dict[str, int], component: str, deadline: float) -> None:
    check = _health_checks(directory, ports)[component]
    while not check():
        if not _alive(pids[component], directory):
            log = directory / "logs" / f"{component}.log"
            raise ClusterError(f"{component} {_exit_reason(pids[component])} during startup; last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{component} not healthy in time (log: {directory / 'logs' / component}.log)")
        time.sleep(0.1)


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


def _api_get(cluster: Cluster, path: str) -> dict | None:
    """GET a path of the cluster's API as the admin; None on any error (the caller polls)."""
    try:
        with urllib.request.urlopen(cluster.server + path, context=_admin_ssl(cluster.directory / "pki"), timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return None


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


# ------------------------------------------------------------------------------------------------------------
# The LeaderWorkerSet controller (optional: multi-node servers)
#
# The real controller (sigs.k8s.io/lws, built by `hack/tools.sh lws` from its module, hack/go/lws) runs as a local process like
# the other components. Its webhooks are not optional: the pod webhook is what labels each pod of a group with its
# worker index and group key and injects LWS_LEADER_ADDRESS / LWS_WORKER_INDEX / LWS_GROUP_SIZE, so they stay on
# (ENABLE_WEBHOOKS=false would leave the pods without their ranks). In a cluster the API server reaches them
# through a Service; here there is no pod network to the host, so the webhook configurations name the local
# process by URL (https://127.0.0.1:PORT/...), with a serving certificate for 127.0.0.1 signed by the cluster's CA
# (the controller's own certificate rotation, which writes a Secret for a Service DNS name, is turned off).

LWS_COMPONENT = "lws-controller"
# The release's CRD, which `hack/tools.sh lws` copies from the same module into the tools directory.
LWS_CRD_FILE_NAME = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
# (configuration name, webhook name, path, API group, resource, operations): the controller's own webhooks
# (config/webhook/manifests.yaml of its release), less the DisaggregatedSet ones.
_LWS_WEBHOOKS = {
    "mutating": (
        (
            "mleaderworkerset.kb.io",
            "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            ["CREATE", "UPDATE"],
        ),
        ("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"]),
    ),
    "validating": (
        (
            "vleaderworkerset.kb.io",
            "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            ["CREATE", "UPDATE"],
        ),
        ("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"]),
    ),
}
# The controller also runs its DisaggregatedSet controller, whose watches need those kinds to exist; nothing
# here creates one, so minimal CRDs stand in for their full ones (2.8 MB of schema).
_DISAGGREGATED_KINDS = (("DisaggregatedSet", "disaggregatedsets"), ("DisaggregatedSetRoleScaler", "disaggregatedsetrolescalers"))


def lws_crd_file(tools: Path | None = None) -> Path:
    """The LeaderWorkerSet CRD of the release the controller was built from."""
    return (tools or tools_dir()) / LWS_CRD_FILE_NAME


def lws_tool_missing(tools: Path | None = None) -> bool:
    """True when the LeaderWorkerSet controller or its CRD is not built (run `hack/tools.sh lws`)."""
    return not os.access((tools or tools_dir()) / LWS_COMPONENT, os.X_OK) or not lws_crd_file(tools).is_file()


def _stub_crd(kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.disaggregatedset.x-k8s.io"},
        "spec": {
            "group": "disaggregatedset.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def _webhook_configurations(port: int, ca_bundle: str) -> list[dict]:
    out = []
    for kind, hooks in _LWS_WEBHOOKS.items():
        webhooks = []
        for name, path, group, resource, operations in hooks:
            hook: dict[str, Any] = {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
                "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": [resource]}],
            }
            if resource == "pods":
                # Only the pods of LeaderWorkerSets (the webhook ignores every other pod): the rest of the cluster
                # keeps working while the controller is down.
                hook["objectSelector"] = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
            webhooks.append(hook)
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration" if kind == "mutating" else "ValidatingWebhookConfiguration",
                "metadata": {"name": f"specdec-dev-lws-{kind}"},
                "webhooks": webhooks,
            }
        )
    return out


def _lws_pki(pki: Path) -> Path:
    """The controller's client identity and its webhook serving certificate (127.0.0.1), once per cluster."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    serving = pki / "lws-webhook"
    for stem, subject, profile in (("lws", "/O=system:masters/CN=lws-controller", "client"), ("lws-webhook/tls", "/CN=lws-webhook", "server")):
        if (pki / f"{stem}.crt").exists():
            continue
        (pki / stem).parent.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "3650", "-out", f"{stem}.crt",
            "-extfile", "openssl.cnf", "-extensions", profile, cwd=pki,
        )  # fmt: skip
        (pki / f"{stem}.csr").unlink()
    return serving


def _free_ports(count: int, avoid: set[int]) -> list[int]:
    ports: list[int] = []
    for port in range(PORT_RANGE[1] - 1, PORT_RANGE[0], -1):  # from the top of the range, away from the blocks
        if port not in avoid and _port_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise ClusterError(f"no {count} free ports in {PORT_RANGE[0]}-{PORT_RANGE[1]} for the LeaderWorkerSet controller")


def start_lws(cluster: Cluster, *, tie_to_parent: bool = False, timeout: float = 120.0, log: Callable[[str], None] | None = None) -> None:
    """Install the LeaderWorkerSet CRD and run the real controller against ``cluster`` (a no-op when it runs).

    Raises ClusterError with a one-line reason (e.g. the controller is not built: `hack/tools.sh lws`).
    """
    say = log or (lambda message: None)
    tools = Path(cluster.tools)
    if lws_tool_missing(tools):
        raise ClusterError(f"the LeaderWorkerSet controller is not built in {tools}: run `hack/tools.sh lws` (or `make tools LWS=1`)")
    directory = cluster.directory
    started = time.monotonic()
    deadline = started + timeout
    with _locked(cluster.name):
        state = _read_state(cluster.name)
        pids = state.setdefault("pids", {})
        lws_state = state.get("lws") or {}
        if LWS_COMPONENT in pids and _alive(int(pids[LWS_COMPONENT]), directory) and _get_ok(f"http://127.0.0.1:{lws_state.get('health')}/readyz"):
            return
        pki = directory / "pki"
        serving = _lws_pki(pki)
        webhook_port, health_port = _free_ports(2, {int(p) for p in (state.get("ports") or {}).values()})
        (directory / "lws.kubeconfig").write_text(_kubeconfig(cluster.server, pki, "lws", f"specdec-{cluster.name}", embed=False))
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(serving)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        }
        (directory / "lws-config.yaml").write_text(json.dumps(config, indent=2) + "\n")
        # The CRD first (server-side: its schema is larger than the last-applied annotation may be).
        crds = [_stub_crd(kind, plural) for kind, plural in _DISAGGREGATED_KINDS]
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(lws_crd_file(tools)), timeout=120)
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds})
        )
        names = [LWS_CRD_NAME] + [f"crd/{plural}.disaggregatedset.x-k8s.io" for _, plural in _DISAGGREGATED_KINDS]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[n if n.startswith("crd/") else f"crd/{n}" for n in names])
        if LWS_COMPONENT in pids:
            _stop_pid(int(pids.pop(LWS_COMPONENT)), directory)
        command = [
            str(tools / LWS_COMPONENT),
            f"--config={directory / 'lws-config.yaml'}",
            f"--kubeconfig={directory / 'lws.kubeconfig'}",
            "--zap-log-level=info",
        ]
        logs = directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pids[LWS_COMPONENT] = _spawn(command, logs / f"{LWS_COMPONENT}.log", directory, tie_to_parent)
        state["lws"] = {"webhook": webhook_port, "health": health_port}
        _write_state(cluster.name, state)
        pid = int(pids[LWS_COMPONENT])
        while not _get_ok(f"http://127.0.0.1:{health_port}/readyz"):
            if not _alive(pid, directory):
                raise ClusterError(f"{LWS_COMPONENT} {_exit_reason(pid)}: {_tail(logs / f'{LWS_COMPONENT}.log')}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {LWS_COMPONENT} (log: {logs / f'{LWS_COMPONENT}.log'})")
            time.sleep(0.2)
        # The webhook server listens once the controller's certificates are loaded; then point the API server at it.
        while True:
            try:
                with socket.create_connection(("127.0.0.1", webhook_port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise ClusterError(f"{LWS_COMPONENT} never served its webhooks on 127.0.0.1:{webhook_port}") from None
                time.sleep(0.2)
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        hooks = _webhook_configurations(webhook_port, ca_bundle)
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks})
        )
    say(f"{LWS_COMPONENT} ready after {time.monotonic() - started:.1f}s (webhooks at https://127.0.0.1:{webhook_port})")


def stop_lws(cluster: Cluster, *, timeout: float = 120.0) -> None:
    """Undo start_lws: the webhook configurations, the controller process and the CRDs (every LeaderWorkerSet in
    the cluster goes with its CRD). A no-op where none of them is there."""
    deadline = time.monotonic() + timeout
    with _locked(cluster.name):
        hooks = [f"{kind}webhookconfiguration/specdec-dev-lws-{kind}" for kind in _LWS_WEBHOOKS]
        cluster.kubectl("delete", "--ignore-not-found", *hooks, timeout=60)
        state = _read_state(cluster.name)
        pids = state.get("pids") or {}
        if LWS_COMPONENT in pids:
            _stop_pid(int(pids.pop(LWS_COMPONENT)), cluster.directory)
            state.pop("lws", None)
            _write_state(cluster.name, state)
        crds = [f"crd/{LWS_CRD_NAME}"] + [f"crd/{plural}.disaggregatedset.x-k8s.io" for _, plural in _DISAGGREGATED_KINDS]
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *crds, timeout=60)
        while cluster.kubectl("get", crds[0], check=False).returncode == 0:
            if time.monotonic() > deadline:
                raise ClusterError(f"the CRD {LWS_CRD_NAME} was not deleted within {timeout:.0f}s")
            time.sleep(0.5)


# ------------------------------------------------------------------------------------------------------------
# Command line


def _built_image_archives() -> list[Path]:
    """The operator and simulator archives that hack/build-image.sh (buildah) wrote, those that exist."""
    env = {}
    for line in (REPO_DIR / "images" / "images.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.strip().split("=", 1)
            env[key] = value
    images_dir = Path(os.environ.get("SPECDEC_IMAGES_DIR") or cache_dir() / "images")
    found = []
    for image, tag in (("OPERATOR_IMAGE", "OPERATOR_TAG"), ("SIMULATOR_IMAGE", "SIMULATOR_TAG")):
        ref = f"{env[image]}:{env[tag]}".replace("/", "_").replace(":", "_")
        if (images_dir / f"{ref}.oci.tar").is_file():
            found.append(images_dir / f"{ref}.oci.tar")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("up", "start the cluster (or reuse it) and print its kubeconfig path"),
        ("down", "stop the cluster; --purge also forgets its certificates and ports"),
        ("status", "show the components and their health"),
        ("kubeconfig", "print the kubeconfig path"),
        ("load-images", "import image archives (OCI or Docker) into the real node's containerd"),
    ):
        command_parser = sub.add_parser(command, help=help_text)
        command_parser.add_argument("--name", default=os.environ.get("SPECDEC_CLUSTER_NAME", DEFAULT_NAME))
        if command == "up":
            command_parser.add_argument(
                "--real-node", action="store_true", help="add one real node (containerd, kubelet, kube-proxy, CoreDNS) beside the kwok nodes"
            )
            command_parser.add_argument(
                "--lws", action="store_true", help="also run the LeaderWorkerSet controller (hack/tools.sh lws) for multi-node servers"
            )
            command_parser.add_argument(
                "--load-images",
                nargs="*",
                metavar="ARCHIVE",
                default=None,
                help="with --real-node: image archives to import (default: those make images-local wrote)",
            )
        if command == "load-images":
            command_parser.add_argument("archives", nargs="+", metavar="ARCHIVE")
        if command == "down":
            command_parser.add_argument("--purge", action="store_true")
        if command == "status":
            command_parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"devcluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.command == "up":
            cluster = up(args.name, log=say, real_node=args.real_node)
            if args.lws:
                start_lws(cluster, log=say)
            if args.real_node and args.load_images is not None:
                archives = args.load_images or _built_image_archives()
                if not archives:
                    say("real node: no image archives to import yet (make images-local builds them)")
                for image in load_images(cluster, archives):
                    say(f"real node: image {image} imported")
            nodes = cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.family").stdout
            print(nodes.rstrip(), file=sys.stderr)
            say(f"kubeconfig: {cluster.kubeconfig}")
            say(f"use it with: export KUBECONFIG={cluster.kubeconfig}")
            print(cluster.kubeconfig)
        elif args.command == "down":
            was_running = down(args.name, purge=args.purge)
            say(f"cluster {args.name!r} {'stopped' if was_running else 'was not running'}" + (" and purged" if args.purge else ""))
        elif args.command == "status":
            report = status(args.name)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                print(f"cluster {report['name']}: {report['state']}  kubeconfig: {report['kubeconfig']}")
                for component, info in report["components"].items():
                    health = "healthy" if info["healthy"] else ("running" if info["pid"] else "stopped")
                    print(f"  {component:<24} {health:<8} pid={info['pid'] or '-'} port={info['port']}")
            return 0 if report["state"] == "up" else 1
        elif args.command == "load-images":
            state = _read_state(args.name)
            if not state.get("ports"):
                raise ClusterError(f"cluster {args.name!r} is not running")
            for image in load_images(_cluster_from_state(args.name, state), args.archives):
                say(f"imported {image}")
        elif args.command == "kubeconfig":
            print(cluster_dir(args.name) / "kubeconfig")
    except ClusterError as error:
        print(f"devcluster: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
