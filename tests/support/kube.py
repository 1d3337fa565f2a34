"""pytest plugin: a real local Kubernetes control plane for tests marked ``@pytest.mark.cluster``.

Registered from tests/conftest.py (``pytest_plugins``). The cluster is started once per session (under
pytest-xdist each worker is a session: one control plane per worker, so the tests of different workers never
share one) by hack/devcluster (real etcd, kube-apiserver, kube-controller-manager, kube-scheduler; kwok plays the kubelets
of simulated GPU nodes) and stopped at the end, leaving no process behind; its components are also tied to the
pytest process, so they die with it even if the session is killed. Set ``SPECDEC_KUBECONFIG`` to run against a
cluster that is already up (e.g. from ``make cluster-up``); it is then left running, and the session must be a
single process (``-n 0``): some tests restart the API server or stop the LeaderWorkerSet controller.

Fixtures (scope):
    kube_cluster (session)     devcluster.Cluster: .kubeconfig, .server, .kubectl(...), .env(), .tools
    kubeconfig_path (session)  str path of the admin (cluster-admin) kubeconfig
    tools_dir (session)        Path of the built binaries (kubectl, helm, kube-apiserver, ...)
    kubectl_bin, helm_bin (session)  str paths of the pinned kubectl and helm
    kube_env (session)         environment for subprocesses: KUBECONFIG set, tools first on PATH
    project_crds (session)     names of the CRDs from crds/*.yaml, installed and Established
    kube_client (session)      kubernetes.client.ApiClient for the admin identity, after project_crds
                               (alias: kube_api_client)
    custom_objects (session)   CustomObjectsApi on kube_client (so the CRDs are there)
    core_v1, apps_v1, batch_v1, discovery_v1, rbac_v1 (session)  typed APIs (do not need crds/ to be valid)
    namespace (function)       name of a fresh namespace (deleted after the test)
    kubectl (function)         kubectl(*args, check=True, input=None) -> CompletedProcess, in `namespace`

Helpers for tests: ``wait_until(predicate, timeout, interval, message)``.
Pod outcomes are scripted with ``specdec.test/*`` annotations: see docs/development.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hack import devcluster

REPO_DIR = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.25, message: str = "condition") -> T:
    """Call ``predicate`` until it returns something truthy and return that; fail the test after ``timeout``.

    Exceptions from kubernetes' API (e.g. a 404 while an object is being created) count as "not yet".
    """
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except ApiException as error:
            last_error = error
        if time.monotonic() > deadline:
            detail = f" (last API error: {last_error.status} {last_error.reason})" if last_error else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {message}{detail}", pytrace=False)
        time.sleep(interval)


def _tools_or_fail() -> Path:
    tools = devcluster.tools_dir()
    missing = devcluster.missing_tools(tools)
    if missing:
        pytest.fail(f"control-plane tools missing in {tools} ({', '.join(missing)}): run `make tools`", pytrace=False)
    return tools


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[devcluster.Cluster]:
    """The session's cluster: reused from SPECDEC_KUBECONFIG, else started here and stopped afterwards."""
    tools = _tools_or_fail()
    external = os.environ.get("SPECDEC_KUBECONFIG")
    if external and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("SPECDEC_KUBECONFIG is one cluster for every pytest-xdist worker: run with -n 0, or unset it", pytrace=False)
    if external:
        path = Path(external).expanduser()
        if not path.is_file():
            pytest.fail(f"SPECDEC_KUBECONFIG={external} is not a file: unset it or run `make cluster-up`", pytrace=False)
        server = re.search(r"server:\s*(\S+)", path.read_text())
        yield devcluster.Cluster(
            name="external",
            directory=path.parent,
            kubeconfig=path,
            server=server.group(1) if server else "",
            ports={},
            tools=tools,
        )
        return
    devcluster.reap_orphans()
    # One cluster per session (the pid keeps concurrent sessions, pytest-xdist workers too, on this machine apart).
    name = f"pytest-{os.getpid()}"
    try:
        cluster = devcluster.up(name, tie_to_parent=True)
    except devcluster.ClusterError as error:
        devcluster.down(name, purge=True)
        pytest.fail(f"could not start the local cluster: {error}", pytrace=False)
    try:
        yield cluster
    finally:
        devcluster.down(name, purge=True)


@pytest.fixture(scope="session")
def kubeconfig_path(kube_cluster: devcluster.Cluster) -> str:
    """Path of the admin kubeconfig (identity in system:masters, i.e. cluster-admin)."""
    return str(kube_cluster.kubeconfig)


@pytest.fixture(scope="session")
def tools_dir() -> Path:
    """Directory of the pinned binaries built by `make tools`."""
    return _tools_or_fail()


@pytest.fixture(scope="session")
def kubectl_bin(tools_dir: Path) -> str:
    """The kubectl built from the same Kubernetes release as the control plane."""
    return str(tools_dir / "kubectl")


@pytest.fixture(scope="session")
def helm_bin(tools_dir: Path) -> str:
    """The pinned helm (v4)."""
    path = tools_dir / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm missing in {tools_dir}: run `make tools`", pytrace=False)
    return str(path)


@pytest.fixture(scope="session")
def kube_env(kube_cluster: devcluster.Cluster) -> dict[str, str]:
    """Environment for subprocesses that talk to the cluster (KUBECONFIG, tools first on PATH)."""
    return kube_cluster.env()


@pytest.fixture(scope="session")
def project_crds(kube_cluster: devcluster.Cluster) -> list[str]:
    """Apply every YAML file in crds/ (server-side) and wait until each CRD is Established."""
    files = sorted((REPO_DIR / "crds").glob("*.yaml"))
    if not files:
        return []
    args = ["apply", "--server-side", "--force-conflicts"]
    for path in files:
        args += ["-f", str(path)]
    applied = kube_cluster.kubectl(*args, "-o", "name", check=False)
    if applied.returncode != 0:
        pytest.fail(f"installing crds/ failed: {applied.stderr.strip()}", pytrace=False)
    names = [line.split("/", 1)[1] for line in applied.stdout.split() if line.startswith("customresourcedefinition")]
    if names:
        pending = kube_cluster.pending_crds(names, timeout=90)
        if pending:
            pytest.fail(f"CRDs from crds/ not Established after 90s: {', '.join(pending)}", pytrace=False)
    return names


@pytest.fixture(scope="session")
def _admin_api_client(kube_cluster: devcluster.Cluster) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def kube_client(_admin_api_client: Any, project_crds: list[str]) -> Any:
    """A kubernetes.client.ApiClient for the cluster-admin identity, with the project's CRDs installed."""
    return _admin_api_client


@pytest.fixture(scope="session")
def kube_api_client(kube_client: Any) -> Any:
    """Alias of kube_client."""
    return kube_client


@pytest.fixture(scope="session")
def core_v1(_admin_api_client: Any) -> Any:
    """kubernetes.client.CoreV1Api on the session client."""
    from kubernetes import client

    return client.CoreV1Api(_admin_api_client)


@pytest.fixture(scope="session")
def apps_v1(_admin_api_client: Any) -> Any:
    """kubernetes.client.AppsV1Api on the session client."""
    from kubernetes import client

    return client.AppsV1Api(_admin_api_client)


@pytest.fixture(scope="session")
def batch_v1(_admin_api_client: Any) -> Any:
    """kubernetes.client.BatchV1Api on the session client."""
    from kubernetes import client

    return client.BatchV1Api(_admin_api_client)


@pytest.fixture(scope="session")
def discovery_v1(_admin_api_client: Any) -> Any:
    """kubernetes.client.DiscoveryV1Api (EndpointSlices) on the session client."""
    from kubernetes import client

    return client.DiscoveryV1Api(_admin_api_client)


@pytest.fixture(scope="session")
def rbac_v1(_admin_api_client: Any) -> Any:
    """kubernetes.client.RbacAuthorizationV1Api on the session client."""
    from kubernetes import client

    return client.RbacAuthorizationV1Api(_admin_api_client)


@pytest.fixture(scope="session")
def custom_objects(kube_client: Any) -> Any:
    """kubernetes.client.CustomObjectsApi on the session client (for the project's CRDs)."""
    from kubernetes import client

    return client.CustomObjectsApi(kube_client)


def _namespace_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-") or "test"
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: Any) -> Iterator[str]:
    """A fresh namespace named after the test; its default ServiceAccount exists; deleted afterwards."""
    from kubernetes import client

    name = _namespace_name(request)
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"specdec.test/namespace": "true"})))
    # Pods are refused until the controller-manager created the namespace's default ServiceAccount.
    wait_until(lambda: core_v1.read_namespaced_service_account("default", name), timeout=30, message=f"ServiceAccount default in namespace {name}")
    try:
        yield name
    finally:
        # Not waited for: the namespace controller finishes the deletion in the background.
        core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def kubectl(kube_cluster: devcluster.Cluster, namespace: str, project_crds: list[str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """kubectl(*args, check=True, input=None) in the test's namespace (the project's CRDs installed)."""

    def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = kube_cluster.kubectl("--namespace", namespace, *args, check=False, input=input)
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}", pytrace=False)
        return proc

    return run
