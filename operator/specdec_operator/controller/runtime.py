"""One operator process: the resources' states, the loop of each resource, and one step of it.

One Kopf daemon per SpeculativeServer runs ``Runtime.serve``: ``step`` = gather observed (``observe``) ->
``reconcile.reconcile`` -> ``Executor.execute(plan)``. It wakes up on any event of the resource or of its children
(pods, Deployments, Services, and the adaptive table's ConfigMap, watched through label-filtered Kopf indexes, so
a step lists nothing), every ``reconcile_interval`` seconds while its status changes with time (servers loading,
a probe running), and every ``resync_interval`` seconds once it is settled (``next_delay``).

Who does what:
    KubernetesWriter (kubewriter.py)   the only code that writes to the API server: children, status, Events
    Executor (execute.py)              carries out a plan through the writer and the probe scheduler
    ProbeScheduler (probescheduler.py) the only code that talks to SGLang: probes and drift scrapes
    ResourceState (state.py)           what this process remembers of one resource between steps
    kopf_tuning.py                     Kopf's storages, index copies and settings
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .. import manifests as m
from .. import poddefaults
from ..api import SpeculativeServerSpec, Variant
from ..engines import engine_for
from ..errors import InputError
from ..monitor import Sample
from ..reconcile import Observed, Plan, read_status, reconcile, stuck
from ..reconcile.diff import labels_of
from ..reconcile.pods import is_ready, pods_of
from ..reconcile.training import ACTIVE as TRAINING_ACTIVE
from ..reconcile.training import JOB_NAME_LABEL, report_pending, stored_training
from ..resource import parse_spec
from .capturecount import CaptureCounts, count_wait, last_job_start
from .config import OperatorConfig
from .datasetreader import FileDatasetReader
from .execute import Executor, stored_status
from .kopf_tuning import job_active, plain
from .kubewriter import MAX_DIAGNOSED_PODS, KubernetesWriter
from .metrics import OperatorMetrics
from .probescheduler import ProbeScheduler
from .state import Key, Logger, ResourceState

# How long API discovery's answer on LeaderWorkerSets (served or not) is trusted before it is asked again: a
# multi-node spec refused for want of the CRD goes on by itself within this long of the CRD being installed.
LWS_RECHECK_S = 30.0
# The longest wait between steps after failures (the backoff doubles from 1 s up to this).
MAX_BACKOFF_S = 60.0
# The shortest wait before a drift scrape that is due (a scrape due now still lets the step's writes land).
MIN_SCRAPE_WAIT_S = 0.2


@dataclass(frozen=True)
class Children:
    """The children of each resource in the operator's indexes, by (namespace, name): what a step observes."""

    pods: Callable[[Key], list]
    servers: Callable[[Key], list]  # Deployments and LeaderWorkerSets
    services: Callable[[Key], list]
    config_maps: Callable[[Key], list]
    # spec.retraining.training: this resource's training Jobs, and the operator's active training Jobs in the whole cluster.
    training_jobs: Callable[[Key], list] = lambda _: []
    training_jobs_running: Callable[[], int] = lambda: 0
    # spec.retraining.capture: the capture proxies' pods (their /metrics count the claim: capturecount.py).
    capture_pods: Callable[[Key], list] = lambda _: []


def next_delay(failures: int, plan: Plan | None, reconcile_interval: float, resync_interval: float) -> float:
    """Seconds until the next step when nothing wakes the loop: a backoff after failed steps (1, 2, 4 ... 60 s),
    the slow resync once settled, the reconcile interval while the status changes with time; sooner when a drift
    scrape is due."""
    if failures:
        delay = min(MAX_BACKOFF_S, 0.5 * 2**failures)
    elif plan is not None and plan.settled:
        delay = resync_interval
    else:
        delay = reconcile_interval
    if plan is not None and plan.next_scrape_in is not None:
        delay = min(delay, max(MIN_SCRAPE_WAIT_S, plan.next_scrape_in))
    if plan is not None and plan.next_step_in is not None:  # a training Job's cooldown or maxPerDay ends
        delay = min(delay, max(MIN_SCRAPE_WAIT_S, plan.next_step_in))
    return delay


class Runtime:
    """One operator process: the resources' states, the writer, the probe scheduler, the step slots."""

    def __init__(
        self,
        config: OperatorConfig,
        metrics: OperatorMetrics,
        api_client: k8s.ApiClient | None = None,
        *,
        writer: KubernetesWriter | None = None,
        probes: ProbeScheduler | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.writer = writer or KubernetesWriter(metrics, api_client)
        self.probes = probes or ProbeScheduler(config)
        if self.probes.read_config_map is None:  # a ConfigMap prompt source is read through the API (get, one object)
            self.probes.read_config_map = self.writer.read_config_map
        if self.probes.read_evidence is None:  # what an earlier run of a probe kept (ConfigMap <name>-probe-evidence)
            self.probes.read_evidence = self.writer.read_probe_evidence
        if self.probes.read_file_dataset is None:  # a File prompt source is read by a reader pod (create, list, delete)
            reader = FileDatasetReader(self.writer.request, config.endpoints, config.reconcile.manifests, timeout=config.dataset_reader_timeout)
            self.probes.read_file_dataset = reader.read
        self.resources: dict[Key, ResourceState] = {}
        self.executor = Executor(config, metrics, self.writer, self.probes, self.wake)
        self.capture_counts = CaptureCounts(config.endpoints, config.scrape_timeout)
        self._step_slots: asyncio.Semaphore | None = None  # created in the event loop, on the first step
        self._lws_served: tuple[float, bool] | None = None  # (checked at, served): API discovery, cached

    def resource(self, key: Key, uid: str) -> ResourceState:
        state = self.resources.get(key)
        if state is None or state.uid != uid:  # first step, or a new object under the same name
            wake = state.wake if state is not None else asyncio.Event()
            state = self.resources[key] = ResourceState(uid=uid, wake=wake)
        return state

    async def lws_served(self) -> bool:
        """Whether the cluster serves LeaderWorkerSets (cached for LWS_RECHECK_S)."""
        now = time.monotonic()
        if self._lws_served is None or now - self._lws_served[0] > LWS_RECHECK_S:
            self._lws_served = (now, await self.writer.served(m.LWS_API_VERSION, m.LWS_PLURAL))
        return self._lws_served[1]

    def step_slot(self) -> asyncio.Semaphore:
        if self._step_slots is None:
            self._step_slots = asyncio.Semaphore(self.config.max_concurrent_reconciles)
        return self._step_slots

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and (namespace, name) in self.resources:
            self.resources[(namespace, name)].wake.set()

    async def due_scrape(self, key: Key, pods: list) -> dict[str, Sample] | None:
        """Scrape every Ready speculative pod when the last step said a scrape is due (before taking a step slot:
        a slow server must not hold one)."""
        state = self.resources.get(key)
        if state is None or not state.monitor_due:
            return None
        return await self.probes.scrape(key, monitored_pods(pods), engine_for(state.spec))

    async def close(self) -> None:
        await self.probes.close()
        await self.capture_counts.close()
        for state in self.resources.values():
            if state.creating is not None:
                state.creating.cancel()

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.probes.forget(key)
        state = self.resources.pop(key, None)
        if state is not None and state.creating is not None:
            state.creating.cancel()
        self.metrics.forget(namespace, name)

    # --- the loop of one resource (a Kopf daemon): wait, step, wait
    async def serve(self, key: Key, body: Any, children: Children, stopped: kopf.DaemonStopped, logger: Logger) -> None:
        """Step this resource until its daemon is stopped: on every wake-up (an event of it or of a child), and
        otherwise after ``next_delay``. Events closer together than ``min_step_interval`` make one step."""
        state = self.resource(key, body["metadata"]["uid"])
        failures = 0
        try:
            while not stopped:
                pause = state.last_step + self.config.min_step_interval - time.monotonic()
                if pause > 0:  # events closer together than that are merged into this one step
                    await _sleep(asyncio.Event(), stopped, pause)
                    if stopped:
                        break
                plan, failed = await self._guarded_step(key, state, body, children, logger)
                failures = failures + 1 if failed else 0
                delay = next_delay(failures, plan, self.config.reconcile_interval, self.config.resync_interval)
                await _sleep(state.wake, stopped, min(delay, count_wait(state, time.monotonic()) or delay))
        finally:
            if stopped.reason is not None and kopf.DaemonStoppingReason.RESOURCE_DELETED in stopped.reason:
                self.forget(*key)
            else:
                self.probes.cancel(key)

    async def _guarded_step(self, key: Key, state: ResourceState, body: Any, children: Children, logger: Logger) -> tuple[Plan | None, bool]:
        """One step in a step slot: (its plan, whether it failed). A failed step is logged, counted and retried."""
        queued = time.monotonic()
        try:
            scrape = await self.due_scrape(key, children.pods(key))
            captured = await self.capture_counts.due(key, state, self._spec(body, state)[0], children.capture_pods(key), last_job_start(body))
            since = state.captured.since if state.captured is not None else None
            since_start = state.captured.since_start if state.captured is not None else None
            captured_since = (since, since_start) if since is not None and since_start is not None else None
            async with self.step_slot():
                state.wake.clear()  # after the wait: what happened while queued is seen by this step
                started = time.monotonic()
                self.metrics.reconcile_queue_seconds.observe(started - queued)
                try:
                    plan = await self.step(
                        body,
                        children.pods(key),
                        children.servers(key),
                        children.services(key),
                        logger,
                        scrape,
                        children.config_maps(key),
                        training=training_of(children, key),
                        captured_samples=captured,
                        captured_since=captured_since,
                    )
                finally:
                    state.last_step = time.monotonic()
                    self.metrics.reconcile_seconds.observe(state.last_step - started)
            return plan, False
        except ApiException as exc:
            self.metrics.reconcile_errors.labels("api").inc()
            await self.executor.api_failure(body, exc, logger, self.resources.get(key))
        except Exception as exc:  # never let one bad step kill the loop; it is retried with backoff
            self.metrics.reconcile_errors.labels(type(exc).__name__).inc()
            logger.exception(f"reconcile step failed (will retry): {exc}")
            if key in self.resources:
                self.resources[key].forget_status()
        return None, True

    # --- one step: gather observed -> reconcile -> execute(plan)
    async def step(
        self,
        body: Any,
        pods: list,
        deployments: list,
        services: list,
        logger: Logger,
        scrape: dict[str, Sample] | None = None,
        config_maps: list | None = None,
        training: Training | None = None,
        captured_samples: int | None = None,
        captured_since: tuple[str, int] | None = None,
    ) -> Plan | None:
        """One step; None when the spec is not served (reconcile refused it: only its status was written)."""
        key: Key = (body["metadata"]["namespace"], body["metadata"]["name"])
        state = self.resource(key, body["metadata"]["uid"])
        if state.status is None:
            state.written = stored_status(body)
            state.status = read_status(state.written)
        spec, spec_error = self._spec(body, state)
        # API discovery is asked only for a multi-node spec (cached for LWS_RECHECK_S).
        served = await self.lws_served() if spec is not None and m.multi_node(spec) else True
        observed = observe(
            self.probes,
            key,
            state,
            body,
            pods,
            deployments,
            services,
            scrape,
            config_maps or [],
            multi_node=spec is not None and m.multi_node(spec),
            spec_error=spec_error,
            leader_worker_sets_served=served,
            pod_events=await self.pod_events(key[0], pods),
            races_elsewhere=self.races_running(key),
            training=await self.training_details(key[0], state, training),
            captured_samples=captured_samples,
            captured_since=captured_since,
        )
        plan = reconcile(spec, observed, state.status, datetime.now(UTC), self.config.reconcile, rendered=state.rendered)
        if plan.refused:  # nothing is created or changed: the children that exist stay as they are
            await self.executor.write_refused(body, state, plan, state.written or {})
            return None
        state.rendered = plan.rendered
        assert spec is not None
        await self.executor.execute(key, state, body, spec, plan, observed, logger)
        return plan

    async def training_details(self, namespace: str, state: ResourceState, training: Training | None) -> Training | None:
        """``training`` with the pods of the Jobs that are active or that the status still records as active (their
        stage, or the stage that failed), and the Warning Events of those without a pod (a quota refusing it is told
        only there). Read on demand, only then: training pods are not watched. Unreadable: neither."""
        if training is None:
            return None
        stored = stored_training(state.status) if state.status is not None else None
        # Also a succeeded Job whose revision's report (its publish container's termination message) is not read yet.
        recorded = stored.job if stored is not None and stored.state in TRAINING_ACTIVE else report_pending(state.status)
        current = [j for j in training.jobs if job_active(j) or j["metadata"]["name"] == recorded]
        if not current:
            return training
        try:
            pods = await self.writer.job_pods(namespace, current)
            podless = [j for j in current if job_active(j) and not any(_job_of(p) == j["metadata"]["name"] for p in pods)]
            events = await self.writer.job_warnings(namespace, podless) if podless else []
        except ApiException:
            return training
        return dataclasses.replace(training, pods=pods, events=events)

    def races_running(self, key: Key) -> int:
        """Races of candidates running in the other resources this replica reconciles (their last written status)."""
        return sum(
            1
            for other, state in self.resources.items()
            if other != key and state.status is not None and state.status.race is not None and state.status.race.state == "Running"
        )

    async def pod_events(self, namespace: str, pods: list) -> list[dict[str, Any]]:
        """The Warning Events about pods in the namespace, read only while one of this resource's pods waits (the
        kubelet says why a volume does not mount only there). Unreadable (RBAC of an older chart): none, and the
        causes that pod status shows are still shown."""
        waiting = [p for p in pods if stuck.waiting(p)]
        if not waiting:
            return []
        # stuck.py diagnoses each variant's newest pod: those first, then the newest others.
        waiting.sort(key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", reverse=True)
        newest = list({labels_of(p).get(m.LABEL_VARIANT): p["metadata"]["name"] for p in reversed(waiting)}.values())
        waiting.sort(key=lambda p: p["metadata"]["name"] not in newest)
        try:
            return await self.writer.pod_warnings(namespace, waiting[:MAX_DIAGNOSED_PODS])
        except ApiException:
            return []

    def _spec(self, body: Any, state: ResourceState) -> tuple[SpeculativeServerSpec | None, str | None]:
        """The parsed spec of this generation (parsed once per generation), or why it does not parse."""
        generation = int(body["metadata"].get("generation") or 1)
        if state.spec is None or state.generation != generation:
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            try:
                # The operator-wide pod defaults go under the resource's podTemplate here, once per generation, so
                # every step, template and reader pod sees the same merged spec (poddefaults.py).
                parsed = parse_spec(plain(body.get("spec") or {}), source=f"{namespace}/{name}")
                state.spec = poddefaults.merged(parsed, self.config.server_pod_defaults)
            except InputError as exc:
                state.spec, state.generation, state.rendered = None, None, {}
                return None, str(exc)
            state.generation, state.rendered = generation, {}
        return state.spec, None


def observe(
    probes: ProbeScheduler,
    key: Key,
    state: ResourceState,
    body: Any,
    pods: list,
    deployments: list,
    services: list,
    scrape: dict[str, Sample] | None,
    config_maps: list,
    multi_node: bool = False,
    spec_error: str | None = None,
    leader_worker_sets_served: bool = True,
    pod_events: list[dict[str, Any]] | None = None,
    races_elsewhere: int = 0,
    training: Training | None = None,
    captured_samples: int | None = None,
    captured_since: tuple[str, int] | None = None,
) -> Observed:
    # A variant's server is a Deployment or (multi-node) a LeaderWorkerSet of the same name; those of the kind
    # the spec does not use are retiring (a resources.nodes change: reconcile/retire.py).
    serving_kind = m.LWS_KIND if multi_node else "Deployment"
    observed_deployments = {d["metadata"]["name"]: d for d in deployments if d.get("kind", "Deployment") == serving_kind}
    retiring = {d["metadata"]["name"]: d for d in deployments if d.get("kind", "Deployment") != serving_kind}
    observed_services = {s["metadata"]["name"]: s for s in services}
    observed_config_maps = {c["metadata"]["name"]: c for c in config_maps}
    by_kind = {"Deployment": observed_deployments, m.LWS_KIND: observed_deployments, "ConfigMap": observed_config_maps}
    for child, obj in state.foreign_objects().items():
        by_kind.get(obj.get("kind") or "", observed_services).setdefault(child, obj)
    return Observed(
        name=key[1],
        namespace=key[0],
        uid=state.uid,
        generation=int(body["metadata"].get("generation") or 1),
        deployments=observed_deployments,
        services=observed_services,
        config_maps=observed_config_maps,
        retiring=retiring,
        pods=list(pods),
        probe_running=probes.running(key),
        probe_result=probes.finished(key),
        probe_progress=probes.progress(key),
        scrape=scrape,
        previous_scrape=state.last_scrape if scrape is not None else None,
        spec_error=spec_error,
        leader_worker_sets_served=leader_worker_sets_served,
        pod_events=pod_events or [],
        annotations=dict((body.get("metadata") or {}).get("annotations") or {}),
        races_elsewhere=races_elsewhere,
        training_jobs={j["metadata"]["name"]: j for j in (training.jobs if training is not None else [])},
        training_pods=list(training.pods) if training is not None else [],
        training_jobs_running=training.running if training is not None else 0,
        training_events=list(training.events) if training is not None else [],
        captured_samples=captured_samples,
        captured_since=captured_since,
    )


@dataclass(frozen=True)
class Training:
    """What a step observes of spec.retraining.training: the resource's Jobs, their pods, the cluster's active count."""

    jobs: list
    pods: list  # read by the step (training_details)
    running: int
    events: list = dataclasses.field(default_factory=list)  # Warning Events of Jobs without a pod (quota refusals)


def _job_of(pod: dict[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(JOB_NAME_LABEL) or labels.get("job-name")


def training_of(children: Children, key: Key) -> Training:
    return Training(children.training_jobs(key), [], children.training_jobs_running())


def monitored_pods(pods: list) -> dict[str, str | None]:
    """The pods the drift monitor scrapes: the Ready speculative pods not being deleted (name -> pod IP)."""
    return {
        p["metadata"]["name"]: (p.get("status") or {}).get("podIP")
        for p in pods_of(pods, Variant.SPECULATIVE)
        if is_ready(p) and labels_of(p).get(m.LABEL_ROLE) != m.ROLE_WORKER
    }


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    """Wait until woken, stopped, or `timeout` seconds."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
