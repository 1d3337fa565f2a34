"""What stands behind the operator's names while it drives the retraining loop on vLLM's CPU build (issue 36, item 5).

`specdec run` on the local control plane runs the loop by itself: the monitor's drift rollback, the training Job, the
offline gate, the race of the revision against the base and the serving drafter, the promotion. Nothing runs in the
cluster's pods (kwok plays the kubelets), so :class:`EngineLoop` puts the real parts behind the names the operator
uses (its --endpoints file) and plays the kubelet where something must run:

* ``<name>-base``: a vLLM server of the copy target (core 0), warm for the whole loop;
* ``<name>-spec``: the speculative slot, pointed at the server of the drafter its Deployment's pod template serves:
  the free-trained drafter's (spec.drafter), or a published revision's (``/revisions/<job>`` in the template), started
  here from the revisions claim's directory as soon as its Job publishes it (core 1; the three servers run at once);
* ``<name>-capture``: a real capture proxy (`specdec capture`) in front of the server the stable Service selects
  (restarted on the other side when the operator switches it), writing into the capture claim's directory; users'
  chat requests go through it;
* the training Job's pod: hack/job_runner.py runs its stages as local processes (the Job in the image cannot run
  here: kwok nodes run no containers), the base Service in its commands mapped to the base server;
* dataset reader pods (the race's held-out workload): hack/reader_kubelet.py.

The speculative pods are held not Ready by kwok (``specdec.test/ready-after`` SPEC_HOLD, for the speculative variant
only) and the router plays their kubelet's readiness probe (:meth:`EngineLoop.mark_ready`): a pod is Ready once the
vLLM server of the drafter its template serves answers, so the operator never probes a slot whose server is still
loading (a revision's server is started when its Job publishes it), and never waits longer than that server needs. The capture claim's volume is made
at the start (a PersistentVolume reserved for the claim: no provisioner here); the revisions claim's once the runner
has bound the Job's pod (else the scheduler would give it to a kwok node, which runs nothing).
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import demo_flywheel as df
from hack.job_mapping import VolumeDirs
from hack.job_runner import JobRunner, LocalExecute
from hack.reader_kubelet import ReaderKubelet, write_endpoints_file
from tests.support.copy_workloads import copy_workload
from tests.support.operator_process import GROUP, PLURAL, VERSION, Operator
from tests.support.retrain_loop import EXTRA_ARGS, base_url_of, chat, training_job
from tests.support.retrain_models import DRAFTER, TARGET, free_prompts
from tests.support.vllm_servers import VllmServer, start_servers

SPEC_HOLD = "1h"  # kwok's ready-after for the speculative pods: longer than any loop; mark_ready makes them Ready
NOTHING = "http://127.0.0.1:9"  # a closed port: connections refused
SPEC_TOKENS = 3


class Users:
    """One user at a time sending greedy chat requests of the current kind ("free" or "copy") through the capture proxy;
    paused while ``kind`` is None. Counts what was answered, by kind."""

    def __init__(self, url: Callable[[], str | None]) -> None:
        self.url = url
        self.kind: str | None = None
        self.sent: dict[str, int] = {}
        self.errors: list[str] = []
        self.prompts = {"free": itertools.cycle(free_prompts(64, seed=300)), "copy": itertools.cycle(copy_workload(64, seed=3))}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="users", daemon=True)

    def start(self) -> Users:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            kind, url = self.kind, self.url()
            if kind is None or url is None:
                self._stop.wait(0.2)
                continue
            try:
                chat(url, next(self.prompts[kind])["messages"])
                self.sent[kind] = self.sent.get(kind, 0) + 1
            except (OSError, urllib.error.URLError) as exc:  # the proxy restarting on the other side: send again
                self.errors = [*self.errors, f"{type(exc).__name__}: {exc}"[:200]][-20:]
                self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(310)


class EngineLoop:
    """The real parts behind one SpeculativeServer's names while the operator drives the loop (module docstring)."""

    def __init__(self, operator: Operator, api_client: Any, namespace: str, name: str, models: Path, logs: Path) -> None:
        from kubernetes import client

        self.operator, self.api_client, self.namespace, self.name = operator, api_client, namespace, name
        self.core, self.custom, self.apps = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client), client.AppsV1Api(api_client)
        self.models, self.logs = models, logs
        self.root = operator.workdir / "job-runner"
        self.claims = self.root / "claims" / namespace
        self.storage_class = f"{namespace}-loop"
        self.lock = threading.Lock()  # around operator.endpoints and the file written from it
        self.servers: dict[str, VllmServer] = {}  # "base", "drafter" and each revision's name
        self.starting: dict[str, threading.Thread] = {}
        self.slot = "drafter"
        self.slot_switches: list[tuple[float, str]] = []
        self.ready_marked: list[tuple[float, str]] = []  # (when, pod): the speculative pods mark_ready made Ready
        self.volumes: list[str] = []
        self.priority_class: str | None = None
        self.proxy: Any = None
        self.upstream: str | None = None
        self.proxy_port, self.admin_port = df.free_port(), df.free_port()
        self.status: dict[str, Any] = {}
        self.race_table: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.users = Users(self.traffic_url)
        self.runner: JobRunner | None = None
        self.readers: ReaderKubelet | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._route_loop, name="engine-loop-router", daemon=True)

    # ---- names -------------------------------------------------------------------------------------------------

    def service(self, suffix: str) -> str:
        return f"{self.namespace}/{self.name}-{suffix}"

    def set_endpoint(self, key: str, url: str) -> None:
        with self.lock:
            if self.operator.endpoints.get(key) != url:
                self.operator.endpoints[key] = url
                self.write_endpoints()

    def write_endpoints(self) -> None:
        write_endpoints_file(self.operator.workdir / "endpoints.yaml", self.operator.endpoints)

    def traffic_url(self) -> str | None:
        proxy = self.proxy
        return f"http://127.0.0.1:{self.proxy_port}" if proxy is not None and proxy.poll() is None else None

    # ---- start and stop ----------------------------------------------------------------------------------------

    def start_servers(self) -> None:
        """The base and the free-trained drafter's servers (before the operator starts: its first probe needs them)."""
        base = VllmServer("base", self.models / TARGET, self.logs / "base.log", core="0")
        drafter = VllmServer(
            "drafter", self.models / TARGET, self.logs / "drafter.log", drafter=self.models / DRAFTER, core="1", num_speculative_tokens=SPEC_TOKENS
        )
        self.servers.update(base=base, drafter=drafter)
        start_servers([base, drafter])
        self.operator.map(f"{self.name}-base", base.url)
        self.operator.map(f"{self.name}-spec", drafter.url)
        self.operator.map(f"{self.name}-capture", f"http://127.0.0.1:{self.admin_port}")

    def start(self, max_steps: int) -> None:
        """After the operator started: the capture claim's volume, the training PriorityClass, the job runner (the base
        Service in the Job's commands -> the base server), the reader kubelet, the proxy, the router and the users."""
        from kubernetes.client.exceptions import ApiException

        from specdec_operator.trainjob import DEFAULT_PRIORITY_CLASS

        self.make_volume("capture")
        try:
            from kubernetes import client

            client.SchedulingV1Api(self.api_client).create_priority_class(df.priority_class())
            self.priority_class = DEFAULT_PRIORITY_CLASS
        except ApiException as exc:
            if exc.status != 409:  # 409: there already (another run's): used as it is, not deleted
                raise
        base_service = base_url_of(training_job(self.name, self.namespace, max_steps)["spec"]["template"]["spec"])
        dirs = VolumeDirs(self.root, named={"model": self.models})
        execute = LocalExecute(nice=10, extra_args=EXTRA_ARGS)
        self.runner = JobRunner(self.api_client, self.root, dirs, execute, {base_service: self.servers["base"].url}, namespaces={self.namespace})
        self.runner.start()
        op = self.operator
        self.readers = ReaderKubelet(
            self.core, self.namespace, op.endpoints, self.write_endpoints, op.workdir, self.root / "model-volume", self.claims, self.lock
        )
        self.readers.start()
        self.restart_proxy(self.servers["base"].url)
        self._thread.start()
        self.users.start()

    def make_volume(self, which: str) -> None:
        name = f"{self.storage_class}-{which}"
        path = self.claims / f"{self.name}-{which}"
        path.mkdir(parents=True, exist_ok=True)
        self.core.create_persistent_volume(df.volume(name, self.storage_class, self.namespace, f"{self.name}-{which}", path))
        self.volumes.append(name)

    def stop(self) -> None:
        self.users.stop()
        self._stop.set()
        self._thread.join(10)
        for part in (self.runner, self.readers):
            if part is not None:
                try:
                    part.stop()
                except AssertionError as exc:  # the reader kubelet's own failure: reported, the rest still stopped
                    self.errors.append(str(exc)[:300])
        if self.proxy is not None:
            self.proxy.terminate()
            self.proxy.wait(10)
        for thread in self.starting.values():
            thread.join(300)
        for server in self.servers.values():
            server.stop()
        for volume in self.volumes:
            try:
                self.core.delete_persistent_volume(volume)
            except Exception:
                pass
        if self.priority_class is not None:
            from kubernetes import client

            client.SchedulingV1Api(self.api_client).delete_priority_class(self.priority_class)

    # ---- the router ----------------------------------------------------------------------------------------------

    def _route_loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.route()
            except Exception as exc:  # the API server busy for a moment: keep the mapping, look again
                self.errors = [*self.errors, f"router: {type(exc).__name__}: {exc}"[:300]][-20:]

    def route(self) -> None:
        """Start a published revision's server; point the slot at the server of the drafter its template serves; make
        the revisions claim's volume once the runner took the Job; keep the proxy in front of the stable side."""
        from kubernetes.client.exceptions import ApiException

        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        self.status = obj.get("status") or {}
        if self.status.get("candidates"):  # the race's table is cleared once the race is over: the last one seen
            self.race_table = self.status["candidates"]
        for published in sorted((self.claims / f"{self.name}-revisions").glob("*/COMPLETE")):
            self.start_revision_server(published.parent)
        try:
            deployment = self.api_client.sanitize_for_serialization(self.apps.read_namespaced_deployment(f"{self.name}-spec", self.namespace))
        except ApiException:
            deployment = None
        slot = df.template_revision(deployment) or "drafter"
        if slot != self.slot:
            server = self.servers.get(slot)
            # A revision whose server is not up yet: nothing answers behind the slot (a refused connection is a
            # transient failure the probe tries again), never the previous drafter's server in its name.
            self.set_endpoint(self.service("spec"), server.url if server is not None else NOTHING)
            if server is None:
                self.errors.append(f"the slot serves {slot} before its server answered")
            self.slot = slot
            self.slot_switches.append((time.monotonic(), slot))
        elif self.operator.endpoints.get(self.service("spec")) == NOTHING and slot in self.servers:
            self.set_endpoint(self.service("spec"), self.servers[slot].url)
        self.mark_ready()
        if self.runner is not None and self.runner.jobs and not any(v.endswith("-revisions") for v in self.volumes):
            self.make_volume("revisions")
        side = self.servers.get(self.slot) if self.status.get("activeVariant") == "speculative" else self.servers["base"]
        if side is not None and side.url != self.upstream:
            self.restart_proxy(side.url)

    def mark_ready(self) -> None:
        """The kubelet's readiness probe of the speculative pods: a Running pod turns Ready once the server of the
        drafter its template serves answers (start_servers returned: its /health answered), as a kubelet's probe of
        /health would report. kwok holds them not Ready until then (SPEC_HOLD)."""
        selector = f"app.kubernetes.io/instance={self.name},specdec.io/variant=speculative"
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=selector).items:
            body = self.api_client.sanitize_for_serialization(pod)
            status = body.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if body["metadata"].get("deletionTimestamp") or status.get("phase") != "Running" or ready:
                continue
            if (df.template_revision({"spec": {"template": body}}) or "drafter") not in self.servers:
                continue
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            conditions = [{"type": kind, "status": "True", "reason": None, "lastTransitionTime": now} for kind in ("ContainersReady", "Ready")]
            # containerStatuses is an atomic list in a strategic merge patch: every entry, whole, marked ready.
            containers = [{**c, "ready": True, "started": True} for c in status.get("containerStatuses") or []]
            self.core.patch_namespaced_pod_status(
                body["metadata"]["name"], self.namespace, {"status": {"conditions": conditions, "containerStatuses": containers}}
            )
            self.ready_marked.append((time.monotonic(), body["metadata"]["name"]))

    def start_revision_server(self, revision: Path) -> None:
        """A vLLM server of a published revision, started once in the background (the router goes on meanwhile)."""
        name = revision.name
        if name in self.servers or name in self.starting:
            return
        server = VllmServer(name, self.models / TARGET, self.logs / f"{name}.log", drafter=revision, core="1", num_speculative_tokens=SPEC_TOKENS)

        def start() -> None:
            try:
                start_servers([server])
                self.servers[name] = server
            except Exception as exc:
                self.errors.append(f"revision server {name}: {exc}"[:600])

        self.starting[name] = threading.Thread(target=start, name=f"vllm-{name}", daemon=True)
        self.starting[name].start()

    def restart_proxy(self, upstream: str) -> None:
        if self.proxy is not None:
            self.proxy.terminate()
            self.proxy.wait(10)
        capture = self.claims / f"{self.name}-capture"
        self.proxy = df.start_capture_proxy(capture, upstream, self.proxy_port, self.admin_port, self.logs / "capture-proxy.log")
        self.upstream = upstream
