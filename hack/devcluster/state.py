"""Where a cluster lives and what it is: the cache and tools directories, the pinned versions, `Cluster`, and
the state file of each cluster with its lock (up/down of one cluster are serialised across processes)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

HACK_DIR = Path(__file__).resolve().parents[1]
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

    def pending_crds(self, names: list[str], timeout: float = 60) -> list[str]:
        """Wait until each CustomResourceDefinition in ``names`` (``plural.group``) is Established; the ones that are
        not after ``timeout`` seconds. Polled rather than `kubectl wait`: a CRD the API server has not processed yet has
        no status.conditions, and kubectl wait fails on that at once instead of waiting (seen on a loaded machine).
        kubectl's discovery cache is dropped after, so the next call sees the new kinds."""
        query = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            pending = [
                n
                for n in pending
                if self.kubectl("get", f"customresourcedefinition/{n}", "-o", f"jsonpath={query}", check=False).stdout.strip() != "True"
            ]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.forget_discovery()
        return pending

    def wait_established(self, names: list[str], timeout: float = 60) -> None:
        """``pending_crds``, raising ClusterError naming the CRDs not Established in time."""
        pending = self.pending_crds(names, timeout)
        if pending:
            raise ClusterError(f"CRDs not Established after {timeout:.0f}s: {', '.join(pending)}")


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
