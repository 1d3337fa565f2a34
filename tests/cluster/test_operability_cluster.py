"""The first week on the real control plane (issue 25): a server no node can hold says why, with the real
scheduler's message, posts a Warning Event, and ends at spec.progressDeadlineSeconds in ProgressDeadlineExceeded;
the plugin's status reads it back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube import wait_until
from tests.support.operator_process import compatible_annotations, event_reasons, example, status, wait_phase

pytestmark = pytest.mark.cluster

NAME = "toobig"


def condition(st: dict, ctype: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def test_a_server_no_node_can_hold_names_the_gpus_and_ends_at_the_deadline(
    operator: Any, custom_objects: Any, core_v1: Any, namespace: str, kube_env: dict, monkeypatch: Any, capsys: Any
) -> None:
    operator.start()
    # 16 GPUs per pod: the simulated nodes have 8 each, so the real scheduler refuses both servers.
    cr = example("llama31-8b-eagle3.yaml", NAME, namespace, annotations=compatible_annotations(), resources__gpus=16, progressDeadlineSeconds=60)
    custom_objects.create_namespaced_custom_object("specdec.io", "v1alpha1", namespace, "speculativeservers", cr)

    def unschedulable() -> dict | None:
        st = status(custom_objects, namespace, NAME)
        return st if condition(st, "BaseReady").get("reason") == "Unschedulable" else None

    st = wait_until(unschedulable, timeout=90, message="BaseReady Unschedulable")
    message = condition(st, "BaseReady")["message"]
    assert "not enough nvidia.com/gpu" in message and "Insufficient nvidia.com/gpu" in message, message
    assert st["waitingFor"] == "the base server (Unschedulable)" and st["waitingSince"]
    wait_until(lambda: "Unschedulable" in event_reasons(core_v1, namespace, NAME), timeout=30, message="a Warning Event Unschedulable")

    failed = wait_phase(custom_objects, namespace, NAME, {"Failed"}, timeout=180)
    assert failed["reason"] == "ProgressDeadlineExceeded", failed
    assert "no progress for 60s" in failed["message"] and "nvidia.com/gpu" in failed["message"]
    wait_until(lambda: "ProgressDeadlineExceeded" in event_reasons(core_v1, namespace, NAME), timeout=30, message="the deadline's Event")

    # `kubectl specdec status` reads the same status back.
    from specdec_operator.cli.kubectl_specdec import main

    for key, value in kube_env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["status", NAME, "-n", namespace]) == 0
    assert f"{NAME}: Failed (ProgressDeadlineExceeded)" in capsys.readouterr().out
