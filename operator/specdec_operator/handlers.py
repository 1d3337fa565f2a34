"""Kopf wiring: gather what exists, call ``reconcile``, execute the plan. Nothing clever lives here.

One Kopf daemon per SpeculativeServer runs the loop: ``step`` = gather observed -> ``reconcile.reconcile`` ->
``execute(plan)``. It wakes up on any event of the resource or of its children (pods, Deployments, Services,
and the adaptive table's ConfigMap, watched through label-filtered Kopf indexes, so a step lists nothing), every ``reconcile_interval`` seconds while
its status changes with time (servers loading, a probe running), and every ``resync_interval`` seconds once it is
settled.

Who does what:
    KubernetesWriter (kubewriter.py)   the only code that writes to the API server: children, status, Events
    ProbeScheduler (probescheduler.py) the only code that talks to SGLang: probes and drift scrapes
    ResourceState (below)              what this process remembers of one resource between steps
    kopf_tuning.py                     Kopf's storages, index copies and settings

Objects with the children's names that this resource does not own are never modified and never probed (phase
Failed, NameConflict).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from . import API_GROUP, API_VERSION, PLURAL
from . import manifests as m
from .api import ConditionType, Phase, Reason, SpeculativeServerSpec, SpeculativeServerStatus, Variant
from .config import OperatorConfig
from .datasetreader import FileDatasetReader
from .errors import InputError
from .kopf_tuning import plain, slim_config_map, slim_deployment, slim_leader_worker_set, slim_pod, slim_service
from .kubewriter import KubernetesWriter
from .metrics import OperatorMetrics
from .monitor import Sample, remember
from .probescheduler import ProbeScheduler
from .reconcile import Observed, Plan, merge_patch, read_status, reconcile, transition_events
from .reconcile.conditions import Conditions
from .reconcile.diff import labels_of
from .reconcile.pods import is_ready, pods_of
from .resource import dump, parse_spec
from .textutil import rfc3339

LOG = logging.getLogger("specdec.operator")
MANAGED = {m.LABEL_MANAGED_BY: m.MANAGED_BY}
# Stable Services created at once beside the steps. Not a limit of the API server (an idle local one creates
# ~230 ClusterIP Services a second with 4 or 32 clients alike); under load each creation takes seconds, and 4 at
# once left 500 of 1,000 stable Services uncreated when everything else had settled (docs/scale.md, run 17).
CREATIONS_AT_ONCE = 16
# How long a name found taken by a foreign object is remembered before it is looked up again.
FOREIGN_TTL_S = 30.0
# How long API discovery's answer on LeaderWorkerSets (served or not) is trusted before it is asked again: a
# multi-node spec refused for want of the CRD goes on by itself within this long of the CRD being installed.
LWS_RECHECK_S = 30.0

LWS_GROUP, LWS_VERSION = m.LWS_API_VERSION.split("/")

Key = tuple[str, str]  # (namespace, name)
Logger = logging.Logger | logging.LoggerAdapter[Any]  # Kopf hands handlers either


@dataclasses.dataclass
class ResourceState:
    """What this process remembers of one SpeculativeServer between steps.

    None of it is needed to resume: a fresh process rebuilds everything from the cluster (status and children).
    """

    uid: str
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    # The status as last written (or read): what the next merge patch is computed against, and its typed form.
    written: dict[str, Any] | None = None
    status: SpeculativeServerStatus | None = None
    # The parsed spec and its rendered pod templates, for one generation (the spec changes only with it).
    generation: int | None = None
    spec: SpeculativeServerSpec | None = None
    rendered: dict[str, Any] = dataclasses.field(default_factory=dict)
    last_scrape: dict[str, Sample] | None = None  # the last drift scrape, by speculative pod
    monitor_due: bool = False
    foreign: dict[str, tuple[float, dict[str, Any]]] = dataclasses.field(default_factory=dict)  # child name -> (seen, object)
    creating: asyncio.Task[None] | None = None  # the stable Service's creation, beside the steps

    def forget_status(self) -> None:
        """Reread the status from the API server at the next step (after a failed step)."""
        self.written = self.status = None

    def foreign_objects(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        for child, (seen, _) in list(self.foreign.items()):
            if now - seen > FOREIGN_TTL_S:
                del self.foreign[child]
        return {child: obj for child, (_, obj) in self.foreign.items()}


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
        if self.probes.read_file_dataset is None:  # a File prompt source is read by a reader pod (create, list, delete)
            reader = FileDatasetReader(self.writer.request, config.endpoints, config.reconcile.manifests, timeout=config.dataset_reader_timeout)
            self.probes.read_file_dataset = reader.read
        self.resources: dict[Key, ResourceState] = {}
        self._step_slots: asyncio.Semaphore | None = None  # created in the event loop, on the first step
        # At most one creation of a stable Service per resource, and at most CREATIONS_AT_ONCE in all, so that
        # they never hold all the API worker threads that the steps need.
        self._creation_slots: asyncio.Semaphore | None = None
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

    async def refusal(self, spec: SpeculativeServerSpec) -> str | None:
        """Why this cluster cannot serve the spec (a multi-node spec without the LeaderWorkerSet CRD), or None."""
        if not m.multi_node(spec):
            return None
        return m.lws_missing_message(spec, frozenset({m.LWS_CRD_NAME}) if await self.lws_served() else frozenset())

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
        return await self.probes.scrape(key, monitored_pods(pods))

    async def close(self) -> None:
        await self.probes.close()
        for state in self.resources.values():
            if state.creating is not None:
                state.creating.cancel()

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.probes.cancel(key)
        state = self.resources.pop(key, None)
        if state is not None and state.creating is not None:
            state.creating.cancel()
        self.metrics.forget(namespace, name)

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
    ) -> Plan | None:
        key: Key = (body["metadata"]["namespace"], body["metadata"]["name"])
        state = self.resource(key, body["metadata"]["uid"])
        if state.status is None:
            state.written = {k: v for k, v in plain(body.get("status") or {}).items() if k != "kopf"}
            state.status = read_status(state.written)
        spec = await self._spec(body, state)
        if spec is None:
            return None
        refused = await self.refusal(spec)
        if refused is not None:  # nothing is created or changed: the children that exist stay as they are
            await self.fail(body, state, Reason.LEADER_WORKER_SET_MISSING, refused)
            return None
        observed = self.gather(key, state, body, pods, deployments, services, scrape, config_maps or [], multi_node=m.multi_node(spec))
        try:
            plan = reconcile(spec, observed, state.status, datetime.now(UTC), self.config.reconcile, rendered=state.rendered)
        except InputError as exc:  # e.g. an sglangVersion the command-line renderer does not know
            await self.fail(body, state, Reason.INVALID_SPEC, str(exc))
            return None
        await self.execute(key, state, body, spec, plan, observed, logger)
        return plan

    async def _spec(self, body: Any, state: ResourceState) -> SpeculativeServerSpec | None:
        generation = int(body["metadata"].get("generation") or 1)
        if state.spec is None or state.generation != generation:
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            try:
                state.spec = parse_spec(plain(body.get("spec") or {}), source=f"{namespace}/{name}")
            except InputError as exc:
                state.spec, state.generation, state.rendered = None, None, {}
                await self.fail(body, state, Reason.INVALID_SPEC, str(exc))
                return None
            state.generation, state.rendered = generation, {}
        return state.spec

    def gather(
        self,
        key: Key,
        state: ResourceState,
        body: Any,
        pods: list,
        deployments: list,
        services: list,
        scrape: dict[str, Sample] | None,
        config_maps: list,
        multi_node: bool = False,
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
            probe_running=self.probes.running(key),
            probe_result=self.probes.finished(key),
            probe_progress=self.probes.progress(key),
            scrape=scrape,
            previous_scrape=state.last_scrape if scrape is not None else None,
        )

    async def execute(
        self, key: Key, state: ResourceState, body: Any, spec: SpeculativeServerSpec, plan: Plan, observed: Observed, logger: Logger
    ) -> None:
        """Carry out a plan: apply children and the status patch, post its Events, start or stop its probe."""
        namespace, name = key
        # Creating a Service with a virtual IP (the stable one) is the slowest write there is: the API server
        # allocates ClusterIPs a few per second under load (2-10 s each with 1,000 resources starting together,
        # docs/scale.md), and nothing in the lifecycle waits for that Service. So it is created beside the step.
        applying = []
        for obj in plan.apply:
            if creates_virtual_ip(obj, observed.services):
                if state.creating is None:
                    state.creating = asyncio.create_task(
                        self._create_beside(key, state, obj, body, logger), name=f"create {namespace}/{obj['metadata']['name']}"
                    )
            else:
                applying.append(obj)
        written = dump(plan.new_status)
        patch = merge_patch(state.written, written)
        # One round trip where order does not matter: every child at once, and the status patch with them (it
        # describes what this step saw and did). Only when a step both re-points an existing Service and changes a
        # Deployment (switch, then scale the loser to 0) do the kinds go one after another, Services first.
        waves = by_kind(applying) if plan.switch_first else [applying]
        for number, wave in enumerate(waves, 1):
            write_status = bool(patch) and number == len(waves)
            results = await asyncio.gather(
                *(self.writer.apply(obj, body, state.uid, known=_known(obj, observed)) for obj in wave),
                *([self.writer.patch_status(namespace, name, patch)] if write_status and patch else []),
            )
            for obj, taken_by in zip(wave, results):
                if taken_by is not None:
                    self._found_foreign(key, state, obj, taken_by, logger)
        # The old kind's servers after a resources.nodes change (retire.py): after the applies, so the Services
        # already select the new kind when the old servers go.
        for obj in plan.delete:
            await self.writer.delete(obj)
        state.written, state.status = written, plan.new_status
        for event in plan.events:
            await self.writer.post_event(body, event)
            if event.rollback:
                self.metrics.rollbacks.labels(namespace, name, event.reason).inc()
            LOG.info(f"{namespace}/{name}: {event.reason}: {event.message}")

        result = observed.probe_result
        if result is not None:  # recorded by this step's status
            self.probes.settle(key)
            if result.revision == plan.revision:
                self.metrics.probes.labels(namespace, name, result.decision or "none", result.reason or "none").inc()
        if plan.cancel_probe:
            self.probes.cancel(key)
        if plan.start_probe:
            load_aware = plan.new_status.probe.load_aware if plan.adaptive_probe and plan.new_status.probe else None
            self.probes.start(
                key,
                spec,
                plan.revision,
                on_done=lambda: self.wake(namespace, name),
                probe_id=plan.probe_id,
                load_aware=load_aware,
                owner_uid=state.uid,
            )
        if observed.scrape is not None:
            state.last_scrape = remember(state.last_scrape, observed.scrape)
        state.monitor_due = plan.monitor_due
        self.metrics.observe_status(namespace, name, written)

    def _found_foreign(self, key: Key, state: ResourceState, obj: dict[str, Any], taken_by: dict[str, Any], logger: Logger) -> None:
        state.foreign[obj["metadata"]["name"]] = (time.monotonic(), taken_by)
        logger.warning(f"{obj['kind']} {key[0]}/{obj['metadata']['name']} exists and is not owned by this SpeculativeServer: left alone")
        self.wake(*key)

    async def _create_beside(self, key: Key, state: ResourceState, obj: dict[str, Any], body: Any, logger: Logger) -> None:
        if self._creation_slots is None:
            self._creation_slots = asyncio.Semaphore(CREATIONS_AT_ONCE)
        try:
            async with self._creation_slots:
                taken_by = await self.writer.apply(obj, body, state.uid, known=False)
            if taken_by is not None:
                self._found_foreign(key, state, obj, taken_by, logger)
        except ApiException as exc:
            self.metrics.reconcile_errors.labels("api").inc()
            await self.api_failure(body, exc, logger)
        except Exception as exc:  # the next step tries again
            self.metrics.reconcile_errors.labels(type(exc).__name__).inc()
            logger.warning(f"creating {obj['kind']} {key[0]}/{obj['metadata']['name']} failed (will retry): {exc}")
        finally:
            state.creating = None
            self.wake(*key)

    # --- failures that end in status
    async def api_failure(self, body: Any, exc: ApiException, logger: Logger) -> None:
        """Log a refused API call; put the ones retrying cannot fix into status (phase Failed)."""
        detail = exc.body[:300] if isinstance(exc.body, str) else ""
        logger.warning(f"reconcile step failed (will retry): API {exc.status} {exc.reason} {detail}".rstrip())
        key: Key = (body["metadata"]["namespace"], body["metadata"]["name"])
        state = self.resources.get(key)
        if state is not None:  # the next step rereads the resource as the server has it
            state.forget_status()
        # Retrying will not fix these: tell the user where they look. Server-side apply answers 500 "failed to
        # create typed patch object" when a child does not fit its type (a free-form spec field such as
        # sglang.env holding a number where EnvVar wants a string).
        typed_patch = exc.status == 500 and "failed to create typed patch object" in (exc.body if isinstance(exc.body, str) else "")
        if exc.status in (400, 403, 422) or typed_patch:
            reason = Reason.FORBIDDEN if exc.status == 403 else Reason.APPLY_REJECTED
            message = f"the API server refused a request ({exc.status}): {_api_message(exc)}"[:1024]
            try:
                await self.fail(body, None, reason, message, full_status=False)
            except ApiException:
                return

    async def fail(self, body: Any, state: ResourceState | None, reason: Reason, message: str, *, full_status: bool = True) -> None:
        """Phase Failed with a one-line reason, and its Event once (both derived like any other transition).

        ``full_status``: the status patch also carries observedGeneration (a spec the operator cannot serve);
        otherwise only phase, reason and message change (an API refusal, reported from outside a step).
        """
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        stored = {k: v for k, v in plain(body.get("status") or {}).items() if k != "kopf"}
        written = state.written if state is not None and state.written is not None else stored
        prev = read_status(written)
        change: dict[str, Any] = {"phase": Phase.FAILED.value, "reason": reason.value, "message": message}
        if full_status:
            generation = int(body["metadata"].get("generation") or 1)
            change["observed_generation"] = generation
            # Ready says it too (kubectl wait --for=condition=Ready, Argo CD): the spec cannot be served as it is.
            conditions = Conditions(prev.conditions, generation, rfc3339(datetime.now(UTC)))
            conditions.set(ConditionType.READY, "False", reason.value, message)
            change["conditions"] = conditions.items()
        new = prev.model_copy(update=change)
        new_written = dump(new)
        if full_status:
            patch = merge_patch(written, new_written)
        elif (prev.phase, prev.reason, prev.message) != (new.phase, new.reason, new.message):
            patch = {k: new_written[k] for k in ("phase", "reason", "message")}
        else:
            patch = None
        if not patch:
            return
        await self.writer.patch_status(namespace, name, patch)
        if state is not None:
            state.written, state.status = new_written, new
        for event in transition_events(prev, new, name=name, workloads=[]):
            await self.writer.post_event(body, event)


def monitored_pods(pods: list) -> dict[str, str | None]:
    """The pods the drift monitor scrapes: the Ready speculative pods not being deleted (name -> pod IP)."""
    return {
        p["metadata"]["name"]: (p.get("status") or {}).get("podIP")
        for p in pods_of(pods, Variant.SPECULATIVE)
        if is_ready(p) and labels_of(p).get(m.LABEL_ROLE) != m.ROLE_WORKER
    }


def _api_message(exc: ApiException) -> str:
    """The message of the API server's Status answer, or the HTTP reason."""
    try:
        return json.loads(exc.body or "").get("message") or str(exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def _known(obj: dict[str, Any], observed: Observed) -> bool:
    """Whether a child is in the operator's (label-filtered) index, i.e. known to be ours."""
    index = {"Deployment": observed.deployments, m.LWS_KIND: observed.deployments, "ConfigMap": observed.config_maps}.get(
        obj["kind"], observed.services
    )
    return obj["metadata"]["name"] in index


def creates_virtual_ip(obj: dict[str, Any], observed_services: dict[str, Any]) -> bool:
    """Whether applying ``obj`` creates a Service with a ClusterIP (not headless, not there yet)."""
    return obj["kind"] == "Service" and obj["metadata"]["name"] not in observed_services and (obj.get("spec") or {}).get("clusterIP") != "None"


def by_kind(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive runs of the same kind, in order: [[svc, svc, svc], [deploy, deploy]]."""
    groups: list[list[dict[str, Any]]] = []
    for obj in objects:
        if groups and groups[-1][0]["kind"] == obj["kind"]:
            groups[-1].append(obj)
        else:
            groups.append([obj])
    return groups


async def _sleep(wake: asyncio.Event, stopped: Any, timeout: float) -> None:
    """Wait until woken, stopped, or `timeout` seconds."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


# ---------------------------------------------------------------------------------------------------------
# Registration


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the handlers of one operator instance."""
    instance = m.LABEL_INSTANCE

    @kopf.index("pods", id="specdec_pods", labels=MANAGED, registry=registry)
    def specdec_pods(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_pod(body)} if labels.get(instance) else None

    @kopf.index("apps", "v1", "deployments", id="specdec_deployments", labels=MANAGED, registry=registry)
    def specdec_deployments(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_deployment(body)} if labels.get(instance) else None

    @kopf.index("v1", "services", id="specdec_services", labels=MANAGED, registry=registry)
    def specdec_services(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_service(body)} if labels.get(instance) else None

    @kopf.index("v1", "configmaps", id="specdec_config_maps", labels=MANAGED, registry=registry)
    def specdec_config_maps(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_config_map(body)} if labels.get(instance) else None

    # Multi-node servers' LeaderWorkerSets. Without the CRD Kopf watches nothing here (the index stays empty) and
    # starts watching once the CRD is installed (its CRD discovery).
    @kopf.index(LWS_GROUP, LWS_VERSION, m.LWS_PLURAL, id="specdec_leader_worker_sets", labels=MANAGED, registry=registry)
    def specdec_leader_worker_sets(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_leader_worker_set(body)} if labels.get(instance) else None

    @kopf.on.event(LWS_GROUP, LWS_VERSION, m.LWS_PLURAL, id="leader_worker_set_changed", labels=MANAGED, registry=registry)
    @kopf.on.event("pods", id="pod_changed", labels=MANAGED, registry=registry)
    @kopf.on.event("apps", "v1", "deployments", id="deployment_changed", labels=MANAGED, registry=registry)
    @kopf.on.event("v1", "services", id="service_changed", labels=MANAGED, registry=registry)
    def child_changed(*, namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        runtime.wake(namespace, labels.get(instance))

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, id="resource_changed", registry=registry)
    def resource_changed(*, namespace: str | None, name: str, **_: Any) -> None:
        runtime.wake(namespace, name)

    # On deletion or shutdown the loop is asked to stop (it exits within a step) and cancelled only after 5 s.
    @kopf.daemon(API_GROUP, API_VERSION, PLURAL, id="reconcile", cancellation_backoff=5.0, cancellation_timeout=10.0, registry=registry)
    async def serve(*, body: kopf.Body, namespace: str | None, name: str, stopped: kopf.DaemonStopped, logger: Logger, **indexes: Any) -> None:
        key: Key = (namespace or "", name)
        pods_index: kopf.Index = indexes["specdec_pods"]
        deployments_index: kopf.Index = indexes["specdec_deployments"]
        services_index: kopf.Index = indexes["specdec_services"]
        config_maps_index: kopf.Index = indexes["specdec_config_maps"]
        groups_index: kopf.Index = indexes["specdec_leader_worker_sets"]
        wake = runtime.resource(key, body["metadata"]["uid"]).wake
        failures = 0
        last_step = -math.inf
        try:
            while not stopped:
                pause = last_step + runtime.config.min_step_interval - time.monotonic()
                if pause > 0:  # events closer together than that are merged into this one step
                    await _sleep(asyncio.Event(), stopped, pause)
                    if stopped:
                        break
                queued = time.monotonic()
                plan = None
                try:
                    scrape = await runtime.due_scrape(key, list(pods_index.get(key, [])))
                    async with runtime.step_slot():
                        wake.clear()  # after the wait: what happened while queued is seen by this step
                        started = time.monotonic()
                        runtime.metrics.reconcile_queue_seconds.observe(started - queued)
                        try:
                            plan = await runtime.step(
                                body,
                                list(pods_index.get(key, [])),
                                list(deployments_index.get(key, [])) + list(groups_index.get(key, [])),
                                list(services_index.get(key, [])),
                                logger,
                                scrape,
                                list(config_maps_index.get(key, [])),
                            )
                        finally:
                            last_step = time.monotonic()
                            runtime.metrics.reconcile_seconds.observe(last_step - started)
                    failures = 0
                except ApiException as exc:
                    failures += 1
                    runtime.metrics.reconcile_errors.labels("api").inc()
                    await runtime.api_failure(body, exc, logger)
                except Exception as exc:  # never let one bad step kill the loop; it is retried with backoff
                    failures += 1
                    runtime.metrics.reconcile_errors.labels(type(exc).__name__).inc()
                    logger.exception(f"reconcile step failed (will retry): {exc}")
                    if key in runtime.resources:
                        runtime.resources[key].forget_status()
                if failures:
                    delay = min(60.0, 0.5 * 2**failures)
                elif plan is not None and plan.settled:
                    delay = runtime.config.resync_interval
                else:
                    delay = runtime.config.reconcile_interval
                if plan is not None and plan.next_scrape_in is not None:
                    delay = min(delay, max(0.2, plan.next_scrape_in))
                await _sleep(wake, stopped, delay)
        finally:
            if stopped.reason is not None and kopf.DaemonStoppingReason.RESOURCE_DELETED in stopped.reason:
                runtime.forget(*key)
            else:
                runtime.probes.cancel(key)

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> Any:
        # A registry of our own has none of Kopf's default handlers: log in as the kubernetes client does
        # (service account in the cluster, else KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.cleanup(id="shutdown", registry=registry)
    async def shutdown(**_: Any) -> None:
        await runtime.close()
