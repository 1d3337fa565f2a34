"""The reader pod of a File prompt source: a dataset file on the model volume or on another PVC (docs/probe.md).

The operator cannot mount a volume, and a pod's termination message (4 KiB) cannot carry a dataset, so when a
probe starts and a workload's prompts are ``source: File`` the operator creates one small pod per workload that
mounts the volume read-only and runs ``specdec dataset-serve`` (probe/reader.py): it parses the file with the
probe's own parser and serves the normalised JSONL, or the one-line error naming the claim, the path and the line.
The operator fetches it the way it reaches the servers (``Endpoints.pod_url``: the pod's IP in a cluster, the
endpoints mapping outside one) and deletes the pod; the owner reference lets the garbage collector remove a pod
an operator crash left behind.

The pod is built in manifests (``manifests.reader_pod``); ``reader_state`` judges its status (pure), and
``FileDatasetReader`` does the API calls (create, list by name, delete: no get, no watch, no exec) around them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes.client.exceptions import ApiException

from .. import manifests as m
from ..api import SpeculativeServerSpec, Workload
from ..errors import InputError
from ..probe import reader
from ..probe.datasets import Prompt, parse_dataset
from .config import Endpoints

Request = Callable[..., Any]  # KubernetesWriter.request: (method, path, path_params, *, query, content_type, body)


def reader_state(pod: dict[str, Any] | None, workload: Workload, namespace: str) -> tuple[str, str]:
    """("ready" | "waiting" | "failed", what the pod's status says), judged from one read of the pod (pure).

    Failed is final: the claim does not exist (the scheduler says so), or the pod ended. Anything else is waited
    for until the reader timeout, and its message is the timeout's explanation."""
    source = m.describe_file(workload)
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
        source = m.describe_file(workload)
        pod = m.reader_pod(name, namespace, owner_uid, workload, spec, self.settings)
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
                    url = self.endpoints.pod_url(namespace, pod_name, (pod.get("status") or {}).get("podIP"), pod_name, port=m.READER_PORT)
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
