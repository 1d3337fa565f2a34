"""Why a pod is not getting anywhere: the cause of a wait, read from the pod and the Events about it.

A server that waits forever looks like progress to a reader of pod phases: an init container that cannot start
because its volume does not mount waits as PodInitializing, a pod whose image cannot be pulled waits as
ContainerCreating between ImagePullBackOff retries. The kubelet says why only in the pod's container states and,
for volumes, only in Events (FailedMount, FailedAttachVolume). This module turns both into one named cause with a
one-line message naming the pod and what is wrong (the volume, the image, the resource and GPU family, the last
termination message), so status, a Warning Event and the progress deadline can all say the same thing.

Pure: pods and Events are the API server's documents (dicts); nothing here reads the cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import manifests as m
from ..api import Reason
from ..textutil import clip

# Container waiting reasons that mean the image will not come without a change (or an outage ending).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"})
# Container waiting reasons that mean the container cannot be created from its spec (a missing Secret or ConfigMap
# key, a bad securityContext, a runtime refusing the command).
CONTAINER_CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# Event reasons the kubelet and the attach/detach controller post when a volume does not come.
VOLUME_EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume"})

_VOLUME_NAMED = re.compile(r'volume "([^"]+)"')
_UNMOUNTED = re.compile(r"unmounted volumes=\[([^\]]*)\]")
_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9./_-]+)")


@dataclass(frozen=True)
class StuckCause:
    """A named reason a pod does not progress, and one line for humans that says where and what."""

    reason: Reason
    message: str
    pod: str


def pod_name(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "?")


def pod_uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def events_for(pod: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Events about ``pod`` (by uid where the Event has one, else by name), newest last."""
    uid, name = pod_uid(pod), pod_name(pod)
    mine = []
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if involved.get("kind") not in (None, "Pod"):
            continue
        if (involved.get("uid") and uid and involved.get("uid") == uid) or (not involved.get("uid") and involved.get("name") == name):
            mine.append(event)
    return sorted(mine, key=_event_time)


def _event_time(event: dict[str, Any]) -> str:
    series = event.get("series") or {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def diagnose(pod: dict[str, Any], events: list[dict[str, Any]] | None = None, gpu_family: str | None = None) -> StuckCause | None:
    """The cause that keeps ``pod`` from running, or None when nothing is known to be wrong (yet).

    Checked in the order a pod meets them: scheduling, volumes, images, container creation, crash loops.
    ``gpu_family``: the family the spec asks for, named when the pod document does not say it (the operator's
    copies of pods keep no affinity: kopf_tuning.slim_pod).
    """
    name = pod_name(pod)
    status = pod.get("status") or {}
    unschedulable = _unschedulable(pod, status, gpu_family)
    if unschedulable is not None:
        return unschedulable
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in IMAGE_PULL_REASONS:
            image = cs.get("image") or _spec_image(pod, cs.get("name"))
            detail = f" ({waiting['message']})" if waiting.get("message") else ""
            return StuckCause(
                Reason.IMAGE_NOT_PULLED, clip(f"pod {name}: image {image} of container {cs.get('name')} cannot be pulled: {reason}{detail}"), name
            )
        if reason in CONTAINER_CONFIG_REASONS:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return StuckCause(
                Reason.CONTAINER_CONFIG_ERROR, clip(f"pod {name}: container {cs.get('name')} cannot be created ({reason}{detail})"), name
            )
    volume = _volume_not_mounted(pod, status, events or [])
    if volume is not None:
        return volume
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return StuckCause(Reason.CRASH_LOOP, clip(f"pod {name}: container {cs.get('name')} is crash-looping ({last_termination(cs)})"), name)
    return None


def last_termination(cs: dict[str, Any]) -> str:
    """'exit code 1: <the container's last words>' from a container status's lastState (or its current state)."""
    term = ((cs.get("lastState") or {}).get("terminated")) or ((cs.get("state") or {}).get("terminated")) or {}
    parts = [term.get("reason") or "Error"]
    if term.get("exitCode") is not None:
        parts.append(f"exit code {term['exitCode']}")
    words = " ".join(str(term.get("message") or "").split())
    restarts = int(cs.get("restartCount") or 0)
    text = ", ".join(parts) + f", {restarts} restarts"
    return f"{text}; last message: {words}" if words else text


def _unschedulable(pod: dict[str, Any], status: dict[str, Any], gpu_family: str | None = None) -> StuckCause | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False":
            continue
        message = " ".join(str(cond.get("message") or cond.get("reason") or "unschedulable").split())
        missing = sorted({found.rstrip(".") for found in _INSUFFICIENT.findall(message)})  # "Insufficient nvidia.com/gpu."
        family = gpu_family_of(pod) or gpu_family
        where = f" on nodes of GPU family {family}" if family else ""
        what = f"not enough {', '.join(missing)}{where}" if missing else f"no node fits{where}"
        return StuckCause(Reason.UNSCHEDULABLE, clip(f"pod {pod_name(pod)} cannot be scheduled: {what} ({message})"), pod_name(pod))
    return None


def gpu_family_of(pod: dict[str, Any]) -> str | None:
    """The GPU family a pod asks for (resources.gpuFamily, rendered as a required node affinity), if any."""
    spec = pod.get("spec") or {}
    selector = (spec.get("nodeSelector") or {}).get(m.GPU_FAMILY_LABEL)
    if selector:
        return str(selector)
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == m.GPU_FAMILY_LABEL and expression.get("values"):
                return ",".join(str(v) for v in expression["values"])
    return None


def _volume_not_mounted(pod: dict[str, Any], status: dict[str, Any], events: list[dict[str, Any]]) -> StuckCause | None:
    if _all_started(status):
        return None  # an Event about a volume of a pod whose containers run is history
    name = pod_name(pod)
    for event in reversed(events_for(pod, events)):
        if event.get("reason") not in VOLUME_EVENT_REASONS:
            continue
        message = " ".join(str(event.get("message") or event.get("note") or "").split())
        volumes = _VOLUME_NAMED.findall(message)
        unmounted = _UNMOUNTED.search(message)
        if not volumes and unmounted:
            volumes = [v for v in unmounted.group(1).split() if v]
        named = ", ".join(dict.fromkeys(volumes)) or "?"
        return StuckCause(Reason.VOLUME_NOT_MOUNTED, clip(f"pod {name}: volume {named} is not mounted ({event.get('reason')}: {message})"), name)
    return None


def _all_started(status: dict[str, Any]) -> bool:
    containers = status.get("containerStatuses") or []
    return bool(containers) and all("running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {}) for cs in containers)


def _spec_image(pod: dict[str, Any], container: str | None) -> str:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            return str(c.get("image") or "?")
    return "?"


def waiting(pod: dict[str, Any]) -> bool:
    """A pod that is not being deleted and whose containers are not all ready: its Events may say why."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    return status.get("phase") in (None, "Pending") or not containers or not all(cs.get("ready") for cs in containers)
