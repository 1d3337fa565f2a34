"""Issue 34 on the real API server: the Warning Events that name a waiting pod's cause are found however busy its
namespace is (a field selector on the pod, every page read)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from specdec_operator.controller.kubewriter import POD_EVENTS_PAGE, KubernetesWriter
from specdec_operator.controller.metrics import OperatorMetrics

pytestmark = pytest.mark.cluster

# More than the 500 Events the operator read per namespace before (one page, no continue token).
BUSY = 520


def _event(namespace: str, name: str, pod: str, uid: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": uid, "apiVersion": "v1"},
        "type": "Warning",
        "reason": reason,
        "message": message,
        "firstTimestamp": "2026-12-02T10:00:00Z",
        "lastTimestamp": "2026-12-02T10:00:00Z",
        "count": 1,
        "source": {"component": "kubelet"},
    }


def test_the_cause_of_a_waiting_pod_is_read_in_a_namespace_with_more_events_than_one_read_took(
    core_v1: Any, kube_api_client: Any, namespace: str
) -> None:
    def create(body: dict[str, Any]) -> None:
        core_v1.create_namespaced_event(namespace, body)

    others = [_event(namespace, f"a-{i:04d}", f"other-{i}", f"uid-other-{i}", "BackOff", "Back-off restarting failed container") for i in range(BUSY)]
    # The pod's own Warnings: more than one page of them, the FailedMount among the last (names sort after the rest).
    mine = [
        _event(namespace, f"z-{i:04d}", "llama-base-0", "uid-llama-base-0", "FailedScheduling", "0/1 nodes are available")
        for i in range(POD_EVENTS_PAGE + 20)
    ]
    mine.append(
        _event(
            namespace,
            "zz-mount",
            "llama-base-0",
            "uid-llama-base-0",
            "FailedMount",
            'MountVolume.SetUp failed for volume "model" : persistentvolumeclaim "weights" not found',
        )
    )
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, others + mine))

    # Before issue 34: one namespace-wide read of at most 500 Events; the pod's cause is not among them.
    first_page = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.kind=Pod,type=Warning", limit=500)
    assert "zz-mount" not in {e.metadata.name for e in first_page.items} and first_page.metadata._continue

    writer = KubernetesWriter(OperatorMetrics(), kube_api_client)
    pod = {"metadata": {"name": "llama-base-0", "uid": "uid-llama-base-0"}}
    found = writer._pod_warnings(namespace, [pod])
    assert {e["metadata"]["name"] for e in found} == {e["metadata"]["name"] for e in mine}, "every page of the pod's own Events, no one else's"
    mounts = [e for e in found if e["reason"] == "FailedMount"]
    assert mounts and 'volume "model"' in mounts[0]["message"]

    from specdec_operator.reconcile import stuck

    waiting = {
        **pod,
        "status": {"phase": "Pending", "containerStatuses": [{"name": "sglang", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    }
    cause = stuck.diagnose(waiting, found)
    assert cause is not None and cause.reason == "VolumeNotMounted" and "model" in cause.message
