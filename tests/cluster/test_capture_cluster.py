"""spec.retraining.capture on the local control plane (docs/capture.md): the real `specdec run` process turns capture
on for a serving resource and off again. The claim binds to a PersistentVolume the test makes (the control plane has
no provisioner), the capture pod is a kwok pod on the CPU node (nothing runs in it: the proxy itself is tested in
tests/unit/test_capture_proxy.py), and what is asserted is what the API server holds: the objects, the stable
Service's endpoints, the servers' pods (not restarted), the Events, and the deletion of the claim, the proxies and
<name>-serving when capture is turned off."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    event_reasons,
    example,
    status,
    wait_phase,
)
from tests.support.simulators import Simulators

pytestmark = pytest.mark.cluster


def _capture_state(custom_objects: Any, namespace: str, name: str) -> str | None:
    return ((status(custom_objects, namespace, name).get("retraining") or {}).get("capture") or {}).get("state")


def _gone(read: Any, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _endpoint_ips(core_v1: Any, namespace: str, name: str) -> set[str]:
    endpoints = core_v1.read_namespaced_endpoints(name, namespace)
    return {a.ip for s in endpoints.subsets or [] for a in s.addresses or []}


def test_capture_on_then_off_moves_the_stable_service_and_deletes_the_claim_without_restarting_servers(
    operator: Operator, sims: Simulators, namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any
) -> None:
    name = "llama"
    operator.map(f"{name}-base", sims.start("llama31-8b-base").url)
    operator.map(f"{name}-spec", sims.start("llama31-8b-eagle3").url)
    operator.script(name, **LLAMA_EAGLE3_SCRIPT)
    operator.start()
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations())
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
    assert wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Failed"}, timeout=120)["phase"] == "Promoted"
    servers = f"app.kubernetes.io/instance={name},app.kubernetes.io/name=sglang"
    server_pods = {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items}
    stable_selector = core_v1.read_namespaced_service(name, namespace).spec.selector

    # A volume for the claim to bind to (its storage class names no provisioner: the claim binds to it by class).
    storage_class = f"capture-{namespace}"
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
    try:
        capture = {"sampleShare": 0.1, "maxBytes": 1 << 20, "storageClassName": storage_class}
        custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": capture}}})
        wait_until(lambda: _capture_state(custom_objects, namespace, name) == "On", timeout=90, message="capture On")
        stable = core_v1.read_namespaced_service(name, namespace)
        assert stable.spec.selector == {"app.kubernetes.io/name": "specdec-capture", "app.kubernetes.io/instance": name}
        assert core_v1.read_namespaced_service(f"{name}-serving", namespace).spec.selector == stable_selector
        assert core_v1.read_namespaced_persistent_volume_claim(f"{name}-capture", namespace).status.phase == "Bound"
        proxies = core_v1.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/name=specdec-capture,app.kubernetes.io/instance={name}"
        ).items
        assert proxies and all(p.spec.node_name == "cpu-0" for p in proxies)  # no GPU node: it tolerates no GPU taint
        wait_until(
            lambda: _endpoint_ips(core_v1, namespace, name) == {p.status.pod_ip for p in proxies},
            timeout=20,
            message="the stable Service's endpoints are the capture pods",
        )
        wait_until(lambda: {"CaptureStarting", "CaptureStarted"} <= set(event_reasons(core_v1, namespace, name)), timeout=20, message="Events")
        # The same server pods: none was restarted.
        assert {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items} == server_pods

        custom_objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": {"enabled": False}}}}
        )
        wait_until(
            lambda: (
                _gone(core_v1.read_namespaced_persistent_volume_claim, f"{name}-capture", namespace)
                and _gone(apps_v1.read_namespaced_deployment, f"{name}-capture", namespace)
                and _gone(core_v1.read_namespaced_service, f"{name}-serving", namespace)
            ),
            timeout=90,
            message="the claim, the proxies and <name>-serving deleted",
        )
        assert core_v1.read_namespaced_service(name, namespace).spec.selector == stable_selector
        wait_until(lambda: _capture_state(custom_objects, namespace, name) is None, timeout=30, message="status.retraining cleared")
        assert "CaptureStopped" in event_reasons(core_v1, namespace, name)
        assert status(custom_objects, namespace, name)["phase"] == "Promoted"
        assert {p.metadata.uid for p in core_v1.list_namespaced_pod(namespace, label_selector=servers).items} == server_pods
    finally:
        try:
            core_v1.delete_persistent_volume(storage_class)
        except ApiException:
            pass
