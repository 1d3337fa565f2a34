"""The Kubernetes writer: the only code of the operator that writes to the API server.

Children are created and updated with server-side apply (owner-referenced, one field manager), the status with
a JSON merge patch of the status subresource, Events through Kopf's poster. Requests go through the kubernetes
client's ApiClient (auth, TLS, retries, errors as ApiException), called in threads since it blocks.

Raw requests rather than the generated CoreV1Api/AppsV1Api/CustomObjectsApi classes: importing those
(pydantic-validated methods) costs 27 MB of RSS and 2.7 s of CPU, which buys nothing for the four requests made
here (docs/scale.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION, PLURAL
from .. import manifests as m
from ..reconcile import Event
from ..reconcile.diff import owned_by
from ..reconcile.training import JOB_NAME_LABEL
from .metrics import OperatorMetrics

FIELD_MANAGER = "specdec-operator"
MAX_EVENT_MESSAGE = 1024
STATUS_PATH = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}/status"

# Characters YAML does not carry raw: non-printables and what YAML 1.1 folds as line breaks (NEL, LS, PS).
# (C0 controls are escaped by json.dumps already.)
_NOT_YAML_PRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def apply_body(obj: dict[str, Any]) -> bytes:
    """A server-side apply body (YAML content) that survives any Unicode in a spec.

    The client would send json.dumps' ASCII output, in which a character beyond the BMP (an emoji in an image
    name or a path) is a surrogate-pair escape: valid JSON, but the API server's YAML decoder refuses it ("found
    invalid Unicode character escape code"), so the children could not be applied (found by
    tests/cluster/test_reliability_api_fuzz.py). Non-ASCII goes as UTF-8; only what YAML cannot carry raw is escaped.
    """
    text = json.dumps(obj, ensure_ascii=False)
    return _NOT_YAML_PRINTABLE.sub(lambda c: f"\\u{ord(c.group()):04x}", text).encode("utf-8")


_CHILD_PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
    "Service": "/api/v1/namespaces/{namespace}/services/{name}",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps/{name}",
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets/{name}",
    # spec.retraining.capture's claim (reconcile/capture.py): applied with the capture proxy, deleted when capture is off.
    "PersistentVolumeClaim": "/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}",
    # spec.retraining.training's Jobs (reconcile/training.py): applied once, when one starts; never changed after.
    "Job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
}


def child_path(kind: str) -> str:
    return _CHILD_PATHS[kind]


# The Warning Events about one waiting pod are read with a server-side field selector on the pod (its uid), a
# page at a time (continue tokens): a namespace-wide read capped at a count let the cause drop out of a busy
# namespace (issue 34). A pod's own Warnings are few (the kubelet aggregates repeats into one Event's count).
POD_EVENTS_PAGE = 100
# The pods whose Events are read in one step (one request each, per step of a waiting resource): each variant's
# newest waiting pod first (the one stuck.py diagnoses), then the newest others.
MAX_DIAGNOSED_PODS = 4


class KubernetesWriter:
    """Writes children, status and Events; times every request in specdec_api_request_duration_seconds."""

    def __init__(self, metrics: OperatorMetrics, api_client: k8s.ApiClient | None = None) -> None:
        self.metrics = metrics
        self.api_client = api_client

    def request(
        self,
        method: str,
        path: str,
        path_params: dict[str, str],
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
        body: Any = None,
    ) -> Any:
        """One blocking API request; the decoded JSON answer, or ApiException."""
        if self.api_client is None:
            self.api_client = k8s.ApiClient()
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
        method, url, headers, _, _ = self.api_client.param_serialize(
            method, path, path_params=path_params, query_params=query or [], header_params=headers, auth_settings=["BearerToken"]
        )
        started = time.monotonic()
        try:
            response = self.api_client.call_api(method, url, headers, body=body)
            response.read()
        finally:
            verb = "APPLY" if content_type == "application/apply-patch+yaml" else method
            resource = path.split("{namespace}/", 1)[-1].replace("{name}", "").replace("//", "/").strip("/")
            self.metrics.api_request_seconds.labels(verb, resource).observe(time.monotonic() - started)
        return self.api_client.response_deserialize(response, {"2XX": "object"}).data  # raises ApiException otherwise

    def _read(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.request("GET", child_path(obj["kind"]), {"namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _apply(self, obj: dict[str, Any], owner: Any, uid: str, known: bool) -> dict[str, Any] | None:
        if not known:
            # Not in our (label-filtered) index: make sure the name is free or ours before applying, so that an
            # object someone else owns is never taken over.
            existing = self._read(obj)
            if existing is not None and not owned_by(existing, uid):
                return existing
        if m.is_replicas_only(obj):
            # Only the count changes (a fleet walking back before its speculative template changes): an apply of
            # this body would drop the template the field manager owns.
            self.request(
                "PATCH",
                child_path(obj["kind"]),
                {"namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]},
                query=[("fieldManager", FIELD_MANAGER)],
                content_type="application/merge-patch+json",
                body={"spec": {"replicas": obj["spec"]["replicas"]}},
            )
            return None
        kopf.append_owner_reference(obj, owner=owner)
        # The body is serialized here (apply_body): the client would send json.dumps' ASCII output.
        self.request(
            "PATCH",
            child_path(obj["kind"]),
            {"namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]},
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
            body=apply_body(obj),
        )
        return None

    def _delete(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if meta.get("uid"):  # this very object, not one made since under the same name
            body["preconditions"] = {"uid": meta["uid"]}
        try:
            self.request("DELETE", child_path(obj["kind"]), {"namespace": meta["namespace"], "name": meta["name"]}, body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or replaced (the precondition failed)
                raise

    async def delete(self, obj: dict[str, Any]) -> None:
        """Delete one server object of the kind the spec no longer uses (retire.py), or an object of capture turned off
        (reconcile/capture.py); its pods go with it (garbage collection in the background)."""
        await asyncio.to_thread(self._delete, obj)

    def _read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", "/api/v1/namespaces/{namespace}/configmaps/{name}", {"namespace": namespace, "name": name})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _pod_warnings(self, namespace: str, pods: list[dict[str, Any]], kind: str = "Pod") -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            which = f"involvedObject.uid={meta['uid']}" if meta.get("uid") else f"involvedObject.name={meta.get('name')}"
            selector = f"involvedObject.kind={kind},type=Warning,{which}"
            token: str | None = None
            while True:
                query = [("fieldSelector", selector), ("limit", str(POD_EVENTS_PAGE))] + ([("continue", token)] if token else [])
                answer = self.request("GET", "/api/v1/namespaces/{namespace}/events", {"namespace": namespace}, query=query) or {}
                events += list(answer.get("items") or [])
                token = (answer.get("metadata") or {}).get("continue") or None
                if token is None:
                    break
        return events

    async def pod_warnings(self, namespace: str, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The Warning Events about ``pods`` (selected by each pod's uid on the API server, every page read): read
        only while a server of a resource waits (reconcile/stuck.py names the cause from them)."""
        return await asyncio.to_thread(self._pod_warnings, namespace, pods)

    def _job_pods(self, namespace: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from .kopf_tuning import slim_pod  # kopf_tuning imports this module

        pods: list[dict[str, Any]] = []
        for job in jobs:
            query = [("labelSelector", f"{JOB_NAME_LABEL}={job['metadata']['name']}")]
            answer = self.request("GET", "/api/v1/namespaces/{namespace}/pods", {"namespace": namespace}, query=query) or {}
            pods += [slim_pod(p) for p in answer.get("items") or []]
        return pods

    async def job_pods(self, namespace: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pods of training Jobs (slim copies), by the Job controller's job-name label: read while a Job is active (the
        pod watch selects the servers' managed-by label, which training pods do not carry)."""
        return await asyncio.to_thread(self._job_pods, namespace, jobs)

    async def job_warnings(self, namespace: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The Warning Events about training Jobs (the Job controller's FailedCreate when a quota refuses the pod): read
        only while a Job of the resource has no pod (reconcile/training.py)."""
        return await asyncio.to_thread(self._pod_warnings, namespace, jobs, "Job")

    async def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One ConfigMap (a workload's prompt dataset), or None when it does not exist. The only read of a ConfigMap:
        read on demand, when a probe starts (the watch sees only the operator's own ConfigMaps)."""
        return await asyncio.to_thread(self._read_config_map, namespace, name)

    async def read_probe_evidence(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The document in ConfigMap <name>-probe-evidence (manifests.probe_evidence_config_map), or None."""
        found = await self.read_config_map(namespace, m.probe_evidence_config_map_name(name))
        text = ((found or {}).get("data") or {}).get(m.PROBE_EVIDENCE_KEY)
        if not text:
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None  # unreadable: the probe starts afresh
        return doc if isinstance(doc, dict) else None

    async def apply(self, obj: dict[str, Any], owner: Any, uid: str, *, known: bool) -> dict[str, Any] | None:
        """Create or update one child with server-side apply, owned by ``owner``.

        ``known``: the child is in the operator's index (so it is ours). Returns None when applied, or the object
        that holds the name when it belongs to someone else (then nothing is written).
        """
        return await asyncio.to_thread(self._apply, obj, owner, uid, known)

    def _served(self, group_version: str, plural: str) -> bool:
        try:
            found = self.request("GET", f"/apis/{group_version}", {})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])

    async def served(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group_version`` (API discovery: a CRD installed and established)."""
        return await asyncio.to_thread(self._served, group_version, plural)

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.request,
            "PATCH",
            STATUS_PATH,
            {"namespace": namespace, "name": name},
            content_type="application/merge-patch+json",
            body={"status": patch},
        )

    async def post_event(self, owner: Any, event: Event) -> None:
        # Kopf queues the Event and posts it in the background (its poster batches and retries).
        kopf.event(owner, type=event.type, reason=event.reason, message=event.message[:MAX_EVENT_MESSAGE])
