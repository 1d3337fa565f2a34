"""The reader pod of a File prompt source: a dataset file on the model volume or on another PVC (docs/probe.md).

The operator cannot mount a volume, and a pod's termination message (4 KiB) cannot carry a dataset, so when a
probe starts and a workload's prompts are ``source: File`` the operator creates one small pod per workload that
mounts the volume read-only and runs ``specdec dataset-serve`` (probe/reader.py): it parses the file with the
probe's own parser and serves the normalised JSONL, or the one-line error naming the claim, the path and the line.
The operator fetches it the way it reaches the servers (``Endpoints.pod_url``: the pod's IP in a cluster, the
endpoints mapping outside one) and deletes the pod; the owner reference lets the garbage collector remove a pod
an operator crash left behind.

Pure functions render the pod and judge its status; ``FileDatasetReader`` does the API calls (create, list by
name, delete: no get, no watch, no exec) around them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes.client.exceptions import ApiException

from . import API_GROUP, API_VERSION, KIND
from . import manifests as m
from .api import SpeculativeServerSpec, Workload
from .config import Endpoints
from .errors import InputError
from .probe import reader
from .probe.datasets import Prompt, parse_dataset
from .probe.traffic import describe_source

READER_CONTAINER = "reader"
READER_VOLUME = "dataset"
READER_MOUNT = "/dataset"
READER_PORT = reader.DEFAULT_PORT
READER_APP = "specdec-dataset-reader"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_DATASET_FOR = "specdec.io/dataset-for"
COMPONENT = "dataset-reader"
# The reader's own unprivileged user (the operator image's), as the validator init container runs.
READER_UID = 65532

Request = Callable[..., Any]  # KubernetesWriter.request: (method, path, path_params, *, query, content_type, body)


def reader_pod_name(name: str, workload: str) -> str:
    return f"{name}-dataset-{workload}"


def describe_file(workload: Workload) -> str:
    """How errors name a File source: ``dataset file PATH on claim CLAIM`` (or ``on the model volume``)."""
    return f"dataset {describe_source(workload)}"


def reader_labels(name: str) -> dict[str, str]:
    # Not the server pods' labels (no app.kubernetes.io/name=sglang, no managed-by): the operator's pod index and
    # status.selector (HPA) must never count a reader as a server.
    labels = {"app.kubernetes.io/name": READER_APP, LABEL_COMPONENT: COMPONENT, LABEL_PART_OF: m.MANAGED_BY}
    if len(name) <= 63:
        labels[LABEL_DATASET_FOR] = name
    return labels


def reader_pod(
    name: str, namespace: str, owner_uid: str, workload: Workload, spec: SpeculativeServerSpec, settings: m.ManifestSettings
) -> dict[str, Any]:
    """The reader pod of one workload's File source (pure). The operator's image, no GPU, the volume read-only."""
    file = workload.prompts.file
    if workload.prompts.source != "File" or file is None:
        raise ValueError(f"workload {workload.name}: prompts.source is {workload.prompts.source}, not File")
    if file.claim_name:
        volume: dict[str, Any] = {"name": READER_VOLUME, "persistentVolumeClaim": {"claimName": file.claim_name, "readOnly": True}}
    else:  # the model volume, exactly as the servers mount it
        volume = {"name": READER_VOLUME, **copy.deepcopy(spec.model.volume)}
    container = {
        "name": READER_CONTAINER,
        "image": settings.validator_image,
        "command": [
            "specdec",
            "dataset-serve",
            "--file",
            f"{READER_MOUNT}/{file.path}",
            "--format",
            workload.prompts.format or "Auto",
            "--source",
            describe_file(workload),
            "--port",
            str(READER_PORT),
        ],
        "ports": [{"name": "http", "containerPort": READER_PORT, "protocol": "TCP"}],
        # Ready once the file is read, whatever its verdict: the verdict is the answer to GET /dataset.
        "readinessProbe": {"httpGet": {"path": reader.HEALTH_PATH, "port": READER_PORT}, "periodSeconds": 2, "failureThreshold": 3},
        # A dataset is at most 64 MiB (datasets.MAX_BYTES); parsed, it takes a few times that.
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "volumeMounts": [{"name": READER_VOLUME, "mountPath": READER_MOUNT, "readOnly": True}],
        "securityContext": {
            **m._container_security(),
            "runAsNonRoot": True,
            "runAsUser": READER_UID,
            "runAsGroup": READER_UID,
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "hostNetwork": False,
        "hostIPC": False,
        "hostPID": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True},
        "terminationGracePeriodSeconds": 5,
        # A reader the operator could not delete (a crash) ends by itself; the owner reference removes it later.
        "activeDeadlineSeconds": 3600,
        # Where the servers run: a hostPath model volume exists on those nodes, and a ReadWriteOnce claim the
        # servers hold can only be mounted on their node. The tolerations let it land there; it asks for no GPU.
        "tolerations": [{"key": m.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] + [copy.deepcopy(t) for t in spec.tolerations],
        "volumes": [volume],
        "containers": [container],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    affinity = m._gpu_affinity(spec)
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reader_pod_name(name, workload.name),
            "namespace": namespace,
            "labels": reader_labels(name),
            "ownerReferences": [
                {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def reader_state(pod: dict[str, Any] | None, workload: Workload, namespace: str) -> tuple[str, str]:
    """("ready" | "waiting" | "failed", what the pod's status says), judged from one read of the pod (pure).

    Failed is final: the claim does not exist (the scheduler says so), or the pod ended. Anything else is waited
    for until the reader timeout, and its message is the timeout's explanation."""
    source = describe_file(workload)
    if pod is None:
        return "waiting", "the reader pod is not there yet"
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    claim = workload.prompts.file.claim_name if workload.prompts.file else None
    scheduled = conditions.get("PodScheduled") or {}
    message = " ".join(str(scheduled.get("message") or "").split())
    if scheduled.get("status") == "False" and "persistentvolumeclaim" in message and "not found" in message:
        what = f"PersistentVolumeClaim {namespace}/{claim}" if claim else "the model volume's PersistentVolumeClaim"
        return "failed", f"{source}: {what} not found; create it, or name an existing claim in prompts.file.claimName"
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        ended = []
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            ended.append(" ".join(str(term.get("message") or term.get("reason") or "").split()))
        why = "; ".join(e for e in ended if e) or status.get("reason") or phase
        return "failed", f"{source}: the reader pod {namespace}/{pod['metadata']['name']} ended ({why[:300]}) before serving the dataset"
    if (conditions.get("Ready") or {}).get("status") == "True":
        return "ready", "ready"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return "waiting", " ".join(f"container {waiting['reason']}: {waiting.get('message') or ''}".split())
    if message:
        return "waiting", f"not scheduled: {message}"
    return "waiting", f"pod {phase or 'Pending'}"


def _api_message(exc: ApiException) -> str:
    """The API server's one-line message from a refused request (its Status body), else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(message or exc.reason).split())[:300]


class FileDatasetReader:
    """Reads one workload's File dataset through a reader pod: create, wait until Ready, fetch, delete."""

    def __init__(self, request: Request, endpoints: Endpoints, settings: m.ManifestSettings, timeout: float = 300.0, poll: float = 1.0) -> None:
        self.request = request
        self.endpoints = endpoints
        self.settings = settings
        self.timeout = timeout
        self.poll = poll

    def _call(self, method: str, path: str, namespace: str, **kwargs: Any) -> Any:
        return self.request(method, path, {"namespace": namespace}, **kwargs)

    def _find(self, namespace: str, pod_name: str) -> dict[str, Any] | None:
        found = self._call("GET", "/api/v1/namespaces/{namespace}/pods", namespace, query=[("fieldSelector", f"metadata.name={pod_name}")])
        items = (found or {}).get("items") or []
        return items[0] if items else None

    def _delete(self, namespace: str, pod_name: str) -> None:
        try:
            self.request(
                "DELETE",
                "/api/v1/namespaces/{namespace}/pods/{name}",
                {"namespace": namespace, "name": pod_name},
                query=[("gracePeriodSeconds", "0")],
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _create(self, pod: dict[str, Any]) -> None:
        namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for _ in range(30):
            try:
                # The client serializes a JSON body itself (a str would be sent as one JSON string).
                self._call("POST", "/api/v1/namespaces/{namespace}/pods", namespace, content_type="application/json", body=pod)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            # A reader of an earlier probe (an operator that crashed mid-read): it holds a stale verdict, replace it.
            self._delete(namespace, pod_name)
            time.sleep(1.0)
        raise InputError(f"the reader pod {namespace}/{pod_name} already exists and could not be replaced; delete it")

    async def read(self, namespace: str, name: str, owner_uid: str, workload: Workload, spec: SpeculativeServerSpec) -> list[Prompt]:
        source = describe_file(workload)
        pod = reader_pod(name, namespace, owner_uid, workload, spec, self.settings)
        pod_name = pod["metadata"]["name"]
        try:
            await asyncio.to_thread(self._create, pod)
        except ApiException as exc:
            fix = "the operator needs create and delete on pods" if exc.status == 403 else "see the API server's message"
            raise InputError(f"{source}: creating the reader pod {namespace}/{pod_name} failed ({exc.status} {_api_message(exc)}); {fix}") from None
        try:
            return await self._wait_and_fetch(namespace, pod_name, workload, source)
        finally:
            try:
                await asyncio.shield(asyncio.to_thread(self._delete, namespace, pod_name))
            except Exception:  # the owner reference and activeDeadlineSeconds still end it; the verdict stands
                pass

    async def _wait_and_fetch(self, namespace: str, pod_name: str, workload: Workload, source: str) -> list[Prompt]:
        deadline = time.monotonic() + self.timeout
        last = "the reader pod was not listed"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                try:
                    pod = await asyncio.to_thread(self._find, namespace, pod_name)
                except ApiException as exc:
                    last = f"listing the pod failed ({exc.status} {exc.reason})"
                    pod = None
                state, said = reader_state(pod, workload, namespace)
                last = said
                if state == "failed":
                    raise InputError(said)
                if state == "ready" and pod is not None:
                    url = self.endpoints.pod_url(namespace, pod_name, (pod.get("status") or {}).get("podIP"), pod_name, port=READER_PORT)
                    if url is not None:
                        fetched = await self._fetch(session, url, source)
                        if fetched is not None:
                            return fetched
                        last = f"the reader pod is Ready but {url}{reader.DATASET_PATH} did not answer"
                await asyncio.sleep(self.poll)
        raise InputError(
            f"{source}: the reader pod {namespace}/{pod_name} did not serve the dataset within {self.timeout:.0f} s ({last}); "
            "check that the claim exists and is bound and that the pod can be scheduled"
        )

    async def _fetch(self, session: aiohttp.ClientSession, url: str, source: str) -> list[Prompt] | None:
        """The dataset the reader serves; InputError with its one-line verdict when the file is bad; None when it did not answer."""
        try:
            async with session.get(f"{url}{reader.DATASET_PATH}", timeout=aiohttp.ClientTimeout(total=30, connect=3)) as resp:
                text = await resp.text()
                if resp.status == 422:
                    raise InputError(" ".join(text.split())[:1000])
                if resp.status != 200:
                    return None
        except (aiohttp.ClientError, TimeoutError):
            return None
        # The reader's normalised JSONL (Chat or Prompt lines), parsed again so the probe gets the same Prompt objects.
        return parse_dataset(text, source=source, fmt="Auto")
