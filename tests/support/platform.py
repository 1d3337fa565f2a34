"""What a platform team sets on its pods: a spec.podTemplate using every field (tests of issue 25, item 5)."""

from __future__ import annotations

from typing import Any

PLATFORM: dict[str, Any] = {
    "metadata": {"labels": {"team": "inference"}, "annotations": {"cost-center": "42"}},
    "nodeSelector": {"pool": "h200"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "serviceAccountName": "inference",
    "automountServiceAccountToken": True,
    "imagePullSecrets": [{"name": "mirror"}],
    "priorityClassName": "inference-high",
    "runtimeClassName": "nvidia",
    "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
    "containerSecurityContext": {"runAsUser": 1000, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "matchLabelKeys": ["pod-template-hash"]}
    ],
    "volumes": [{"name": "ca", "configMap": {"name": "company-ca"}}, {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "cache"}}],
    "volumeMounts": [
        {"name": "ca", "mountPath": "/etc/ssl/company", "readOnly": True},
        {"name": "compile-cache", "mountPath": "/cache/triton"},
    ],
}
