"""spec.retraining.capture on the local control plane (docs/capture.md): the real `specdec run` process turns capture
on for a promoted resource and off again. The claim binds to a PersistentVolume the test makes (the control plane has
no provisioner), the capture pod is a kwok pod on the CPU node (nothing runs in it: the proxy itself is tested in
tests/unit/test_capture_proxy.py), and what is asserted is what the API server holds: the objects, the stable
Service's endpoints, the servers' pods (not replaced), the Events, and the deletion of the claim, the proxies and
<name>-serving when capture is turned off (tests/support/capture.py), and of the claim with the resource. The chart's end-to-end test runs the same round
trip under the chart's ServiceAccount (tests/cluster/test_chart_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.capture import capture_on_and_off, capture_state, delete_volume, gone, make_volume
from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    example,
    wait_phase,
)
from tests.support.simulators import Simulators

pytestmark = pytest.mark.cluster


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
    volume = make_volume(core_v1, namespace)
    volumes = [volume]
    try:
        capture_on_and_off(core_v1, apps_v1, custom_objects, namespace, name, volume)
        # On again, then the resource deleted: the claim goes with it (owner reference), the records with the claim.
        second = make_volume(core_v1, namespace, "-2")
        volumes.append(second)
        capture = {"enabled": True, "sampleShare": 0.1, "maxBytes": 1 << 20, "storageClassName": second}  # a merge patch: enabled was false
        custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": capture}}})
        wait_until(lambda: capture_state(custom_objects, namespace, name) == "On", timeout=90, message="capture On again")
        claim = core_v1.read_namespaced_persistent_volume_claim(f"{name}-capture", namespace)
        assert [(o.kind, o.name) for o in claim.metadata.owner_references or []] == [("SpeculativeServer", name)]
        custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        wait_until(
            lambda: (
                gone(core_v1.read_namespaced_persistent_volume_claim, f"{name}-capture", namespace)
                and gone(apps_v1.read_namespaced_deployment, f"{name}-capture", namespace)
            ),
            timeout=90,
            message="the claim and the proxies garbage-collected with the resource",
        )
    finally:
        for made in volumes:
            delete_volume(core_v1, made)
