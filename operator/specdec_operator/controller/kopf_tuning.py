"""How the operator keeps Kopf cheap at 1,000 resources: slim index copies, lean storages, its settings.

Nothing here decides anything; each piece removes work Kopf would do on every event of every watched object
(docs/scale.md measured each of them).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf

from .. import API_GROUP, trainjob
from .. import manifests as m
from .kubewriter import FIELD_MANAGER

# ---------------------------------------------------------------------------------------------------------
# Slim copies of children for the indexes (what reconcile reads, nothing more)


def _meta(body: Any) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences", "creationTimestamp", "deletionTimestamp", "uid")
    return {k: plain(meta.get(k)) for k in keep if meta.get(k) is not None}


def plain(value: Any) -> Any:
    """Kopf's mapping views as plain dicts and lists."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def extended_resource(name: str) -> bool:
    """An extended resource (nvidia.com/gpu, a RDMA device, ...): a domain-prefixed name outside kubernetes.io.

    cpu, memory, ephemeral-storage and hugepages-* are native; kubernetes.io/ and *.kubernetes.io/ names are reserved."""
    domain, slash, _ = name.partition("/")
    return bool(slash) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _extended_resources(container: Any) -> dict[str, Any]:
    resources = container.get("resources") or {}
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        amounts = {str(k): str(v) for k, v in (resources.get(kind) or {}).items() if extended_resource(str(k))}
        if amounts:
            out[kind] = amounts
    return out


def slim_pod(body: Any) -> dict[str, Any]:
    """The pod's metadata, the status fields reconcile reads, and of its spec only the extended resources (the GPUs)
    each container asks for: reconcile/gpus.py counts what each pod holds from its own requests, so a pod of an
    older template (or the other kind, during a retirement) counts with the GPUs it was created with. Containers
    that ask for none, and init containers (they run before the containers, not beside them), are left out."""
    status = body.get("status") or {}
    keep = ("phase", "conditions", "initContainerStatuses", "containerStatuses", "startTime", "podIP")
    slim: dict[str, Any] = {"metadata": _meta(body), "status": {k: plain(status.get(k)) for k in keep if status.get(k) is not None}}
    containers = []
    for container in (body.get("spec") or {}).get("containers") or []:
        resources = _extended_resources(container)
        if resources:
            containers.append({"name": container.get("name"), "resources": resources})
    if containers:
        slim["spec"] = {"containers": containers}
    return slim


def slim_job(body: Any) -> dict[str, Any]:
    """A training Job (reconcile/training.py): its metadata, activeDeadlineSeconds and the status retrain_progress reads."""
    status = body.get("status") or {}
    keep = ("conditions", "active", "ready", "succeeded", "failed", "startTime", "completionTime")
    spec = body.get("spec") or {}
    slim: dict[str, Any] = {"metadata": _meta(body), "status": {k: plain(status.get(k)) for k in keep if status.get(k) is not None}}
    if spec.get("activeDeadlineSeconds") is not None:
        slim["spec"] = {"activeDeadlineSeconds": spec.get("activeDeadlineSeconds")}
    return slim


def job_active(job: dict[str, Any]) -> bool:
    """Whether a Job has not ended (no Complete or Failed condition): what the cluster-wide cap of training Jobs counts."""
    ended = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
    return not any(c.get("type") in ended and c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or [])


def slim_deployment(body: Any) -> dict[str, Any]:
    spec = body.get("spec") or {}
    template_meta = ((spec.get("template") or {}).get("metadata")) or {}
    return {
        "kind": "Deployment",
        "metadata": _meta(body),
        "spec": {"replicas": spec.get("replicas"), "template": {"metadata": {"annotations": plain(template_meta.get("annotations") or {})}}},
        "status": plain(body.get("status") or {}),
    }


def slim_service(body: Any) -> dict[str, Any]:
    spec = body.get("spec") or {}
    return {
        "kind": "Service",
        "metadata": _meta(body),
        "spec": {"selector": plain(spec.get("selector") or {}), "ports": plain(spec.get("ports") or [])},
    }


def slim_leader_worker_set(body: Any) -> dict[str, Any]:
    """A LeaderWorkerSet: its replicas (groups), the hashes of its leader and worker templates, its status."""
    spec = body.get("spec") or {}
    lwt = spec.get("leaderWorkerTemplate") or {}

    def hashed(template: Any) -> dict[str, Any]:
        annotations = ((template or {}).get("metadata") or {}).get("annotations") or {}
        return {"metadata": {"annotations": {k: annotations[k] for k in (m.ANNOTATION_TEMPLATE_HASH,) if k in annotations}}}

    return {
        "kind": m.LWS_KIND,
        "metadata": _meta(body),
        "spec": {
            "replicas": spec.get("replicas"),
            "leaderWorkerTemplate": {
                "size": lwt.get("size"),
                "leaderTemplate": hashed(lwt.get("leaderTemplate")),
                "workerTemplate": hashed(lwt.get("workerTemplate")),
            },
        },
        "status": plain(body.get("status") or {}),
    }


def slim_config_map(body: Any) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": _meta(body), "data": plain(body.get("data") or {})}


# ---------------------------------------------------------------------------------------------------------
# Storages


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's default essence storage (same essence, same annotation) without copying what it throws away.

    Kopf builds the essence of every watched object on every event (for change detection) by deep-copying the
    whole object, status included, and then deleting metadata and status. With 8,000 watched pods, Deployments
    and Services that copy was about 5 % of the operator's CPU at 1,000 resources (docs/scale.md); here only
    what the essence keeps is handed over.
    """

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        fields = list(extra_fields or [])
        if fields:  # handlers that watch status fields need the whole object
            return super().build(body=body, extra_fields=fields)
        meta = body.get("metadata") or {}
        lean = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        lean["metadata"] = {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
        return super().build(body=kopf.Body(cast(kopf.RawBody, lean)))


class LeanProgressStorage(kopf.SmartProgressStorage):
    """Kopf's default progress storage, whose clear() does not copy an essence that holds no progress records.

    Before diffing, Kopf strips its progress records (``status.kopf.progress``, ``kopf.zalando.org/*``
    annotations) from the old and new essence of every event of every watched object, and each of the two
    storages deep-copies the essence to do it: with LeanDiffBaseStorage's copy, three deep copies per event, about a
    tenth of the operator's busy CPU while 1,000 resources settle (py-spy, docs/scale.md). The essences handed in are
    fresh objects that nobody else holds; when there is nothing to strip and no empty stanza to drop, the result
    would equal the input, so the input is returned as it is.
    """

    def __init__(self) -> None:
        super().__init__()
        # The annotation prefixes its storages write under (kopf.zalando.org/), looked up once, not per event.
        prefixes = (getattr(storage, "prefix", None) for storage in self.storages)
        self.prefixes = tuple(f"{prefix}/" for prefix in prefixes if prefix)

    def clear(self, *, essence: Any) -> Any:
        metadata = essence.get("metadata")
        annotations = (metadata or {}).get("annotations")
        if (
            "status" in essence
            or metadata == {}
            or annotations == {}
            or (metadata or {}).get("labels") == {}
            or any(key.startswith(self.prefixes) for key in annotations or ())
        ):
            return super().clear(essence=essence)
        return essence


def configure(settings: kopf.OperatorSettings) -> None:
    """Kopf settings the operator needs: server-side label filters on the children's watches, Event names."""
    selector = f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}"
    for resource in ("pods", "deployments", "services", "configmaps", m.LWS_PLURAL):
        settings.watching.label_selectors[resource] = selector
    # spec.retraining.training's Jobs (trainjob.training_labels): only the operator's are watched.
    settings.watching.label_selectors["jobs"] = f"{trainjob.LABEL_COMPONENT}={trainjob.COMPONENT},{trainjob.LABEL_PART_OF}={trainjob.PART_OF}"
    settings.posting.reporting_component = FIELD_MANAGER
    # Kopf's own log lines are not Events; the operator posts its Events explicitly.
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.persistence.diffbase_storage = LeanDiffBaseStorage()
    settings.persistence.progress_storage = LeanProgressStorage()
