"""The objects of spec.retraining.capture (docs/capture.md), as pure functions: the claim ``<name>-capture``, the
capture proxy's Deployment ``<name>-capture``, the Service ``<name>-serving`` (the selector the stable Service had)
and the stable Service fronted by the proxy. Owner references are added by the writer, as for every child."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from .. import manifests as m
from ..api import SpeculativeServerSpec
from ..api_retraining import CaptureSettings

CAPTURE_APP = "specdec-capture"  # the proxy pods' app.kubernetes.io/name: never counted as servers (status.selector)
COMPONENT = "capture-proxy"
ADMIN_PORT = 9091  # /metrics and /healthz of the proxy (specdec capture --admin-port)
ADMIN_PORT_NAME = "admin"
CAPTURE_DIR = "/capture"
CAPTURE_VOLUME = "capture"
ANNOTATION_CAPTURE = "specdec.io/capture"  # on the stable Service while it selects the capture proxy
PROXY_UID = 65532  # the operator image's unprivileged user (as the validator's)
# A claim holds the cap, a quarter more (a file being written, files another replica is about to delete) and 64 MiB.
CLAIM_ROOM = 1.25
CLAIM_EXTRA = 64 << 20


def capture_name(name: str) -> str:
    """The capture proxy's Deployment and the claim of its records."""
    return f"{name}-capture"


def serving_name(name: str) -> str:
    """The Service the proxy forwards to: the servers the stable Service selected before capture."""
    return f"{name}-serving"


def proxy_selector(name: str) -> dict[str, str]:
    return {m.LABEL_NAME: CAPTURE_APP, m.LABEL_INSTANCE: name}


def claim_size(max_bytes: int) -> str:
    """The claim's request: maxBytes with room, in whole GiB."""
    return f"{math.ceil((max_bytes * CLAIM_ROOM + CLAIM_EXTRA) / (1 << 30))}Gi"


def _labels(name: str) -> dict[str, str]:
    # managed-by: the operator's label-filtered watch sees the Deployment (its readiness decides the routing).
    return {m.LABEL_NAME: CAPTURE_APP, m.LABEL_INSTANCE: name, m.LABEL_MANAGED_BY: m.MANAGED_BY, m.LABEL_COMPONENT: COMPONENT}


@dataclass(frozen=True)
class ClaimShape:
    """What a claim is made with. Its class and access mode cannot change once it exists, and a larger request needs
    a class that expands: a claim keeps the shape it was created with (status.retraining.capture records it), so a
    changed spec never makes the API server refuse the claim."""

    size: str
    storage_class_name: str | None
    access_mode: str

    @classmethod
    def of(cls, capture: CaptureSettings) -> ClaimShape:
        return cls(claim_size(capture.max_bytes), capture.storage_class_name, capture.access_mode)


def claim(name: str, namespace: str, shape: ClaimShape) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [shape.access_mode], "resources": {"requests": {"storage": shape.size}}}
    if shape.storage_class_name:
        spec["storageClassName"] = shape.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": capture_name(name), "namespace": namespace, "labels": _labels(name)},
        "spec": spec,
    }


def proxy_command(name: str, namespace: str, capture: CaptureSettings, settings: m.ManifestSettings) -> list[str]:
    command = [
        "specdec",
        "capture",
        "--upstream",
        f"http://{serving_name(name)}.{namespace}.svc:{settings.port}",
        "--dir",
        CAPTURE_DIR,
        "--sample-share",
        repr(capture.sample_share),
        "--max-bytes",
        str(capture.max_bytes),
        "--retention-hours",
        str(capture.retention_hours),
        "--port",
        str(settings.port),
        "--admin-port",
        str(ADMIN_PORT),
    ]
    if capture.include_responses:
        command.append("--include-responses")
    redaction = capture.redaction
    if redaction is not None:
        for pattern in redaction.patterns:
            command += ["--redact", pattern]
        command += ["--redact-replacement", redaction.replacement]
        if redaction.url:
            command += ["--redaction-url", redaction.url]
    return command


def _pod_spec(
    name: str, namespace: str, spec: SpeculativeServerSpec, capture: CaptureSettings, settings: m.ManifestSettings, access_mode: str
) -> dict[str, Any]:
    container = {
        "name": "capture",
        "image": settings.validator_image,  # the operator's image
        "command": proxy_command(name, namespace, capture, settings),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": m.PORT_NAME, "containerPort": settings.port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": ADMIN_PORT_NAME}, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": ADMIN_PORT_NAME}, "periodSeconds": 20, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "volumeMounts": [{"name": CAPTURE_VOLUME, "mountPath": CAPTURE_DIR}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
        },
    }
    pod: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True, "fsGroup": PROXY_UID},
        # In-flight requests finish (specdec capture waits 25 s for them) and the queued records are written.
        "terminationGracePeriodSeconds": 30,
        "volumes": [{"name": CAPTURE_VOLUME, "persistentVolumeClaim": {"claimName": capture_name(name)}}],
        "containers": [container],
    }
    if spec.pod_template.image_pull_secrets:  # a private mirror of the operator's image needs the servers' secrets
        pod["imagePullSecrets"] = [{"name": ref.name} for ref in spec.pod_template.image_pull_secrets]
    if access_mode == "ReadWriteOnce":
        # A ReadWriteOnce volume attaches to one node: every capture pod there (the first one chooses it).
        pod["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": proxy_selector(name)}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    return pod


def proxy_deployment(
    name: str, namespace: str, spec: SpeculativeServerSpec, capture: CaptureSettings, settings: m.ManifestSettings, access_mode: str | None = None
) -> dict[str, Any]:
    """Deployment ``<name>-capture``: capture.replicas proxies, replaced one at a time with a surge (never none Ready:
    a settings change rolls the proxies, never the servers). ``access_mode``: the claim's (ClaimShape), which may be
    the one it was created with rather than the spec's."""
    template = {
        # managed-by: the operator's pod watch sees the proxies (it reads their count of the claim: controller/capturecount.py).
        "metadata": {"labels": {**proxy_selector(name), m.LABEL_COMPONENT: COMPONENT, m.LABEL_MANAGED_BY: m.MANAGED_BY}, "annotations": {}},
        "spec": _pod_spec(name, namespace, spec, capture, settings, access_mode or capture.access_mode),
    }
    template["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] = m.template_hash(template)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": capture_name(name), "namespace": namespace, "labels": _labels(name)},
        "spec": {
            "replicas": capture.replicas,
            "selector": {"matchLabels": proxy_selector(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }


def serving_service(stable: dict[str, Any], name: str) -> dict[str, Any]:
    """``<name>-serving``: the stable Service's selector and port under another name (a ClusterIP: the proxies'
    connections are balanced over the servers as the stable Service's were)."""
    out = copy.deepcopy(stable)
    out["metadata"]["name"] = serving_name(name)
    return out


def fronted(stable: dict[str, Any], name: str) -> dict[str, Any]:
    """The stable Service selecting the capture proxies (same name, port and ClusterIP: clients notice nothing). Its
    active-variant annotation still names the decided variant; ``specdec.io/capture`` says where the traffic goes."""
    out = copy.deepcopy(stable)
    out["metadata"].setdefault("annotations", {})[ANNOTATION_CAPTURE] = capture_name(name)
    out["spec"]["selector"] = proxy_selector(name)
    return out


def selects_capture(service: dict[str, Any] | None) -> bool:
    """Whether a (stable) Service selects the capture proxies."""
    selector = ((service or {}).get("spec") or {}).get("selector") or {}
    return selector.get(m.LABEL_NAME) == CAPTURE_APP


def routing_service(services: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The Service whose selector says which servers get the traffic: the stable Service, or ``<name>-serving``
    while the stable one selects the capture proxies."""
    stable = services.get(m.child_name(name, None))
    if selects_capture(stable):
        return services.get(serving_name(name), stable)
    return stable
