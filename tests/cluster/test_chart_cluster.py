"""The Helm chart on the local control plane: installed, admitted under the restricted Pod Security level, its RBAC
proved with `kubectl auth can-i`, and the operator from the checkout run under the chart's ServiceAccount with every
API request recorded (the rendering and static checks are tests/unit/test_chart.py)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.capture import capture_on_and_off, delete_volume, make_volume
from tests.support.chart import CHART, CRD_DISCOVERY, DISCOVERY_USAGE, OPERATOR_NAMESPACED_USAGE, PEERING_VERBS, ROOT, api_request_kinds, one, render
from tests.support.kube import wait_until
from tests.support.operator_process import LLAMA_EAGLE3_SCRIPT, compatible_annotations, example

# =============================================================================================================
# On the local control plane: install, Pod Security admission, `kubectl auth can-i`, and the operator from the
# checkout running under the chart's ServiceAccount.

GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"


def _helm_install(kube_cluster: Any, helm_bin: str, release: str, namespace: str, *sets: str) -> None:
    proc = subprocess.run(
        [
            helm_bin,
            "install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--wait",
            "--timeout",
            "90s",
            *[arg for s in sets for arg in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=kube_cluster.env(),
    )
    if proc.returncode != 0:
        pytest.fail(f"helm install {release} failed: {proc.stderr.strip()}", pytrace=False)


def _helm_uninstall(kube_cluster: Any, helm_bin: str, release: str, namespace: str) -> None:
    subprocess.run(
        [helm_bin, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s"],
        capture_output=True,
        text=True,
        timeout=90,
        env=kube_cluster.env(),
    )


def _make_namespace(core_v1: Any, prefix: str, labels: dict[str, str] | None = None) -> str:
    import uuid

    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"specdec.test/namespace": "true", **(labels or {})})))
    return name


class Release(dict):
    """What a test needs to know about an installed release."""

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self['namespace']}:{self['serviceaccount']}"


@pytest.fixture(scope="module")
def cluster_release(kube_cluster, kube_client, core_v1, helm_bin) -> Iterator[Release]:
    """The chart installed with its defaults (cluster-wide) into a namespace enforcing `restricted` pod security."""
    import uuid

    namespace = _make_namespace(core_v1, "specdec-system", {"pod-security.kubernetes.io/enforce": "restricted"})
    release = f"chart-{uuid.uuid4().hex[:5]}"
    _helm_install(kube_cluster, helm_bin, release, namespace)
    fullname = f"{release}-specdec-operator"
    try:
        yield Release(namespace=namespace, release=release, fullname=fullname, serviceaccount=fullname, peering=fullname)
    finally:
        _helm_uninstall(kube_cluster, helm_bin, release, namespace)
        core_v1.delete_namespace(namespace, propagation_policy="Background")


def can_i(kube_cluster: Any, user: str, verb: str, resource: str, namespace: str | None, subresource: str | None = None) -> bool:
    """`kubectl auth can-i VERB RESOURCE --as=USER` (namespace None: across all namespaces / cluster scope)."""
    args = ["auth", "can-i", verb, resource, f"--as={user}"]
    args += ["--namespace", namespace] if namespace else ["--all-namespaces"]
    if subresource:
        args.append(f"--subresource={subresource}")
    proc = kube_cluster.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def _resource_arg(group: str, resource: str) -> tuple[str, str | None]:
    base, _, sub = resource.partition("/")
    return (f"{base}.{group}" if group else base), (sub or None)


def can_i_matrix(kube_cluster: Any, user: str, checks: list[tuple[str, str, str | None]]) -> dict:
    """Answer many can-i questions (verb, resource-arg, namespace) concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(check: tuple[str, str, str | None]) -> bool:
        verb, resource, namespace = check
        base, _, sub = resource.partition("|")
        return can_i(kube_cluster, user, verb, base, namespace, sub or None)

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(checks, pool.map(ask, checks)))


# Things the operator never needs: each must be refused (resource argument for kubectl, '|subresource').
FORBIDDEN = [
    *[(verb, "secrets", ns) for verb in ("get", "list", "watch", "create", "update", "patch", "delete") for ns in ("default", None)],
    ("*", "*", None),
    ("*", "*", "default"),
    ("get", "*", "default"),
    ("*", "deployments.apps", "default"),
    ("update", "configmaps", "default"),
    ("deletecollection", "configmaps", "default"),
    ("patch", "pods", "default"),
    ("update", "pods", "default"),
    ("create", "pods|exec", "default"),
    ("get", "pods|log", "default"),
    ("get", "services|proxy", "default"),
    ("deletecollection", "deployments.apps", "default"),
    ("deletecollection", "services", "default"),
    ("update", "deployments.apps", "default"),
    ("update", "services", "default"),
    ("get", "pods", "default"),
    ("create", "events.events.k8s.io", "default"),
    ("update", "speculativeservers.specdec.io|status", "default"),
    ("create", "speculativeservers.specdec.io", "default"),
    ("delete", "speculativeservers.specdec.io", "default"),
    ("update", "speculativeservers.specdec.io", "default"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("create", "namespaces", None),
    ("delete", "namespaces", None),
    ("list", "nodes", None),
    # The capture claim is applied, read before taking its name and deleted; never listed, watched or updated.
    ("list", "persistentvolumeclaims", "default"),
    ("watch", "persistentvolumeclaims", "default"),
    ("update", "persistentvolumeclaims", "default"),
    ("deletecollection", "persistentvolumeclaims", "default"),
    ("get", "persistentvolumes", None),
    # Training Jobs are watched, read, created and applied once; never updated or deleted (the garbage collector does).
    ("update", "jobs.batch", "default"),
    ("delete", "jobs.batch", "default"),
    ("deletecollection", "jobs.batch", "default"),
    ("create", "cronjobs.batch", "default"),
    ("create", "priorityclasses.scheduling.k8s.io", None),
    ("create", "serviceaccounts|token", "default"),
    ("create", "rolebindings.rbac.authorization.k8s.io", "default"),
    ("bind", "clusterroles.rbac.authorization.k8s.io", None),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ("impersonate", "users", None),
    ("impersonate", "serviceaccounts", "default"),
    ("create", "clusterkopfpeerings.kopf.dev", None),
    ("delete", "clusterkopfpeerings.kopf.dev", None),
    ("get", "clusterkopfpeerings.kopf.dev/someone-else", None),
    ("patch", "clusterkopfpeerings.kopf.dev/someone-else", None),
]


# Groups whose CRD the test cluster does not serve: `kubectl auth can-i` cannot resolve their resources without
# discovery (it answers no), so their grants are checked statically only (test_cluster_wide_rbac_is_exactly_the_operator_usage).
NOT_SERVED_HERE = {"leaderworkerset.x-k8s.io"}


def _usage_checks(usage: dict[tuple[str, str], set[str]], namespaces: list[str | None]) -> list:
    checks = []
    for (group, resource), verbs in usage.items():
        if group in NOT_SERVED_HERE:
            continue
        base, sub = _resource_arg(group, resource)
        for verb in sorted(verbs):
            for ns in namespaces:
                checks.append((verb, f"{base}|{sub}" if sub else base, ns))
    return checks


@pytest.mark.cluster
def test_operator_pod_passes_restricted_pod_security_admission(cluster_release, kube_cluster, core_v1, helm_bin):
    """The namespace enforces the `restricted` Pod Security Standard: the operator's pod is admitted."""
    ns = cluster_release["namespace"]
    pods = wait_until(
        lambda: core_v1.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=operator").items, timeout=30, message="operator pod"
    )
    assert pods[0].spec.service_account_name == cluster_release["serviceaccount"]
    # Guard: the same namespace refuses a relaxed copy of that pod, so the admission above meant something.
    deployment = one(render(helm_bin, None, "--set", "securityContext.allowPrivilegeEscalation=true", namespace=ns), "Deployment")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "relaxed", "namespace": ns},
        "spec": {**deployment["spec"]["template"]["spec"], "serviceAccountName": cluster_release["serviceaccount"]},
    }
    proc = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr


@pytest.mark.cluster
def test_cluster_wide_rbac_can_i_matrix(cluster_release, kube_cluster):
    user = cluster_release.user
    peering = cluster_release["peering"]
    allowed = _usage_checks(OPERATOR_NAMESPACED_USAGE, ["default", "some-team", None])
    allowed += _usage_checks(CRD_DISCOVERY, [None])
    allowed += [(v, "clusterkopfpeerings.kopf.dev", None) for v in ("list", "watch")]
    allowed += [("patch", f"clusterkopfpeerings.kopf.dev/{peering}", None)]
    forbidden = FORBIDDEN + [("list", "namespaces", None), ("get", "namespaces", None)]
    answers = can_i_matrix(kube_cluster, user, allowed + forbidden)
    refused = [c for c in allowed if not answers[c]]
    assert not refused, f"the operator's ServiceAccount lacks: {refused}"
    granted = [c for c in forbidden if answers[c]]
    assert not granted, f"the operator's ServiceAccount may do what it never needs: {granted}"


@pytest.mark.cluster
def test_namespaced_rbac_can_i_matrix_and_operator_run(kube_cluster, kube_client, core_v1, apps_v1, custom_objects, helm_bin, tmp_path):
    """Namespaced mode: `kubectl auth can-i` in the served namespace (yes) and elsewhere (no); then the operator
    under that ServiceAccount serves a resource there with nothing refused, using the namespaces grant."""
    import uuid

    home = _make_namespace(core_v1, "specdec-ops")
    served = _make_namespace(core_v1, "team-a")
    other = _make_namespace(core_v1, "team-b")
    release = f"ns-{uuid.uuid4().hex[:5]}"
    # The module's cluster-wide release already made the cluster-scoped PriorityClass specdec-training: a second release
    # in the same cluster leaves it out (the chart README says so).
    _helm_install(
        kube_cluster, helm_bin, release, home, "watch.allNamespaces=false", f"watch.namespaces={{{served}}}", "training.priorityClass.create=false"
    )
    try:
        user = f"system:serviceaccount:{home}:{release}-specdec-operator"
        allowed = _usage_checks(OPERATOR_NAMESPACED_USAGE, [served])
        allowed += _usage_checks(DISCOVERY_USAGE, [None])
        allowed += [(v, "kopfpeerings.kopf.dev", served) for v in ("list", "watch")]
        allowed += [("patch", f"kopfpeerings.kopf.dev/{release}-specdec-operator", served)]
        refused_expected = _usage_checks(OPERATOR_NAMESPACED_USAGE, [other, home, None])
        refused_expected += [("list", "clusterkopfpeerings.kopf.dev", None), ("list", "kopfpeerings.kopf.dev", other)]
        refused_expected += [c for c in FORBIDDEN if c[2] is not None] + [(v, r, served) for v, r, ns in FORBIDDEN if ns == "default"]
        answers = can_i_matrix(kube_cluster, user, allowed + refused_expected)
        assert not [c for c in allowed if not answers[c]], "missing in the served namespace"
        assert not [c for c in refused_expected if answers[c]], "granted outside the served namespace"

        fullname = f"{release}-specdec-operator"
        operator = OperatorUnderServiceAccount(
            kube_cluster,
            core_v1,
            apps_v1,
            Release(namespace=home, release=release, fullname=fullname, serviceaccount=fullname, peering=fullname),
            tmp_path,
            [],
        )
        try:
            assert f"--namespace={served}" in operator.chart_args
            custom_objects.create_namespaced_custom_object(
                GROUP, VERSION, served, PLURAL, example("llama31-8b-eagle3.yaml", "llama", served, annotations=compatible_annotations())
            )

            def served_with_children() -> bool:
                operator.check_running()
                st = custom_objects.get_namespaced_custom_object(GROUP, VERSION, served, PLURAL, "llama").get("status")
                names = {d.metadata.name for d in apps_v1.list_namespaced_deployment(served).items}
                return bool(st and st.get("phase")) and names == {"llama-base", "llama-spec"}

            wait_until(served_with_children, timeout=60, interval=0.5, message="status and Deployments")
            custom_objects.delete_namespaced_custom_object(GROUP, VERSION, served, PLURAL, "llama")
            wait_until(
                lambda: not custom_objects.list_namespaced_custom_object(GROUP, VERSION, served, PLURAL)["items"],
                timeout=60,
                message="the resource gone",
            )
        finally:
            operator.stop()
        operator.assert_nothing_refused()
        used = operator.used()
        # Kopf resolves --namespace patterns by listing and watching namespaces: the grant is needed here.
        assert {("list", "", "namespaces"), ("watch", "", "namespaces"), ("patch", "kopf.dev", "kopfpeerings")} <= used
        assert not {k for k in used if k[2] == "clusterkopfpeerings"}
        wait_until(lambda: not core_v1.list_namespaced_pod(served).items, timeout=60, message="pods gone")
    finally:
        _helm_uninstall(kube_cluster, helm_bin, release, home)
        for ns in (home, served, other):
            core_v1.delete_namespace(ns, propagation_policy="Background")


# -------------------------------------------------------------------------------------------------------------
# The operator from the checkout under the chart's ServiceAccount, every API request recorded.


class RecordingProxy:
    """A plain-HTTP reverse proxy in front of the kube-apiserver that records every request the operator makes.

    The operator's kubeconfig points here with the ServiceAccount's bearer token; the proxy forwards each request
    unchanged (TLS to the API server, streaming watches chunk by chunk) and records (method, path, query,
    status). The API server authenticates and authorizes the token: the proxy adds no privilege.
    """

    def __init__(self, upstream: str, ca_data: bytes) -> None:
        import asyncio
        import ssl
        import threading

        self.upstream = upstream.rstrip("/")
        self.ssl = ssl.create_default_context(cadata=ca_data.decode())
        self.records: list[tuple[str, str, str, int]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-recorder", daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> str:
        import aiohttp
        from aiohttp import web

        self.session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _forward(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        hop = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        body = await request.read()
        # No Content-Type where the client sent none: aiohttp would add application/octet-stream to a body, which the
        # API server refuses (415) for a DELETE's DeleteOptions that the kubernetes client sends without one.
        async with self.session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            ssl=self.ssl,
            skip_auto_headers=() if "content-type" in {k.lower() for k in headers} else ("Content-Type",),
        ) as upstream:
            self.records.append((request.method, request.path, request.query_string, upstream.status))
            response = web.StreamResponse(status=upstream.status, headers={k: v for k, v in upstream.headers.items() if k.lower() not in hop})
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the operator closed a watch, or the proxy is shutting down
            return response

    def close(self) -> None:
        import asyncio

        async def stop() -> None:
            await self.session.close()  # ends the forwarded watches first, so the handlers return
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _service_account_kubeconfig(core_v1: Any, release: Release, server: str, path: pathlib.Path) -> None:
    """A kubeconfig holding a bound token of the release's ServiceAccount (TokenRequest API), for `server`."""
    from kubernetes import client

    token = core_v1.create_namespaced_service_account_token(
        release["serviceaccount"],
        release["namespace"],
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "operator",
                "clusters": [{"name": "local", "cluster": {"server": server}}],
                "users": [{"name": release["serviceaccount"], "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "local", "user": release["serviceaccount"]}}],
            }
        )
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OperatorUnderServiceAccount:
    """`specdec run` from the checkout with the arguments the chart gives its container, authenticated as the
    chart's ServiceAccount (a bound token from the TokenRequest API), every API request through a RecordingProxy.

    Only what an out-of-cluster run needs differs from the Deployment: loopback liveness and metrics ports, and
    an --endpoints mapping to simulators instead of cluster DNS.
    """

    def __init__(
        self,
        kube_cluster: Any,
        core_v1: Any,
        apps_v1: Any,
        release: Release,
        workdir: pathlib.Path,
        extra_args: list[str],
        pod_id: str = "checkout-operator",
    ) -> None:
        import base64
        import os
        import sys

        admin = yaml.safe_load(pathlib.Path(kube_cluster.kubeconfig).read_text())
        cluster = admin["clusters"][0]["cluster"]
        ca = (
            base64.b64decode(cluster["certificate-authority-data"])
            if "certificate-authority-data" in cluster
            else pathlib.Path(cluster["certificate-authority"]).read_bytes()
        )
        self.proxy = RecordingProxy(cluster["server"], ca)
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = workdir / "operator.kubeconfig"
        _service_account_kubeconfig(core_v1, release, self.proxy.url, kubeconfig)
        deployment = apps_v1.read_namespaced_deployment(release["fullname"], release["namespace"])
        self.chart_args = list(deployment.spec.template.spec.containers[0].args)
        self.health, self.metrics = _free_port(), _free_port()
        args = [a for a in self.chart_args if not a.startswith(("--liveness=", "--metrics-port="))]
        args += [
            f"--liveness=http://127.0.0.1:{self.health}/healthz",
            f"--metrics-port={self.metrics}",
            "--metrics-address=127.0.0.1",
            "--reconcile-interval=1",
            *extra_args,
        ]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_ID": pod_id}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specdec_operator.cli", "run", *args],
            stdout=open(workdir / "operator.log", "w"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
        wait_until(self._alive, timeout=60, interval=0.5, message="the operator's liveness endpoint")

    def log(self) -> str:
        return (self.workdir / "operator.log").read_text()

    def check_running(self) -> None:
        assert self.process.poll() is None, f"operator exited {self.process.returncode}:\n{self.log()}"

    def _alive(self) -> bool:
        import urllib.request

        self.check_running()
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.proxy.close()

    def used(self) -> set[tuple[str, str, str]]:
        return {k for record in self.proxy.records for k in api_request_kinds(*record)}

    def assert_nothing_refused(self) -> None:
        refused = [r for r in self.proxy.records if r[3] in (401, 403)]
        assert not refused, f"refused requests: {refused[:10]}"
        assert "Forbidden" not in self.log() and "Not enough permissions" not in self.log(), self.log()

    def request_table(self) -> str:
        counts: dict[tuple[str, str, str], int] = {}
        for record in self.proxy.records:
            for key in api_request_kinds(*record):
                counts[key] = counts.get(key, 0) + 1
        return "\n".join(
            f"  {n:5d}  {k[0]:<7} {k[1] or 'core'}/{k[2]}" for k, n in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))
        )


@pytest.mark.cluster
@pytest.mark.slow
def test_operator_runs_an_example_end_to_end_under_the_chart_serviceaccount(
    cluster_release, kube_cluster, core_v1, apps_v1, custom_objects, tmp_path
):
    """`specdec run` from the checkout, as the chart runs it and authenticated as the chart's ServiceAccount,
    takes the Llama example through validation, deployment, a probe (scripted evidence; SGLang simulators behind
    the Services), promotion, traffic capture turned on and off (spec.retraining.capture), and deletion. Every API request goes through a recording proxy: none may be refused (the RBAC suffices), and
    every permission the chart grants must have been used (the RBAC is minimal)."""
    import urllib.request

    from tests.support.simulators import Simulators

    # Two simulators stand in for the base and speculative SGLang servers (no GPU here).
    simulators = Simulators()
    sims = [simulators.start("llama31-8b-base", seed=11), simulators.start("llama31-8b-eagle3", seed=11)]
    namespace = _make_namespace(core_v1, "sa-e2e")
    name = "llama31-8b"
    (tmp_path / "endpoints.yaml").write_text(yaml.safe_dump({f"{namespace}/{name}-base": sims[0].url, f"{namespace}/{name}-spec": sims[1].url}))
    # The probe decides on scripted evidence (the profile's truth, about 2x; probe/scripted.py): the test is about the
    # chart's RBAC through a whole lifecycle, not about measuring, so a busy machine cannot turn it Inconclusive.
    (tmp_path / "probe-script.yaml").write_text(yaml.safe_dump({f"{namespace}/{name}": LLAMA_EAGLE3_SCRIPT}))
    operator = None
    try:
        operator = OperatorUnderServiceAccount(
            kube_cluster,
            core_v1,
            apps_v1,
            cluster_release,
            tmp_path,
            ["--endpoints", str(tmp_path / "endpoints.yaml"), "--probe-script", str(tmp_path / "probe-script.yaml")],
        )
        assert "--all-namespaces" in operator.chart_args
        assert f"--peering={cluster_release['peering']}" in operator.chart_args
        custom_objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations())
        )

        def decided() -> dict | None:
            operator.check_running()
            st = custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status")
            return st if st and st.get("phase") in ("Promoted", "RolledBack", "Invalid", "Failed") else None

        status = wait_until(decided, timeout=150, interval=0.5, message="a decision")
        assert status["phase"] == "Promoted", f"{status.get('reason')}: {status.get('message')}"
        stable = core_v1.read_namespaced_service(name, namespace)
        assert stable.spec.selector["specdec.io/variant"] == "speculative"
        assert {e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.kind == "SpeculativeServer"} >= {
            "DrafterCompatible",
            "ProbeStarted",
        }
        # The peering object carries this replica's keep-alive.
        peering = custom_objects.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", cluster_release["peering"])
        assert "checkout-operator" in (peering.get("status") or {})
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics}/metrics", timeout=5).read().decode()
        assert f'specdec_active_variant{{name="{name}",namespace="{namespace}",variant="speculative"}} 1.0' in scraped
        # spec.retraining.capture on and off (docs/capture.md): the claim and <name>-serving's verbs, used under the
        # chart's ServiceAccount.
        volume = make_volume(core_v1, namespace)
        try:
            capture_on_and_off(core_v1, apps_v1, custom_objects, namespace, name, volume)
        finally:
            delete_volume(core_v1, volume)

        # Deleting the resource: the operator releases its finalizer, the garbage collector removes the children
        # and their pods (whose simulated GPUs the next test's servers need).
        custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        wait_until(
            lambda: not custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout=60,
            message="the resource gone",
        )
        wait_until(
            lambda: not apps_v1.list_namespaced_deployment(namespace).items and not core_v1.list_namespaced_pod(namespace).items,
            timeout=60,
            message="children garbage-collected",
        )
    finally:
        if operator is not None:
            operator.stop()
        simulators.close()
        core_v1.delete_namespace(namespace, propagation_policy="Background")

    # Sufficient: the API server refused nothing the operator asked for.
    operator.assert_nothing_refused()
    # Minimal: every granted permission was used.
    print("\nAPI requests by verb and resource (operator under the chart's ServiceAccount, cluster-wide):")
    print(operator.request_table())
    granted = {
        (verb, group, resource)
        for (group, resource), verbs in {**OPERATOR_NAMESPACED_USAGE, **CRD_DISCOVERY, ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS}.items()
        for verb in verbs
    }
    used = operator.used()
    # Writing the adaptive table happens only in a load-aware trial (a drafter that wins at low load and loses at
    # high), which this example is not: tests/cluster/test_operator_e2e.py's load-aware test exercises those three verbs.
    load_aware_only = {("get", "", "configmaps"), ("create", "", "configmaps"), ("patch", "", "configmaps")}
    # LeaderWorkerSets are used only for multi-node specs in a cluster with their CRD, which this one is not (Kopf
    # watches nothing there without it): tests/cluster/test_multinode_cluster.py applies and watches them.
    multi_node_only = {(verb, "leaderworkerset.x-k8s.io", "leaderworkersets") for verb in ("get", "list", "watch", "create", "patch", "delete")}
    # A File prompt dataset's reader pod is created and deleted only when a workload names one, which this example
    # does not: tests/cluster/test_datasets_volume_cluster.py creates and deletes them.
    file_dataset_only = {("create", "", "pods"), ("delete", "", "pods")}
    # Deleting Deployments happens only when resources.nodes changes from 1 to more (reconcile/retire.py), which
    # this example does not do: tests/cluster/test_multinode_cluster.py's nodes-change test does.
    nodes_change_only = {("delete", "apps", "deployments")}
    # A training Job is read, created and applied only when spec.retraining.training starts one (a drift rollback with
    # training on), which this example does not: tests/cluster/test_training_cluster.py makes the operator create one.
    # Its list and watch are used here (the Kopf index of training Jobs).
    training_only = {(verb, "batch", "jobs") for verb in ("get", "create", "patch")}
    unused = granted - used - load_aware_only - multi_node_only - file_dataset_only - nodes_change_only - training_only
    assert not unused, f"granted but never used (remove them from the chart): {unused}"
    assert used <= granted, f"used but not in the chart's usage table: {used - granted}"


@pytest.mark.cluster
def test_plain_manifests_install_with_kubectl(kube_cluster, kube_client, core_v1, apps_v1, tools_dir, tmp_path):
    """dist/install.yaml as docs/install.md applies it: CRDs first, then the rest; the operator pod is admitted in
    a namespace enforcing the `restricted` Pod Security Standard."""
    import uuid

    namespace = f"specdec-plain-{uuid.uuid4().hex[:5]}"
    proc = subprocess.run(
        ["bash", str(ROOT / "hack" / "manifests.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECDEC_TOOLS_DIR": str(tools_dir), "DIST_DIR": str(tmp_path), "NAMESPACE": namespace},
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "install.yaml").read_text()) if d]
    try:
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "crds.yaml"))
        kube_cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{d['metadata']['name']}" for d in docs if d["kind"] == "CustomResourceDefinition"],
        )
        applied = kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "install.yaml"), check=False)
        assert applied.returncode == 0, applied.stderr
        assert core_v1.read_namespace(namespace).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
        pods = wait_until(
            lambda: core_v1.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=operator").items,
            timeout=30,
            message="the operator pod admitted",
        )
        assert pods[0].spec.service_account_name == "specdec-operator"
        assert can_i(kube_cluster, f"system:serviceaccount:{namespace}:specdec-operator", "patch", "deployments.apps", "anywhere")
    finally:
        # Everything but the CRDs: deleting those would delete every SpeculativeServer of the session's cluster.
        for doc in reversed(docs):
            if doc["kind"] not in ("CustomResourceDefinition", "Namespace"):
                kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=json.dumps(doc), check=False)
        core_v1.delete_namespace(namespace, propagation_policy="Background")


@pytest.mark.cluster
@pytest.mark.slow
def test_two_replicas_elect_one_through_the_charts_peering(cluster_release, kube_cluster, core_v1, apps_v1, tmp_path):
    """Two operators with the chart's arguments and ServiceAccount: the younger one pauses in favour of the older,
    and takes over when the older one stops. The chart's peering object and RBAC are all Kopf's peering needs.
    A peering lifetime of 15 s (Kopf's shortest that does not flap) instead of 60: keep-alives every 5-10 s."""
    import time

    lifetime = ["--peering-lifetime=15"]
    first = OperatorUnderServiceAccount(kube_cluster, core_v1, apps_v1, cluster_release, tmp_path / "a", lifetime, pod_id="replica-a")
    second = None
    try:
        wait_until(
            lambda: "replica-a" in (_peering_status(kube_cluster, cluster_release) or {}),
            timeout=30,
            message="replica-a's keep-alive in the peering object",
        )
        second = OperatorUnderServiceAccount(kube_cluster, core_v1, apps_v1, cluster_release, tmp_path / "b", lifetime, pod_id="replica-b")
        # replica-b starts paused (mandatory peering) and stays so while replica-a, older and so of higher
        # priority, keeps its keep-alive: it announces itself in the peering but never resumes.
        wait_until(
            lambda: "replica-b" in _peering_status(kube_cluster, cluster_release), timeout=30, message="replica-b's keep-alive in the peering object"
        )
        peers = _peering_status(kube_cluster, cluster_release)
        assert peers["replica-a"]["priority"] > peers["replica-b"]["priority"], peers

        # Each replica's keep-alive again after both were in the peering: changes of the peering object that both
        # watch, each showing the other alive (the state each must act on), before looking at what they did.
        def both_kept_alive() -> bool:
            now = _peering_status(kube_cluster, cluster_release)
            return all(now[replica]["lastseen"] != peers[replica]["lastseen"] for replica in ("replica-a", "replica-b"))

        wait_until(both_kept_alive, timeout=45, message="a keep-alive of each replica after both joined")
        assert "Resuming operations" not in second.log(), f"{peers}\n{second.log()}"
        assert "Pausing" not in first.log()
        stopped = time.monotonic()
        first.stop()  # a graceful stop removes replica-a from the peering at once
        wait_until(lambda: "Resuming operations" in second.log(), timeout=30, message="replica-b taking over")
        print(f"\ntakeover after a graceful stop of the active replica: {time.monotonic() - stopped:.1f}s")
        assert set(_peering_status(kube_cluster, cluster_release)) == {"replica-b"}
    finally:
        if first.process.poll() is None:
            first.stop()
        if second is not None:
            second.stop()
    for replica in (first, second):
        replica.assert_nothing_refused()


def _peering_status(kube_cluster: Any, release: Release) -> dict[str, Any]:
    proc = kube_cluster.kubectl("get", "clusterkopfpeering", release["peering"], "-o", "json")
    return json.loads(proc.stdout).get("status") or {}
