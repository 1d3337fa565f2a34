"""Kopf wiring: the indexes of the children, the events that wake a resource's loop, the daemon that runs it.

Nothing is decided here: each SpeculativeServer's daemon runs ``Runtime.serve`` (runtime.py), whose steps gather
what the indexes hold, call ``reconcile`` and execute the plan. Children are found by label (managed-by and
instance), so a step lists nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

from .. import API_GROUP, API_VERSION, KIND, PLURAL, trainjob
from .. import manifests as m
from ..reconcile.capture_objects import CAPTURE_APP
from .kopf_tuning import job_active, slim_config_map, slim_deployment, slim_job, slim_leader_worker_set, slim_pod, slim_service
from .runtime import Children, Runtime
from .state import Key, Logger

MANAGED = {m.LABEL_MANAGED_BY: m.MANAGED_BY}
# Training Jobs (trainjob.training_labels): not the servers' labels, so an index of their own. Their pods are not
# watched (the pod watch selects managed-by, the servers'): a step reads them while a Job is active (runtime.py).
TRAINING = {trainjob.LABEL_COMPONENT: trainjob.COMPONENT, trainjob.LABEL_PART_OF: trainjob.PART_OF}


def owner_name(body: Mapping[str, Any]) -> str | None:
    """The SpeculativeServer that owns a training Job (its controller owner reference)."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("name") for r in refs if r.get("kind") == KIND and r.get("controller")), None)


LWS_GROUP, LWS_VERSION = m.LWS_API_VERSION.split("/")


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the handlers of one operator instance."""
    instance = m.LABEL_INSTANCE

    @kopf.index("pods", id="specdec_pods", labels=MANAGED, registry=registry)
    def specdec_pods(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_pod(body)} if labels.get(instance) and labels.get(m.LABEL_NAME) != CAPTURE_APP else None

    # The capture proxies' pods (spec.retraining.capture): never servers; their /metrics count the captured records.
    @kopf.index("pods", id="specdec_capture_pods", labels={**MANAGED, m.LABEL_NAME: CAPTURE_APP}, registry=registry)
    def specdec_capture_pods(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict | None:
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

    # Training Jobs (reconcile/training.py), by the resource that owns them; the cluster-wide cap counts the active Jobs
    # of every resource.
    @kopf.index("batch", "v1", "jobs", id="specdec_training_jobs", labels=TRAINING, registry=registry)
    def specdec_training_jobs(*, namespace: str | None, body: kopf.Body, **_: Any) -> dict | None:
        owner = owner_name(body)
        return {(namespace, owner): slim_job(body)} if owner else None

    @kopf.on.event("batch", "v1", "jobs", id="training_job_changed", labels=TRAINING, registry=registry)
    def training_job_changed(*, namespace: str | None, body: kopf.Body, **_: Any) -> None:
        runtime.wake(namespace, owner_name(body))

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
        def lister(*names: str) -> Callable[[Key], list]:
            return lambda key: [obj for index in names for obj in indexes[index].get(key, [])]

        children = Children(
            pods=lister("specdec_pods"),
            servers=lister("specdec_deployments", "specdec_leader_worker_sets"),
            services=lister("specdec_services"),
            config_maps=lister("specdec_config_maps"),
            capture_pods=lister("specdec_capture_pods"),
            training_jobs=lister("specdec_training_jobs"),
            training_jobs_running=lambda: sum(1 for jobs in indexes["specdec_training_jobs"].values() for job in jobs if job_active(job)),
        )
        await runtime.serve((namespace or "", name), body, children, stopped, logger)

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> Any:
        # A registry of our own has none of Kopf's default handlers: log in as the kubernetes client does
        # (service account in the cluster, else KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.cleanup(id="shutdown", registry=registry)
    async def shutdown(**_: Any) -> None:
        await runtime.close()
