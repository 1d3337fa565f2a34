"""The GPUs each variant holds, and how many of them do nothing: status.gpus and the idle-GPU metric.

A GPU is held from the moment a pod that requests it exists until the pod is gone (terminating pods hold theirs
to the end). It is idle when its server serves no traffic (the stable Service does not select its variant) and is
not being probed: a warm base after a promotion, a losing speculative server kept warm, pods still going away.

Each pod counts with what it asked for itself (its containers' nvidia.com/gpu, which the operator's index copy of
the pod keeps: controller/kopf_tuning.slim_pod), not with what the spec asks for now: a pod of an older template
holds its own GPUs until it is gone.

Pure: pod documents in, counts out.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .. import manifests as m
from ..api import GpuStatus, Variant
from .diff import labels_of


def pod_gpus(pod: dict[str, Any]) -> int:
    """GPUs a pod holds: the sum over its containers of nvidia.com/gpu, from limits (where Kubernetes sets an extended
    resource; a request, when given, must equal it) or else requests. Init containers run before, not beside, them.

    ``pod`` is the operator's index copy (controller/kopf_tuning.slim_pod), which keeps exactly these fields."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(m.GPU_RESOURCE)
        if amount is None:
            amount = (resources.get("requests") or {}).get(m.GPU_RESOURCE)
        try:
            total += int(str(amount)) if amount is not None else 0
        except ValueError:
            continue
    return total


def gpu_status(pods: list[dict[str, Any]], serving: Collection[Variant], probing: bool) -> GpuStatus:
    """What status.gpus says: GPUs held by each variant's pods, and the idle ones among them.

    ``serving``: the variants the stable Service selects; ``probing``: a probe measures both servers now."""
    held = {Variant.BASE: 0, Variant.SPECULATIVE: 0}
    idle = 0
    for pod in pods:
        variant = labels_of(pod).get(m.LABEL_VARIANT)
        if variant not in (Variant.BASE.value, Variant.SPECULATIVE.value):
            continue
        gpus = pod_gpus(pod)
        held[Variant(variant)] += gpus
        going = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        if going or (Variant(variant) not in serving and not probing):
            idle += gpus
    return GpuStatus(base=held[Variant.BASE], speculative=held[Variant.SPECULATIVE], idle=idle)
