"""spec.retraining.capture turned on and off on the local control plane (docs/capture.md), for the cluster tests: the
capture round trip of tests/cluster/test_capture_cluster.py, also run by the chart's end-to-end test under its
ServiceAccount (so the claim's and <name>-serving's verbs are used, and the chart's RBAC proven minimal with them)."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION, event_reasons, status

PROXY_SELECTOR = "app.kubernetes.io/name=specdec-capture,app.kubernetes.io/instance={name}"


def capture_state(custom_objects: Any, namespace: str, name: str) -> str | None:
    return ((status(custom_objects, namespace, name).get("retraining") or {}).get("capture") or {}).get("state")


def gone(read: Any, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def endpoint_ips(core_v1: Any, namespace: str, name: str) -> set[str]:
    endpoints = core_v1.read_namespaced_endpoints(name, namespace)
    return {a.ip for s in endpoints.subsets or [] for a in s.addresses or []}


def make_volume(core_v1: Any, namespace: str, suffix: str = "") -> str:
    """A PersistentVolume the claim binds to, by a storage class named after the namespace (the control plane has no
    provisioner); its name, which is also that class's. One claim only: released, it keeps the claim's reference
    (Retain), so a second claim needs a second volume. The caller deletes it (delete_volume)."""
    storage_class = f"capture-{namespace}{suffix}"
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": storage_class},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/tmp/{storage_class}"},
        },
    }
    core_v1.create_persistent_volume(volume)
    return storage_class


def delete_volume(core_v1: Any, name: str) -> None:
    try:
        core_v1.delete_persistent_volume(name)
    except ApiException:
        pass


def capture_on_and_off(core_v1: Any, apps_v1: Any, custom_objects: Any, namespace: str, name: str, storage_class: str) -> None:
    """Turn capture on for a serving resource, check the routing and that no server pod was replaced, turn it off and
    check that the claim, the proxies and <name>-serving are deleted and the stable Service selects the servers again."""
    servers = f"app.kubernetes.io/instance={name},app.kubernetes.io/name=sglang"
    server_pods = {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items}
    stable_selector = core_v1.read_namespaced_service(name, namespace).spec.selector
    phase = status(custom_objects, namespace, name)["phase"]

    capture = {"sampleShare": 0.1, "maxBytes": 1 << 20, "storageClassName": storage_class}
    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": capture}}})
    wait_until(lambda: capture_state(custom_objects, namespace, name) == "On", timeout=90, message="capture On")
    stable = core_v1.read_namespaced_service(name, namespace)
    assert stable.spec.selector == {"app.kubernetes.io/name": "specdec-capture", "app.kubernetes.io/instance": name}
    assert core_v1.read_namespaced_service(f"{name}-serving", namespace).spec.selector == stable_selector
    assert core_v1.read_namespaced_persistent_volume_claim(f"{name}-capture", namespace).status.phase == "Bound"
    proxies = core_v1.list_namespaced_pod(namespace, label_selector=PROXY_SELECTOR.format(name=name)).items
    assert proxies and all(p.spec.node_name == "cpu-0" for p in proxies)  # no GPU node: it tolerates no GPU taint
    wait_until(
        lambda: endpoint_ips(core_v1, namespace, name) == {p.status.pod_ip for p in proxies},
        timeout=20,
        message="the stable Service's endpoints are the capture pods",
    )
    wait_until(lambda: {"CaptureStarting", "CaptureStarted"} <= set(event_reasons(core_v1, namespace, name)), timeout=20, message="Events")
    assert {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items} == server_pods  # none restarted

    custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": {"enabled": False}}}})
    wait_until(
        lambda: (
            gone(core_v1.read_namespaced_persistent_volume_claim, f"{name}-capture", namespace)
            and gone(apps_v1.read_namespaced_deployment, f"{name}-capture", namespace)
            and gone(core_v1.read_namespaced_service, f"{name}-serving", namespace)
        ),
        timeout=90,
        message="the claim, the proxies and <name>-serving deleted",
    )
    assert core_v1.read_namespaced_service(name, namespace).spec.selector == stable_selector
    wait_until(lambda: capture_state(custom_objects, namespace, name) is None, timeout=30, message="status.retraining cleared")
    assert "CaptureStopped" in event_reasons(core_v1, namespace, name)
    assert status(custom_objects, namespace, name)["phase"] == phase
    assert {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items} == server_pods
